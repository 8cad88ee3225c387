"""What the fusions (``fuse_*.py``) ask of the TensorFlow graph: values, not names.

A fusion proves its pattern on the graph the model's author wrote (ops, constants, which input
feeds what), then hands the ONNX exporter a ``Fused`` replacement
(``tfsurgery.export.onnx_splice``).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from tfsurgery.constants import constant_values
from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref

ADDS = {"AddV2", "Add", "BiasAdd"}
Split = Optional[Tuple[np.ndarray, Ref]]


def producer(graph: Graph, ref: Ref, ops) -> Optional[str]:
    """The node behind ``ref`` if it is one of ``ops`` (output 0), else None."""
    if ref is None or ref.port != 0 or graph.op(ref) not in ops:
        return None
    return ref.node


# binary ops whose operands may swap: x op c == c op x
COMMUTATIVE = {"AddV2", "Add", "Mul", "Maximum", "Minimum", "SquaredDifference"}


def const_and_other(graph: Graph, name: Optional[str]) -> Split:
    """(c, x) where binary ``name`` is ``x op c`` with a constant ``c``: either side for a
    commutative op (Add, Mul, ...), only the right for the others (RealDiv, Pow, Sub, BiasAdd:
    ``c / x`` is not ``x / c``; ``constant_first`` reads ``c op x``)."""
    if name is None:
        return None
    inputs = graph.inputs(name)
    if len(inputs) != 2:
        return None
    orders = (inputs[::-1], inputs) if graph.op(name) in COMMUTATIVE else (inputs[::-1],)
    return _split(graph, orders)


def constant_first(graph: Graph, name: Optional[str]) -> Split:
    """(c, x) where binary ``name`` is ``c op x`` with a constant ``c`` (``beta - y``)."""
    inputs = graph.inputs(name) if name is not None else []
    return _split(graph, (inputs,)) if len(inputs) == 2 else None


def _split(graph: Graph, orders) -> Split:
    for const, other in orders:
        value = graph.const_value(const)
        if value is not None and graph.const_value(other) is None:
            return np.asarray(value), other
    return None


def computed_value(graph: Graph, ref: Optional[Ref]) -> Optional[np.ndarray]:
    """``ref``'s value where it is computed from constants alone — TensorFlow evaluates it (a
    Keras causal mask at a static length is Cumsum/GreaterEqual over a constant shape, left
    unfolded when its value outweighs its ops) — else None."""
    if ref is None:
        return None
    value = graph.const_value(ref)
    return value if value is not None else constant_values(graph, [ref])[str(ref)]


def dimension_of(graph: Graph, ref: Optional[Ref]) -> Optional[Tuple[Ref, int]]:
    """(x, axis) where ``ref`` is Shape(x)[axis] — a StridedSlice taking one element, step 1 —
    as Keras writes a run-time dimension; None otherwise. ``axis`` as written (may be < 0)."""
    cut = producer(graph, ref, {"StridedSlice"})
    shape = cut and producer(graph, graph.inputs(cut)[0], {"Shape"})
    bounds = [graph.const_value(r) for r in graph.inputs(cut)[1:4]] if shape else [None]
    if any(b is None or b.size != 1 for b in bounds) or \
            graph.attr(cut, "shrink_axis_mask", 0) != 1 or int(np.ravel(bounds[2])[0]) != 1:
        return None
    return graph.inputs(shape)[0], int(np.ravel(bounds[0])[0])


def scalar_near(value, target: float, rtol: float = 1e-5) -> bool:
    """``value`` is one number (any shape of size 1) within ``rtol`` of ``target``."""
    return value is not None and np.size(value) == 1 and \
        abs(float(np.ravel(value)[0]) - target) <= rtol * abs(target)


def other_input(graph: Graph, name: str, known: Ref) -> Optional[Ref]:
    """The input of binary ``name`` that is not ``known``."""
    inputs = graph.inputs(name)
    if len(inputs) != 2 or known not in inputs:
        return None
    return inputs[1] if inputs[0] == known else inputs[0]


def consumers_with_op(graph: Graph, name: str, ops) -> Sequence[str]:
    return sorted(c.node for c in graph.consumers(name, 0) if graph.op(c.node) in ops)


def as_vector(value: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """A per-channel parameter ([H], [1, 1, H], ...) as [H] float32; None if it is not one."""
    if value is None or value.ndim == 0 or any(d != 1 for d in value.shape[:-1]):
        return None
    return value.reshape(-1).astype(np.float32)
