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
control inputs (the constant would lose the ordering).
"""
from __future__ import annotations

import numpy as np

from tfsurgery.graph import Graph, Ref
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
    for name in names:
        if name not in graph or graph.control_inputs(name):
            continue
        if graph.op(name) == "Reshape":
            _identity_reshape(graph, name, shapes, options, report)
        elif graph.op(name) == "ShapeN":
            _shape_n(graph, name, shapes, report)
        else:
            _shape_of(graph, name, shapes, options, report)
    return report


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


def _shape_of(graph: Graph, name: str, shapes, options: Options, report) -> None:
    op, x = graph.op(name), graph.inputs(name)[0]
    if reaches_outside(graph.node(x.node)):
        report.skip(name, f"{op} of {x}: {graph.op(x.node)} acts outside the graph (left "
                          "opaque, never evaluated)")
        return
    found = _value(op, _known(shapes, x), graph.node(name).attr["out_type"].type
                   if op != "Rank" else None)
    if found is None:
        if name in shapes:
            report.skip(name, f"{op} of {x}: its static shape is not fully known")
        return
    value, dtype = found
    device = graph.node(name).device
    graph.remove([name])            # readers (and an output) keep the name: now a Const
    graph.add_const(name, value, dtype=dtype, device=device)
    report.matched += 1
    report.rewritten.append(f"{name}: {op} of {x} is the constant {value.tolist()}")


def _shape_n(graph: Graph, name: str, shapes, report) -> None:
    out_type = graph.node(name).attr["out_type"].type
    device = graph.node(name).device
    for port, x in enumerate(graph.inputs(name)):
        if not graph.consumers(name, port):
            continue
        found = _value("Shape", _known(shapes, x), out_type)
        if found is None:
            continue
        const = graph.add_const(f"{name}/shape_{port}", found[0], dtype=out_type, device=device)
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
