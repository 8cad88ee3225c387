"""Canonical forms of attention spellings (``canonical_forms``' rules) for ``fuse_attention``.

The matcher reads one form: ``Einsum(BTNH,BSNH->BNTS)(q, k) · scale``, a mask, ``Softmax``,
``Einsum(BNTS,BSNH->BTNH)(p, v)``. Producers write the same function as batched matmuls between
transposes (Keras 3's TF backend lowers keras-hub's einsums so; Hugging Face writes
``BatchMatMulV2(q, k, adj_y=True)``), with other einsum letters and operand orders (tf_keras'
``aecd,abcd->acbe``), with the scale on the query or as a division. Each rule below rewrites
one of these spellings on the export's private copy, keeping the names the splice needs, and
says why it is exact.
"""
from __future__ import annotations

import string
from typing import List, Optional, Tuple

import numpy as np

from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref
from tfsurgery.transforms.canonical_forms import Rewrite, Shapes, add_const, add_node, become
from tfsurgery.transforms.fusion_match import ADDS, const_and_other, dimension_of, producer

BATCH_MATMULS = {"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"}
# the spellings fuse_attention reads (its SCORES and CONTEXT), operands in its order
KNOWN = ("BTNH,BSNH->BNTS", "BNTS,BSNH->BTNH")


def _rank(graph: Graph, shapes: Shapes, ref: Ref) -> Optional[int]:
    """A tensor's rank: an Einsum's from its equation (rules add Einsums shapes() does not
    know), a Transpose's from its permutation, else from the static shapes."""
    if graph.op(ref) == "Einsum" and ref.port == 0:
        output = _equation(graph, ref.node)[1]
        return None if "." in output else len(output)
    if graph.op(ref) == "Transpose" and ref.port == 0:
        perm = graph.const_value(graph.inputs(ref.node)[1])
        if perm is not None:
            return int(perm.size)
    shape = shapes(ref)
    return None if shape is None else len(shape)


def _equation(graph: Graph, node: str) -> Tuple[List[str], str]:
    equation = graph.attr(node, "equation", b"")
    equation = equation.decode() if isinstance(equation, bytes) else equation
    operands, _, output = equation.partition("->")
    return operands.split(","), output


def _set_einsum(graph: Graph, node: str, operands: List[str], output: str) -> None:
    graph.edit_node(node).attr["equation"].s = f"{','.join(operands)}->{output}".encode()


def batch_matmul_as_einsum(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``BatchMatMul(x, y, adj_x, adj_y)`` of two rank-r tensors (r = 3 or 4) is
    ``Einsum(..ij,..jk->..ik)`` with ``ij`` → ``ji`` for ``adj_x`` and ``jk`` → ``kj`` for
    ``adj_y`` (real inputs: the adjoint is the transpose): the same sum of products over ``j``
    for every batch index. Where BatchMatMulV2 would broadcast a batch dimension of 1 the Einsum
    refuses to run; the attention matcher then proves q, k and v are projections of one input
    into the same heads, so their batch dimensions are equal."""
    rewrites = []
    for node in graph.names_with_ops(BATCH_MATMULS):
        x, y = graph.inputs(node)[:2]
        ranks = {_rank(graph, shapes, x), _rank(graph, shapes, y)}
        if len(ranks) != 1 or ranks.pop() not in (3, 4) or \
                graph.attr(node, "T", None) is None:
            continue
        batch = "ab"[:_rank(graph, shapes, x) - 2]
        left = batch + ("ji" if graph.attr(node, "adj_x", False) else "ij")
        right = batch + ("kj" if graph.attr(node, "adj_y", False) else "jk")
        become(graph, node, "Einsum", [x, y])
        graph.edit_node(node).attr["N"].i = 2
        _set_einsum(graph, node, [left, right], batch + "ik")
        rewrites.append(Rewrite("batch-matmul-as-einsum", node, "BatchMatMul → Einsum"))
    return rewrites


def transposes_into_einsum(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``Einsum(.., Transpose(a, p), ..)`` is the Einsum reading ``a`` with its letters
    permuted (axis ``p[k]`` of ``a`` is axis ``k`` of the transpose), and ``Transpose(Einsum,
    p)`` the Einsum writing its output letters in the order ``p``: a transpose only renames
    which index is which, and an einsum names indices by letter."""
    rewrites = []
    # outputs first: an einsum reading Transpose(Einsum) then reads the folded einsum's name
    for node in graph.names_with_ops({"Transpose"}):
        source, perm = graph.inputs(node)
        perm = graph.const_value(perm)
        if producer(graph, source, {"Einsum"}) is None or perm is None:
            continue
        operands, output = _equation(graph, source.node)
        if "." in output or perm.size != len(output):
            continue
        inputs = graph.inputs(source.node)
        become(graph, node, "Einsum", inputs)
        graph.edit_node(node).attr["N"].i = len(inputs)
        _set_einsum(graph, node, operands, "".join(output[int(p)] for p in perm))
        rewrites.append(Rewrite("transposes-into-einsum", node, "Transpose(Einsum) → Einsum"))
    for node in graph.names_with_ops({"Einsum"}):
        rewrites += _fold_operand_transposes(graph, node)
    return rewrites


def _fold_operand_transposes(graph: Graph, node: str) -> List[Rewrite]:
    rewrites = []
    while True:
        operands, output = _equation(graph, node)
        for index, ref in enumerate(graph.inputs(node)):
            transpose = producer(graph, ref, {"Transpose"})
            perm = transpose and graph.const_value(graph.inputs(transpose)[1])
            if perm is None or "." in operands[index] or perm.size != len(operands[index]):
                continue
            letters = [""] * perm.size
            for k, p in enumerate(perm):
                letters[int(p)] = operands[index][k]
            operands[index] = "".join(letters)
            graph.set_input(node, index, graph.inputs(transpose)[0])
            _set_einsum(graph, node, operands, output)
            rewrites.append(Rewrite("transposes-into-einsum", node, "Einsum(Transpose) → Einsum"))
            break
        else:
            return rewrites


def _normalised(operands: List[str], output: str) -> str:
    """The equation with its letters renamed in order of first appearance."""
    names = {}
    for letter in "".join(operands) + output:
        names.setdefault(letter, string.ascii_lowercase[len(names)])
    return ",".join("".join(names[c] for c in op) for op in operands) + "->" + \
        "".join(names[c] for c in output)


def einsum_spelling(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """A two-operand Einsum that is one of the attention's (``KNOWN``) up to the names of its
    letters, or with its operands swapped, is written as that one: renaming summation and
    output letters consistently, or swapping operands with their subscripts, is the same sum
    (tf_keras writes the scores as ``aecd,abcd->acbe`` of (key, query))."""
    rewrites = []
    for node in graph.names_with_ops({"Einsum"}):
        operands, output = _equation(graph, node)
        if len(operands) != 2 or "." in "".join(operands) + output:
            continue
        spelled = f"{','.join(operands)}->{output}"
        for known in KNOWN:
            known_operands, known_output = known.split("->")
            known_operands = known_operands.split(",")
            target = _normalised(known_operands, known_output)
            if spelled != known and _normalised(operands, output) == target:
                _set_einsum(graph, node, known_operands, known_output)
            elif _normalised(operands[::-1], output) == target:
                x, y = graph.inputs(node)
                graph.set_input(node, 0, y)
                graph.set_input(node, 1, x)
                _set_einsum(graph, node, known_operands, known_output)
            else:
                continue
            rewrites.append(Rewrite("einsum-spelling", node, f"Einsum {spelled} → {known}"))
            break
    return rewrites


def divide_as_multiply(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``x / c`` with a constant scalar ``c`` on the right is ``x · (1/c)``, where it scales the
    scores (Hugging Face divides them by √d) or a query or key before them (DistilBERT): equal
    up to one rounding of ``1/c`` (none for a power of two, as √d of 16 or 64 is)."""
    rewrites = []
    for node in graph.names_with_ops({"RealDiv"}):
        x, c = graph.inputs(node)
        value = graph.const_value(c)
        if value is None or value.size != 1 or graph.const_value(x) is not None or \
                float(np.ravel(value)[0]) == 0.0 or not _touches_einsum(graph, node, x):
            continue
        reciprocal = (1.0 / np.asarray(value, np.float64)).astype(value.dtype)
        become(graph, node, "Mul", [x, add_const(graph, node, "reciprocal", reciprocal)])
        rewrites.append(Rewrite("divide-as-multiply", node, "RealDiv by a constant → Mul"))
    return rewrites


def _touches_einsum(graph: Graph, node: str, x: Ref) -> bool:
    """``node`` divides an Einsum's result or feeds an Einsum (through transposes/reshapes)."""
    products = {"Einsum"} | BATCH_MATMULS
    if producer(graph, x, products):
        return True
    frontier = [node]
    for _ in range(3):
        readers = [c.node for name in frontier for c in graph.consumers(name, 0)]
        if any(graph.op(r) in products for r in readers):
            return True
        frontier = [r for r in readers if graph.op(r) in ("Transpose", "Reshape")]
    return False


def query_scale_onto_scores(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``Einsum(BTNH,BSNH->BNTS)(q · c, k)`` with a constant scalar ``c`` (tf_keras and
    keras-hub scale the query before the scores) is ``Einsum(q, k) · c``: the einsum is linear
    in each operand, so a scalar factor moves out of the sum — equal up to rounding (none for a
    power of two, as 1/√16 and 1/√64 are)."""
    rewrites = []
    for node in graph.names_with_ops({"Einsum"}):
        if graph.attr(node, "equation", b"") not in (KNOWN[0], KNOWN[0].encode()):
            continue
        for index, ref in enumerate(graph.inputs(node)):
            split = const_and_other(graph, producer(graph, ref, {"Mul"}))
            if split is None or split[0].size != 1:
                continue
            inputs = list(graph.inputs(node))
            inputs[index] = split[1]
            unscaled = add_node(graph, "Einsum", node, "unscaled", inputs, node)
            for key in ("equation", "N"):
                graph.edit_node(unscaled.node).attr[key].CopyFrom(graph.node(node).attr[key])
            become(graph, node, "Mul", [unscaled, add_const(graph, node, "scale",
                                                             split[0].reshape(()))])
            rewrites.append(Rewrite("query-scale-onto-scores", node,
                                    "Einsum(q · c, k) → Einsum(q, k) · c"))
            break
    return rewrites


def softmax_shift(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """``Softmax(x + c)`` with a constant scalar ``c`` is ``Softmax(x)``: softmax is invariant
    to adding one number to every score (exp(x + c) / Σ exp(x + c) = exp(x) / Σ exp(x))."""
    rewrites = []
    for node in graph.names_with_ops({"Softmax"}):
        split = const_and_other(graph, producer(graph, graph.inputs(node)[0], {"AddV2", "Add"}))
        if split is not None and split[0].size == 1:
            graph.set_input(node, 0, split[1])
            rewrites.append(Rewrite("softmax-shift", node, "Softmax(x + c) → Softmax(x)"))
    return rewrites


def _tensordot(graph: Graph, shapes: Shapes, ref: Ref):
    """(x, W [H, O]) where ``ref`` is tf_keras' Dense on a rank-3 ``x`` [B, S, H]:
    Reshape(MatMul(Reshape(x, [-1, H]), W), [B, S, O]) (``Tensordot``), the static shapes saying
    both ends are [·, S, ·] — the same product per position as Einsum(abc,cd->abd); or
    hand-written TF's ``tf.matmul(x, W)``, a BatchMatMulV2 of x by a constant matrix (which
    broadcasts W over [B, S]: the same product per position)."""
    direct = producer(graph, ref, BATCH_MATMULS)
    if direct and not any(graph.attr(direct, a, False) for a in ("adj_x", "adj_y")):
        x, weight = graph.inputs(direct)[0], graph.const_value(graph.inputs(direct)[1])
        shape = shapes(x)
        if weight is not None and weight.ndim == 2 and shape is not None and \
                len(shape) == 3 and shape[2] == weight.shape[0]:
            return x, weight
        return None
    outer = producer(graph, ref, {"Reshape"})
    matmul = outer and producer(graph, graph.inputs(outer)[0], {"MatMul"})
    if not matmul or any(graph.attr(matmul, t, False) for t in ("transpose_a", "transpose_b")):
        return None
    inner = producer(graph, graph.inputs(matmul)[0], {"Reshape"})
    weight = graph.const_value(graph.inputs(matmul)[1])
    if not inner or weight is None or weight.ndim != 2:
        return None
    x = graph.inputs(inner)[0]
    flat, before, after = graph.const_value(graph.inputs(inner)[1]), shapes(x), shapes(ref)
    if flat is None or list(np.ravel(flat)) != [-1, weight.shape[0]] or before is None or \
            after is None or len(before) != 3 or len(after) != 3 or \
            before[2] != weight.shape[0] or after[2] != weight.shape[1]:
        return None
    kept = before[1] is not None and before[1] == after[1] or \
        _leading_axes_of(graph, graph.inputs(outer)[1], x, weight.shape[1])
    return (x, weight) if kept else None


def _leading_axes_of(graph: Graph, shape: Ref, x: Ref, last: int) -> bool:
    """``shape`` is tf_keras Tensordot's own ConcatV2(Gather(Shape(x), [0, 1]), [last]):
    x's first two dimensions, then ``last``."""
    concat = producer(graph, shape, {"ConcatV2"})
    parts = graph.inputs(concat) if concat else []
    gather = len(parts) == 3 and producer(graph, parts[0], {"GatherV2", "Gather"})
    source = gather and producer(graph, graph.inputs(gather)[0], {"Shape"})
    if not source or graph.inputs(source)[0] != x:
        return False
    axes = graph.const_value(graph.inputs(gather)[1])
    tail = graph.const_value(parts[1])
    return axes is not None and list(np.ravel(axes)) == [0, 1] and tail is not None and \
        list(np.ravel(tail)) == [last] and \
        all(v is not None and int(np.ravel(v)[0]) == 0
            for v in (graph.const_value(graph.inputs(gather)[2]) if len(
                graph.inputs(gather)) > 2 else np.zeros(1), graph.const_value(parts[2])))


def _batch_then_rest(graph: Graph, shape: Ref, count: int) -> bool:
    """``shape`` is Pack(Shape(t)[0], -1, c...) (Hugging Face's head split and merge): the
    batch dimension read from a tensor of the block, the positions inferred (-1), then
    ``count`` - 2 constants."""
    pack = producer(graph, shape, {"Pack"})
    parts = graph.inputs(pack) if pack else []
    if len(parts) != count or not dimension_of(graph, parts[0]) or \
            dimension_of(graph, parts[0])[1] != 0:
        return False
    values = [graph.const_value(p) for p in parts[1:]]
    return all(v is not None and v.size == 1 for v in values) and \
        int(np.ravel(values[0])[0]) == -1


def head_split_projection(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """Hugging Face's query/key/value: ``Reshape(Dense(x) + b, [B, S, N, h])`` with Dense a
    Tensordot (``_tensordot``) is ``Einsum(abc,cde->abde, x, W') + b'``, W' = W reshaped [H, N,
    h] and b' = b reshaped [N, h]: splitting the last axis of every position's product into
    heads is the same row-major reshape of the weight's columns (static shapes prove the
    positions [B, S] are kept)."""
    rewrites = []
    for node in graph.names_with_ops({"Reshape"}):
        after = shapes(Ref(node, 0))
        add = producer(graph, graph.inputs(node)[0], {"BiasAdd", "AddV2", "Add"})
        split = add and const_and_other(graph, add)
        dense = split and _tensordot(graph, shapes, split[1])
        if not dense or after is None or len(after) != 4 or None in after[2:]:
            continue
        x, weight = dense
        heads, size = after[2], after[3]
        if heads * size != weight.shape[1] or split[0].size != weight.shape[1] or not (
                after[1] is not None and shapes(split[1])[1] == after[1] or
                _batch_then_rest(graph, graph.inputs(node)[1], 4)):
            continue
        kernel = add_const(graph, node, "kernel", weight.reshape(weight.shape[0], heads, size))
        einsum = add_node(graph, "Einsum", node, "projection", [x, kernel], node)
        graph.edit_node(einsum.node).attr["N"].i = 2
        graph.edit_node(einsum.node).attr["equation"].s = b"abc,cde->abde"
        bias = add_const(graph, node, "bias", split[0].reshape(heads, size))
        become(graph, node, "AddV2", [einsum, bias])
        rewrites.append(Rewrite("head-split-projection", node,
                                "Reshape(Dense(x), heads) → Einsum(abc,cde->abde) + b"))
    return rewrites


def head_merge_projection(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """Hugging Face's attention output: ``Dense(Reshape(c, [B, S, N·h]))`` of the context
    ``c`` [B, S, N, h] (a Tensordot, ``_tensordot``) is ``Einsum(abcd,cde->abe, c, W')``, W' =
    W reshaped [N, h, O]: merging the heads row-major and multiplying contracts over (N, h)
    with the weight's rows reshaped alike (static shapes prove [B, S] kept)."""
    rewrites = []
    for node in graph.names_with_ops({"Reshape"} | BATCH_MATMULS):
        dense = _tensordot(graph, shapes, Ref(node, 0))
        merge = dense and producer(graph, dense[0], {"Reshape"})
        if not merge:
            continue
        context, weight = graph.inputs(merge)[0], dense[1]
        heads_shape = shapes(context)
        if heads_shape is None or len(heads_shape) != 4 or None in heads_shape[2:] or \
                heads_shape[2] * heads_shape[3] != weight.shape[0] or not (
                    heads_shape[1] is not None and heads_shape[1] == shapes(dense[0])[1] or
                    _batch_then_rest(graph, graph.inputs(merge)[1], 3)):
            continue
        kernel = add_const(graph, node, "kernel",
                           weight.reshape(heads_shape[2], heads_shape[3], weight.shape[1]))
        become(graph, node, "Einsum", [context, kernel])
        graph.edit_node(node).attr["N"].i = 2
        graph.edit_node(node).attr["equation"].s = b"abcd,cde->abe"
        rewrites.append(Rewrite("head-merge-projection", node,
                                "Dense(Reshape(context, merged heads)) → Einsum(abcd,cde->abe)"))
    return rewrites


def _row(bias: np.ndarray) -> Optional[np.ndarray]:
    """A bias added to a [rows, O] product, [O] or [1, O] (Conv1D keeps it [1, O]), as [O]."""
    return bias.reshape(-1) if bias.ndim in (1, 2) and bias.shape[0] in (1, bias.size) else None


def _conv1d(graph: Graph, shapes: Shapes, ref: Ref):
    """(x, W [H, O], b [O]) where ``ref`` is Hugging Face GPT-2's Conv1D on x [B, S, H]:
    Reshape(MatMul(Reshape(x, [-1, H]), W) + b, [B, S, O]), static shapes saying both ends are
    [·, S, ·] — the same product per position as Einsum(abc,cd->abd) + b."""
    outer = producer(graph, ref, {"Reshape"})
    split = outer and const_and_other(graph, producer(graph, graph.inputs(outer)[0], ADDS))
    matmul = split and producer(graph, split[1], {"MatMul"})
    if not matmul or any(graph.attr(matmul, t, False) for t in ("transpose_a", "transpose_b")):
        return None
    inner = producer(graph, graph.inputs(matmul)[0], {"Reshape"})
    weight, bias = graph.const_value(graph.inputs(matmul)[1]), _row(split[0])
    if not inner or weight is None or weight.ndim != 2 or bias is None or \
            bias.shape != weight.shape[1:]:
        return None
    x = graph.inputs(inner)[0]
    flat, before, after = graph.const_value(graph.inputs(inner)[1]), shapes(x), shapes(ref)
    if flat is None or list(np.ravel(flat)) != [-1, weight.shape[0]] or before is None or \
            after is None or len(before) != 3 or len(after) != 3 or before[1] is None or \
            before[1] != after[1] or before[2] != weight.shape[0] or \
            after[2] != weight.shape[1]:
        return None
    return x, weight, bias


def packed_projection_split(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """GPT-2's packed query/key/value: ``Reshape(Split(n, last axis)(Conv1D(x))[k], [B, S, N,
    h])`` → ``Einsum(abc,cde->abde, x, W_k') + b_k'``, W_k the k-th of n column blocks of W
    (reshaped [H, N, h]) and b_k that of b: the k-th block of columns of x·W + b is x·W_k + b_k
    (each column of a product depends on its own weight column alone), and the head split is
    the row-major reshape of those columns (static shapes prove the positions [B, S] kept)."""
    rewrites = []
    for split_node in graph.names_with_ops({"Split"}):
        axis, source = graph.inputs(split_node)
        axis, count = graph.const_value(axis), graph.attr(split_node, "num_split", 0)
        dense = _conv1d(graph, shapes, source)
        if dense is None or axis is None or int(np.ravel(axis)[0]) % 3 != 2 or not count or \
                dense[1].shape[1] % count:
            continue
        x, weight, bias = dense
        block = weight.shape[1] // count
        for reader in graph.consumers(split_node):
            node, after = reader.node, shapes(Ref(reader.node, 0))
            if graph.op(node) != "Reshape" or reader.index != 0 or after is None or \
                    len(after) != 4 or None in after[1:] or after[2] * after[3] != block or \
                    after[1] != shapes(graph.inputs(node)[0])[1]:
                continue
            k = graph.inputs(node)[0].port
            columns = slice(k * block, (k + 1) * block)
            kernel = add_const(graph, node, "kernel",
                               weight[:, columns].reshape(weight.shape[0], after[2], after[3]))
            einsum = add_node(graph, "Einsum", node, "projection", [x, kernel], node)
            graph.edit_node(einsum.node).attr["N"].i = 2
            graph.edit_node(einsum.node).attr["equation"].s = b"abc,cde->abde"
            bias_k = add_const(graph, node, "bias", bias[columns].reshape(after[2], after[3]))
            become(graph, node, "AddV2", [einsum, bias_k])
            rewrites.append(Rewrite("packed-projection-split", node,
                                    "Reshape(Split(x·[Wq|Wk|Wv] + b)[k], heads) → "
                                    "Einsum(abc,cde->abde, x, W_k) + b_k"))
    return rewrites


def conv1d_head_merge(graph: Graph, shapes: Shapes) -> List[Rewrite]:
    """GPT-2's attention output: ``Conv1D`` reading the context c [B, S, N, h] flattened to
    [B·S, N·h] (``Reshape(c, [-1, N·h])``, the head merge and Conv1D's own flattening in one)
    is ``Einsum(abcd,cde->abe, c, W') + b``, W' = W reshaped [N, h, O]: the rows of the
    flattened c are the positions (b, s) in order and its columns the heads merged row-major,
    so contracting over (N, h) with W's rows reshaped alike gives every position's product."""
    rewrites = []
    for node in graph.names_with_ops({"Reshape"}):
        dense = _conv1d_on_heads(graph, shapes, Ref(node, 0))
        if dense is None:
            continue
        context, weight, bias, heads = dense
        kernel = add_const(graph, node, "kernel", weight.reshape(*heads, weight.shape[1]))
        einsum = add_node(graph, "Einsum", node, "projection", [context, kernel], node)
        graph.edit_node(einsum.node).attr["N"].i = 2
        graph.edit_node(einsum.node).attr["equation"].s = b"abcd,cde->abe"
        become(graph, node, "AddV2", [einsum, add_const(graph, node, "bias", bias)])
        rewrites.append(Rewrite("conv1d-head-merge", node, "Conv1D(Reshape(context, [-1, N·h]))"
                                " → Einsum(abcd,cde->abe) + b"))
    return rewrites


def _conv1d_on_heads(graph: Graph, shapes: Shapes, ref: Ref):
    """(c, W, b, (N, h)) where ``ref`` is Reshape(MatMul(Reshape(c [B, S, N, h], [-1, N·h]), W)
    + b, [-1, S, O]) with static S, N, h and O."""
    outer = producer(graph, ref, {"Reshape"})
    split = outer and const_and_other(graph, producer(graph, graph.inputs(outer)[0], ADDS))
    matmul = split and producer(graph, split[1], {"MatMul"})
    if not matmul or any(graph.attr(matmul, t, False) for t in ("transpose_a", "transpose_b")):
        return None
    inner = producer(graph, graph.inputs(matmul)[0], {"Reshape"})
    weight, bias = graph.const_value(graph.inputs(matmul)[1]), _row(split[0])
    if not inner or weight is None or weight.ndim != 2 or bias is None or \
            bias.shape != weight.shape[1:]:
        return None
    context = graph.inputs(inner)[0]
    flat, before = graph.const_value(graph.inputs(inner)[1]), shapes(context)
    target = graph.const_value(graph.inputs(outer)[1])
    if flat is None or list(np.ravel(flat)) != [-1, weight.shape[0]] or before is None or \
            len(before) != 4 or None in before[1:] or before[2] * before[3] != weight.shape[0] \
            or target is None or list(np.ravel(target)) != [-1, before[1], weight.shape[1]]:
        return None
    return context, weight, bias, (before[2], before[3])


RULES = (packed_projection_split, conv1d_head_merge, head_split_projection,
         head_merge_projection, divide_as_multiply, batch_matmul_as_einsum,
         transposes_into_einsum, einsum_spelling, query_scale_onto_scores, softmax_shift)
