"""merge-duplicates: nodes that compute the same thing are computed once.

Two nodes are the same when they have the same op, device, attributes and inputs (control inputs
as a set); two Consts are the same when their dtype, shape and values are. The two operands of a
commutative op count in either order (``Add(a, b)`` is ``Add(b, a)``: IEEE addition and
multiplication commute exactly; never ``Maximum``/``Minimum``, whose NaN handling depends on the
order, nor an ``Add`` of strings, which concatenates). Visiting producers
before consumers makes one pass reach the fixpoint: once ``a`` and ``a'`` are one node, ``f(a)``
and ``f(a')`` read the same input and merge too. The anchors are graph_transforms'
``merge_duplicate_nodes`` and Grappler's dedup. Never merged: stateful ops (variables, queues,
random numbers, prints — op_def ``is_stateful``), placeholders, v1 control-flow frame ops,
the empty TensorLists a loop writes into (``LOOP_BUFFERS``), and nodes with no OpDef here. A
protected node (graph input/output) is never the one removed.
"""
from __future__ import annotations

from typing import Dict, Hashable, Optional, Tuple

from tensorflow.core.framework import types_pb2

from tfsurgery.graph import Graph, Ref, op_def, parse_ref
from tfsurgery.ops import CONTROL_FLOW_V1_OPS, PLACEHOLDER_OPS
from tfsurgery.contract import Options, TransformReport, transform

MAX_ROUNDS = 5
# To TensorFlow two equal empty lists are one value; to converters each is the buffer of the loop
# that fills it: tf2onnx turns a While's TensorListReserve into that Loop's scan output and
# deletes it, so three GRU loops sharing one Reserve fail to convert ("Cannot find node with
# output '@@ALLOC'"), and tensor_list_loops cannot give a shared list a TensorArray of its own.
LOOP_BUFFERS = frozenset({"TensorListReserve", "EmptyTensorList"})
COMMUTATIVE = frozenset({"Add", "AddV2", "Mul", "LogicalAnd", "LogicalOr", "Equal", "NotEqual",
                         "BitwiseAnd", "BitwiseOr", "BitwiseXor"})


@transform("merge-duplicates", repeat=True)
def merge_duplicates(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("merge-duplicates")
    if options.outputs:     # what no output needs goes anyway: merging it would be wasted work
        report.pruned = graph.prune(options.outputs, keep=options.inputs)   # booked to prune
    report.shared_constants_only = not report.pruned     # until something else is merged
    for _ in range(MAX_ROUNDS):     # one round suffices without cycles; loops may need another
        merged, acyclic = _merge_round(graph, options, report)
        if not merged or acyclic:
            break
    return report


def _merge_round(graph: Graph, options: Options, report: TransformReport) -> Tuple[int, bool]:
    """Merge in producer-first order: (merges, whether that order had no cycle — then nothing
    visited earlier can have become a duplicate of anything, and the round was the fixpoint)."""
    protected = options.protected
    order, acyclic = graph.producer_first_order()
    # Bucketed by a key cheap to compute (op and inputs); the full signature (attributes) only
    # when a bucket already holds a node. A Const's key is its whole signature.
    buckets: Dict[Hashable, Dict[Hashable, str]] = {}
    constants: Dict[Hashable, str] = {}     # a Const's whole signature → the first with it
    merged = 0
    nodes = graph.nodes
    for name in order:
        node = nodes.get(name)
        if node is None:
            continue
        if node.op == "Const":      # its value is read anyway: the whole signature at once
            keeper = constants.setdefault(_const_signature(graph, name, node), name)
        else:
            keeper = _keeper(graph, name, node, buckets)
        if keeper is None or keeper == name:
            continue
        if name in protected:
            continue
        if node.op != "Const" or graph.input_refs(name):
            report.shared_constants_only = False    # (a Const's control inputs lose a reader)
        _replace(graph, name, keeper)
        report.matched += 1
        report.rewritten.append(f"{name}: same as {keeper}")
        merged += 1
    return merged, acyclic


def _keeper(graph: Graph, name: str, node, buckets) -> Optional[str]:
    """The first node seen that computes what ``name`` computes (``name`` itself if none; None
    if it must never merge)."""
    bucket_key = _bucket(graph, name, node)
    if bucket_key is None:
        return None
    bucket = buckets.get(bucket_key)
    if bucket is None:
        buckets[bucket_key] = {_LATER: name}     # its signature when someone needs it
        return name
    if _LATER in bucket:
        first = bucket.pop(_LATER)
        bucket.setdefault(_signature(graph, first), first)
    return bucket.setdefault(_signature(graph, name), name)


_LATER = object()       # a bucket's first node, whose signature is not computed yet
_MERGEABLE: Dict[str, bool] = {}      # op → whether its nodes may merge (asked per node)


def _may_merge(op: str) -> bool:
    mergeable = _MERGEABLE.get(op)
    if mergeable is None:
        definition = op_def(op)
        mergeable = definition is not None and not definition.is_stateful and \
            op not in PLACEHOLDER_OPS and op not in CONTROL_FLOW_V1_OPS and \
            op not in LOOP_BUFFERS
        if definition is not None:          # an op TF does not know yet is asked again
            _MERGEABLE[op] = mergeable
    return mergeable


def _bucket(graph: Graph, name: str, node) -> Optional[Hashable]:
    """Part of what the node computes, cheap to read; None for nodes that must never merge."""
    op = node.op
    if not _may_merge(op):
        return None
    refs = graph.input_refs(name)
    if any(ref.control for ref in refs):
        data = _in_order(node, tuple(ref for ref in refs if not ref.control))
        return (op, data, frozenset(ref.node for ref in refs if ref.control))
    return (op, _in_order(node, refs))


def _signature(graph: Graph, name: str) -> Hashable:
    """What a node other than a Const computes, as a hashable key."""
    node = graph.node(name)
    data = _in_order(node, tuple(str(parse_ref(text)) for text in node.input
                                 if not text.startswith("^")))
    control = frozenset(text for text in node.input if text.startswith("^"))
    attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                         for k, v in node.attr.items()))
    return (node.op, node.device, attrs, data, control)


def _const_signature(graph: Graph, name: str, node) -> Hashable:
    """What a Const holds (its control inputs, if any, as a set)."""
    tensor = node.attr["value"].tensor
    # Packed values are the array's bytes; other encodings (float_val, string_val, a broadcast
    # scalar) are decoded so that equal values in either encoding merge.
    value = tensor.tensor_content or _value_key(graph.const_value(Ref(name, 0),
                                                                 through_identity=False))
    attrs = node.attr
    if len(attrs) == 2 and "dtype" in attrs:    # value and dtype, as most Consts: the dtype is
        attrs = attrs["dtype"].type             # the value's (a type attr holds nothing else)
    else:
        attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                             for k, v in attrs.items() if k != "value"))
    control = frozenset(ref.node for ref in graph.input_refs(name))
    return (node.device, attrs, tensor.dtype,
            tensor.tensor_shape.SerializeToString(deterministic=True), value, control)


def _in_order(node, data: tuple) -> tuple:
    """A commutative op's two operands in one canonical order; any other op's as they are."""
    if node.op not in COMMUTATIVE or len(data) != 2 or \
            ("T" in node.attr and node.attr["T"].type == types_pb2.DT_STRING):
        return data
    return tuple(sorted(data, key=str))


def _value_key(value) -> Hashable:
    """Equal arrays, equal keys (strings by content: an object array's bytes are pointers)."""
    return tuple(value.ravel().tolist()) if value.dtype == object else value.tobytes()


def _replace(graph: Graph, duplicate: str, keeper: str) -> None:
    """Readers of ``duplicate`` (every port, control edges too) read ``keeper``; then it goes."""
    for consumer in graph.consumers(duplicate):
        graph.set_input(consumer.node, consumer.index,
                        Ref(keeper, consumer.ref.port, consumer.ref.control))
    if graph.has_control_consumers(duplicate):
        graph.move_control_consumers(duplicate, keeper)
    graph.remove([duplicate])
