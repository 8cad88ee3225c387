"""GELU as TensorFlow lowers it → onnxruntime's ``Gelu`` / ``FastGelu`` (com.microsoft).

Exact GELU is ``0.5 x (1 + erf(x / √2))``; TF 2.21 writes it ``0.5 x · erfc(-x / √2)`` (the
``Erfc`` tf2onnx cannot convert), older code ``0.5 x (1 + erf(x · (1/√2)))``. The tanh form
(BERT, GPT-2) is ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``. Each is matched by its
constants and by every branch reading the same ``x``, then replaced by one op: ``Gelu(x)`` or
``FastGelu(x)``, producing the last Mul's output under its TensorFlow name. onnxruntime then
takes a bias Add in front into it (``BiasGelu`` / ``FastGelu`` with bias; see
``tfsurgery.export.onnx_fusion``). The quick GELU of CLIP and Hugging Face's ``quick_gelu``,
``x · sigmoid(1.702 x)``, is onnxruntime's ``QuickGelu(x, alpha=1.702)``: the same formula.
(Spellings such as ``x·x·x`` for the cube are made canonical first: ``canonical_norm``.)
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

from tfsurgery.export.onnx_splice import MICROSOFT, Fused, tensor_name
from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.fusion_match import (ADDS, const_and_other, consumers_with_op,
                                               other_input, producer, scalar_near)

NAME = "fuse-gelu"
WHAT_EXACT = "GELU (erf) → Gelu"
WHAT_TANH = "GELU (tanh) → FastGelu"
WHAT_QUICK = "quick GELU (x·sigmoid(1.702x)) → QuickGelu"
QUICK_ALPHA = 1.702
SQRT_HALF = 1 / math.sqrt(2)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def find(graph: Graph, shapes=None) -> Tuple[List[Fused], List[Tuple[str, str]]]:
    """Every GELU as a ``Fused``; (Erf/Erfc/Tanh node, why not) for the others."""
    found, skipped = [], []
    for node in graph.names_with_ops({"Erfc", "Erf", "Tanh"}):
        x = _gelu_argument(graph, node)
        out, why = _product(graph, node, x) if isinstance(x, Ref) else (None, x)
        if out is None:
            skipped.append((node, why))
        else:
            exact = graph.op(node) != "Tanh"
            found.append(_fused(graph, out, x, "Gelu" if exact else "FastGelu",
                                WHAT_EXACT if exact else WHAT_TANH))
    for sigmoid in graph.names_with_ops({"Sigmoid"}):
        quick = _quick_gelu(graph, sigmoid)
        if isinstance(quick, str):
            skipped.append((sigmoid, quick))
        elif quick is not None:
            found.append(quick)
    return found, skipped


def _quick_gelu(graph: Graph, sigmoid: str):
    """``x · sigmoid(1.702 x)`` as a ``Fused`` QuickGelu; None where the sigmoid's argument is
    not 1.702·x (a plain sigmoid: not a candidate); why not where it is but x · it is not."""
    from onnx import helper
    split = const_and_other(graph, producer(graph, graph.inputs(sigmoid)[0], {"Mul"}))
    if split is None or not scalar_near(split[0], QUICK_ALPHA, 1e-4):
        return None
    x = split[1]
    for out in consumers_with_op(graph, sigmoid, {"Mul"}):
        if other_input(graph, out, Ref(sigmoid)) == x:
            node = helper.make_node("QuickGelu", [tensor_name(x)], [f"{out}:0"],
                                    name=f"{out}/QuickGelu", domain=MICROSOFT,
                                    alpha=float(np.ravel(split[0])[0]))
            return Fused(WHAT_QUICK, f"{out}:0", [tensor_name(x)], [node])
    return "sigmoid(1.702 x) is not multiplied by the same x"


def _gelu_argument(graph: Graph, node: str):
    """The ``x`` whose GELU ``node`` (Erfc, Erf or Tanh) is part of, or why none."""
    op, inner = graph.op(node), graph.inputs(node)[0]
    split = const_and_other(graph, producer(graph, inner, {"Mul"}))
    if split is None and op == "Erf":      # x / √2
        split = const_and_other(graph, producer(graph, inner, {"RealDiv"}))
        split = split and (1 / split[0], split[1])
    if split is None:
        return f"the {op} argument is not a product with a constant"
    c, arg = split
    if op == "Erfc":
        neg = producer(graph, arg, {"Neg"})
        return graph.inputs(neg)[0] if neg and scalar_near(c, SQRT_HALF) else \
            "not erfc(-x / √2)"
    if op == "Erf":
        return arg if scalar_near(c, SQRT_HALF) else "not erf(x / √2)"
    if not scalar_near(c, SQRT_2_OVER_PI):
        return "not tanh(√(2/π) · ...)"
    return _cubic_argument(graph, arg)


def _cubic_argument(graph: Graph, inner: Ref):
    """x when ``inner`` is x + 0.044715 · x³ (Pow(x, 3))."""
    add = producer(graph, inner, ADDS - {"BiasAdd"})
    if add is None:
        return "not tanh(c · (x + ...))"
    for x, cubic in (graph.inputs(add), graph.inputs(add)[::-1]):
        split = const_and_other(graph, producer(graph, cubic, {"Mul"}))
        power = split and const_and_other(graph, producer(graph, split[1], {"Pow"}))
        if split and power and scalar_near(split[0], 0.044715) and \
                scalar_near(power[0], 3.0) and power[1] == x:
            return x
    return "not tanh(c · (x + 0.044715 x³))"


def _product(graph: Graph, node: str, x: Ref):
    """(the node computing 0.5 · x · g, None) where g is ``node`` (erfc) or 1 + ``node`` (erf,
    tanh); (None, why not)."""
    g = node
    if graph.op(node) != "Erfc":
        adds = [a for a in consumers_with_op(graph, node, ADDS - {"BiasAdd"})
                if scalar_near(const_and_other(graph, a) and const_and_other(graph, a)[0], 1.0)]
        if not adds:
            return None, f"1 + {graph.op(node)}(...) not found"
        g = adds[0]
    for mul in consumers_with_op(graph, g, {"Mul"}):
        half = other_input(graph, mul, Ref(g))       # 0.5x · g, x · 0.5g or 0.5 · xg
        if _is_half_of(graph, half, x):
            return mul, None
        for outer in consumers_with_op(graph, mul, {"Mul"}):
            rest = other_input(graph, outer, Ref(mul))
            if (half == x and _is_value(graph, rest, 0.5)) or \
                    (_is_value(graph, half, 0.5) and rest == x):
                return outer, None
    return None, "not 0.5 · x · (...) of the same x"


def _is_half_of(graph: Graph, ref: Optional[Ref], x: Ref) -> bool:
    split = const_and_other(graph, producer(graph, ref, {"Mul"}))
    return bool(split) and scalar_near(split[0], 0.5) and split[1] == x


def _is_value(graph: Graph, ref: Optional[Ref], value: float) -> bool:
    return ref is not None and scalar_near(graph.const_value(ref), value)


def _fused(graph: Graph, out: str, x: Ref, op: str, what: str) -> Fused:
    """``op(x)``; where ``x = y + bias`` (a 1-D constant), ``BiasGelu(y, bias)`` /
    ``FastGelu(y, bias)`` instead, falling back to ``op(x)`` if ``y`` is not in the ONNX."""
    from onnx import helper
    node = helper.make_node(op, [tensor_name(x)], [f"{out}:0"], name=f"{out}/{op}",
                            domain=MICROSOFT)
    plain = Fused(what, f"{out}:0", [tensor_name(x)], [node])
    split = const_and_other(graph, producer(graph, x, ADDS))
    if split is None or split[0].ndim != 1:
        return plain
    bias, y = split
    biased = "BiasGelu" if op == "Gelu" else op
    name = f"{out}/fused/bias"
    node = helper.make_node(biased, [tensor_name(y), name], [f"{out}:0"],
                            name=f"{out}/{biased}", domain=MICROSOFT)
    return Fused(f"{what} (bias taken in: {biased})", f"{out}:0", [tensor_name(y)], [node],
                 {name: bias.astype("float32")}, fallback=plain)
