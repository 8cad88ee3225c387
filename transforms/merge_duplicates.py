"""merge-duplicates: nodes that compute the same thing are computed once.

Two nodes are the same when they have the same op, device, attributes and inputs (control inputs
as a set); two Consts are the same when their dtype, shape and values are. Visiting producers
before consumers makes one pass reach the fixpoint: once ``a`` and ``a'`` are one node, ``f(a)``
and ``f(a')`` read the same input and merge too. The anchors are graph_transforms'
``merge_duplicate_nodes`` and Grappler's dedup. Never merged: stateful ops (variables, queues,
random numbers, prints — op_def ``is_stateful``), placeholders, v1 control-flow frame ops, and
nodes with no OpDef here. A protected node (graph input/output) is never the one removed.
"""
from __future__ import annotations

from typing import Dict, Hashable, Optional

from tensorflow.python.framework import op_def_registry

from tfsurgery.graph import Graph, Ref, parse_ref
from tfsurgery.ops import CONTROL_FLOW_V1_OPS, PLACEHOLDER_OPS
from tfsurgery.transform import Options, TransformReport, transform

MAX_ROUNDS = 5


@transform("merge-duplicates", repeat=True)
def merge_duplicates(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("merge-duplicates")
    for _ in range(MAX_ROUNDS):     # one round suffices without cycles; loops may need another
        if not _merge_round(graph, options, report):
            break
    return report


def _merge_round(graph: Graph, options: Options, report: TransformReport) -> int:
    protected = options.protected
    seen: Dict[Hashable, str] = {}
    merged = 0
    for name in graph.topological_order():
        if name not in graph:
            continue
        key = _signature(graph, name)
        if key is None:
            continue
        keeper = seen.setdefault(key, name)
        if keeper == name:
            continue
        if name in protected:
            continue
        _replace(graph, name, keeper)
        report.matched += 1
        report.rewritten.append(f"{name}: same as {keeper}")
        merged += 1
    return merged


def _signature(graph: Graph, name: str) -> Optional[Hashable]:
    """What the node computes, as a hashable key; None for nodes that must never merge."""
    node = graph.node(name)
    if node.op in PLACEHOLDER_OPS or node.op in CONTROL_FLOW_V1_OPS:
        return None
    op_def = op_def_registry.get(node.op)
    if op_def is None or op_def.is_stateful:
        return None
    data = tuple(str(parse_ref(text)) for text in node.input if not text.startswith("^"))
    control = frozenset(text for text in node.input if text.startswith("^"))
    if node.op == "Const":
        tensor = node.attr["value"].tensor
        shape = tuple(d.size for d in tensor.tensor_shape.dim)
        # Packed values are the array's bytes; other encodings (float_val, string_val, a
        # broadcast scalar) are decoded so that equal values in either encoding merge.
        value = tensor.tensor_content or _value_key(graph.const_value(Ref(name, 0),
                                                                     through_identity=False))
        attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                             for k, v in node.attr.items() if k != "value"))
        return ("Const", node.device, attrs, tensor.dtype, shape, value, control)
    attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                         for k, v in node.attr.items()))
    return (node.op, node.device, attrs, data, control)


def _value_key(value) -> Hashable:
    """Equal arrays, equal keys (strings by content: an object array's bytes are pointers)."""
    return tuple(value.ravel().tolist()) if value.dtype == object else value.tobytes()


def _replace(graph: Graph, duplicate: str, keeper: str) -> None:
    """Readers of ``duplicate`` (every port, control edges too) read ``keeper``; then it goes."""
    for consumer in graph.consumers(duplicate):
        graph.set_input(consumer.node, consumer.index,
                        Ref(keeper, consumer.ref.port, consumer.ref.control))
    graph.move_control_consumers(duplicate, keeper)
    graph.remove([duplicate])
