"""Which parts of a graph are computed from constants alone, and their values (by TensorFlow).

Shared by the transforms that fold constants, decide cond predicates and drop pointless control
edges. Stateful and random ops, control flow, placeholders, fake quantization (TFLite reads its ranges)
and ops acting outside the graph (tfsurgery.trust.outside) are never constant.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, Iterable, List, Optional, Set

import numpy as np

from tfsurgery.graph import Graph, op_def
from tfsurgery.ops import CONTROL_FLOW_V1_OPS, PLACEHOLDER_OPS
from tfsurgery.trust.outside import CONDITIONAL_OPS, EMBEDDED_GRAPH_OPS, OUTSIDE_OPS
from tfsurgery.tfsession import run_nodes

# ops acting outside the graph (ReadFile, ...) are never evaluated, even where the user allowed
# them to run: a file's bytes must never end up as a constant in a result
NEVER_FOLD = PLACEHOLDER_OPS | CONTROL_FLOW_V1_OPS | {"Const", "NoOp", "Assert", "Print",
                                                      "PrintV2"} | set(OUTSIDE_OPS) | \
    set(CONDITIONAL_OPS) | EMBEDDED_GRAPH_OPS


_FOLDABLE: Dict[str, bool] = {}


def _is_foldable_op(op: str) -> bool:
    foldable = _FOLDABLE.get(op)
    if foldable is None:
        definition = None if (op in NEVER_FOLD or "Random" in op or "Variable" in op or
                              op.startswith("FakeQuant")) else op_def(op)
        foldable = definition is not None and not definition.is_stateful
        if foldable or definition is not None or op in NEVER_FOLD:
            _FOLDABLE[op] = foldable        # an op TF does not know yet is asked again
    return foldable


def constant_nodes(graph: Graph) -> Set[str]:
    """Nodes computed from constants alone: Consts and NoOps whose (control) inputs are all
    constant, and foldable ops whose every input is.

    Spread from the input-less Consts and NoOps to their readers, each reader counting down its
    inputs still unknown: only the constant part of the graph and its border are visited."""
    constant: Set[str] = set()
    pending: Dict[str, int] = {}            # reader → inputs not yet known constant
    reader_slots, input_refs = graph.reader_slots, graph.input_refs     # (a hot loop)
    ready = [name for name in graph.names_with_ops(("Const", "NoOp")) if not input_refs(name)]
    while ready:
        name = ready.pop()
        constant.add(name)
        for reader, _index in reader_slots(name):
            left = pending.get(reader)
            if left is None:
                left = len(input_refs(reader))
            pending[reader] = left = left - 1
            if left == 0:
                op = graph.op(reader)
                if op in ("Const", "NoOp") or _is_foldable_op(op):
                    ready.append(reader)
    return constant

def constant_valued_nodes(graph: Graph) -> Set[str]:
    """Nodes whose value is fixed, a superset of ``constant_nodes`` for recognising patterns
    (a dropout rate, say), never for folding: also a Const inside a v1 while loop (its control
    edge from the loop's pivot only places it in the loop's frame), a loop invariant
    ``Enter(is_constant=True)`` of a fixed value, and foldable ops of those. A Const made from
    such a node would sit outside the loop's frame, which TensorFlow refuses."""
    waiting = {node.name: len(graph.inputs(node.name)) for node in graph}
    ready = deque(name for name, count in waiting.items() if count == 0)
    fixed: Set[str] = set()
    while ready:                       # Kahn over data edges: loop-carried values never get here
        name = ready.popleft()
        node = graph.node(name)
        inputs = [ref.node for ref in graph.inputs(name)]
        if node.op == "Const" or (inputs and all(i in fixed for i in inputs) and (
                _is_foldable_op(node.op) or _is_invariant_enter(node))):
            fixed.add(name)
        for consumer in graph.consumers(name):
            waiting[consumer.node] -= 1
            if waiting[consumer.node] == 0:
                ready.append(consumer.node)
    return fixed


def _is_invariant_enter(node) -> bool:
    return node.op in ("Enter", "RefEnter") and node.attr["is_constant"].b


def evaluate(graph: Graph, tensors: List[str]) -> List[np.ndarray]:
    """Run the graph's constant part in TensorFlow and fetch ``tensors``."""
    needed = graph.ancestors(tensors)
    return run_nodes([node for name, node in graph.nodes.items() if name in needed], tensors)


def constant_values(graph: Graph, refs: Iterable) -> Dict[str, Optional[np.ndarray]]:
    """Each tensor's value if it is a Const or computed from constants only (then TensorFlow
    evaluates it, e.g. ``LogicalNot(training)``); None where it is not, or TF refuses."""
    refs = [str(ref) for ref in refs]
    values = {ref: graph.const_value(ref) for ref in refs}
    unknown = [ref for ref, value in values.items() if value is None]
    computable = constant_nodes(graph) if unknown else set()
    pending = {ref: str(graph.resolve(ref)) for ref in unknown
               if graph.resolve(ref).node in computable}
    if pending:
        from tfsurgery.tfsession import tf_errors
        try:
            values.update(zip(pending, evaluate(graph, list(pending.values()))))
        except (ValueError, TypeError, KeyError, tf_errors().OpError):
            pass                   # TensorFlow rejects it: those stay unknown
    return values
