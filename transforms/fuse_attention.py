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
causal mask as one ``[batch, queries, keys]`` mask (``_with_causal``), or that mask alone:
``unidirectional=1``. Hugging Face's additive ``scores + (1 - m)·c`` is the same mask, its filler
``c`` (``_additive``); Keras' SelectV2(mask, Softmax, 0) after the softmax zeroes a row with no
valid key (``_zero_rows_without_keys``). Other producers' spellings (batched matmuls between
transposes, other einsum letters, a pre-scaled query, Tensordot heads) reach this matcher in
this form through ``canonical_attention``'s and ``canonical_masks``' rules (GPT-2's packed
q/k/v, its causal band, keras-hub's int masks), on the export's private copy. The causal mask
is proven by its value where it is computed from constants (static length: TensorFlow
evaluates it, a lower triangle); with dynamic shapes Keras computes it from the run-time
length, and then its form is the proof: Cumsum of ones over rows >= over columns is
i + 1 >= j + 1 at every length, the length being Shape(x)[1] of the attention's own input —
or, with no other mask, Keras' MatrixBandPart(ones [T, S], -1, 0), T and S the scores' own
dimensions. Any other ``[batch, queries, keys]`` mask, cross-attention or unequal head sizes
are left alone, saying so.
A row whose keys are all masked differs (Keras: uniform; ``Attention``: filler added to scores).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from tfsurgery.export.onnx_splice import MICROSOFT, Fused, tensor_name
from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.fusion_match import (ADDS, computed_value, const_and_other,
                                               consumers_with_op, dimension_of, other_input,
                                               producer, scalar_near)

NAME = "fuse-attention"
WHAT = "attention → Attention"
PROJECT = "abc,cde->abde"
SCORES = "BTNH,BSNH->BNTS"
CONTEXT = "BNTS,BSNH->BTNH"
OUTPUT = "abcd,cde->abe"
# Hugging Face GPT-2: its causal band replaces future scores by -1e4 (canonical_masks), then the
# padding mask adds (1 - m)·(-1e4). A query row whose past keys are all padded (left padding)
# then weighs a future key by exp(-1e4) against a past one by exp(score - 1e4): the scores of
# the kernel's masked keys always enter (score + filler), so no Attention mask computes that row.
CAUSAL_THEN_ADDITIVE = (
    "a causal mask that replaces the scores (Hugging Face GPT-2's s·b - 1e4·(1 - b)) meets an "
    "additive padding mask: where every past key of a query is padded (left padding) the model "
    "weighs its future keys against its past ones by their scores, which no Attention mask "
    "computes")


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
    scale, product = (float(np.ravel(split[0])[0]), split[1]) \
        if split and split[0].size == 1 else (1.0, scores)
    qk = _einsum(graph, product, SCORES)
    if qk is None:
        return _why_not_scores(graph, product)
    probabilities, zero_masked_rows = _read_probabilities(graph, softmax, mask)
    contexts = [c for c in consumers_with_op(graph, probabilities, {"Einsum"})
                if graph.inputs(c)[0] == Ref(probabilities) and _einsum(graph, Ref(c), CONTEXT)]
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
        mask = (mask[0], mask[1], True, mask[3])
    output = _output_projection(graph, context)
    if output is None:
        return f"the context is not read by Einsum({OUTPUT}) with a constant kernel"
    fused = _fused(projections, scale, mask, output, zero_masked_rows, shapes)
    fused.fallback = _with_residual(graph, output, projections, scale, mask,
                                    zero_masked_rows, shapes)
    return fused


def _with_residual(graph: Graph, output, *args) -> Optional[Fused]:
    """The same replacement writing the residual ``Add`` after the output projection, for
    where tf2onnx's Einsum lowering renamed the projection's own output (keras-hub's
    ``abcd,cde->abe`` + bias reaches ONNX as a Squeeze of a Reshape chain)."""
    readers = [c.node for c in graph.consumers(output[0], 0)]
    if len(readers) != 1 or graph.op(readers[0]) not in ("AddV2", "Add"):
        return None
    residual = other_input(graph, readers[0], Ref(output[0]))
    return _fused(*args[:1], *args[1:3], output, *args[3:], residual=(readers[0], residual)) \
        if residual is not None else None


def _why_not_scores(graph: Graph, product: Ref) -> str:
    """The precise reason the scores are not the canonical Einsum (after canonical_attention)."""
    op = graph.op(product)
    if op == "Einsum":
        return (f"the scores are Einsum({graph.attr(product.node, 'equation', b'').decode()}), "
                f"not Einsum({SCORES}) of query and key")
    if op in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        return "the scores are a BatchMatMul of operands of unknown or unequal rank"
    return f"the Softmax input is computed by {op}, not by Einsum({SCORES}) of query and key " \
        "(· scale, masked)"


def _read_probabilities(graph: Graph, softmax: str, mask):
    """(the node the context reads the probabilities from, zero_masked_rows): the Softmax, or
    Keras' SelectV2(condition, Softmax, 0) with the condition of the mask before it — the same
    probabilities where a row has a valid key (a masked key's is exp(filler - max) = 0
    already), and 0 for a row with none (zero_masked_rows)."""
    if mask is None or len(mask) < 4 or mask[3] is None:
        return softmax, False
    for select in consumers_with_op(graph, softmax, {"SelectV2", "Select"}):
        condition, kept, zero = graph.inputs(select)
        if condition == mask[3] and kept == Ref(softmax) and \
                scalar_near(graph.const_value(zero), 0.0) and \
                not [c for c in graph.consumers(softmax, 0) if c.node != select]:
            return select, True
    return softmax, False


def _unmasked(graph: Graph, ref: Ref, shapes):
    """(scores, None) or (scores, (padding mask as [batch, 1, keys] or [batch, 1, 1, keys] or
    None, filler, causal, the select's condition or None)), or (_, why not). A select's
    condition is ExpandDims(mask, -3) — as simplify-algebra leaves it — or Keras' own
    LogicalAnd(ones_like(scores), ExpandDims(mask, -3)); an additive mask is Hugging Face's
    scores + (1 - m)·c (``_additive``)."""
    additive = _additive(graph, ref, shapes)
    if additive is not None and not isinstance(additive[1], str) and \
            producer(graph, additive[0], {"SelectV2", "Select"}):
        return additive[0], CAUSAL_THEN_ADDITIVE
    if additive is not None:
        return additive
    select = producer(graph, ref, {"SelectV2", "Select"})
    if select is None:
        return ref, None
    condition, scores, filler = graph.inputs(select)
    filler = graph.const_value(filler)
    if filler is not None and filler.size == 1 and (
            _is_lower_triangle(computed_value(graph, condition)) or     # folded whole
            _lower_band_of(graph, condition, scores)):
        return scores, (None, float(np.ravel(filler)[0]), True, condition)
    expand = _expanded_mask(graph, condition)
    if filler is None or filler.size != 1 or expand is None:
        return scores, "the Softmax input is a SelectV2 that is not Keras' attention mask"
    mask, causal = _without_causal(graph, graph.inputs(expand)[0])
    if isinstance(causal, str):
        return scores, causal
    if mask is None:                                # the causal triangle alone
        return scores, (None, float(np.ravel(filler)[0]), causal, condition)
    mask = _compared_with_zero(graph, mask)
    shape = shapes(mask)
    if shape is None or len(shape) != 3 or shape[1] != 1:
        return scores, (f"the mask {tensor_name(mask)} is not a key-padding mask "
                        f"[batch, 1, keys] (static shape {shape})")
    return scores, (mask, float(np.ravel(filler)[0]), causal, condition)


def _additive(graph: Graph, ref: Ref, shapes):
    """(scores, (m, c, False, None)) where ``ref`` is scores + (1 - m)·c, ``m`` a 0/1 key mask
    [batch, 1, 1, keys] and ``c`` a constant (Hugging Face: -1e4 or the dtype's minimum): the
    ``Attention`` kernel adds ``mask_filter_value`` = c where m is 0 and nothing where it is 1,
    the same sum for a 0/1 mask (a token mask). Else None."""
    add = producer(graph, ref, {"AddV2", "Add"})
    if add is None:
        return None
    for scores, adder in (graph.inputs(add), graph.inputs(add)[::-1]):
        split = const_and_other(graph, producer(graph, adder, {"Mul"}))
        if split is None or split[0].size != 1:
            continue
        sub = producer(graph, split[1], {"Sub"})
        if sub is None or not scalar_near(graph.const_value(graph.inputs(sub)[0]), 1.0):
            continue
        mask = graph.inputs(sub)[1]
        shape = shapes(mask)
        if shape is None or len(shape) != 4 or shape[1:3] != [1, 1]:
            return scores, (f"the additive mask {tensor_name(mask)} is not a key-padding mask "
                            f"[batch, 1, 1, keys] (static shape {shape})")
        return scores, (mask, float(np.ravel(split[0])[0]), False, None)
    return None


def _compared_with_zero(graph: Graph, mask: Ref) -> Ref:
    """``m`` where ``mask`` is Greater(m, 0) of an integer ``m`` (keras-hub's int mask):
    the kernel reads its mask as ``mask_index > 0`` itself (after a Cast to int32, exact for
    the int32 and narrower integers accepted here), else ``mask``."""
    greater = producer(graph, mask, {"Greater"})
    if greater is None or graph.attr(greater, "T", None) not in (3, 4, 5, 6) or \
            not _is_value(graph.const_value(graph.inputs(greater)[1]), 0):
        return mask
    return graph.inputs(greater)[0]


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


def _fused(projections, scale: float, mask, output, zero_masked_rows: bool = False,
           shapes=None, residual=None) -> Fused:
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
        bool_mask, filler, causal = mask[:3]
        attributes["unidirectional"] = int(causal)
        attributes["mask_filter_value"] = filler
    if mask is not None and bool_mask is not None:
        reads.append(tensor_name(bool_mask))
        shape = shapes(bool_mask) if shapes else None
        axes = [1, 2] if shape is not None and len(shape) == 4 else [1]
        weights[f"{prefix}/mask_axis"] = np.array(axes, np.int64)
        nodes += [helper.make_node("Squeeze", [tensor_name(bool_mask), f"{prefix}/mask_axis"],
                                   [f"{prefix}/mask_2d"], name=f"{prefix}/mask_squeeze"),
                  helper.make_node("Cast", [f"{prefix}/mask_2d"], [f"{prefix}/mask_index"],
                                   name=f"{prefix}/mask_cast", to=TensorProto.INT32)]
        mask_index = f"{prefix}/mask_index"
        if causal:
            nodes += _with_causal(prefix, weights)
            mask_index = f"{prefix}/mask_3d"
            attributes["unidirectional"] = 0
    inputs = [x, f"{prefix}/qkv_weight", f"{prefix}/qkv_bias"] + ([mask_index] if mask_index
                                                                   else [])
    context = f"{prefix}/context"
    nodes.append(helper.make_node("Attention", inputs, [context],
                                  name=f"{prefix}/Attention", domain=MICROSOFT, **attributes))
    if zero_masked_rows and mask_index:
        nodes += _zero_rows_without_keys(prefix, mask_index, context, weights, causal)
        context = f"{prefix}/context_kept"
    written = f"{out}:0" if residual is None else f"{prefix}/projection"
    projected = written if b_out is None else f"{prefix}/projected"
    nodes.append(helper.make_node("MatMul", [context, f"{prefix}/out_weight"],
                                  [projected], name=f"{prefix}/MatMul"))
    if b_out is not None:
        weights[f"{prefix}/out_bias"] = b_out
        nodes.append(helper.make_node("Add", [projected, f"{prefix}/out_bias"], [written],
                                      name=f"{prefix}/Add"))
    if residual is None:
        return Fused(WHAT, written, reads, nodes, weights)
    add, other = residual
    reads.append(tensor_name(other))
    nodes.append(helper.make_node("Add", [written, tensor_name(other)], [f"{add}:0"],
                                  name=f"{prefix}/residual"))
    return Fused(WHAT, f"{add}:0", reads, nodes, weights)


def _with_causal(prefix: str, weights) -> list:
    """The padding mask [B, S] ANDed with the causal triangle as one [B, S, S] mask (with
    ``unidirectional=0``): with the 2-D mask and ``unidirectional=1``, onnxruntime adds
    ``mask_filter_value`` twice where a padded key is also in the future, and a row whose keys
    are all masked (a left-padded row's first queries) then weighs only the keys masked once,
    where the model's select (one filler everywhere) weighs all alike."""
    from onnx import helper
    weights[f"{prefix}/zero"] = np.array(0, np.int64)
    weights[f"{prefix}/one"] = np.array(1, np.int64)
    weights[f"{prefix}/axis_0"] = np.array([0], np.int64)
    weights[f"{prefix}/axis_1"] = np.array([1], np.int64)
    p = prefix
    return [
        helper.make_node("Shape", [f"{p}/mask_index"], [f"{p}/mask_shape"], name=f"{p}/shape"),
        helper.make_node("Gather", [f"{p}/mask_shape", f"{p}/one"], [f"{p}/keys"],
                         name=f"{p}/keys", axis=0),
        helper.make_node("Range", [f"{p}/zero", f"{p}/keys", f"{p}/one"], [f"{p}/positions"],
                         name=f"{p}/range"),
        helper.make_node("Unsqueeze", [f"{p}/positions", f"{p}/axis_0"], [f"{p}/columns"],
                         name=f"{p}/columns"),
        helper.make_node("Unsqueeze", [f"{p}/positions", f"{p}/axis_1"], [f"{p}/rows"],
                         name=f"{p}/rows"),
        helper.make_node("LessOrEqual", [f"{p}/columns", f"{p}/rows"], [f"{p}/triangle"],
                         name=f"{p}/triangle"),
        helper.make_node("Cast", [f"{p}/triangle"], [f"{p}/triangle_int"],
                         name=f"{p}/triangle_cast", to=6),
        helper.make_node("Unsqueeze", [f"{p}/mask_index", f"{p}/axis_1"],
                         [f"{p}/mask_rows"], name=f"{p}/mask_rows"),
        helper.make_node("Mul", [f"{p}/mask_rows", f"{p}/triangle_int"], [f"{p}/mask_3d"],
                         name=f"{p}/mask_3d"),
    ]


def _zero_rows_without_keys(prefix: str, mask_index: str, context: str, weights,
                            causal: bool) -> list:
    """Keras' SelectV2(mask, Softmax, 0) after the softmax: a query row with no valid key has
    probabilities 0, its context 0 (the kernel's would be an average): the context times
    (any key valid in the row), [B, S, 1] from the 3-D mask or [B, 1, 1] from the 2-D one."""
    from onnx import helper
    p = prefix
    weights[f"{p}/last_axis"] = np.array([-1], np.int64)
    nodes = [
        helper.make_node("Cast", [mask_index], [f"{p}/mask_float"], name=f"{p}/mask_float",
                         to=1),
        helper.make_node("ReduceSum", [f"{p}/mask_float", f"{p}/last_axis"],
                         [f"{p}/valid_keys"], name=f"{p}/valid_keys", keepdims=1),
        helper.make_node("Min", [f"{p}/valid_keys", f"{p}/one_float"], [f"{p}/any_key"],
                         name=f"{p}/any_key")]
    weights[f"{p}/one_float"] = np.array(1.0, np.float32)
    row = f"{p}/any_key"
    if not causal:                                  # [B, 1] → [B, 1, 1]
        weights[f"{p}/axis_2"] = np.array([2], np.int64)
        nodes.append(helper.make_node("Unsqueeze", [row, f"{p}/axis_2"], [f"{p}/any_key_3d"],
                                      name=f"{p}/any_key_3d"))
        row = f"{p}/any_key_3d"
    nodes.append(helper.make_node("Mul", [context, row], [f"{p}/context_kept"],
                                  name=f"{p}/context_kept"))
    return nodes
