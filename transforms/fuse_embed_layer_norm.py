"""BERT's embedding → onnxruntime's ``EmbedLayerNormalization`` (com.microsoft).

A BERT-style embedding (our builders; Keras ``Embedding`` + a learned position table) sums
rows of constant tables and normalizes the sum::

    x = Gather(words, ids) [+ Gather(segments, segment_ids)] + positions[0:seq]
    y = LayerNorm(x)                                   (``fuse_layer_norm``'s pattern)

which is ``EmbedLayerNormalization(ids, segment_ids, words, positions, segments, gamma, beta)``:
the kernel adds ``words[ids] + positions[0..seq-1] + segments[segment_ids]`` and normalizes.
Matched by value: a sum (any order) of one or two ``Gather``s of constant float tables along
axis 0 with int32 ids (the kernel's only id type) of rank 2, and one constant position block
``[1, seq, hidden]`` whose ``seq`` is the ids' static length — positions 0..seq-1 exactly, the
kernel's default — added as it is or, as keras-hub's ``PositionEmbedding`` does, broadcast to
a gathered term's own shape first — or, at a run-time length n, the first n rows of a
constant table (``table[None, :n]``, n = Shape(term)[1]): the whole table goes to the kernel,
which adds rows 0..n-1; every table ``hidden`` wide, as gamma. The ids the kernel
reads are the ones TensorFlow gathers with: Keras wraps negative ids (``ids < 0 ? ids + vocab
: ids``) before its Gather, and that stays in front. The attention keeps its own mask: the
kernel's ``mask_index`` counts valid tokens (right padding only), where TensorFlow's mask may
be any 0/1 pattern. Positions from another row than 0, int64 ids, a third table, or a sum
read elsewhere too (GPT-2's pre-LN residual: its gathers would stay beside the fused op) are
left alone, saying so.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from tfsurgery.export.onnx_splice import MICROSOFT, Fused, tensor_name
from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.fuse_layer_norm import LayerNorm, layer_norms
from tfsurgery.transforms.fusion_match import dimension_of, producer

NAME = "fuse-embed-layer-norm"
WHAT = "embedding + LayerNorm → EmbedLayerNormalization"
GATHERS = {"GatherV2", "Gather"}
SUMS = {"AddV2", "Add"}
SLICES = {"StridedSlice", "Slice", "BroadcastTo"}       # a position block cut at run time
SHAPE_READERS = {"Shape", "ShapeN", "Size", "Rank"}
LAYER_NORM_READERS = {"Mean", "SquaredDifference", "Mul"}     # the ops a LayerNorm reads x with


def find(graph: Graph, shapes=None) -> Tuple[List[Fused], List[Tuple[str, str]]]:
    """Every embedding LayerNorm as a ``Fused``; (LayerNorm output, why not) for the
    LayerNorms over a sum of gathered rows that do not fit. Other LayerNorms are not ours."""
    shapes = shapes or (lambda ref: None)
    found, skipped = [], []
    for norm in layer_norms(graph)[0]:
        leaves = _summands(graph, norm.x, top=True)
        if not _looks_like_embedding(graph, leaves):
            continue
        result = _embedding(graph, leaves, norm, shapes)
        if isinstance(result, str):
            skipped.append((norm.out, result))
        else:
            found.append(result)
    return found, skipped


def _summands(graph: Graph, ref: Ref, top: bool = False, adds=None) -> List[Ref]:
    """The terms of a tree of Adds (a single term where ``ref`` is no Add); an inner sum read
    elsewhere too is a term (a residual stream is not an embedding's sum). ``adds``, if given,
    collects the tree's Add nodes."""
    add = producer(graph, ref, SUMS)
    if add is None or (not top and len(_value_readers(graph, Ref(add))) > 1):
        return [ref]
    if adds is not None:
        adds.append(add)
    return [term for summand in graph.inputs(add) for term in _summands(graph, summand,
                                                                          adds=adds)]


def _value_readers(graph: Graph, ref: Ref) -> List[str]:
    """The ops reading ``ref``'s values (Shape and the like read only its shape)."""
    return [graph.op(c.node) for c in graph.consumers(ref.node, ref.port)
            if graph.op(c.node) not in SHAPE_READERS]


def _looks_like_embedding(graph: Graph, leaves: List[Ref]) -> bool:
    """Gathered rows plus constants or slices of them: an embedding, fused or said why not."""
    def constant_ish(leaf):
        sliced = producer(graph, leaf, SLICES)
        return graph.const_value(leaf) is not None or \
            (sliced is not None and graph.const_value(graph.inputs(sliced)[0]) is not None)
    gathers = [leaf for leaf in leaves if producer(graph, leaf, GATHERS)]
    return bool(gathers) and all(constant_ish(leaf) for leaf in leaves if leaf not in gathers)


def _embedding(graph: Graph, leaves: List[Ref], norm: LayerNorm, shapes):
    if not set(_value_readers(graph, norm.x)) <= LAYER_NORM_READERS:
        return ("the embedding sum is read besides its LayerNorm (a pre-LN residual): the "
                "fused op would not replace its gathers")
    tables, rest = [], []
    for leaf in leaves:
        gathered = _gathered(graph, leaf)
        if isinstance(gathered, str):
            return gathered
        (tables if gathered else rest).append(gathered or leaf)
    if len(tables) > 2:
        return f"{len(tables)} gathered tables: the kernel takes words and segments only"
    id_shapes = [shapes(ids) for ids, _ in tables]
    if any(shape is None or len(shape) != 2 for shape in id_shapes) or \
            any(shape != id_shapes[0] for shape in id_shapes):
        return f"the ids are not [batch, seq] alike (static shapes {id_shapes})"
    hidden = norm.gamma.size
    sized = _sequence_sized(graph, norm.x, leaves)
    leading = [_leading_rows(graph, leaf, sized, hidden) for leaf in rest]
    if len(rest) == 1 and leading[0] is not None:         # table[:n] at run-time length n
        block = leading[0]
    else:
        positions = [_position_block(graph, leaf, leaves) for leaf in rest]
        if len(rest) != 1 or positions[0] is None:
            return ("the rows added are not one constant position block [1, seq, hidden] nor "
                    "the first rows of a constant table at the run-time length")
        seq = [shape[1:] for shape in id_shapes]
        block = positions[0]
        if block.ndim not in (2, 3) or block.shape[:-2] not in ((), (1,)) or \
                any(s != [block.shape[-2]] for s in seq):
            return (f"the position block {block.shape} is not [1, seq, hidden] at the ids' "
                    f"static length {seq[0]}")
    if any(t.shape[1] != hidden for _, t in tables) or block.shape[-1] != hidden:
        return "a table's width is not the LayerNorm's"
    return _fused(norm, tables, block.reshape(-1, hidden).astype(np.float32))


def _sequence_sized(graph: Graph, x: Ref, leaves: List[Ref]) -> set:
    """Nodes whose output's dimension 1 is the sequence length: the gathered terms and the
    sums of the tree (each [batch, seq, hidden])."""
    adds: List[str] = []
    _summands(graph, x, top=True, adds=adds)
    return set(adds) | {leaf.node for leaf in leaves if producer(graph, leaf, GATHERS)}


def _leading_rows(graph: Graph, leaf: Ref, sized: set, hidden: int) -> Optional[np.ndarray]:
    """The constant table [rows, hidden] when ``leaf`` is its first n rows, n = Shape(t)[1] of
    a ``sized`` tensor (the run-time length): a StridedSlice from 0 with step 1 whose only
    bounded end is n on the table's row axis (``table[None, :n]``, ``table[:, :n]``) —
    exactly what the kernel adds by default (positions 0..n-1)."""
    cut = producer(graph, leaf, {"StridedSlice"})
    table = graph.const_value(graph.inputs(cut)[0]) if cut else None
    end = producer(graph, graph.inputs(cut)[2], {"Pack"}) if cut else None
    begin, strides = (graph.const_value(graph.inputs(cut)[i]) for i in (1, 3)) if end else \
        (None, None)
    if begin is None or strides is None or table is None or table.shape[-1] != hidden or \
            graph.attr(cut, "ellipsis_mask", 0) or graph.attr(cut, "shrink_axis_mask", 0):
        return None
    new_axes, begins, ends = (graph.attr(cut, m, 0) for m in
                              ("new_axis_mask", "begin_mask", "end_mask"))
    row_axis, axis, lengths = None, 0, []
    for k, bound in enumerate(graph.inputs(end)):
        if new_axes >> k & 1:
            continue
        if not (begins >> k & 1 or int(np.ravel(begin)[k]) == 0) or int(strides[k]) != 1:
            return None
        if not ends >> k & 1:
            lengths.append(bound)
            row_axis = axis
        axis += 1
    if len(lengths) != 1 or row_axis is None or row_axis == table.ndim - 1 or \
            any(d != 1 for i, d in enumerate(table.shape[:-1]) if i != row_axis) or \
            _node_sized(graph, lengths[0], 1) not in sized:
        return None
    return table.reshape(-1, hidden)


def _position_block(graph: Graph, leaf: Ref, leaves: List[Ref]) -> Optional[np.ndarray]:
    """The constant position block ``leaf`` adds: a constant, or keras-hub's
    BroadcastTo(constant, Shape(rows)) — the shape of a gathered term, or the Pack
    [Shape(rows)[0], seq, hidden] materialize-shapes makes of it — where broadcasting to the
    term's own shape adds the same as the Add's broadcasting would."""
    value = graph.const_value(leaf)
    broadcast = producer(graph, leaf, {"BroadcastTo"})
    if value is not None or broadcast is None:
        return value
    block, shape = graph.const_value(graph.inputs(broadcast)[0]), graph.inputs(broadcast)[1]
    gathered = {leaf.node for leaf in leaves if producer(graph, leaf, GATHERS)}
    of_shape = producer(graph, shape, {"Shape"})
    if block is None or (of_shape and graph.inputs(of_shape)[0].node in gathered):
        return block
    pack = producer(graph, shape, {"Pack"})
    dims = graph.inputs(pack) if pack else []
    sizes = [graph.const_value(d) for d in dims[1:]]
    if len(dims) != 3 or [int(v) if v is not None and v.size == 1 else None
                          for v in sizes] != list(block.shape[-2:]):
        return None
    return block if _node_sized(graph, dims[0], 0) in gathered else None


def _node_sized(graph: Graph, ref: Ref, axis: int) -> Optional[str]:
    """The node t where ``ref`` is Shape(t)[axis]."""
    dimension = dimension_of(graph, ref)
    return dimension[0].node if dimension and dimension[1] == axis else None


def _gathered(graph: Graph, leaf: Ref):
    """(ids, table) where ``leaf`` is Gather(constant float table [rows, hidden], int32 ids
    [batch, seq]) along axis 0; None where it is no Gather; why not where it is another one."""
    gather = producer(graph, leaf, GATHERS)
    if gather is None:
        return None
    from tensorflow.core.framework import types_pb2
    inputs = graph.inputs(gather)
    table = graph.const_value(inputs[0])
    axis = graph.const_value(inputs[2]) if len(inputs) > 2 else np.zeros(())
    if table is None or table.ndim != 2 or table.dtype != np.float32:
        return f"{gather} does not gather a constant float32 table [rows, hidden]"
    if axis is None or int(np.ravel(axis)[0]) != 0 or graph.attr(gather, "batch_dims", 0):
        return f"{gather} does not gather rows (axis 0, no batch dims)"
    if graph.node(gather).attr["Tindices"].type != types_pb2.DT_INT32:
        return f"{gather} reads int64 ids: EmbedLayerNormalization takes int32"
    return inputs[1], table


def _fused(norm: LayerNorm, tables, positions: np.ndarray) -> Fused:
    from onnx import helper
    prefix = f"{norm.out}/fused"
    (ids, words), segment = tables[0], (tables[1] if len(tables) > 1 else None)
    weights = {f"{prefix}/word_embedding": words, f"{prefix}/position_embedding": positions,
               f"{prefix}/gamma": norm.gamma, f"{prefix}/beta": norm.beta}
    reads = [tensor_name(ids)] + ([tensor_name(segment[0])] if segment else [])
    if segment:
        weights[f"{prefix}/segment_embedding"] = segment[1]
    inputs = [reads[0], reads[1] if segment else "", f"{prefix}/word_embedding",
              f"{prefix}/position_embedding", f"{prefix}/segment_embedding" if segment else "",
              f"{prefix}/gamma", f"{prefix}/beta"]
    # mask_index (read by nothing: no mask given) is declared because onnxruntime's
    # quantize_dynamic makes QEmbedLayerNormalization, which has exactly two outputs
    node = helper.make_node("EmbedLayerNormalization", inputs,
                            [f"{norm.out}:0", f"{prefix}/mask_index"],
                            name=f"{prefix}/EmbedLayerNormalization", domain=MICROSOFT,
                            epsilon=norm.eps)
    return Fused(WHAT, f"{norm.out}:0", reads, [node], weights)

