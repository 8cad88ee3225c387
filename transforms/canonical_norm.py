"""Canonical forms of normalisation and activation spellings (``canonical_forms``' rules).

Each rule rewrites one family of spellings into the form ``fuse_layer_norm`` / ``fuse_gelu``
match, on the export's private copy of the graph, keeping the names the splice needs (see
``canonical_forms``). Each says why it is exact.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
from tensorflow.core.framework import attr_value_pb2, types_pb2

from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.canonical_forms import (Rewrite, Shapes, add_const, add_node,
                                                  become)
from tfsurgery.transforms.fusion_match import (ADDS, as_vector, const_and_other,
                                               consumers_with_op, producer, scalar_near)

REDUCTIONS = {"Mean", "Sum", "Max", "Min", "Prod"}


def negative_axes(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """A reduction over constant axes ``a >= 0`` of a tensor of known rank ``r`` reduces over
    ``a - r``: the same axes counted from the end (tf_keras' ``LayerNormalization`` writes
    ``[2]`` for the last axis of a rank-3 tensor, the matchers ask for ``[-1]``). Exact: an
    index, not a computation, changes. The constant may be shared, so the node gets its own.
    Only reductions that keep their dimensions (a normalisation's statistics; a global pooling
    drops them) are asked about: a shape question imports the graph into TensorFlow once."""
    rewrites = []
    for node in graph.names_with_ops(REDUCTIONS):
        if not graph.attr(node, "keep_dims", False):
            continue
        inputs = graph.inputs(node)
        axes = graph.const_value(inputs[1]) if len(inputs) == 2 else None
        shape = shapes(inputs[0]) if axes is not None and np.any(axes >= 0) else None
        if shape is None:
            continue
        rank = len(shape)
        if np.any(axes >= rank) or np.any(axes < -rank):
            continue
        negative = np.where(axes >= 0, axes - rank, axes).astype(axes.dtype)
        graph.set_input(node, 1, add_const(graph, node, "axes", negative))
        rewrites.append(Rewrite("negative-axes", node, f"{graph.op(node)} axes "
                                f"{np.ravel(axes).tolist()} → {np.ravel(negative).tolist()}"))
    return rewrites


def rsqrt(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``1 / Sqrt(v)``, ``Reciprocal(Sqrt(v))``, ``Pow(v, -0.5)`` → ``Rsqrt(v)``, and
    ``a / Sqrt(v)`` → ``a · Rsqrt(v)``: the same real number (1/√v), rounded once less or more.
    The node keeps its name; the Sqrt stays for any other reader."""
    rewrites = []
    for node in graph.names_with_ops({"RealDiv", "Reciprocal", "Pow"}):
        op, inputs = graph.op(node), graph.inputs(node)
        if op == "Pow":
            power = const_and_other(graph, node)
            if power is not None and power[1] == inputs[0] and scalar_near(power[0], -0.5):
                become(graph, node, "Rsqrt", [inputs[0]])
                rewrites.append(Rewrite("rsqrt", node, "Pow(v, -0.5) → Rsqrt(v)"))
            continue
        sqrt = producer(graph, inputs[-1], {"Sqrt"})
        if sqrt is None:
            continue
        v = graph.inputs(sqrt)[0]
        if op == "Reciprocal" or scalar_near(graph.const_value(inputs[0]), 1.0):
            become(graph, node, "Rsqrt", [v])
            rewrites.append(Rewrite("rsqrt", node, f"{'1 / ' if op == 'RealDiv' else op}"
                                    "Sqrt(v) → Rsqrt(v)"))
        else:
            r = add_node(graph, "Rsqrt", node, "Rsqrt", [v], sqrt)
            become(graph, node, "Mul", [inputs[0], r])
            rewrites.append(Rewrite("rsqrt", node, "a / Sqrt(v) → a · Rsqrt(v)"))
    return rewrites


def cube(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """A product of ``x`` three times and at most one constant ``c``, in any grouping
    (``x·x·x``, ``Square(x)·x``, ``c·x·x·x`` as ``0.044715 * h * h * h`` groups it) →
    ``c · Pow(x, 3)`` (the tanh GELU's cube): the same product, rounded differently. The
    outermost Mul keeps its name; inner products read elsewhere too are factors of their own."""
    rewrites = []
    for node in graph.names_with_ops({"Mul"}):
        leaves = _factors(graph, Ref(node, 0), top=True)
        constants = [f for f in leaves if graph.const_value(f) is not None]
        variables = [f for f in leaves if f not in constants]
        if len(variables) != 3 or len(set(variables)) != 1 or len(constants) > 1 or \
                any(graph.const_value(c).size != 1 for c in constants):
            continue
        x, three = variables[0], add_const(graph, node, "three",
                                           np.asarray(3, _numpy_dtype(graph, node)))
        if constants:
            cubed = add_node(graph, "Pow", node, "Pow", [x, three], node)
            become(graph, node, "Mul", [constants[0], cubed])
        else:
            become(graph, node, "Pow", [x, three])
        rewrites.append(Rewrite("cube", node, f"{'c·' if constants else ''}x·x·x → "
                                f"{'c·' if constants else ''}Pow(x, 3)"))
    return rewrites


def _factors(graph: Graph, ref: Ref, top: bool = False) -> List[Ref]:
    """The factors of a tree of Mul/Square (an inner product read elsewhere is one factor)."""
    op = graph.op(ref) if ref.port == 0 else None
    if op not in ("Mul", "Square") or (not top and graph.reader_count(ref.node) > 1):
        return [ref]
    factors = [f for inner in graph.inputs(ref.node) for f in _factors(graph, inner)]
    return factors * 2 if op == "Square" else factors


def _numpy_dtype(graph: Graph, node: str):
    from tensorflow.python.framework import dtypes
    return dtypes.as_dtype(graph.node(node).attr["T"].type).as_numpy_dtype



def fused_batch_norm_layer_norm(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """tf_keras' ``LayerNormalization`` at epsilon ≥ 1.001e-5 (its default 1e-3: Model Garden,
    TF Hub encoders) normalizes with a batch norm in training mode::

        y = Reshape(FusedBatchNorm(Reshape(x, [1, rows, H, 1]), ones, zeros, NCHW,
                                   is_training), Shape(x)) [* gamma] [+ beta]

    Each NCHW channel of ``[1, rows, H, 1]`` is one length-``H`` row of ``x`` (row-major, ``H``
    its last dimension), normalized by its own mean and biased variance with scale 1 and offset
    0: ``(x - mean) / sqrt(var + eps)`` over the last axis, then gamma and beta — exactly
    ``fuse_layer_norm``'s LayerNorm, which the output node now computes in canonical form.
    Proven by the static shapes (the reshape's ``[1, ?, H, 1]`` with ``H`` x's last dimension;
    the reshape back to x's own shape), the constant scale/offset and the attributes."""
    rewrites = []
    for norm in graph.names_with_ops({"FusedBatchNorm", "FusedBatchNormV2",
                                      "FusedBatchNormV3"}):
        x = _rows_of_last_axis(graph, norm, shapes)
        back = _reshaped_back(graph, norm, x, shapes) if x is not None else None
        if back is None:
            continue
        out, gamma, beta = _scale_and_offset(graph, back)
        eps = graph.attr(norm, "epsilon", 1e-4)
        write_layer_norm(graph, out, x, float(eps), gamma, beta, shapes(x)[-1], norm)
        rewrites.append(Rewrite("layer-norm-forms", out,
                                "FusedBatchNorm over rows → LayerNorm (canonical)"))
    return rewrites


def centered_layer_norm(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """A LayerNorm written by hand: ``(x - mean) · Rsqrt(var + eps) [* gamma] [+ beta]`` with
    ``mean, var = tf.nn.moments(x, [-1], keepdims=True)`` (the ``rsqrt`` rule made the
    ``/ sqrt`` a ``· Rsqrt``). Distributing the product over ``x - mean`` gives
    ``x · inv + (beta - mean · inv)``, ``inv = Rsqrt(var + eps) · gamma``: the canonical form,
    computed by the output node. Matched by value: the same ``x`` in the difference and the
    moments, constants eps, gamma, beta."""
    from tfsurgery.transforms.fuse_layer_norm import moments
    rewrites = []
    for r in graph.names_with_ops({"Rsqrt"}):
        plus_eps = const_and_other(graph, producer(graph, graph.inputs(r)[0], ADDS))
        found = moments(graph, plus_eps[1]) if plus_eps and plus_eps[0].size == 1 else None
        if found is None or isinstance(found, str):
            continue
        x, mean = found
        for mul in consumers_with_op(graph, r, {"Mul"}):
            centered = producer(graph, _other(graph, mul, Ref(r, 0)), {"Sub"})
            if centered is None or graph.inputs(centered) != [x, mean]:
                continue
            out, gamma, beta = _scale_and_offset(graph, mul)
            shape = shapes(x)
            size = next((v.size for v in (gamma, beta) if v is not None),
                        shape[-1] if shape else None)
            if not isinstance(size, int):
                continue
            write_layer_norm(graph, out, x, float(np.ravel(plus_eps[0])[0]), gamma, beta,
                             size, r)
            rewrites.append(Rewrite("layer-norm-forms", out,
                                    "(x - mean) · Rsqrt(var + eps) → LayerNorm (canonical)"))
    return rewrites


def write_layer_norm(graph: Graph, out: str, x: Ref, eps: float, gamma, beta, size: int,
                     like: str) -> None:
    """Node ``out`` now computes ``fuse_layer_norm``'s canonical LayerNorm of ``x`` over the
    last axis: ``x·inv + (beta - mean·inv)``, ``inv = Rsqrt(var + eps)·gamma`` (gamma 1 and
    beta 0 where absent; ``size`` their length). New nodes take ``like``'s dtype."""
    dtype = graph.node(like).attr["T"].type
    numpy_dtype = _numpy_dtype(graph, like)
    t = {"T": attr_value_pb2.AttrValue(type=dtype)}
    reduce = dict(t, Tidx=attr_value_pb2.AttrValue(type=types_pb2.DT_INT32),
                  keep_dims=attr_value_pb2.AttrValue(b=True))

    def new(op, what, inputs, attrs=t):
        return Ref(graph.new_node(op, graph.unique_name(f"{out}/canonical/{what}"), inputs,
                                  attrs).name, 0)

    def const(what, value):
        return add_const(graph, out, what, np.asarray(value, numpy_dtype))

    last = add_const(graph, out, "axis", np.asarray([-1], np.int32))
    mean = new("Mean", "mean", [x, last], reduce)
    variance = new("Mean", "variance",
                   [new("SquaredDifference", "squared_difference", [x, mean]), last], reduce)
    inv = new("Rsqrt", "rsqrt", [new("AddV2", "plus_eps", [variance, const("eps", eps)])])
    inv = new("Mul", "times_gamma", [inv, const("gamma", np.ones(size) if gamma is None
                                                else gamma)])
    shift = new("Sub", "shift", [const("beta", np.zeros(size) if beta is None else beta),
                                 new("Mul", "mean_inv", [mean, inv])])
    become(graph, out, "AddV2", [new("Mul", "x_inv", [x, inv]), shift])


def _rows_of_last_axis(graph: Graph, norm: str, shapes: Shapes) -> Optional[Ref]:
    """x where batch norm ``norm`` normalizes Reshape(x, [1, rows, H, 1]) in training mode,
    NCHW, scale ones and offset zeros, H = x's last dimension; its statistics unread."""
    inputs = graph.inputs(norm)
    if not graph.attr(norm, "is_training", False) or \
            graph.attr(norm, "data_format", b"NHWC") not in (b"NCHW", "NCHW") or \
            any(graph.consumers(norm, port) for port in range(1, 6)):
        return None
    if not (_filled_with(graph, inputs[1], 1.0) and _filled_with(graph, inputs[2], 0.0)):
        return None
    reshape = producer(graph, inputs[0], {"Reshape"})
    x = graph.inputs(reshape)[0] if reshape else None
    shape, rows = (shapes(x), shapes(inputs[0])) if x is not None else (None, None)
    if not shape or not isinstance(shape[-1], int) or rows is None or len(rows) != 4 or \
            rows[0] != 1 or rows[2] != shape[-1] or rows[3] != 1:
        return None
    return x


def _reshaped_back(graph: Graph, norm: str, x: Ref, shapes: Shapes) -> Optional[str]:
    """The Reshape of ``norm``'s output to x's own shape: by Shape(x), or to a static shape
    equal to x's whose only unknown dimension is the first (then the element count fixes it)."""
    for back in consumers_with_op(graph, norm, {"Reshape"}):
        target = producer(graph, graph.inputs(back)[1], {"Shape"})
        if target is not None and graph.inputs(target)[0] == x:
            return back
        shape, out = shapes(x), shapes(Ref(back, 0))
        if shape and out == shape and all(isinstance(d, int) for d in shape[1:]):
            return back
    return None


def _scale_and_offset(graph: Graph, node: str):
    """(output node, gamma, beta): ``node`` [* gamma] [+ beta] with per-channel constants,
    each taken where it is ``node``'s (then the product's) only reader."""
    gamma = beta = None
    readers = consumers_with_op(graph, node, {"Mul"})
    split = const_and_other(graph, readers[0]) if len(readers) == 1 and \
        graph.reader_count(node) == 1 else None
    if split is not None and as_vector(split[0]) is not None:
        node, gamma = readers[0], as_vector(split[0])
    readers = consumers_with_op(graph, node, ADDS)
    split = const_and_other(graph, readers[0]) if len(readers) == 1 and \
        graph.reader_count(node) == 1 else None
    if split is not None and as_vector(split[0]) is not None:
        node, beta = readers[0], as_vector(split[0])
    if gamma is not None and beta is not None and gamma.size != beta.size:
        return node, None, None
    return node, gamma, beta


def _filled_with(graph: Graph, ref: Ref, value: float) -> bool:
    """``ref`` is a constant of all ``value``, or Fill(shape, ``value``)."""
    fill = producer(graph, ref, {"Fill"})
    constant = graph.const_value(graph.inputs(fill)[1] if fill else ref)
    return constant is not None and constant.size >= 1 and bool(np.all(constant == value))


def _other(graph: Graph, node: str, known: Ref) -> Optional[Ref]:
    inputs = graph.inputs(node)
    return inputs[1] if inputs[0] == known else inputs[0] if inputs[1] == known else None


RULES = (negative_axes, rsqrt, cube, fused_batch_norm_layer_norm, centered_layer_norm)
