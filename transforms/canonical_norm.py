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
    index, not a computation, changes. The constant may be shared, so the node gets its own."""
    rewrites = []
    for node in graph.names_with_ops(REDUCTIONS):
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
    """``x·x·x`` (either grouping) and ``Square(x)·x`` → ``Pow(x, 3)`` (the tanh GELU's x³):
    the same product, rounded once or twice. The outer Mul keeps its name."""
    rewrites = []
    for node in graph.names_with_ops({"Mul"}):
        x = _cubed(graph, node)
        if x is None:
            continue
        three = add_const(graph, node, "three",
                          np.asarray(3, _numpy_dtype(graph, node)))
        become(graph, node, "Pow", [x, three])
        rewrites.append(Rewrite("cube", node, "x·x·x → Pow(x, 3)"))
    return rewrites


def _cubed(graph: Graph, mul: str) -> Optional[Ref]:
    """x where Mul ``mul`` is x·(x·x), (x·x)·x or Square(x)·x."""
    a, b = graph.inputs(mul)
    for square, x in ((a, b), (b, a)):
        inner = producer(graph, square, {"Mul", "Square"})
        if inner is None:
            continue
        factors = graph.inputs(inner)
        if graph.op(inner) == "Square" and factors[0] == x:
            return x
        if graph.op(inner) == "Mul" and factors[0] == x and factors[1] == x:
            return x
    return None


def _numpy_dtype(graph: Graph, node: str):
    from tensorflow.python.framework import dtypes
    return dtypes.as_dtype(graph.node(node).attr["T"].type).as_numpy_dtype


RULES = (negative_axes, rsqrt, cube)
