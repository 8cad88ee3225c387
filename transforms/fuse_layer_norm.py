"""LayerNorm as TensorFlow lowers it → one ONNX ``LayerNormalization`` (opset 17).

Keras' ``LayerNormalization`` (and ``tf.nn.moments`` + ``batch_normalization`` by hand) arrives
as nine ops over the last axis::

    mean = Mean(x, -1)                  var = Mean(SquaredDifference(x, mean), -1)
    inv  = Rsqrt(var + eps) * gamma
    y    = x * inv + (beta - mean * inv)        (Keras 3: x * inv + (-mean * inv + beta))

which is ``(x - mean) / sqrt(var + eps) * gamma + beta``: ``LayerNormalization(x, gamma, beta,
axis=-1, epsilon=eps)``. Matched by value — the two means read the same ``x`` over the last
axis, ``eps``/``gamma``/``beta`` are constants — never by name. The replacement produces ``y``
under its TensorFlow name. onnxruntime then turns a residual ``Add`` in front into
``SkipLayerNormalization`` (``tfsurgery.export.onnx_fusion``).
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from tfsurgery.export.onnx_splice import Fused, tensor_name
from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.fusion_match import (ADDS, as_vector, const_and_other, constant_first,
                                               consumers_with_op, other_input, producer)

NAME = "fuse-layer-norm"
WHAT = "LayerNorm → LayerNormalization"


class LayerNorm(NamedTuple):
    """``out = (x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis."""
    out: str
    x: Ref
    gamma: np.ndarray
    beta: np.ndarray
    eps: float


def find(graph: Graph, shapes=None) -> Tuple[List[Fused], List[Tuple[str, str]]]:
    """Every LayerNorm of the graph as a ``Fused``; and (Rsqrt node, why not) for the rest."""
    found, skipped = layer_norms(graph)
    return [_fused(*norm) for norm in found], skipped


def layer_norms(graph: Graph) -> Tuple[List[LayerNorm], List[Tuple[str, str]]]:
    """Every LayerNorm of the graph; and (Rsqrt node, why not) for the rest."""
    found, skipped = [], []
    for rsqrt in graph.names_with_ops({"Rsqrt"}):
        result = _match(graph, rsqrt)
        if isinstance(result, str):
            skipped.append((rsqrt, result))
        else:
            found.append(result)
    return found, skipped


def _match(graph: Graph, rsqrt: str):
    plus_eps = const_and_other(graph, producer(graph, graph.inputs(rsqrt)[0], ADDS))
    if plus_eps is None or plus_eps[0].size != 1:
        return "not Rsqrt(variance + epsilon)"
    eps, variance = plus_eps
    found = moments(graph, variance)
    if isinstance(found, str):
        return found
    x, mean = found
    inv, gamma = _scaled(graph, rsqrt)
    output = _normalized(graph, inv, x, mean)
    if isinstance(output, str):
        return output
    out, beta = output
    size = next((v.size for v in (gamma, beta) if v is not None), None)
    if size is None:
        return "no scale and no offset: the normalized size is not known from the graph"
    gamma = np.ones(size, np.float32) if gamma is None else gamma
    beta = np.zeros(size, np.float32) if beta is None else beta
    if gamma.size != beta.size:
        return "scale and offset differ in size"
    return LayerNorm(out, x, gamma, beta, float(np.ravel(eps)[0]))


def moments(graph: Graph, variance: Ref):
    """(x, mean) when ``variance`` is Mean(SquaredDifference(x, Mean(x, -1)), -1)."""
    var = producer(graph, variance, {"Mean"})
    if var is None:
        return "the variance is not a Mean"
    if not _last_axis_kept(graph, var):
        axes = graph.const_value(graph.inputs(var)[1])
        axes = np.ravel(axes).tolist() if axes is not None else "computed at run time"
        kept = "" if graph.attr(var, "keep_dims", False) else " without keep_dims"
        return (f"the variance is a Mean over axes {axes}{kept}, not over the last axis alone "
                "(-1; an axis counted from the front is made -1 where the rank is known)")
    sq = producer(graph, graph.inputs(var)[0], {"SquaredDifference"})
    if sq is None:
        return "variance is not a mean of SquaredDifference"
    for x, mean in (graph.inputs(sq), graph.inputs(sq)[::-1]):
        mean_node = producer(graph, mean, {"Mean"})
        if mean_node and graph.inputs(mean_node)[0] == x and _last_axis_kept(graph, mean_node):
            return x, mean
    return "the squared difference is not from the mean of the same tensor"


def _last_axis_kept(graph: Graph, mean: str) -> bool:
    axes = graph.const_value(graph.inputs(mean)[1])
    return axes is not None and np.array_equal(np.ravel(axes), [-1]) and \
        bool(graph.attr(mean, "keep_dims", False))


def _scaled(graph: Graph, rsqrt: str) -> Tuple[str, Optional[np.ndarray]]:
    """``Rsqrt * gamma`` (its node and gamma) where gamma is a per-channel constant; else the
    Rsqrt itself and no gamma."""
    for mul in consumers_with_op(graph, rsqrt, {"Mul"}):
        split = const_and_other(graph, mul)
        if split is not None and split[1].node == rsqrt and as_vector(split[0]) is not None:
            return mul, as_vector(split[0])
    return rsqrt, None


def _normalized(graph: Graph, inv: str, x: Ref, mean: Ref):
    """(output node, beta or None) of ``x * inv + (beta - mean * inv)`` in its two spellings."""
    x_inv = mean_inv = None
    for mul in consumers_with_op(graph, inv, {"Mul"}):
        other = other_input(graph, mul, Ref(inv))
        if other == x:
            x_inv = mul
        elif other == mean or (producer(graph, other, {"Neg"}) and
                               graph.inputs(other.node)[0] == mean):
            mean_inv = (mul, other != mean)
    if x_inv is None or mean_inv is None:
        return "not x * inv and mean * inv"
    mul, negated = mean_inv
    shift, beta = Ref(mul), None
    for add in consumers_with_op(graph, mul, ADDS | {"Sub"}):
        split = constant_first(graph, add) if graph.op(add) == "Sub" else \
            const_and_other(graph, add)
        sub_ok = graph.op(add) == "Sub" and not negated and graph.inputs(add)[1] == Ref(mul)
        add_ok = graph.op(add) != "Sub" and negated
        if split is not None and as_vector(split[0]) is not None and (sub_ok or add_ok):
            shift, beta = Ref(add), as_vector(split[0])
    if beta is None and not negated:
        return "mean * inv is not subtracted from an offset"
    for out in consumers_with_op(graph, x_inv, ADDS - {"BiasAdd"}):
        if other_input(graph, out, Ref(x_inv)) == shift:
            return out, beta
    return "x * inv and the shift are not added"


def _fused(out: str, x: Ref, gamma: np.ndarray, beta: np.ndarray, eps: float) -> Fused:
    from onnx import helper
    scale, bias = f"{out}/fused/gamma", f"{out}/fused/beta"
    node = helper.make_node("LayerNormalization", [tensor_name(x), scale, bias], [f"{out}:0"],
                            name=f"{out}/LayerNormalization", axis=-1, epsilon=eps)
    return Fused(WHAT, f"{out}:0", [tensor_name(x)], [node], {scale: gamma, bias: beta})
