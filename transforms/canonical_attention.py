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
from tfsurgery.transforms.fusion_match import const_and_other, producer

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


RULES = (divide_as_multiply, batch_matmul_as_einsum, transposes_into_einsum, einsum_spelling,
         query_scale_onto_scores, softmax_shift)
