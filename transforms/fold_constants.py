"""fold-constants: subgraphs computed from constants alone become single constants.

Frozen Keras 3 graphs compute batch-norm parameters at run time — ``Rsqrt(var + eps) * gamma``,
``Reshape`` of gamma/beta, ReadVariableOp-style Identity chains — and tf.cond predicates may be
``LogicalNot(training)``. TensorFlow itself evaluates them (one Session run for the whole frontier);
stateful and random ops, control flow, fake quantization and anything a placeholder feeds are never
folded. A fold is kept only when it does not grow the serialized graph (think ``Fill``, ``Tile``, a
``Split`` into many constants, ``Dequantize`` of uint8 weights) and stays below
``FoldConstantsParams.max_bytes``.
"""
from __future__ import annotations

import dataclasses

import re
from typing import Dict, List, Set

import numpy as np

from tfsurgery.constants import constant_nodes, evaluate
from tfsurgery.graph import Graph, Ref, parse_ref
from tfsurgery.ops import first_line
from tfsurgery.tfsession import tf_errors
from tfsurgery.contract import Options, TransformReport, transform

NODE_BYTES = 64           # what a NodeDef costs besides its tensor (name, op, attrs), roughly


def frontier(graph: Graph, constant: Set[str], options: Options) -> Dict[str, List[int]]:
    """Computed constants someone non-constant reads (or that are outputs): name → ports read."""
    wanted: Dict[str, Set[int]] = {}
    # A Const already is one; what is left was computed (a set: in name order, so every run
    # folds alike)
    for name in sorted(constant.difference(graph.names_with_ops(("Const", "NoOp")))):
        for consumer in graph.consumers(name):
            if consumer.node not in constant:
                wanted.setdefault(name, set()).add(consumer.ref.port)
        if name in options.protected:
            wanted.setdefault(name, set()).add(0)
    return {name: sorted(ports) for name, ports in wanted.items()}


def _subgraph_bytes(graph: Graph, name: str, constant: Set[str]) -> int:
    """Roughly what the constant subgraph computing ``name`` takes in the serialized graph."""
    nodes = [n for n in graph.ancestors([name]) if n in constant]
    return sum(graph.const_nbytes(n) for n in nodes if graph.op(n) == "Const") + \
        NODE_BYTES * len(nodes)


@dataclasses.dataclass
class FoldConstantsParams:
    max_bytes: int = 64 << 20           # a folded constant may not be larger than this


@transform("fold-constants", repeat=True, params=FoldConstantsParams, constants_by_value=True)
def fold_constants(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("fold-constants")
    constant = constant_nodes(graph)
    wanted = frontier(graph, constant, options)
    if not wanted:
        return report
    values, refused = evaluate_what_runs(graph, wanted)
    for name, ports in wanted.items():
        report.matched += 1
        if name in refused:
            report.skip(name, f"TensorFlow refused to evaluate it: {refused[name]}")
            continue
        results = {port: values[str(Ref(name, port))] for port in ports}
        size = sum(np.asarray(v).nbytes + NODE_BYTES for v in results.values())
        before = _subgraph_bytes(graph, name, constant)
        if size > min(options.params_for(fold_constants).max_bytes, before):
            report.skip(name, f"folded value would take {size} bytes where its subgraph takes "
                              f"{before}: folding would grow the graph")
            continue
        if any(np.asarray(v).dtype == object for v in results.values()):
            report.skip(name, "string-valued result left as is")
            continue
        replace_by_constants(graph, name, results)
        report.rewritten.append(name)
    return report


def evaluate_what_runs(graph: Graph, wanted: Dict[str, List[int]]):
    """The values TensorFlow computes for the ``wanted`` constant tensors, in one run when it can.
    One subgraph TensorFlow refuses (an index out of range, a malformed constant) must not stop
    the others from folding: on an error the frontier is halved until each refusal is pinned to
    its node. Returns ({tensor: value}, {node: TensorFlow's reason})."""
    names = list(wanted)
    tensors = [str(Ref(name, port)) for name in names for port in wanted[name]]
    try:
        return dict(zip(tensors, evaluate(graph, tensors))), {}
    except (ValueError, TypeError, KeyError, tf_errors().OpError) as error:
        if len(names) == 1:
            return {}, {names[0]: _reason(error)}
    middle = len(names) // 2
    values, refused = {}, {}
    for half in (names[:middle], names[middle:]):
        more_values, more_refused = evaluate_what_runs(graph, {n: wanted[n] for n in half})
        values.update(more_values)
        refused.update(more_refused)
    return values, refused


def _reason(error) -> str:
    """TensorFlow's own words: an OpError's message (its str() may be only "Graph execution
    error:"), else the exception's text."""
    text = first_line(getattr(error, "message", None) or error, limit=400)
    return re.sub(r"Detected at node '[^']*' defined at \(most recent call last\):.*?"
                  r"Node: '[^']*' ", "", text)


def replace_by_constants(graph: Graph, name: str, results: Dict[int, np.ndarray]) -> None:
    """Port 0 keeps the node's name (its consumers and output name stay valid); other ports get
    new constants that their consumers are moved to."""
    device = graph.node(name).device
    for port, value in results.items():
        if port != 0:
            const = graph.add_const(f"{name}/folded_{port}", value, device=device)
            graph.rewire(Ref(name, port), const)
    if 0 in results:
        graph.remove([name])
        graph.add_const(name, results[0], device=device)
    elif not graph.consumers(name, control=True):
        graph.remove([name])
