"""The mutation sweep as a test tool (benchmarks/mutation_sweep.py does the sweeping): each
weight layer ×1.05 through a user's transform after the default pipeline must fail the check
(VerificationFailed: nothing handed back or written) — and TensorFlow itself, in the test's own
session, must show that each mutation changed the output (else the mutation proves nothing)."""
from typing import Mapping, Optional, Sequence

import numpy as np

from benchmarks.mutation_sweep import Sweep, sweep  # noqa: F401 - re-exported for tests
from tfsurgery import api

import oracle


def swept(graph_def, inputs: Sequence[str], outputs: Sequence[str], name: str, *,
          settings: Optional[Mapping[str, object]] = None, channel: bool = False,
          **source) -> Sweep:
    """Sweep a model; assert the unmutated run passes, every mutation is caught, and the
    oracle sees each mutated result's outputs differ from the original's. ``channel``: each
    kernel's last output channel mutated, not the whole kernel."""
    built = api.Source(graph_def, name, inputs=list(inputs), outputs=list(outputs), **source)
    result = sweep(built, name, channel=channel)
    assert result.unmutated_passed, result.line()
    assert result.outcomes, f"{name}: nothing to mutate"
    assert not result.misses, result.line()
    feeds = oracle.random_feeds(graph_def, inputs, seed=0)
    expected = oracle.run(graph_def, {**feeds, **(settings or {})}, outputs)
    for outcome in result.outcomes:
        assert outcome.mutated is not None, outcome.how
        actual = oracle.run(outcome.mutated, feeds, outputs)
        assert any(not np.array_equal(e, a) for e, a in zip(expected, actual)), \
            f"{name}: mutating '{outcome.target.const}' changed no output (the oracle)"
    return result
