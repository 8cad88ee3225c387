"""The widened comparison (every conv/linear tensor both graphs have, tfsurgery.verify.sensitivity) keeps
its values for only as many stacked --samples rows as fit ``verify.WIDE_BYTES``; the outputs are
still compared on every row. Without the bound a Keras ResNet50 at 224 (186 MiB of such values
per row and graph) took 12.7 GB on a first batch of 32 rows (docs/int8.md, Memory). Counting
rows fed, never timing; the outputs checked against the tests' own oracle."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.verify import runs
from tfsurgery.verify import check as verify
from tfsurgery.verify import widen
from tfsurgery.errors import VerificationFailed
from tfsurgery.ops import node_name
from tfsurgery.verify.samples import Samples

import oracle
from test_blind_spots import deep_cond_bn_cnn, scale_one_kernel

ROWS = 12
SOURCE = dict(inputs=["input"], outputs=["output"], training_flags=["training"])


def graph_with(batch, channels=2):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [batch, 4, 4, channels], name="input")
        tf.identity(x * 2.0, name="doubled")
    return graph


def test_wide_rows_keeps_both_graphs_values_within_the_budget():
    graph = graph_with(None)
    feeds = {"input": np.zeros((ROWS, 4, 4, 2), np.float32)}
    per_row = 2 * 4 * 4 * 2 * 4                 # both graphs' float32 [4, 4, 2] per row
    assert verify.wide_rows(feeds, graph, ["doubled:0"], budget=3 * per_row + 5) == 3
    assert verify.wide_rows(feeds, graph, ["doubled:0"], budget=1) == 1      # at least one
    assert verify.wide_rows(feeds, graph, ["doubled:0"], budget=ROWS * per_row) is None
    fixed = graph_with(ROWS)                     # a fixed batch cannot be cut
    assert verify.wide_rows(feeds, fixed, ["doubled:0"], budget=1) is None
    assert verify.first_rows(feeds, 3)["input"].shape[0] == 3
    assert verify.first_rows(feeds, None) is feeds


@pytest.fixture
def fed_rows(monkeypatch):
    """(fetched names, rows fed to the input) of every run of a check."""
    seen = []
    run = runs.Runner.run

    def counted(self, feeds, outputs):
        seen.append((list(outputs), {len(v) for k, v in feeds.items()
                                     if node_name(k) == "input"}))
        return run(self, feeds, outputs)
    monkeypatch.setattr(runs.Runner, "run", counted)
    return seen


def samples(seed=0):
    values = np.random.default_rng(seed).standard_normal((ROWS, 8, 8, 3)).astype(np.float32)
    return Samples({"input": values}, {"input": False}, "rows")


@pytest.mark.parametrize("budget, wide", [(1, 1), (verify.WIDE_BYTES, ROWS)])
def test_intermediates_on_the_rows_that_fit_outputs_on_every_row(monkeypatch, fed_rows,
                                                                 budget, wide):
    monkeypatch.setattr(widen, "WIDE_BYTES", budget)
    graph, rows = deep_cond_bn_cnn(), samples()
    result = api.optimize(api.Source(graph, "deep", **SOURCE),
                          options=api.RunOptions(samples=rows))
    v = result.verification
    assert v.passed, v.failure()
    assert v.intermediate                                   # widened at once (18 conv layers)
    widened = [fed for names, fed in fed_rows if set(names) - {"output", "output:0"}
               and any("block_" in n for n in names)]
    assert widened and all(fed <= {wide} for fed in widened)
    assert any(fed == {ROWS} for _, fed in fed_rows)        # the outputs: every row at once
    expected = oracle.run(graph, {"input": rows.arrays["input"], "training": False},
                          ["output"])[0]
    np.testing.assert_allclose(v.expected["output"], expected, rtol=1e-5, atol=1e-6)
    assert ("on the first 1 row(s)" in v.summary()) == (wide == 1)


def test_a_middle_layer_times_1_05_is_still_caught_on_the_first_row(monkeypatch):
    monkeypatch.setattr(widen, "WIDE_BYTES", 1)
    graph = deep_cond_bn_cnn()
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(api.Source(graph, "mutated", **SOURCE),
                     ["default", scale_one_kernel("scale-block-9", "block_9/Conv2D")],
                     options=api.RunOptions(samples=samples()))
    v = failed.value.verification
    assert v.hidden or v.max_error > 1e-4
