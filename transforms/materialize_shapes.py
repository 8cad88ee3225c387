"""materialize-shapes: what the graph already knows about shapes becomes constants.

``Shape``/``ShapeN``/``Size`` of a tensor whose static shape TensorFlow's shape inference knows
fully, and ``Rank`` of one whose rank it knows (its dims may be unknown), become ``Const``s — then
fold-constants folds what was computed from them. A ``Reshape`` whose output has the static shape
of its input is its input: both shapes equal dim by dim with one unknown dim (the element count
is preserved, so the unknown one is equal too; fully known shapes are simplify-arithmetic's) — ``Reshape(x, concat(shape(x)[:1], [3, 28,
28]))``, Keras' way of keeping the batch. Exact: the values are what the ops would compute for
every input the graph accepts (a placeholder's declared shape is enforced when fed).

Refused: an op acting outside the graph (ReadFile, ...: opaque, as fold-constants leaves it), a
tensor whose shape is not fully known (an unknown batch), an output port other than
the first of a multi-output producer (shape inference is read for first outputs), nodes with
control inputs (the constant would lose the ordering). Inside a v1 while loop's frame a
constant needs an edge from the frame, or TensorFlow refuses the graph ("is in frame ''"): each
one made there takes a control input from the node whose shape it states (as TensorFlow's own
loop constants hang on the loop's pivot); where that node is a ``Switch`` (its control edge
fires on the untaken side too) the op stays, said.
"""
from __future__ import annotations

import numpy as np

from tfsurgery.graph import Graph, Ref, encode_tensor
from tfsurgery.trust.outside import reaches_outside
from tfsurgery.tfsession import StaticShapes
from tfsurgery.contract import Options, TransformReport, transform

SHAPE_OPS = ("Shape", "ShapeN", "Rank", "Size")
RULE_OPS = SHAPE_OPS + ("Reshape",)


@transform("materialize-shapes", repeat=True)
def materialize_shapes(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("materialize-shapes")
    names = graph.names_with_ops(RULE_OPS)
    if not names:
        return report
    shapes = StaticShapes(graph, options.outputs)
    graph_frames = _Frames(graph)
    for name in names:
        if name not in graph or graph.control_inputs(name):
            continue
        if graph.op(name) == "Reshape":
            _identity_reshape(graph, name, shapes, options, report)
            if name in graph and graph.op(name) == "Reshape":
                _one_computed_dim(graph, name, shapes, graph_frames, report)
        elif graph.op(name) == "ShapeN":
            _shape_n(graph, name, shapes, graph_frames, report)
        else:
            _shape_of(graph, name, shapes, options, graph_frames, report)
    return report


class _Frames:
    """Which nodes run inside a v1 while loop's frame: reached from an ``Enter`` (data or
    control edges) before an ``Exit``. A constant made for one of them hangs on a node there."""

    def __init__(self, graph: Graph):
        self.graph, self.inside = graph, set()
        stack = [c.node for enter in graph.names_with_ops(("Enter", "RefEnter"))
                 for c in graph.consumers(enter, control=True)]
        while stack:
            name = stack.pop()
            if name in self.inside or graph.op(name) in ("Exit", "RefExit"):
                continue
            self.inside.add(name)
            stack += [c.node for c in graph.consumers(name, control=True)]

    def refusal(self, beside: str, anchor: Ref):
        """Why no constant can stand for node ``beside`` (computed from ``anchor``), or None."""
        if beside in self.inside and self.graph.op(anchor.node) in ("Switch", "RefSwitch"):
            return (f"inside a while loop's frame, its constant would hang on '{anchor.node}', "
                    "a Switch (whose control edge fires on the untaken side too); left as it is")
        return None

    def add_const(self, beside: str, anchor: Ref, name: str, value, dtype) -> str:
        """A Const for ``value``, computed where node ``beside`` runs from tensor ``anchor``
        (``refusal`` is None): inside a frame with a control input from ``anchor``'s node."""
        device = self.graph.node(beside).device if beside in self.graph else ""
        if beside not in self.inside:
            return self.graph.add_const(name, value, dtype=dtype, device=device)
        const = _const_node(self.graph.unique_name(name), value, dtype, device)
        const.input.append(f"^{anchor.node}")
        self.graph.add_node(const)
        self.inside.add(const.name)
        return const.name


def _const_node(name: str, value, dtype, device: str):
    from tensorflow.core.framework import node_def_pb2
    node = node_def_pb2.NodeDef(op="Const", name=name, device=device)
    node.attr["dtype"].type = encode_tensor(value, dtype, into=node.attr["value"].tensor).dtype
    return node


def _known(shapes, ref: Ref):
    """The static shape of tensor ``ref`` (a list, None dims unknown), or None."""
    return shapes.get(ref.node) if not ref.port and ref.node in shapes else None


def _value(op: str, dims, out_type: int):
    """What Shape/Rank/Size compute for a tensor of static shape ``dims`` (None: not known)."""
    if dims is None:
        return None
    if op == "Rank":
        return np.array(len(dims), np.int32), None
    if None in dims:
        return None
    if op == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64))), out_type
    return np.array(dims, np.int64).reshape(-1), out_type


def _shape_of(graph: Graph, name: str, shapes, options: Options, frames: _Frames,
              report) -> None:
    op, x = graph.op(name), graph.inputs(name)[0]
    if reaches_outside(graph.node(x.node)):
        report.skip(name, f"{op} of {x}: {graph.op(x.node)} acts outside the graph (left "
                          "opaque, never evaluated)")
        return
    found = _value(op, _known(shapes, x), graph.node(name).attr["out_type"].type
                   if op != "Rank" else None)
    if found is None:
        if op == "Shape" and _known(shapes, x) is not None:
            _known_parts(graph, name, _known(shapes, x), frames, report)   # the known dims
        if name in shapes and graph.consumers(name):
            report.skip(name, f"{op} of {x}: its static shape {_shown(_known(shapes, x))} is "
                              "not fully known (a fixed --input-shape would make it constant)")
        return
    value, dtype = found
    if not _replace_by_const(graph, name, x, value, dtype, frames, report):
        return
    report.matched += 1
    report.rewritten.append(f"{name}: {op} of {x} is the constant {value.tolist()}")


def _shape_n(graph: Graph, name: str, shapes, frames: _Frames, report) -> None:
    out_type = graph.node(name).attr["out_type"].type
    for port, x in enumerate(graph.inputs(name)):
        if not graph.consumers(name, port):
            continue
        found = _value("Shape", _known(shapes, x), out_type)
        if found is None:
            continue
        if frames.refusal(name, x):
            report.skip(f"{name}:{port}", frames.refusal(name, x))
            continue
        const = frames.add_const(name, x, f"{name}/shape_{port}", found[0], out_type)
        graph.rewire(Ref(name, port), Ref(const))
        report.matched += 1
        report.rewritten.append(f"{name}:{port}: ShapeN of {x} is the constant "
                                f"{found[0].tolist()}")


def _identity_reshape(graph: Graph, name: str, shapes, options: Options, report) -> None:
    x = graph.inputs(name)[0]
    before, after = _known(shapes, x), shapes.get(name) if name in shapes else None
    # fully known shapes: simplify-arithmetic's rule (after fold-constants); here the one
    # unknown dim (a batch) that the element count pins
    if before is None or before != after or sum(d is None for d in before) != 1 or 0 in before:
        return
    graph.bypass(name, x, keep_name_as=graph.node(name).attr["T"] if name in options.protected
                 else None)
    report.matched += 1
    report.rewritten.append(f"{name}: Reshape of {x} to its own static shape {before}")


def _replace_by_const(graph: Graph, name: str, x: Ref, value, dtype, frames: _Frames,
                      report) -> bool:
    """Node ``name`` (computed from tensor ``x``) becomes a Const of the same name: its
    readers (and an output) keep the name. False (said) where its frame forbids it."""
    if frames.refusal(name, x):
        report.skip(name, frames.refusal(name, x))
        return False
    device = graph.node(name).device
    graph.remove([name])
    if name in frames.inside:
        const = _const_node(name, value, dtype, device)
        const.input.append(f"^{x.node}")
        graph.add_node(const)
    else:
        graph.add_const(name, value, dtype=dtype, device=device)
    return True


# ---------------------------------------------------------------- known dims of a free shape
def _known_parts(graph: Graph, name: str, dims, frames: _Frames, report) -> None:
    """``Shape(x)`` of ``[?, ?, 16]`` stays, but what picks only known dims from it — a
    ``GatherV2`` with constant indices (Keras' Tensordot: ``gather(shape(x), [2])``) or a
    ``StridedSlice`` with constant bounds — is a constant. Needs the rank and those dims only."""
    out_type = graph.node(name).attr["out_type"].type
    for consumer in graph.consumers(name):
        reader = consumer.node
        if consumer.index != 0 or graph.control_inputs(reader):
            continue
        picked = _picked(graph, reader, dims)
        if picked is None or any(d is None for d in np.ravel(picked).tolist()):
            continue
        value = np.array(picked, dtype=np.int64)
        if not _replace_by_const(graph, reader, graph.inputs(name)[0], value, out_type,
                                 frames, report):
            continue
        report.matched += 1
        report.rewritten.append(f"{reader}: the known dims {value.tolist()} of {name} "
                                f"(of static shape {_shown(dims)})")


def _picked(graph: Graph, reader: str, dims):
    """The dims (a list, or one dim) ``reader`` takes from a shape vector ``dims``, or None."""
    op, inputs = graph.op(reader), graph.inputs(reader)
    values = [graph.const_value(ref) for ref in inputs[1:]]
    if any(v is None for v in values):
        return None
    vector = np.array(dims, dtype=object)
    if op == "GatherV2" and int(values[1]) == 0 and graph.attr(reader, "batch_dims", 0) == 0:
        indices = values[0].astype(np.int64)
        if np.any(indices >= len(dims)) or np.any(indices < 0):   # TF refuses negative ones
            return None
        return vector[indices].tolist()
    if op == "StridedSlice" and len(values) == 3 and all(v.shape == (1,) for v in values):
        masks = {k: graph.attr(reader, k, 0) for k in ("begin_mask", "end_mask",
                 "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
        if masks["ellipsis_mask"] or masks["new_axis_mask"]:
            return None
        begin, end, stride = (int(v[0]) for v in values)
        if masks["shrink_axis_mask"] & 1:
            return vector[begin] if -len(dims) <= begin < len(dims) else None
        return vector[slice(None if masks["begin_mask"] & 1 else begin,
                            None if masks["end_mask"] & 1 else end, stride)].tolist()
    return None


def _one_computed_dim(graph: Graph, name: str, shapes, frames: _Frames, report) -> None:
    """``Reshape(x, stack([n, 16]))`` with ``n`` computed (Keras' Tensordot: the product of
    the free dims), or ``Reshape(y, concat([shape(x)[0:2], [128]]))`` where only the batch of
    ``x`` is unknown, is ``Reshape(x, [-1, 16])`` / ``[-1, 16, 128]``: the element count pins
    the one size left free. Needs the known sizes only, none zero (-1 would be ambiguous)."""
    if _own_batch(graph, name):
        return                      # simplify-arithmetic's rule, with its own report line
    sizes = _sizes(graph, graph.inputs(name)[1], shapes)
    if sizes is None or sum(d is None for d in sizes) != 1 or \
            any(d is not None and d <= 0 for d in sizes):
        return
    sizes = [-1 if d is None else d for d in sizes]
    dtype = graph.node(name).attr["Tshape"].type
    if frames.refusal(name, graph.inputs(name)[0]):
        report.skip(name, frames.refusal(name, graph.inputs(name)[0]))
        return
    const = frames.add_const(name, graph.inputs(name)[0], f"{name}/shape",
                             np.array(sizes, np.int64), dtype)
    graph.set_input(name, 1, const)
    report.matched += 1
    report.rewritten.append(f"{name}: Reshape to {sizes} (its one computed size is what the "
                            "element count leaves)")


def _own_batch(graph: Graph, name: str) -> bool:
    """``Reshape(x, stack([shape(x)[0], ...]))``: its size taken from its own input."""
    x, shape = graph.inputs(name)
    if graph.op(shape) != "Pack" or shape.port:
        return False
    for part in graph.inputs(shape.node):
        if graph.op(part) in ("StridedSlice", "GatherV2"):
            source = graph.inputs(part.node)[0]
            if graph.op(source) == "Shape" and graph.inputs(source.node)[0] == x:
                return True
    return False


def _sizes(graph: Graph, ref: Ref, shapes):
    """The entries of a shape vector, None where computed: a constant, a ``Pack`` of scalars,
    a ``ConcatV2`` of such parts and of known dims picked from a ``Shape``; else None."""
    value = graph.const_value(ref)
    if value is not None:
        return [int(v) for v in np.ravel(value)] if value.ndim == 1 else None
    if ref.port:
        return None
    op, inputs = graph.op(ref.node), graph.inputs(ref.node)
    if op == "Pack" and graph.attr(ref.node, "axis", 0) == 0:
        values = [graph.const_value(part) for part in inputs]
        if any(v is not None and v.ndim for v in values):
            return None
        return [None if v is None else int(v) for v in values]
    if op == "ConcatV2" and graph.const_value(inputs[-1]) is not None and \
            int(graph.const_value(inputs[-1])) == 0:
        parts = [_sizes(graph, part, shapes) for part in inputs[:-1]]
        return None if any(p is None for p in parts) else [d for p in parts for d in p]
    source = inputs[0] if inputs else None
    if op in ("GatherV2", "StridedSlice") and graph.op(source) == "Shape" and not source.port:
        dims = _known(shapes, graph.inputs(source.node)[0])
        picked = _picked(graph, ref.node, dims) if dims is not None else None
        return picked if isinstance(picked, list) else None
    return None


def _shown(dims) -> str:
    if dims is None:                 # not even the rank is known
        return "(unknown rank)"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
