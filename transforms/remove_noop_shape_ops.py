"""remove-noop-shape-ops: shape ops that hand their input through unchanged are bypassed.

Every rule is exact: the bypassed op copies its input's elements in their order (or, for a
Transpose that only moves size-1 dims, reinterprets them under another shape).

- ``Tile(x, [1, …, 1])`` → ``x``; ``Pad``/``PadV2``/``MirrorPad`` by all-zero paddings → ``x``:
  the rank of ``x`` must be known and equal the multiples' length (the paddings' rows) — a
  mismatch is an error at run time, which bypassing would hide.
- ``Slice(x, 0…, size)`` with every size ``-1`` or ``x``'s known dim → ``x``. ``StridedSlice`` with
  strides 1, every begin 0 (or masked), every end masked or at least ``x``'s known dim, and no
  ellipsis/new-axis/shrink masks → ``x``.
- ``Sum``/``Mean``/``Prod``/``Max``/``Min``/``All``/``Any`` with ``keep_dims`` over axes whose
  dims are known to be 1 (or over no axis) → ``x``: TensorFlow's kernels copy such a reduction's
  input (a sum of one element is not ``0 + x``: ``-0.0`` stays ``-0.0``).
- ``ReverseV2`` (``Reverse``) over axes whose dims are known to be 1 → ``x``.
- ``Transpose`` whose permutation keeps the order of every dim not known to be 1: the same
  elements in the same order. Same shape → ``x``; else → ``Reshape`` to its static output shape
  (at most one unknown dim, as ``-1``), when its permutation constant is its own to reuse.
- ``ConcatV2(…, ConcatV2(a, b, axis), …, axis)`` on one axis → ``ConcatV2(…, a, b, …, axis)``:
  the inner concat read by the outer alone.
- ``ResizeBilinear``/``ResizeNearestNeighbor``/``ResizeBicubic``/``ResizeArea`` of a float32
  image to its own static height and width → ``x``: every output pixel samples exactly one input
  pixel centre (scale 1, with or without half-pixel centres or aligned corners; the cubic kernel
  is 1 at 0 and 0 at ±1, ±2) — Keras' ``Resizing`` at the input size.
- ``StridedSlice(Pack(v₀, …, vₙ₋₁, axis=k), …)`` picking index ``i`` on axis ``k`` (shrink mask on
  ``k`` alone, dims before ``k`` taken whole by their masks, strides 1) → ``vᵢ``.

Refused: unknown shapes where a rule needs one (the report says so), non-constant parameters,
nodes (or their constant parameters) with control inputs. Graph outputs keep their names (a bypassed output becomes an
Identity). Runs to its own fixpoint.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from tfsurgery.graph import Graph, Ref
from tfsurgery.tfsession import StaticShapes
from tfsurgery.contract import Options, TransformReport, transform

PADS = ("Pad", "PadV2", "MirrorPad")
REDUCTIONS = ("Sum", "Mean", "Prod", "Max", "Min", "All", "Any")    # not EuclideanNorm: |x|
RESIZES = ("ResizeBilinear", "ResizeNearestNeighbor", "ResizeBicubic", "ResizeArea")
RULE_OPS = frozenset(PADS) | frozenset(REDUCTIONS) | frozenset(RESIZES) | {
    "Tile", "Slice", "StridedSlice", "ReverseV2", "Reverse", "Transpose", "ConcatV2"}
MAX_ROUNDS = 10


@transform("remove-noop-shape-ops", repeat=True)
def remove_noop_shape_ops(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("remove-noop-shape-ops")
    for _ in range(MAX_ROUNDS):
        rules = _Rules(graph, options, report, StaticShapes(graph, options.outputs))
        changed = sum(rules.apply(name) for name in graph.names_with_ops(RULE_OPS)
                      if name in graph)
        if not changed:
            break
    return report


class _Rules:
    def __init__(self, graph: Graph, options: Options, report: TransformReport, shapes):
        self.graph, self.options, self.report, self.shapes = graph, options, report, shapes

    def apply(self, name: str) -> bool:
        graph = self.graph
        if graph.control_inputs(name) or any(graph.op(ref) == "Const" and
                                             graph.control_inputs(ref.node)
                                             for ref in graph.inputs(name)):
            return False                # the ordering would be lost with the node
        op = graph.op(name)
        if op == "Tile":
            return self._tile(name)
        if op in PADS:
            return self._pad(name)
        if op == "Slice":
            return self._slice(name)
        if op == "StridedSlice":
            return self._picks_from_pack(name) or self._strided_slice(name)
        if op in REDUCTIONS:
            return self._reduction(name)
        if op in ("ReverseV2", "Reverse"):
            return self._reverse(name)
        if op == "Transpose":
            return self._transpose(name)
        if op == "ConcatV2":
            return self._concat_of_concat(name)
        if op in RESIZES:
            return self._resize_to_own_size(name)
        return False

    # ------------------------------------------------------------ shapes and constants
    def _shape(self, ref: Ref) -> Optional[List[Optional[int]]]:
        """The static shape of tensor ``ref`` (None dims unknown), None when its rank is not."""
        return self.shapes.get(ref.node) if not ref.port else None

    def _ints(self, ref: Ref) -> Optional[List[int]]:
        value = self.graph.const_value(ref)
        return None if value is None else [int(v) for v in np.ravel(value)]

    def _rank_is(self, name: str, x: Ref, rank: int, what: str) -> bool:
        shape = self._shape(x)
        if shape is None:
            self.report.skip(name, f"{what}: the rank of {x} is not known")
            return False
        return len(shape) == rank

    # ------------------------------------------------------------ Tile, Pad
    def _tile(self, name: str) -> bool:
        x, multiples_ref = self.graph.inputs(name)
        multiples = self._ints(multiples_ref)
        if multiples is None or any(m != 1 for m in multiples) or \
                not self._rank_is(name, x, len(multiples), "Tile by ones"):
            return False
        return self._bypass(name, x, "Tile by ones")

    def _pad(self, name: str) -> bool:
        x, paddings_ref = self.graph.inputs(name)[:2]
        paddings = self.graph.const_value(paddings_ref)
        if paddings is None or paddings.ndim != 2 or np.any(paddings != 0) or \
                not self._rank_is(name, x, paddings.shape[0], f"{self.graph.op(name)} by zeros"):
            return False
        return self._bypass(name, x, f"{self.graph.op(name)} by zeros")

    # ------------------------------------------------------------ Slice, StridedSlice
    def _slice(self, name: str) -> bool:
        x, begin_ref, size_ref = self.graph.inputs(name)
        begin, size = self._ints(begin_ref), self._ints(size_ref)
        if begin is None or size is None or any(begin):
            return False
        shape = self._shape(x)
        if shape is None or len(shape) != len(size):
            self.report.skip(name, "Slice from 0: the shape of its input is not known")
            return False
        if any(s != -1 and s != d for s, d in zip(size, shape)):
            if any(d is None for s, d in zip(size, shape) if s != -1):
                self.report.skip(name, "Slice from 0: a sliced dim of its input is not known")
            return False
        return self._bypass(name, x, "Slice of the whole tensor")

    def _masks(self, name: str) -> List[int]:
        return [self.graph.attr(name, key, 0) for key in
                ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")]

    def _strided_slice(self, name: str) -> bool:
        x, *spec_refs = self.graph.inputs(name)
        begin, end, strides = (self._ints(ref) for ref in spec_refs)
        begin_mask, end_mask, ellipsis, new_axis, shrink = self._masks(name)
        if begin is None or end is None or strides is None or ellipsis or new_axis or shrink or \
                any(s != 1 for s in strides):
            return False
        if any(b != 0 and not begin_mask >> i & 1 for i, b in enumerate(begin)):
            return False
        shape = self._shape(x)
        if shape is None or len(shape) < len(begin):
            self.report.skip(name, "StridedSlice from 0: the shape of its input is not known")
            return False
        for i, (e, dim) in enumerate(zip(end, shape)):
            if end_mask >> i & 1:
                continue
            if dim is None:
                self.report.skip(name, f"StridedSlice from 0: dim {i} of its input is not known")
                return False
            if e < dim:
                return False
        return self._bypass(name, x, "StridedSlice of the whole tensor")

    def _picks_from_pack(self, name: str) -> bool:
        """StridedSlice(Pack(v…, axis=k))[…, i] → v_i: the shrink mask on k alone."""
        graph = self.graph
        pack, *spec_refs = graph.inputs(name)
        if graph.op(pack) != "Pack" or pack.port or graph.control_inputs(pack.node):
            return False
        values = graph.inputs(pack.node)
        axis = graph.attr(pack.node, "axis", 0)
        if axis < 0:                    # the packed rank is the values' rank + 1
            rank = self._shape(values[0])
            if rank is None:
                return False
            axis += len(rank) + 1
        begin, end, strides = (self._ints(ref) for ref in spec_refs)
        begin_mask, end_mask, ellipsis, new_axis, shrink = self._masks(name)
        if begin is None or end is None or strides is None or ellipsis or new_axis or \
                shrink != 1 << axis or len(begin) != axis + 1 or begin_mask >> axis & 1 or \
                any(s != 1 for s in strides):
            return False
        whole = (1 << axis) - 1         # every dim before the packed one taken whole
        if begin_mask & whole != whole or end_mask & whole != whole:
            return False
        index = begin[axis] + (len(values) if begin[axis] < 0 else 0)
        if not 0 <= index < len(values):
            return False
        return self._bypass(name, values[index], f"picks input {index} of {pack.node} back out")

    # ------------------------------------------------------------ reductions, Reverse
    def _axes_of_size_one(self, name: str, x: Ref, axes: Optional[List[int]]) -> bool:
        if axes is None:
            return False
        if not axes:
            return True
        shape = self._shape(x)
        if shape is None or not all(-len(shape) <= a < len(shape) for a in axes):
            self.report.skip(name, f"{self.graph.op(name)}: the shape of its input is not known")
            return False
        dims = [shape[a] for a in axes]
        if None in dims:
            self.report.skip(name, f"{self.graph.op(name)}: a dim it works on is not known")
        return all(d == 1 for d in dims)

    def _reduction(self, name: str) -> bool:
        x, axes_ref = self.graph.inputs(name)
        axes = self._ints(axes_ref)
        if axes and not self.graph.attr(name, "keep_dims", False):
            return False                # the size-1 dims go: a Reshape, not a bypass
        if not self._axes_of_size_one(name, x, axes):
            return False
        return self._bypass(name, x, f"{self.graph.op(name)} over size-1 dims")

    def _reverse(self, name: str) -> bool:
        x, axes_ref = self.graph.inputs(name)
        if self.graph.op(name) == "Reverse":      # a bool per dim
            flags = self.graph.const_value(axes_ref)
            axes = None if flags is None else [int(i) for i in np.flatnonzero(flags)]
            if flags is None or not self._rank_is(name, x, np.size(flags), "Reverse"):
                return False
        else:
            axes = self._ints(axes_ref)
        if not self._axes_of_size_one(name, x, axes):
            return False
        return self._bypass(name, x, f"{self.graph.op(name)} over size-1 dims")

    # ------------------------------------------------------------ Resize to the same size
    def _resize_to_own_size(self, name: str) -> bool:
        x, size_ref = self.graph.inputs(name)
        shape, size = self._shape(x), self._ints(size_ref)
        if self.graph.node(name).attr["T"].type != 1 or size is None:   # 1: DT_FLOAT
            return False
        if shape is None or len(shape) != 4 or None in shape[1:3]:
            self.report.skip(name, "resize: the image's height and width are not known")
            return False
        if list(shape[1:3]) != size:
            return False
        return self._bypass(name, x, f"{self.graph.op(name)} to the image's own size")

    # ------------------------------------------------------------ Transpose of size-1 dims
    def _transpose(self, name: str) -> bool:
        graph = self.graph
        x, perm_ref = graph.inputs(name)
        perm = self._ints(perm_ref)
        shape = self._shape(x)
        if perm is None or sorted(perm) != list(range(len(perm))) or perm == sorted(perm):
            return False                # the identity is simplify-arithmetic's
        if shape is None or len(shape) != len(perm):
            self.report.skip(name, "Transpose: the shape of its input is not known")
            return False
        moved = [axis for axis in perm if shape[axis] != 1]
        if moved != sorted(moved):
            return False
        out = [shape[axis] for axis in perm]
        if out == shape and all(d is not None or perm[i] == i for i, d in enumerate(out)):
            return self._bypass(name, x, "Transpose of size-1 dims only")
        if out.count(None) > 1 or perm_ref.port or graph.op(perm_ref) != "Const" or \
                graph.reader_count(perm_ref.node) != 1 or perm_ref.node in self.options.protected:
            return False
        dtype = graph.node(perm_ref.node).attr["dtype"].type
        graph.set_const_value(perm_ref.node, np.array([-1 if d is None else d for d in out]),
                              dtype=dtype)
        node = graph.node(name)
        attrs = {"T": node.attr["T"], "Tshape": node.attr["Tperm"]}
        device = node.device
        graph.remove([name])
        graph.new_node("Reshape", name, [x, perm_ref], attrs, device=device)
        self._count(name, "Transpose of size-1 dims only → Reshape")
        return True

    # ------------------------------------------------------------ Concat of Concat
    def _concat_of_concat(self, name: str) -> bool:
        graph = self.graph
        *values, axis_ref = graph.inputs(name)
        axis = self._ints(axis_ref)
        if axis is None:
            return False
        for position, ref in enumerate(values):
            if graph.op(ref) != "ConcatV2" or ref.port or graph.reader_count(ref.node) != 1 or \
                    ref.node in self.options.protected or graph.control_inputs(ref.node):
                continue
            *inner, inner_axis_ref = graph.inputs(ref.node)
            inner_axis = self._ints(inner_axis_ref)
            if inner_axis is None or not self._same_axis(name, axis[0], inner_axis[0]):
                continue
            spliced = values[:position] + inner + values[position + 1:] + [axis_ref]
            node = graph.node(name)
            attrs = {key: node.attr[key] for key in ("T", "Tidx")}
            attrs["N"] = len(spliced) - 1
            device = node.device
            graph.remove([name, ref.node])
            graph.new_node("ConcatV2", name, spliced, attrs, device=device)
            self._count(name, f"{ref.node} spliced in (one axis)")
            return True
        return False

    def _same_axis(self, name: str, a: int, b: int) -> bool:
        if a == b:
            return True
        shape = self.shapes.get(name)
        if shape is None:
            return False
        return a % len(shape) == b % len(shape)

    # ------------------------------------------------------------ graph edits
    def _count(self, name: str, why: str) -> None:
        self.report.matched += 1
        self.report.rewritten.append(f"{name}: {why}")

    def _bypass(self, name: str, source: Ref, why: str) -> bool:
        """Readers of ``name`` read ``source`` instead; an output keeps its name as an Identity."""
        graph = self.graph
        keep = graph.node(name).attr["T"] if name in self.options.protected else None
        graph.bypass(name, source, keep_name_as=keep)
        self._count(name, why)
        return True
