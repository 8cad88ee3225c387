"""Each output judged at its own scale, and within an output each part the model itself made
apart.

A detector writes boxes in pixels and scores in [0, 1] into one tensor: one head conv, split
into xy / wh / objectness, each scaled its own way, concatenated back. Judged against the whole
tensor's largest value (the boxes'), a 5% error in the objectness weights is 2·10⁻⁵ — invisible.
So where an output is a ``ConcatV2`` (or ``Pack``) — reached back from the output through ops
that keep every element where it is (Identity, elementwise ops, a Transpose, a Reshape that
keeps the axis) — each of its inputs is a part, judged against its own largest value: a 1%
change in any part fails. Concats of concats along other axes (per-level boxes and scores of a
YOLOv5 head) make a grid of parts. Everything else is judged as a whole: a tensor one op made
holds one quantity, and no element is judged against its own value (a logit near 0 would fail
on round-off alone).

A part's scale is at least PART_FLOOR of the whole tensor's, so a part that is all (near) zero
is judged at the precision of the tensor it sits in, not at 0.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Dict, List, Optional, Tuple

import numpy as np

from tfsurgery.ops import tensor_name
from tfsurgery.verify.runs import OutputError, PartError, measure, output_error

PART_FLOOR = 1e-6
# ops whose output element i is computed from their (same-shaped) input's element i alone, with
# scalars or broadcast constants: the parts of the input are the parts of the output
ELEMENTWISE = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient", "Sigmoid",
                         "Tanh", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus", "Exp",
                         "Log", "Neg", "Abs", "Square", "Sqrt", "Rsqrt", "Floor", "Round",
                         "Cast", "Mul", "Add", "AddV2", "Sub", "RealDiv", "Div", "Maximum",
                         "Minimum", "ClipByValue", "BiasAdd", "Pow", "SquaredDifference"})
CONCAT_OPS = frozenset({"ConcatV2", "Pack"})
MAX_DEPTH = 64                  # ops walked back from an output


@dataclasses.dataclass(frozen=True)
class Parts:
    """The parts of a tensor, per axis: axis → the sizes along it (a grid where more than one
    axis is cut), and the op(s) that made them."""
    cuts: Tuple[Tuple[int, Tuple[int, ...]], ...]
    source: str

    def describe(self) -> str:
        axes = "; ".join(f"axis {axis}: {len(sizes)} parts of {', '.join(map(str, sizes))}"
                         for axis, sizes in self.cuts)
        return f"each part of '{self.source}' at its own scale ({axes})"

    def blocks(self, shape) -> Optional[List[Tuple[str, tuple]]]:
        """(where, index) of each part of a value of ``shape``; None when the value does not
        have the sizes the graph said (a free dimension cut)."""
        per_axis = []
        for axis, sizes in self.cuts:
            if axis >= len(shape) or sum(sizes) != shape[axis]:
                return None
            bounds = np.cumsum((0,) + sizes)
            per_axis.append([(axis, int(lo), int(hi)) for lo, hi in zip(bounds, bounds[1:])])
        blocks = []
        for combo in itertools.product(*per_axis):
            index = [slice(None)] * len(shape)
            for axis, lo, hi in combo:
                index[axis] = slice(lo, hi)
            blocks.append((", ".join(f"axis {a} [{lo}:{hi}]" for a, lo, hi in combo),
                           tuple(index)))
        return blocks


def parts_of(graph, name: str) -> Optional[Parts]:
    """The parts the model's structure makes of tensor ``name`` of the imported tf.Graph
    ``graph``, or None (judged as a whole)."""
    try:
        tensor = graph.get_tensor_by_name(tensor_name(name))
    except (KeyError, ValueError):
        return None
    try:
        found = _parts(tensor, MAX_DEPTH)
    except (ValueError, TypeError, IndexError):      # an op not as expected: judged whole
        found = None
    if not found:
        return None
    cuts, source = found
    return Parts(tuple(sorted(cuts.items())), source)


def _parts(tensor, depth: int):
    """(axis → sizes, the concat's name) of ``tensor``, walking back through ops that keep each
    element in place; None where no concat makes it."""
    op = tensor.op
    if depth <= 0 or tensor.shape.rank is None:
        return None
    if op.type in CONCAT_OPS:
        return _concat_parts(op, depth)
    if op.type in ELEMENTWISE:
        same = [t for t in op.inputs if t.shape.rank is not None and
                t.shape.as_list() == tensor.shape.as_list()]
        for source in same:
            found = _parts(source, depth - 1)
            if found:
                return found
        return None
    if op.type == "Transpose":
        perm = _const(op.inputs[1])
        found = _parts(op.inputs[0], depth - 1)
        if perm is None or not found:
            return None
        cuts, source = found
        return {list(perm).index(axis): sizes for axis, sizes in cuts.items()}, source
    if op.type == "Reshape":
        found = _parts(op.inputs[0], depth - 1)
        if not found:
            return None
        cuts, source = found
        moved = {_reshaped_axis(op.inputs[0].shape, tensor.shape, axis): sizes
                 for axis, sizes in cuts.items()}
        moved.pop(None, None)
        return (moved, source) if moved else None
    return None


def _concat_parts(op, depth: int):
    values = list(op.inputs[:-1]) if op.type == "ConcatV2" else list(op.inputs)
    rank = op.outputs[0].shape.rank
    if op.type == "ConcatV2":
        axis = _const(op.inputs[-1])
        if axis is None:
            return None
        axis = int(axis) % rank
        sizes = [v.shape[axis] if v.shape.rank else None for v in values]
    else:
        axis = op.get_attr("axis") % rank
        sizes = [1] * len(values)
    if any(s is None for s in sizes) or len(values) < 2:
        return None
    inner = [_parts(v, depth - 1) if op.type == "ConcatV2" else None for v in values]
    flat = []           # a part that is itself a concat along the same axis: its parts
    for size, found in zip(sizes, inner):
        own = dict(found[0]).get(axis) if found else None
        flat += list(own) if own and sum(own) == size else [int(size)]
    cuts: Dict[int, tuple] = {axis: tuple(flat)}
    # every part cut the same way along another axis (a YOLOv5 level: xy, wh, scores): a grid
    if all(inner):
        shared = set.intersection(*({(a, s) for a, s in i[0].items() if a != axis}
                                    for i in inner))
        cuts.update(dict(shared))
    return cuts, op.name


def _reshaped_axis(before, after, axis: int) -> Optional[int]:
    """The axis of ``after`` holding what ``axis`` of ``before`` held, where a reshape keeps it
    whole and in place (the same size, the same count of elements before it); else None."""
    if before.rank is None or after.rank is None:
        return None
    before, after = before.as_list(), after.as_list()
    prefix = _count(before[:axis])
    for candidate, size in enumerate(after):
        if size == before[axis] and _count(after[:candidate]) == prefix:
            return candidate
    return None


def _count(dims) -> Tuple[int, int]:
    """(free dimensions, the product of the known ones)."""
    return sum(d is None for d in dims), int(np.prod([d for d in dims if d is not None]))


def _const(tensor):
    import tensorflow as tf
    op = tensor.op
    while op.type == "Identity":
        op = op.inputs[0].op
    return tf.make_ndarray(op.get_attr("value")) if op.type == "Const" else None


def judged_error(name: str, reference, result, parts: Optional[Parts] = None, *,
                 same_dtype: bool = True) -> OutputError:
    """``output_error`` of one output, judged at each part's own scale where ``parts`` says
    what the model made apart (the error: the largest of the parts'); as a whole otherwise."""
    whole = output_error(name, reference, result, same_dtype=same_dtype)
    reference, result = np.asarray(reference), np.asarray(result)
    blocks = parts.blocks(reference.shape) if parts is not None else None
    if whole.reason or reference.dtype.kind != "f" or not blocks:
        whole.judged = "the whole tensor" if parts is None or whole.reason or \
            reference.dtype.kind != "f" else \
            "the whole tensor (its parts' sizes did not fit the value)"
        return whole
    floor = PART_FLOOR * whole.scale
    errors = []
    for where, index in blocks:
        max_abs, magnitude, _ = measure(reference[index], result[index])
        scale = max(magnitude, floor, np.finfo(np.float32).tiny)
        errors.append(PartError(where, max_abs, max_abs / scale, scale))
    return dataclasses.replace(whole, max_rel=max(e.max_rel for e in errors),
                               parts=tuple(errors), judged=parts.describe())


def part_errors(error: OutputError) -> List[float]:
    """The relative errors an output is judged by: one per part, or the whole's."""
    return [p.max_rel for p in error.parts] if error.parts else [error.max_rel]


def parts_in(graph_def, names) -> Dict[str, Parts]:
    """``parts_of`` each of ``names`` in a GraphDef (imported once); those judged as a whole
    are left out."""
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        try:
            tf.compat.v1.import_graph_def(graph_def, name="")
        except (ValueError, TypeError, tf.errors.OpError):
            return {}
    return {name: found for name in names if (found := parts_of(graph, name)) is not None}
