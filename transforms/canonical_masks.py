"""Canonical forms of attention masks (``canonical_forms``' rules) for ``fuse_attention``.

The matcher reads a mask as Keras writes it: ``SelectV2(condition, scores, filler)`` with the
condition a key-padding mask ANDed with a causal lower triangle (or either alone), or Hugging
Face's additive ``scores + (1 - m)·c``. keras-hub merges its int masks by ``Minimum`` and
compares with 0; Hugging Face's GPT-2 writes its causal band as ``scores·b - 1e4·(1 - b)``.
Each rule below rewrites one such spelling on the export's private copy and says why it is
exact.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.canonical_forms import (Rewrite, Shapes, add_const, add_node, become,
                                                   remove_unread)
from tfsurgery.transforms.fusion_match import computed_value, producer

INTEGER_TYPES = {3, 4, 5, 6, 9}              # DT_INT32, UINT8, INT16, INT8, INT64


def _greater_than_constant(graph: Graph, node: str):
    """(x, c) where ``node`` is Greater(x, c), c a constant scalar on the right."""
    if graph.op(node) != "Greater":
        return None
    x, c = graph.inputs(node)
    value = graph.const_value(c)
    return (x, c) if value is not None and value.size == 1 and \
        graph.const_value(x) is None else None


def constant_broadcast_dropped(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """keras-hub broadcasts its causal triangle ``t`` [1, T, S] (computed from constants)
    to [batch, T, S] before merging it with the padding mask [batch, 1, S] by an elementwise
    ``Minimum``: ``BroadcastTo(t, [B, T, S])`` → ``t`` where only Casts lead from it to that
    elementwise op. Elementwise ops broadcast their operands themselves, and the other operand
    brings the batch (a key-padding mask's batch is the input's, as ``fuse_attention`` takes
    every padding mask): the same [B, T, S] values. Then TensorFlow can evaluate the triangle
    and ``fuse_attention`` proves it causal by its value."""
    rewrites = []
    for node in graph.names_with_ops({"BroadcastTo"}):
        source, shape = graph.inputs(node)
        value = computed_value(graph, source)       # a folded triangle, or Range-based (seq 32+)
        if value is None or value.ndim < 2 or shapes(shape) is None or \
                len(shapes(shape)) != 1 or shapes(shape)[0] != value.ndim or \
                any(d != 1 for d in value.shape[:-2]) or not _read_elementwise(graph, node):
            continue
        tail = _trailing_constants(graph, shape, 2)
        if tail is None or tail != list(value.shape[-2:]):
            continue
        become(graph, node, "Identity", [source])
        rewrites.append(Rewrite("constant-broadcast-dropped", node,
                                "Minimum(mask, BroadcastTo(constant)) → Minimum(mask, constant)"))
    return rewrites


def _read_elementwise(graph: Graph, node: str) -> bool:
    """Every reader of ``node`` is a Cast leading on to, or is, a Minimum/LogicalAnd."""
    readers = [c.node for c in graph.consumers(node, 0)]
    return bool(readers) and all(
        graph.op(r) in ("Minimum", "LogicalAnd") or
        graph.op(r) == "Cast" and _read_elementwise(graph, r) for r in readers)


def _trailing_constants(graph: Graph, shape: Ref, count: int) -> Optional[List[int]]:
    """The last ``count`` entries of a Pack'ed shape where they are constants."""
    value = graph.const_value(shape)
    if value is not None:
        return [int(v) for v in np.ravel(value)[-count:]]
    pack = producer(graph, shape, {"Pack"})
    values = [graph.const_value(r) for r in graph.inputs(pack)[-count:]] if pack else [None]
    return None if any(v is None or v.size != 1 for v in values) else \
        [int(np.ravel(v)[0]) for v in values]


def compare_before_expand(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``Greater(ExpandDims(x, a), c)`` → ``ExpandDims(Greater(x, c), a)``: a comparison with a
    scalar is elementwise, and a new axis of size 1 holds the same elements (keras-hub's Softmax
    compares its expanded int mask with 0)."""
    rewrites = []
    for node in graph.names_with_ops({"Greater"}):
        split = _greater_than_constant(graph, node)
        expand = split and producer(graph, split[0], {"ExpandDims"})
        if not expand:
            continue
        x, axis = graph.inputs(expand)
        compared = add_node(graph, "Greater", node, "compared", [x, split[1]], node)
        tdim = graph.node(expand).attr["Tdim"]
        become(graph, node, "ExpandDims", [compared, axis], keep_attrs=())
        graph.edit_node(node).attr["T"].type = 10                      # DT_BOOL
        graph.edit_node(node).attr["Tdim"].CopyFrom(tdim)
        rewrites.append(Rewrite("compare-before-expand", node,
                                "Greater(ExpandDims(m), c) → ExpandDims(Greater(m, c))"))
    return rewrites


def minimum_as_and(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``Greater(Minimum(a, b), c)`` → ``LogicalAnd(Greater(a, c), Greater(b, c))``: the
    smaller of two numbers exceeds c exactly when both do (keras-hub merges its padding and
    causal masks as the Minimum of two int masks)."""
    rewrites = []
    for node in graph.names_with_ops({"Greater"}):
        split = _greater_than_constant(graph, node)
        minimum = split and producer(graph, split[0], {"Minimum"})
        if not minimum:
            continue
        sides = [add_node(graph, "Greater", node, "side", [side, split[1]], node)
                 for side in graph.inputs(minimum)]
        become(graph, node, "LogicalAnd", sides, keep_attrs=())
        rewrites.append(Rewrite("minimum-as-and", node,
                                "Greater(Minimum(a, b), c) → LogicalAnd(a > c, b > c)"))
    return rewrites



def _computed_and_other(graph: Graph, node: str):
    """(value, other) of Mul ``node`` where one side is computed from constants alone (GPT-2's
    band: a folded constant, or Range/GreaterEqual at seq 32+, TensorFlow evaluates it)."""
    for known, other in (graph.inputs(node), graph.inputs(node)[::-1]):
        value = computed_value(graph, known)
        if value is not None and computed_value(graph, other) is None:
            return np.asarray(value), other
    return None


def causal_band_as_select(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """Hugging Face GPT-2's causal mask ``s·b - c`` with ``b`` a 0/1 band and ``c`` the
    value ``K·(1 - b)`` (both computed from constants: folded at a short length, Range and
    GreaterEqual from seq 32) is ``SelectV2(b, s, -K)``: where b = 1 it is s·1 - 0 = s, where b = 0
    it is s·0 - K = -K (for finite scores, as every score of a model that runs is)."""
    rewrites = []
    for node in graph.names_with_ops({"Sub"}):
        product, subtracted = graph.inputs(node)
        multiply = producer(graph, product, {"Mul"})
        offset = computed_value(graph, subtracted) if multiply else None
        split = _computed_and_other(graph, multiply) if offset is not None else None
        if split is None:
            continue
        band, scores = split
        if band.ndim < 2 or not np.all((band == 0) | (band == 1)) or \
                offset.shape != band.shape or not np.any(band == 0):
            continue
        filler = offset[band == 0].ravel()
        if not np.all(filler == filler[0]) or not np.all(offset[band == 1] == 0):
            continue
        condition = add_const(graph, node, "band", band.astype(bool))
        select = add_node(graph, "SelectV2", node, "select", [
            condition, scores, add_const(graph, node, "filler", np.asarray(-filler[0],
                                                                          offset.dtype))], node)
        graph.rewire(Ref(node, 0), select)        # a Sub cannot become a 3-input op in place
        remove_unread(graph, [node])
        rewrites.append(Rewrite("causal-band-as-select", node,
                                "s·b - K·(1 - b) → SelectV2(b, s, -K)"))
    return rewrites


RULES = (constant_broadcast_dropped, compare_before_expand, minimum_as_and,
         causal_band_as_select)
