"""simplify-arithmetic: operations that do nothing are bypassed.

``x*1``, ``1*x``, ``x+0``, ``0+x``, ``x-0``, ``x/1`` (never ``x*0 → 0``: it would hide NaN and Inf),
``Cast`` to the dtype the tensor has, ``Transpose`` by the identity permutation, two Transposes
composed into one (none when they cancel), ``Neg(Neg(x))``, ``Reshape(Reshape(x))`` as one Reshape,
a Reshape to ``[Shape(x)[0], c…]`` as the constant ``[-1, c…]``,
``Reshape``/``ExpandDims``/``Squeeze`` (or a pair of them) to the shape the tensor already has, a
Reshape that puts back the dims a reduction dropped (the reduction keeps them: ``keep_dims``), and
``BiasAdd(x, b1) + BiasAdd(y, b2)`` as ``BiasAdd(x, b1 + b2) + y``.
Keras 3's swish is ``x * sigmoid(1.0 * x)``: every EfficientNet carries dozens of ``Mul(1.0, x)``.

A constant operand may only be bypassed when broadcasting cannot change the result's shape: a
scalar always qualifies; a larger all-ones/all-zeros constant only where TensorFlow's shape
inference shows the result has the shape of ``x`` (``x + zeros([1,1,1,C])`` may broadcast ``x``
up). Unknown shapes: left alone, and the report says so. Graph outputs keep their names (the node
becomes an Identity of ``x``). Runs to its own fixpoint, since one rewrite can expose another.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from tfsurgery.graph import Graph, Ref
from tfsurgery.tfsession import StaticShapes
from tfsurgery.contract import Options, TransformReport, transform

NEUTRAL = {"Mul": 1, "Add": 0, "AddV2": 0, "BiasAdd": 0, "Sub": 0, "RealDiv": 1, "Div": 1}
COMMUTATIVE = ("Mul", "Add", "AddV2")
SHAPE_OPS = ("Reshape", "ExpandDims", "Squeeze")
REDUCTIONS = ("Mean", "Sum", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm")
MAX_ROUNDS = 10
RULE_OPS = frozenset(NEUTRAL) | {"Cast", "Neg", "Transpose"} | frozenset(SHAPE_OPS)  # any rule


@transform("simplify-arithmetic", repeat=True)
def simplify_arithmetic(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("simplify-arithmetic")
    for _ in range(MAX_ROUNDS):
        shapes = StaticShapes(graph, options.outputs)
        changed = sum(_simplify(graph, name, shapes, options, report)
                      for name in graph.names_with_ops(RULE_OPS) if name in graph)
        if not changed:
            break
    return report


def _simplify(graph: Graph, name: str, shapes, options: Options, report) -> bool:
    op = graph.op(name)
    if op in NEUTRAL:
        if _neutral_operand(graph, name, shapes, options, report):
            return True
        return op in ("Add", "AddV2") and _two_biases(graph, name, options, report)
    inputs = graph.inputs(name)
    if op == "Cast" and graph.attr(name, "SrcT") == graph.attr(name, "DstT"):
        return _bypass(graph, name, inputs[0], options, report, "Cast to its own dtype")
    if op == "Neg" and graph.op(inputs[0]) == "Neg":
        return _bypass(graph, name, graph.inputs(inputs[0].node)[0], options, report, "Neg∘Neg")
    if op == "Transpose":
        return _transpose(graph, name, options, report)
    if op in SHAPE_OPS:
        return _shape_op(graph, name, shapes, options, report)
    return False


def _neutral_operand(graph: Graph, name: str, shapes, options: Options, report) -> bool:
    """x op c where c is the op's neutral element (1 for Mul/Div, 0 for Add/Sub)."""
    op, inputs = graph.op(name), graph.inputs(name)
    if len(inputs) != 2:
        return False
    positions = (1, 0) if op in COMMUTATIVE else (1,)
    for position in positions:
        value = graph.const_value(inputs[position])
        if value is None or value.size == 0 or value.flat[0] != NEUTRAL[op] or \
                not np.all(value == NEUTRAL[op]):     # (the first value rejects most at once)
            continue
        x = inputs[1 - position]
        if value.ndim and not _same_shape(shapes, Ref(name), x):
            report.skip(name, f"{op} by a constant {NEUTRAL[op]} of shape {list(value.shape)} "
                              "might broadcast its input; its shape is not known")
            return False
        return _bypass(graph, name, x, options, report, f"{op} by {NEUTRAL[op]}")
    return False


def _two_biases(graph: Graph, name: str, options: Options, report) -> bool:
    """BiasAdd(x, b1) + BiasAdd(y, b2) → BiasAdd(x, b1 + b2) + y: two summed branches need one bias
    (ResNet's projection shortcuts, once their batch norms are folded). Both BiasAdds must be read
    by this Add alone; the biases are constants of one shape along the same data_format axis, so
    the sum is the same — up to the rounding of adding in another order."""
    first, second = graph.inputs(name) if len(graph.inputs(name)) == 2 else (None, None)
    if first is None or first.node == second.node or first.port or second.port:
        return False
    biases = []
    for ref in (first, second):
        if graph.op(ref) != "BiasAdd" or ref.node in options.protected or \
                graph.reader_count(ref.node) != 1 or graph.control_inputs(ref.node):
            return False
        biases.append(graph.const_value(graph.inputs(ref.node)[1]))
    b1, b2 = biases
    if b1 is None or b2 is None or b1.shape != b2.shape or b1.dtype != b2.dtype or \
            b1.dtype.kind != "f" or graph.attr(first.node, "data_format", "NHWC") != \
            graph.attr(second.node, "data_format", "NHWC"):
        return False
    merged = graph.add_const(f"{first.node}/merged_bias",
                             (b1.astype(np.float64) + b2).astype(b1.dtype),
                             device=graph.node(first.node).device)
    graph.set_input(first.node, 1, merged)
    graph.set_input(name, 1, graph.inputs(second.node)[0])
    graph.remove([second.node])
    report.matched += 1
    report.rewritten.append(f"{name}: one bias for both summed branches ({second.node} into "
                            f"{first.node})")
    return True


def _transpose(graph: Graph, name: str, options: Options, report) -> bool:
    x, perm_ref = graph.inputs(name)
    perm = graph.const_value(perm_ref)
    if perm is None:
        return False
    if np.array_equal(perm, np.arange(perm.size)):
        return _bypass(graph, name, x, options, report, "Transpose by the identity")
    inner = graph.node(x.node)
    if inner.op != "Transpose" or x.port or len(graph.consumers(x.node, control=True)) != 1:
        return False
    inner_x, inner_perm_ref = graph.inputs(x.node)
    inner_perm = graph.const_value(inner_perm_ref)
    if inner_perm is None or inner_perm.size != perm.size:
        return False
    composed = inner_perm[perm]                 # out[i] = in[inner_perm[perm[i]]]
    if np.array_equal(composed, np.arange(composed.size)):
        return _bypass(graph, name, inner_x, options, report, "Transpose pair that cancels")
    graph.set_input(name, 0, inner_x)
    graph.set_input(name, 1, graph.add_const(f"{name}/composed_perm",
                                              composed.astype(perm.dtype)))
    report.rewritten.append(f"{name}: two Transposes composed into one")
    return True


def _shape_op(graph: Graph, name: str, shapes, options: Options, report) -> bool:
    x = graph.inputs(name)[0]
    if graph.op(name) == "Reshape" and graph.op(x) == "Reshape" and not x.port and \
            len(graph.consumers(x.node, control=True)) == 1:
        graph.set_input(name, 0, graph.inputs(x.node)[0])
        report.rewritten.append(f"{name}: consecutive Reshapes as one")
        return True
    if name not in shapes:
        return False
    if graph.op(name) == "Reshape" and _batch_of_own_input(graph, name, shapes):
        return _constant_batch_shape(graph, name, report)
    if graph.op(name) == "Reshape" and _restores_reduced_dims(graph, name, shapes, options):
        reduction = x.node
        graph.edit_node(reduction).attr["keep_dims"].b = True
        return _bypass(graph, name, x, options, report,
                       f"the dims {graph.op(reduction)} dropped, kept by it instead")
    if _same_shape(shapes, Ref(name), x) and shapes[name] is not None:
        return _bypass(graph, name, x, options, report, f"{graph.op(name)} to the same shape")
    if graph.op(x) in SHAPE_OPS and not x.port:     # ExpandDims then Squeeze, and the like
        inner_x = graph.inputs(x.node)[0]
        if _same_shape(shapes, Ref(name), inner_x):
            return _bypass(graph, name, inner_x, options, report,
                           f"{graph.op(x)} then {graph.op(name)} back to the same shape")
    return False


def _restores_reduced_dims(graph: Graph, name: str, shapes, options: Options) -> bool:
    """Reshape(reduce(x, axes), s) whose output is what the reduction gives with keep_dims=True
    (Keras' squeeze-excite: a mean over H, W reshaped to [-1, 1, 1, C]). Static shapes decide:
    the reduced axes are 1, every other dim equals x's, at most one unknown on both sides (then
    the element count makes it equal)."""
    x = graph.inputs(name)[0]
    if graph.op(x) not in REDUCTIONS or x.port or graph.attr(x.node, "keep_dims", False) or \
            graph.reader_count(x.node) != 1 or x.node in options.protected or \
            graph.control_inputs(name):
        return False
    source, axes_ref = graph.inputs(x.node)
    axes = graph.const_value(axes_ref)
    before = shapes.get(source.node) if not source.port else None
    after = shapes.get(name)
    if axes is None or before is None or after is None or len(before) != len(after) or \
            not before:
        return False
    reduced = {int(a) % len(before) for a in np.ravel(axes)}
    unknown = 0
    for axis, (dim, new) in enumerate(zip(before, after)):
        if axis in reduced:
            if new != 1:
                return False
        elif dim is None and new is None:
            unknown += 1
        elif dim is None or dim != new:
            return False
    return unknown <= 1


def _batch_of_own_input(graph: Graph, name: str, shapes) -> bool:
    """Reshape(x, Pack(Shape(x)[0], c1, …, ck)) with x's other dims known and c1·…·ck equal
    to their product: the shape is the constant [-1, c1, …, ck] (Keras' Reshape layer keeps
    the batch this way; EfficientNet's squeeze-excite does it 16 times)."""
    x, shape_ref = graph.inputs(name)
    if graph.op(shape_ref) != "Pack" or shape_ref.port or graph.attr(shape_ref.node, "axis"):
        return False
    first, *rest = graph.inputs(shape_ref.node)
    dims = [graph.const_value(ref) for ref in rest]
    if graph.op(first) != "StridedSlice" or any(d is None or d.ndim for d in dims):
        return False
    shape_of, begin, end, strides = graph.inputs(first.node)
    masks = [graph.attr(first.node, key, 0) for key in
             ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")]
    if graph.op(shape_of) != "Shape" or graph.inputs(shape_of.node)[0] != x or \
            masks != [0, 0, 0, 0, 1] or [_ints(graph, r) for r in (begin, end, strides)] != \
            [[0], [1], [1]]:
        return False
    known = shapes.get(x.node) if not x.port else None
    if not known or None in known[1:] or any(int(d) < 0 for d in dims):
        return False
    return int(np.prod(known[1:])) == int(np.prod([int(d) for d in dims])) != 0


def _ints(graph: Graph, ref: Ref):
    value = graph.const_value(ref)
    return None if value is None else value.reshape(-1).tolist()


def _constant_batch_shape(graph: Graph, name: str, report) -> bool:
    shape_ref = graph.inputs(name)[1]
    dims = [int(graph.const_value(ref)) for ref in graph.inputs(shape_ref.node)[1:]]
    dtype = graph.node(name).attr["Tshape"].type
    graph.set_input(name, 1, graph.add_const(f"{name}/batch_shape", np.array([-1] + dims),
                                             dtype=dtype))
    report.matched += 1
    report.rewritten.append(f"{name}: shape from its own input's batch became [-1, {dims}]")
    return True


def _bypass(graph: Graph, name: str, source: Ref, options: Options, report, why: str) -> bool:
    """Readers of ``name`` read ``source`` instead; an output keeps its name as an Identity."""
    if graph.control_inputs(name):
        return False
    keep = None
    if name in options.protected:
        node = graph.node(name)
        keep = node.attr["T"] if "T" in node.attr else node.attr["DstT"]
    graph.bypass(name, source, keep_name_as=keep)
    report.matched += 1
    report.rewritten.append(f"{name}: {why}")
    return True


def _same_shape(shapes, a: Ref, b: Ref) -> bool:
    """Both tensors' static shapes fully known and equal."""
    first, second = shapes.get(a.node) if not a.port else None, \
        shapes.get(b.node) if not b.port else None
    return first is not None and first == second and None not in first
