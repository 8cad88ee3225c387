"""Keras ``MultiHeadAttention`` (self-attention) → onnxruntime's ``Attention`` (com.microsoft).

Keras lowers one self-attention block over ``x`` [batch, seq, hidden] to::

    q, k, v = Einsum("abc,cde->abde", x, W) + b           (W: [hidden, heads, head_size];
                                with static shapes: Reshape(MatMul(x, W [hidden, heads·size])))
    s = Einsum("BTNH,BSNH->BNTS", q, k) · scale
    s = SelectV2(LogicalAnd(ones_like(s), ExpandDims(mask, -3)), s, filler)     (with a mask)
    c = Einsum("BNTS,BSNH->BTNH", Softmax(s), v)
    y = Einsum("abcd,cde->abe", c, Wo) + bo     (or MatMul(Reshape(c, [-1, seq, heads·size])))

which is ``Attention(x, [Wq|Wk|Wv], [bq|bk|bv], mask)`` (packed weights; ``scale`` and the
mask's ``filler`` as attributes) followed by ``MatMul(·, Wo) + bo``; the replacement produces
``y`` under its TensorFlow name. Matched by value: the three projections read the same ``x``,
weights and biases are constants, the mask is a key-padding mask ``[batch, 1, keys]`` (its
static shape says so), given to ``Attention`` as ``[batch, keys]`` int32 — ANDed with Keras'
causal mask, or that mask alone: ``unidirectional=1``. The causal mask is proven by its value
where it is computed from constants (static length: TensorFlow evaluates it, a lower
triangle); with dynamic shapes Keras computes it from the run-time length, and then its form is
the proof: Cumsum of ones over rows >= over columns is i + 1 >= j + 1 at every length, the
length being Shape(x)[1] of the attention's own input — or, with no other mask, Keras'
MatrixBandPart(ones [T, S], -1, 0), T and S the scores' own dimensions. Any other
``[batch, queries, keys]`` mask, cross-attention or unequal head sizes are left alone, saying
so.
A row whose keys are all masked differs (Keras: uniform; ``Attention``: filler added to scores).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from tfsurgery.export.onnx_splice import MICROSOFT, Fused, tensor_name
from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.fusion_match import (ADDS, computed_value, const_and_other,
                                               consumers_with_op, dimension_of, producer,
                                               scalar_near)

NAME = "fuse-attention"
WHAT = "attention → Attention"
PROJECT = "abc,cde->abde"
SCORES = "BTNH,BSNH->BNTS"
CONTEXT = "BNTS,BSNH->BTNH"
OUTPUT = "abcd,cde->abe"


def find(graph: Graph, shapes=None) -> Tuple[List[Fused], List[Tuple[str, str]]]:
    """Every self-attention block as a ``Fused``; (Softmax, why not) for the others.
    ``shapes(ref)``: a tensor's static shape (a list, None where unknown) or None."""
    found, skipped = [], []
    for softmax in graph.names_with_ops({"Softmax"}):
        result = _match(graph, softmax, shapes or (lambda ref: None))
        if isinstance(result, str):
            skipped.append((softmax, result))
        else:
            found.append(result)
    return found, skipped


def _einsum(graph: Graph, ref: Optional[Ref], equation: str) -> Optional[str]:
    node = producer(graph, ref, {"Einsum"})
    return node if node and graph.attr(node, "equation", b"") in (equation, equation.encode()) \
        else None


def _match(graph: Graph, softmax: str, shapes):
    scores, mask = _unmasked(graph, graph.inputs(softmax)[0], shapes)
    if isinstance(mask, str):
        return mask
    split = const_and_other(graph, producer(graph, scores, {"Mul"}))
    qk = _einsum(graph, split[1], SCORES) if split and split[0].size == 1 else None
    if qk is None:
        return f"Softmax input is not Einsum({SCORES}) · scale"
    contexts = [c for c in consumers_with_op(graph, softmax, {"Einsum"})
                if graph.inputs(c)[0] == Ref(softmax) and _einsum(graph, Ref(c), CONTEXT)]
    if not contexts:
        return f"Softmax is not read by Einsum({CONTEXT})"
    context = contexts[0]
    projections = [_projection(graph, ref) for ref in
                   graph.inputs(qk) + graph.inputs(context)[1:]]
    if any(p is None for p in projections):
        return f"query, key or value is not Einsum({PROJECT}, x, W) + b with constant W, b"
    if len({p[0] for p in projections}) != 1:
        return "query, key and value read different tensors (cross-attention)"
    if len({p[1].shape for p in projections}) != 1:
        return "query, key and value projections differ in shape"
    if mask is not None and isinstance(mask[2], Ref):
        if mask[2] != projections[0][0]:
            return "the run-time causal mask is not at the length of the attention's input"
        mask = (mask[0], mask[1], True)
    output = _output_projection(graph, context)
    if output is None:
        return f"the context is not read by Einsum({OUTPUT}) with a constant kernel"
    return _fused(projections, float(np.ravel(split[0])[0]), mask, output)


def _unmasked(graph: Graph, ref: Ref, shapes):
    """(scores, None) or (scores, (padding mask as [batch, 1, keys] bool or None, filler,
    causal)), or (_, why not). The condition is ExpandDims(mask, -3) — as simplify-algebra
    leaves it — or Keras' own LogicalAnd(ones_like(scores), ExpandDims(mask, -3))."""
    select = producer(graph, ref, {"SelectV2", "Select"})
    if select is None:
        return ref, None
    condition, scores, filler = graph.inputs(select)
    filler = graph.const_value(filler)
    if filler is not None and filler.size == 1 and (
            _is_lower_triangle(computed_value(graph, condition)) or     # folded whole
            _lower_band_of(graph, condition, scores)):
        return scores, (None, float(np.ravel(filler)[0]), True)
    expand = _expanded_mask(graph, condition)
    if filler is None or filler.size != 1 or expand is None:
        return scores, "the Softmax input is a SelectV2 that is not Keras' attention mask"
    mask, causal = _without_causal(graph, graph.inputs(expand)[0])
    if isinstance(causal, str):
        return scores, causal
    if mask is None:                                # the causal triangle alone
        return scores, (None, float(np.ravel(filler)[0]), causal)
    shape = shapes(mask)
    if shape is None or len(shape) != 3 or shape[1] != 1:
        return scores, (f"the mask {tensor_name(mask)} is not a key-padding mask "
                        f"[batch, 1, keys] (static shape {shape})")
    return scores, (mask, float(np.ravel(filler)[0]), causal)


def _expanded_mask(graph: Graph, condition: Ref) -> Optional[str]:
    """The ExpandDims(mask, -3 or 1) node the condition is, or is ANDed with ones_like."""
    candidates = [condition]
    both = producer(graph, condition, {"LogicalAnd"})
    if both is not None:
        for ones, expanded in (graph.inputs(both), graph.inputs(both)[::-1]):
            fill = producer(graph, ones, {"Fill"})
            if fill and scalar_near(graph.const_value(graph.inputs(fill)[1]), 1.0):
                candidates = [expanded]
    expand = producer(graph, candidates[0], {"ExpandDims"})
    axis = graph.const_value(graph.inputs(expand)[1]) if expand else None
    return expand if axis is not None and int(np.ravel(axis)[0]) in (-3, 1) else None


def _without_causal(graph: Graph, mask: Ref):
    """Split Keras' causal mask off: (padding mask, causal) when ``mask`` is LogicalAnd(padding
    mask, causal mask), (None, causal) when it is the causal mask alone, else (mask, False) — or
    (mask, why not) for a causal-looking mask that cannot be proven (see ``_causal``)."""
    alone = _causal(graph, mask)
    if alone is not None:
        return (mask, alone) if isinstance(alone, str) else (None, alone)
    both = producer(graph, mask, {"LogicalAnd"})
    if both is None:
        return mask, False
    for causal, padding in (graph.inputs(both), graph.inputs(both)[::-1]):
        found = _causal(graph, causal)
        if found is not None:
            return (mask, found) if isinstance(found, str) else (padding, found)
    return mask, False


def _causal(graph: Graph, ref: Ref):
    """True where ``ref`` is proven a causal mask by its value (computed from constants alone,
    TensorFlow evaluates it: a lower triangle); the tensor ``x`` where it is Keras' triangle of
    ``x``'s run-time length (dynamic shapes; ``_match`` checks ``x`` is the attention's
    input); why not for another GreaterEqual; None for anything else."""
    if _is_lower_triangle(computed_value(graph, ref)):
        return True
    if producer(graph, ref, {"GreaterEqual"}) is None:
        return None
    length_of = _runtime_causal(graph, ref)
    return length_of if length_of is not None else (
        f"the causal mask {tensor_name(ref)} is computed at run time in a form other than "
        "Keras' (Cumsum over rows >= Cumsum over columns of ones [1, n, n], n = Shape(x)[1])")


def _lower_band_of(graph: Graph, ref: Ref, scores: Ref) -> bool:
    """Keras' causal mask with no other mask, at a run-time length: MatrixBandPart(ones [T, S],
    -1, 0) — 1 where j <= i — under new leading axes, T and S the last two dimensions of the
    ``scores`` it masks: the lower triangle of every [T, S]."""
    cut = producer(graph, ref, {"StridedSlice"})
    if cut is not None:
        if not _adds_leading_axes(graph, cut):
            return False
        ref = graph.inputs(cut)[0]
    band = producer(graph, ref, {"MatrixBandPart"})
    fill = band and producer(graph, graph.inputs(band)[0], {"Fill"})
    pack = fill and producer(graph, graph.inputs(fill)[0], {"Pack"})
    if not pack or not scalar_near(graph.const_value(graph.inputs(fill)[1]), 1.0) or \
            not scalar_near(graph.const_value(graph.inputs(band)[1]), -1.0) or \
            not _is_value(graph.const_value(graph.inputs(band)[2]), 0):
        return False
    dims = [dimension_of(graph, d) for d in graph.inputs(pack)]    # scores: [B, N, T, S]
    return dims in ([(scores, 2), (scores, 3)], [(scores, -2), (scores, -1)])


def _adds_leading_axes(graph: Graph, cut: str) -> bool:
    """The StridedSlice only puts new axes in front (``t[None, None, :, :]``)."""
    new_axes, begins, ends = (graph.attr(cut, m, 0) for m in
                              ("new_axis_mask", "begin_mask", "end_mask"))
    strides = graph.const_value(graph.inputs(cut)[3])
    if strides is None or np.any(strides != 1) or graph.attr(cut, "shrink_axis_mask", 0) or \
            graph.attr(cut, "ellipsis_mask", 0):
        return False
    rest = ((1 << strides.size) - 1) ^ new_axes        # the axes after the new ones: whole
    return new_axes & (new_axes + 1) == 0 and begins & rest == rest and ends & rest == rest


def _is_value(value, number: int) -> bool:
    return value is not None and value.size == 1 and int(np.ravel(value)[0]) == number


def _runtime_causal(graph: Graph, ref: Ref) -> Optional[Ref]:
    """``x`` where ``ref`` is Keras' causal mask at ``x``'s run-time length n:
    GreaterEqual(Cumsum(ones, -2), Cumsum(ones, -1)), ones = Fill([1, n, n], 1), n =
    Shape(x)[1]. Element (i, j) compares i + 1 with j + 1: the lower triangle at every n."""
    greater = producer(graph, ref, {"GreaterEqual"})
    rows, cols = (producer(graph, side, {"Cumsum"}) for side in graph.inputs(greater))
    if not rows or not cols or graph.inputs(rows)[0] != graph.inputs(cols)[0] or any(
            graph.attr(c, flag, False) for c in (rows, cols) for flag in ("exclusive", "reverse")):
        return None
    axes = [graph.const_value(graph.inputs(c)[1]) for c in (rows, cols)]
    if any(a is None or a.size != 1 for a in axes) or \
            (int(np.ravel(axes[0])[0]) % 3, int(np.ravel(axes[1])[0]) % 3) != (1, 2):
        return None
    fill = producer(graph, graph.inputs(rows)[0], {"Fill"})
    pack = fill and producer(graph, graph.inputs(fill)[0], {"Pack"})
    if not pack or not scalar_near(graph.const_value(graph.inputs(fill)[1]), 1.0):
        return None
    dims = graph.inputs(pack)
    if len(dims) != 3 or not scalar_near(graph.const_value(dims[0]), 1.0) or dims[1] != dims[2]:
        return None
    return _sequence_length_of(graph, dims[1])


def _sequence_length_of(graph: Graph, ref: Ref) -> Optional[Ref]:
    """``x`` where ``ref`` is Shape(x)[1]."""
    dimension = dimension_of(graph, ref)
    return dimension[0] if dimension and dimension[1] == 1 else None


def _is_lower_triangle(value: Optional[np.ndarray]) -> bool:
    """``value`` is a [.., seq, seq] boolean lower triangle (ones on and below the diagonal)."""
    if value is None or value.ndim < 2 or value.size != value.shape[-1] * value.shape[-2] or \
            value.shape[-1] != value.shape[-2]:
        return False
    square = value.reshape(value.shape[-2:])
    return np.array_equal(square.astype(bool), np.tril(np.ones(square.shape, bool)))


def _projection(graph: Graph, ref: Ref):
    """(x, W [hidden, heads, size], b [heads, size]) of Einsum(PROJECT, x, W) + b, or of its
    static-shape lowering Reshape(MatMul(x, W [hidden, heads·size]), [-1, seq, heads, size])."""
    split = const_and_other(graph, producer(graph, ref, ADDS))
    bias, product = split if split else (None, ref)
    x, weight = _projected(graph, product)
    if weight is None or weight.ndim != 3:
        return None
    bias = np.zeros(weight.shape[1:], np.float32) if bias is None else bias
    if bias.shape != weight.shape[1:]:
        return None
    return x, weight.astype(np.float32), bias.astype(np.float32)


def _projected(graph: Graph, product: Ref):
    """(x, W [hidden, heads, size]) of the projection ``product``, or (None, None)."""
    einsum = _einsum(graph, product, PROJECT)
    if einsum:
        return graph.inputs(einsum)[0], graph.const_value(graph.inputs(einsum)[1])
    reshape = producer(graph, product, {"Reshape"})
    matmul = reshape and _matmul_by_const(graph, graph.inputs(reshape)[0])
    shape = graph.const_value(graph.inputs(reshape)[1]) if reshape else None
    if not matmul or shape is None or shape.size != 4:
        return None, None
    x, weight = matmul
    heads, size = (int(d) for d in shape[2:])
    if weight.ndim != 2 or weight.shape[1] != heads * size:
        return None, None
    return x, weight.reshape(weight.shape[0], heads, size)


def _matmul_by_const(graph: Graph, ref: Ref):
    """(x, W) of MatMul/BatchMatMulV2(x, W) with a constant 2-D W and no transposes."""
    node = producer(graph, ref, {"MatMul", "BatchMatMulV2", "BatchMatMul"})
    if node is None or any(graph.attr(node, a, False) for a in
                           ("transpose_a", "transpose_b", "adj_x", "adj_y")):
        return None
    weight = graph.const_value(graph.inputs(node)[1])
    return (graph.inputs(node)[0], weight) if weight is not None and weight.ndim == 2 else None


def _output_projection(graph: Graph, context: str):
    """(output node, Wo [heads·size, hidden], bo or None) of Einsum(OUTPUT, context, Wo) + bo,
    or of its lowering MatMul(Reshape(context, [-1, seq, heads·size]), Wo) + bo."""
    for reader in consumers_with_op(graph, context, {"Einsum", "Reshape"}):
        if graph.op(reader) == "Einsum":
            weight = graph.const_value(graph.inputs(reader)[1])
            product = reader if _einsum(graph, Ref(reader), OUTPUT) else None
        else:
            products = [m for m in consumers_with_op(graph, reader, {"MatMul", "BatchMatMulV2"})
                        if _matmul_by_const(graph, Ref(m))]
            product = products[0] if products else None
            weight = _matmul_by_const(graph, Ref(product))[1] if product else None
        if product is None or weight is None or weight.ndim not in (2, 3):
            continue
        flat = weight.reshape(-1, weight.shape[-1]).astype(np.float32)
        for add in consumers_with_op(graph, product, ADDS):
            split = const_and_other(graph, add)
            if split and split[0].shape == (weight.shape[-1],):
                return add, flat, split[0].astype(np.float32)
        return product, flat, None
    return None


def _fused(projections, scale: float, mask, output) -> Fused:
    from onnx import TensorProto, helper
    x = tensor_name(projections[0][0])
    out, w_out, b_out = output
    heads = projections[0][1].shape[1]
    hidden = projections[0][1].shape[0]
    prefix = f"{out}/fused"
    weights = {f"{prefix}/qkv_weight": np.concatenate([w.reshape(hidden, -1)
                                                       for _, w, _ in projections], axis=1),
               f"{prefix}/qkv_bias": np.concatenate([b.reshape(-1) for _, _, b in projections]),
               f"{prefix}/out_weight": w_out}
    nodes, reads, mask_index = [], [x], ""
    attributes = dict(num_heads=int(heads), scale=scale)
    if mask is not None:
        bool_mask, filler, causal = mask
        attributes["unidirectional"] = int(causal)
        attributes["mask_filter_value"] = filler
    if mask is not None and bool_mask is not None:
        reads.append(tensor_name(bool_mask))
        weights[f"{prefix}/mask_axis"] = np.array([1], np.int64)
        nodes += [helper.make_node("Squeeze", [tensor_name(bool_mask), f"{prefix}/mask_axis"],
                                   [f"{prefix}/mask_2d"], name=f"{prefix}/mask_squeeze"),
                  helper.make_node("Cast", [f"{prefix}/mask_2d"], [f"{prefix}/mask_index"],
                                   name=f"{prefix}/mask_cast", to=TensorProto.INT32)]
        mask_index = f"{prefix}/mask_index"
    inputs = [x, f"{prefix}/qkv_weight", f"{prefix}/qkv_bias"] + ([mask_index] if mask_index
                                                                   else [])
    nodes.append(helper.make_node("Attention", inputs, [f"{prefix}/context"],
                                  name=f"{prefix}/Attention", domain=MICROSOFT, **attributes))
    projected = f"{out}:0" if b_out is None else f"{prefix}/projected"
    nodes.append(helper.make_node("MatMul", [f"{prefix}/context", f"{prefix}/out_weight"],
                                  [projected], name=f"{prefix}/MatMul"))
    if b_out is not None:
        weights[f"{prefix}/out_bias"] = b_out
        nodes.append(helper.make_node("Add", [projected, f"{prefix}/out_bias"], [f"{out}:0"],
                                      name=f"{prefix}/Add"))
    return Fused(WHAT, f"{out}:0", reads, nodes, weights)
