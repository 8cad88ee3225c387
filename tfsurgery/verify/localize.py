"""When the numbers move, say where: the first transform after which the check fails, and the
first tensor that transform changed beyond the tolerance.

1. The transform: the pipeline re-run on prefixes of its transform list, bisected (the empty
   prefix is the original, which matches itself; the whole list failed): the first prefix whose
   result fails verification names its last transform.
2. The tensor: the graphs just before and just after that transform — not the original against
   the end result, where a batch-norm fold legitimately changes its conv's raw output — run on the
   verification's inputs with every tensor that exists under the same name in both fetched, in
   topological order. The first whose values differ beyond the tolerance is named, with its op
   and error, and the transform's own record of that node when it rewrote or skipped it. A
   difference every reader of the tensor makes up for (a conv whose weights took a fold's scale,
   read by the node that took its shift) is a legitimate rewrite, not the place things went wrong.

It starts only after a failure, so a passing run pays nothing; every graph run has the run's
deadline.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from tfsurgery import pipeline
from tfsurgery.verify import scales, sensitivity
from tfsurgery.verify import check as verify
from tfsurgery.contract import Options, TransformReport
from tfsurgery.errors import VerificationError
from tfsurgery.graph import Graph
from tfsurgery.verify.reference import comparable_reference

NUMERIC_KINDS = "fciub"
MAX_TENSORS = 5000          # fetched at most, nearest the inputs first


@dataclasses.dataclass
class Divergence:
    transform: Optional[str]            # the first transform after which the check fails
    node: Optional[str] = None          # the first tensor it changed beyond the tolerance
    op: Optional[str] = None
    error: float = 0.0
    record: Optional[str] = None        # what the transform's report says about that node
    compared: int = 0                   # tensors compared before and after it
    note: str = ""

    def line(self) -> str:
        if self.transform is None:
            return f"the failure could not be pinned to one transform ({self.note})"
        text = f"first diverging transform '{self.transform}'"
        if self.node:
            text += (f", first diverging tensor '{self.node}' ({self.op}): relative error "
                     f"{self.error:.3g}")
            if self.record:
                text += f"; {self.transform} says: {self.record}"
        elif self.note:
            text += f" ({self.note})"
        return text

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def locate(original, transforms: Sequence[str], options: Options,
           passes: Callable[[object], bool], *, feeds: Dict[str, np.ndarray],
           settings: Dict[str, np.ndarray], tolerance: float,
           timeout: float = verify.DEFAULT_TIMEOUT, changed: Optional[set] = None) -> Divergence:
    """``passes(graph_def)``: does this result verify against the original? ``feeds`` and
    ``settings``: what verification fed (settings only to graphs that still have them).
    ``changed``: the transforms whose report shows a change in the failed run — only a prefix
    ending at one of them can be the first to fail, so only those are bisected."""
    transforms = list(transforms)
    low, high, results = first_failing_prefix(original, transforms, options, passes,
                                              changed=changed)
    if low not in results:
        results[low] = pipeline.run(original, transforms[:low], options)
    name = transforms[high - 1]
    before, after = results[low][0], results[high][0]
    report = next((r for r in results[high][1] if r.name == name), None)
    found = Divergence(name)
    try:
        first_difference(found, before, after, report, feeds=feeds, settings=settings,
                         tolerance=tolerance, timeout=timeout)
    except VerificationError as error:
        found.note = f"its tensors could not be compared: {error}"
    return found


def first_failing_prefix(original, transforms: Sequence[str], options: Options,
                         passes: Callable[[object], bool], *, changed: Optional[set] = None):
    """Bisection over prefixes of ``transforms`` (the whole list fails ``passes``, the empty
    one — the original — is taken to pass): (low, high, results) with ``transforms[:low]``
    passing and ``transforms[:high]`` the first prefix that fails, so ``transforms[high - 1]``
    is the transform that broke it; ``results`` holds each pipeline run made, by prefix length
    ((graph_def, reports); ``high`` always among them). Only prefixes ending at a transform in
    ``changed`` (those whose report shows a change) are tried."""
    points = [0] + [k for k in range(1, len(transforms) + 1)
                    if changed is None or transforms[k - 1] in changed]
    if points[-1] != len(transforms):
        points.append(len(transforms))
    low, high = 0, len(points) - 1          # prefix[:points[low]] passes, [:points[high]] fails
    results = {0: (original, [])}
    while high - low > 1:
        middle = (low + high) // 2
        results[points[middle]] = pipeline.run(original, transforms[:points[middle]], options)
        if passes(results[points[middle]][0]):
            low = middle
        else:
            high = middle
    low, high = points[low], points[high]
    if high not in results:
        results[high] = pipeline.run(original, transforms[:high], options)
    return low, high, results


def quick_check(original, outputs: Sequence[str], *, feeds, settings, allowed: float,
                class_outputs: Sequence[str] = (), timeout: float = verify.DEFAULT_TIMEOUT):
    """``passes(graph_def)`` for the bisection: one run of the candidate on the failing batch
    against the original's outputs (run once per form of the reference: its random ops seeded
    or at their expected value), the verdict's own bound and top-1 rule — not a full
    verification (no second size, no noise floor), so each step costs one run."""
    cache: Dict[bytes, tuple] = {}

    def passes(graph_def) -> bool:
        reference, candidate, _ = comparable_reference(original, graph_def, settings)
        # no random op: the original itself (the usual case; no need to serialize it as a key)
        key = b"" if reference is original else reference.SerializeToString(deterministic=True)
        try:
            if key not in cache:
                cache[key] = _reference_values(reference, outputs, {**feeds, **settings},
                                               timeout)
            graph, values = cache[key]
            with verify.Runner(candidate, timeout=timeout,
                               label="a partly optimized graph") as run:
                # the outputs and the logits under them (tfsurgery.verify.sensitivity), as verified
                watches, _ = sensitivity.watched(graph, run.graph, outputs)
                actual = run.run(feeds, list(outputs) + [w.optimized for w in watches])
        except VerificationError:
            return False
        expected = [values[o] for o in outputs] + [values[w.reference] for w in watches]
        names = list(outputs) + [w.label for w in watches]
        sources = list(outputs) + [w.reference for w in watches]
        errors = [scales.judged_error(n, e, a, scales.parts_of(graph, source))   # as verified
                  for n, source, e, a in zip(names, sources, expected, actual)]
        if not verify.compared_real_numbers(errors) or verify.worst_error(errors) > allowed:
            return False
        scores = [(e, a) for n, e, a in zip(outputs, expected, actual)
                  if n in class_outputs and verify.is_class_scores(e) and
                  verify.is_class_scores(a)]
        return not any(verify.top1_agreement(np.asarray(e), np.asarray(a), allowed)["flips"]
                       for e, a in scores)
    return passes


def _reference_values(reference, outputs, feeds, timeout) -> tuple:
    """(the imported graph, tensor → value) of the reference's outputs and the logits under
    them, run once."""
    with verify.Runner(reference, timeout=timeout, label="the original graph") as run:
        watches, _ = sensitivity.watched(run.graph, run.graph, outputs)
        names = list(outputs) + [w.reference for w in watches]
        return run.graph, dict(zip(names, run.run(feeds, names)))


def first_difference(found: Divergence, before, after, report: Optional[TransformReport], *,
                     feeds, settings, tolerance: float, timeout: float) -> None:
    reference, candidate, _ = comparable_reference(before, after, settings)
    names = common_tensors(reference, candidate)
    found.compared = len(names)
    if not names:
        found.note = "no tensor exists under the same name before and after it"
        return
    run_feeds = {**feeds, **settings}
    expected = verify.run_graph(reference, run_feeds, names, timeout=timeout,
                                label="the graph before it")
    actual = verify.run_graph(candidate, run_feeds, names, timeout=timeout,
                              label="the graph after it")
    errors = {name: verify.output_error(name, e, a).max_rel
              for name, e, a in zip(names, expected, actual)}
    graph = Graph(candidate, check_inputs=False)
    for name in names:
        if errors[name] <= tolerance or made_up_for(graph, name, errors, tolerance):
            continue
        node = name.split(":")[0]
        found.node, found.op, found.error = node, graph.op(node), errors[name]
        found.record = _record(report, node)
        return
    found.note = "no common tensor differs beyond the tolerance (the change is in what only " \
                 "one of them has)"


def common_tensors(before, after) -> List[str]:
    """``name:0`` of every node in both graphs with a numeric first output, in topological
    order of the graph after (Consts and placeholders left out: they are what is fed)."""
    import tensorflow as tf
    present = {node.name: node.op for node in before.node}
    graph = Graph(after, check_inputs=False)
    order = graph.topological_order()
    numeric = set()
    with tf.Graph().as_default() as imported:
        try:
            tf.compat.v1.import_graph_def(after, name="")
        except (ValueError, TypeError, tf.errors.OpError):
            return []
        for operation in imported.get_operations():
            if operation.outputs and operation.outputs[0].dtype.is_numpy_compatible and \
                    np.dtype(operation.outputs[0].dtype.as_numpy_dtype).kind in NUMERIC_KINDS:
                numeric.add(operation.name)
    skip = {"Const", "Placeholder", "PlaceholderWithDefault", "NoOp"}
    return [f"{name}:0" for name in order if name in present and name in numeric and
            graph.op(name) not in skip and present[name] not in skip][:MAX_TENSORS]


def made_up_for(graph: Graph, name: str, errors: Dict[str, float], tolerance: float) -> bool:
    """Every reader of this tensor (compared) matches: the difference is internal to a rewrite."""
    readers = [f"{c.node}:0" for c in graph.consumers(name.split(":")[0])]
    compared = [r for r in readers if r in errors]
    return bool(compared) and all(errors[r] <= tolerance for r in compared)


def _record(report: Optional[TransformReport], node: str) -> Optional[str]:
    if report is None:
        return None
    for entry in report.rewritten:
        if str(entry) == node or str(entry).split(" ")[0] == node:
            return f"rewrote it ({entry})"
    for skipped, reason in report.skipped:
        if skipped == node:
            return f"skipped it: {reason}"
    return None
