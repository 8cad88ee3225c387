"""A mutation sweep: how many single-layer weight errors does verification catch?

Each weight layer of a model's optimized graph — every conv/matmul/einsum kernel (through a
Cast, Conv1D's ExpandDims, a reshape) and every embedding table, with ``all_weights`` also every
bias and normalization scale — is made ``factor`` × its value (1.05: 5% off) by a user's
transform (the plugin mechanism, docs/plugins.md) run after the default pipeline; the run must
fail (``VerificationFailed``: exit 1, nothing handed back or written). A mutation that passes is
a miss. ``channel=True`` mutates one output channel of each kernel instead (its last).

Used by ``tests/mutation_sweep.py`` (with TensorFlow as the oracle that each mutation is real),
``scripts/mutation_sweep.py MODEL`` and ``scripts/benchmark.py --mutation-sweep``."""
from __future__ import annotations

import dataclasses
import time
from typing import List, Optional, Sequence

import numpy as np
from tensorflow.core.framework import graph_pb2

import tfsurgery
from tfsurgery import api, pipeline
from tfsurgery.errors import CannotVerify, VerificationFailed

FACTOR = 1.05
PASS_THROUGH = {"Identity", "Snapshot", "StopGradient", "Cast", "ExpandDims", "Reshape",
                "Squeeze", "Transpose", "ReadVariableOp"}
KERNEL_OPS = {"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul",
              "BatchMatMulV2", "BatchMatMulV3", "Conv2DBackpropInput", "Conv3DBackpropInputV2",
              "Einsum"}
TABLE_OPS = {"Gather", "GatherV2", "ResourceGather", "GatherNd"}
FLOATS = {1, 2, 14, 19}            # DT_FLOAT, DT_DOUBLE, DT_BFLOAT16, DT_HALF


@dataclasses.dataclass
class Target:
    const: str          # the Const node mutated
    reader: str         # the op that uses it (the layer)
    kind: str           # kernel, table, weight


@dataclasses.dataclass
class Outcome:
    target: Target
    caught: bool
    how: str            # "failed: ...", "cannot verify: ...", or "passed"
    mutated: Optional[graph_pb2.GraphDef] = None    # the mutated result (from the failure)


@dataclasses.dataclass
class Sweep:
    model: str
    outcomes: List[Outcome]
    unmutated: str           # the unmutated run's verdict line
    unmutated_passed: bool
    seconds: float
    factor: float = FACTOR

    @property
    def caught(self) -> int:
        return sum(o.caught for o in self.outcomes)

    @property
    def misses(self) -> List[Outcome]:
        return [o for o in self.outcomes if not o.caught]

    def line(self) -> str:
        refused = sum(o.how.startswith("cannot verify") for o in self.outcomes)
        text = (f"{self.model}: mutation sweep caught {self.caught}/{len(self.outcomes)} "
                f"(×{self.factor:g} of one weight layer each; {refused} of them as 'cannot verify'); "
                f"unmutated: {'passes' if self.unmutated_passed else 'REFUSED'} "
                f"({self.unmutated}); {self.seconds:.1f} s")
        for miss in self.misses:
            text += f"\n  missed: {miss.target.kind} '{miss.target.const}' of '{miss.target.reader}'"
        return text


def targets(graph_def: graph_pb2.GraphDef, all_weights: bool = False) -> List[Target]:
    """The weight layers of a graph, in graph order, read from its NodeDefs alone (not from
    the verifier's own list: the sweep must not only test what the probe knows about)."""
    readers = {}
    for node in graph_def.node:
        for index, source in enumerate(node.input):
            if not source.startswith("^"):
                readers.setdefault(source.split(":")[0], []).append((node, index))
    found = []
    for node in graph_def.node:
        if node.op != "Const" or node.attr["dtype"].type not in FLOATS:
            continue
        dims = node.attr["value"].tensor.tensor_shape.dim
        if int(np.prod([d.size for d in dims])) <= 1:
            continue
        reader, index, hops = node, 0, 0
        while hops < 64:
            users = readers.get(reader.name, [])
            if len(users) != 1:
                break
            reader, index = users[0]
            if reader.op not in PASS_THROUGH or index != 0:
                break
            hops += 1
        if reader is node or reader.op in PASS_THROUGH:
            continue
        kind = "kernel" if reader.op in KERNEL_OPS else \
            "table" if reader.op in TABLE_OPS and index == 0 else "weight"
        if kind != "weight" or all_weights:
            found.append(Target(node.name, reader.name, kind))
    return found


def mutation(target: Target, factor: float = FACTOR, channel: bool = False, number: int = 0):
    """A user's transform: ``target``'s constant × ``factor`` (its last output channel only,
    with ``channel``), in its own dtype."""
    name = f"mutate-{number}"

    @tfsurgery.transform(name)
    def mutate(graph, options):
        """One weight layer 5% off (a mutation sweep)."""
        report = tfsurgery.TransformReport(name)
        value = graph.const_value(target.const)
        wide = value.astype(np.float64)
        if channel:
            wide[..., -1] *= factor
        else:
            wide *= factor
        graph.set_const_value(target.const, wide.astype(value.dtype))
        report.rewritten.append(target.const)
        return report
    return mutate


def sweep(source: api.Source, name: str = "model", *, factor: float = FACTOR,
          channel: bool = False, all_weights: bool = False, limit: Optional[int] = None,
          checks: Optional[api.Checks] = None) -> Sweep:
    """The default pipeline on ``source`` (it must pass), then each weight layer of its result
    mutated by a user's transform after it: caught or missed. ``limit``: at most that many
    layers, spread over the depth (first, last, middles)."""
    started = time.perf_counter()
    kept, localize = dict(pipeline.USER), api._localize
    # where a caught mutation went wrong is not the question here: no localizing (a few more
    # verifications per mutation)
    api._localize = lambda *args, **kwargs: None
    try:
        unmutated, passed, line = _unmutated(source, checks)
        graph = unmutated.graph_def if unmutated is not None else source.graph_def
        outcomes = [_mutated(source, target, factor, channel, number, checks) for number, target
                    in enumerate(_spread(targets(graph, all_weights), limit))]
    finally:
        pipeline.USER.clear()
        pipeline.USER.update(kept)
        api._localize = localize
    return Sweep(name, outcomes, line, passed, time.perf_counter() - started, factor)


def _unmutated(source, checks):
    try:
        result = _optimize(source, None, checks)
    except VerificationFailed as failure:
        return None, False, _first(failure)
    passed = result.verification is not None and result.verification.passed
    return result, passed, result.verification.summary().splitlines()[0] if passed else "refused"


def _mutated(source, target: Target, factor, channel, number, checks) -> Outcome:
    try:
        _optimize(source, mutation(target, factor, channel, number), checks)
    except CannotVerify as failure:
        return Outcome(target, True, "cannot verify: " + _first(failure), _graph(failure))
    except VerificationFailed as failure:
        return Outcome(target, True, "failed: " + _first(failure), _graph(failure))
    return Outcome(target, False, "passed")


def _optimize(source, transform, checks):
    transforms = ["default"] + ([transform] if transform is not None else [])
    if checks is None:
        return api.optimize(source, transforms)
    return api.optimize(source, transforms, checks=checks)


def _first(failure) -> str:
    return str(failure).splitlines()[0][:300]


def _graph(failure):
    result = getattr(failure, "result", None)
    return getattr(result, "graph_def", None)


def _spread(found: Sequence[Target], limit: Optional[int]) -> List[Target]:
    if limit is None or len(found) <= limit:
        return list(found)
    from tfsurgery.verify.sensitivity import sample_layers
    picked = sample_layers(list(range(len(found))), limit)
    return [found[i] for i in sorted(picked)]
