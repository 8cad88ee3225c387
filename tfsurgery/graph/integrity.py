"""Is the graph still well formed? A structure check after every transform, cheap after small edits.

A graph is sound when every input names an existing node and an output port that node has,
every colocation (``_class``) names an existing node, and there is no cycle outside a while loop
(a loop's cycle is closed by a NextIteration: its *back edge*).

Checking that from scratch walks the whole graph (``full_problem``). After a clean check, though,
only what edits touched can have broken, and the index tells the proof what each edit did:

- a **topological position** per node (a float; loops' back edges aside). A new node gets a
  position between its inputs' and its readers'; a new edge that runs from a lower to a higher
  position keeps the proof that there is no cycle. When there is no room or an edge runs
  backwards, the positions are dropped and the next check is a full one (which rebuilds them);
- **producers to recheck**: nodes removed while still read, or read at a port above 0, or missing
  when an edge to them was made. Only their readers can read something wrong;
- whether a colocation was added;
- whether a node was handed out to be changed freely (``Graph.edit_node``): then anything may
  have changed, and the next check is a full one.

When several defects exist, both checks name the same one: the first by name (producer, reader,
colocation target), so the incremental check reports exactly what a full check reports.

``check_structure`` checks a raw GraphDef as it is loaded (unique names, inputs, ports,
attribute kinds) without building an index.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Dict, Iterable, List, Optional, Set, Tuple

from tensorflow.core.framework import graph_pb2, node_def_pb2

from tfsurgery.errors import GraphError
from tfsurgery.graph.opdefs import check_attr_kinds, num_outputs
from tfsurgery.graph.refs import Ref, parse_ref

BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})   # a while loop's back edge


class StructureProof:
    """What the last clean structure check proved, and what edits since may have broken.

    It reads the index's own maps (the same dict objects, updated in place by ``Graph``):
    ``nodes`` name → NodeDef, ``refs`` name → parsed inputs, ``consumers`` producer →
    {(reader, input index): Ref}, ``ops`` name → op as filed, ``colocated`` target → holders,
    ``by_op`` op → {name: position} (current when ``Graph`` asks for a check)."""

    def __init__(self, nodes, refs, consumers, ops, colocated, by_op):
        self._nodes, self._refs, self._consumers = nodes, refs, consumers
        self._ops, self._colocated, self._by_op = ops, colocated, by_op
        self.clean_at = -1              # the edit count at the last clean check (-1: none yet)
        self.full_check_due = False     # the next check walks everything
        # Since the last clean check: producers some edge may read wrongly (removed, or read at
        # a port above 0), and whether a colocation was added.
        self.producers_to_recheck: Set[str] = set()
        self.colocation_added = False
        # A topological position per node (loops' back edges aside), kept while edits allow:
        # proof that no edit closed a cycle, without Kahn over the whole graph.
        self.positions: Optional[Dict[str, float]] = None
        self._lowest = 0

    # ---------------------------------------------------------------- fed while indexing
    def indexed(self, in_order: bool) -> None:
        """The index is built; ``in_order``: inputs and ports were checked while indexing and
        every node reads only nodes before it. Then graph order is the positions, and the graph
        is sound unless a colocation names a missing node."""
        if in_order and self.colocation_problem() is None:
            self.positions = dict(zip(self._nodes, itertools.count()))    # graph order (no loop)
            self.clean_at = 0
            self.colocation_added = False

    # ---------------------------------------------------------------- fed by edits
    def node_added(self, name: str) -> None:
        """Give a new node a topological position between those of its inputs and its readers
        (when there is no room, or no positions, the next structure check is a full one), and
        note what the next check must look at: producers it reads that are missing or read at
        a port above 0, and itself if its readers read such ports. (A hot path: plain loops.)"""
        if self.positions is None:
            self.full_check_due = True
            return
        ops, positions, recheck = self._ops, self.positions, self.producers_to_recheck
        low = high = None
        for ref in self._refs[name]:
            op = ops.get(ref.node)
            if ref.port or op is None:
                recheck.add(ref.node)
            if ref.node == name:                    # a self-loop
                self.forget_positions()
                return
            if op is not None and op not in BACK_EDGE_OPS:
                at = positions[ref.node]
                low = at if low is None or at > low else low
        for (reader, _index), ref in self._consumers.get(name, {}).items():
            if ref.port:
                recheck.add(name)
            if reader in ops and ops[name] not in BACK_EDGE_OPS:
                at = positions[reader]
                high = at if high is None or at < high else high
        if low is None:                             # a source: below everything so far
            at = self._lowest = min(self._lowest, high if high is not None else 0) - 1
        else:
            at = low + 1 if high is None else (low + high) / 2
        if (low is not None and not low < at) or (high is not None and not at < high):
            self.forget_positions()                 # no room left between them
            return
        positions[name] = at

    def edge_added(self, ref: Ref, consumer: str) -> None:
        """A new edge: ``consumer`` reads ``ref``. Recheck its producer if missing or read at a
        port above 0; does the edge respect the topological positions?"""
        producer = ref.node
        op = self._ops.get(producer)
        if ref.port or producer not in self._nodes:
            self.producers_to_recheck.add(producer)
        if self.positions is None:
            self.full_check_due = True
        elif op is not None and op not in BACK_EDGE_OPS:
            if not self.positions[producer] < self.positions[consumer]:
                self.forget_positions()

    def removed_while_read(self, names: Iterable[str]) -> None:
        """Nodes removed although something read them (unless their readers went too)."""
        self.producers_to_recheck.update(names)

    def anything_may_change(self) -> None:
        """A node was handed out to be changed freely: the next check is a full one."""
        self.full_check_due = True

    def forget_positions(self) -> None:
        self.positions = None
        self.full_check_due = True

    # ---------------------------------------------------------------- checks
    def problem(self, edits: int) -> Optional[str]:
        """What is broken after ``edits`` edits so far, if anything (None when sound)."""
        if self.clean_at == edits:
            return None                     # nothing changed since the last clean check
        if self.clean_at >= 0 and not self.full_check_due:
            problem = self.problem_since_clean()
        else:
            problem = self.full_problem()
        if problem is None:
            self.clean_at, self.full_check_due = edits, False
            self.producers_to_recheck.clear()
            self.colocation_added = False
        return problem

    def problem_since_clean(self) -> Optional[str]:
        """Since a clean check, edits went through the index (no ``edit_node``) and kept the
        topological positions (no cycle): only the edges of producers noted for a recheck can
        be wrong, and colocations only if one was added."""
        problem = self._first_edge_problem(self.producers_to_recheck)
        if problem:
            return problem
        return self.colocation_problem() if self.colocation_added else None

    def full_problem(self) -> Optional[str]:
        """The whole graph checked: edges, colocations, cycles (which rebuilds the positions)."""
        problem = None if self._edges_look_sound() else self._first_edge_problem(self._consumers)
        if problem:
            return problem
        problem = self.colocation_problem()
        if problem:
            return problem
        cycle = self._cycle_outside_loops()
        return f"cycle outside a while loop through node '{cycle}'" if cycle else None

    def colocation_problem(self) -> Optional[str]:
        nodes = self._nodes
        missing = [target for target, holders in self._colocated.items()
                   if holders and target not in nodes]
        if not missing:
            return None
        target = min(missing)
        return f"node '{min(self._colocated[target])}' is colocated with missing node '{target}'"

    def _edges_look_sound(self) -> bool:
        """The quick pass over the edges: every producer read exists (one set difference) and
        each port read above 0 exists. When it has doubts, ``_first_edge_problem`` names one."""
        consumers, nodes = self._consumers, self._nodes
        if any(consumers[name] for name in consumers.keys() - nodes.keys()):
            return False
        top: Dict[str, int] = {}
        for refs in self._refs.values():
            for ref in refs:
                if ref.port > top.get(ref.node, 0):
                    top[ref.node] = ref.port
        for producer, port in top.items():
            ports = num_outputs(nodes[producer])
            if ports is not None and port >= ports:
                return False
        return True

    def _first_edge_problem(self, producers: Iterable[str]) -> Optional[str]:
        """The edge problem of the first of ``producers``, by name, read wrongly."""
        for producer in sorted(producers):
            problem = self._producer_problem(producer)
            if problem:
                return problem
        return None

    def _producer_problem(self, producer: str) -> Optional[str]:
        """Whether the readers of ``producer`` read a node that exists, at a port it has."""
        readers = self._consumers.get(producer)
        if not readers:
            return None
        node = self._nodes.get(producer)
        if node is None:
            reader = min(readers)                 # (reader, input index): the first by name
            return f"node '{reader[0]}' reads '{readers[reader]}' but no node '{producer}' exists"
        top = max(readers.values()).port          # the Refs differ only in port / control
        if top > 0:
            ports = num_outputs(node)
            if ports is not None and top >= ports:
                return f"'{producer}:{top}' is read but {node.op} '{producer}' has {ports} output(s)"
        return None

    def _cycle_outside_loops(self) -> Optional[str]:
        """A node on a cycle that no NextIteration closes (Kahn without the loops' back edges)."""
        by_op = self._by_op
        back = {name for op in BACK_EDGE_OPS for name in by_op.get(op, ())}
        order, indegree = kahn(self._nodes, self._refs, self._consumers, skip=back)
        if len(order) == len(self._nodes):
            self.positions = dict(zip(order, itertools.count()))     # for the next checks
            self._lowest = 0
            return None
        return min(name for name, d in indegree.items() if d > 0)


def kahn(nodes: Dict[str, node_def_pb2.NodeDef], refs: Dict[str, Tuple[Ref, ...]],
         consumers: Dict[str, Dict[Tuple[str, int], Ref]],
         skip: Set[str] = frozenset()) -> Tuple[List[str], Dict[str, int]]:
    """Kahn's order over the edges whose producer exists and is not in ``skip``, and the
    in-degrees left (above 0: on or behind a cycle)."""
    indegree = {name: len(inputs) for name, inputs in refs.items()}
    # edges that do not count (set operations pick their producers without a Python loop)
    for producer in (consumers.keys() - nodes.keys()) | (consumers.keys() & skip):
        for consumer, _index in consumers[producer]:
            indegree[consumer] -= 1
    ready = deque(name for name, d in indegree.items() if d == 0)
    order: List[str] = []
    append, popleft = order.append, ready.popleft
    while ready:
        name = popleft()
        append(name)
        if name in skip:
            continue
        for consumer, _index in consumers.get(name, ()):
            left = indegree[consumer] - 1
            indegree[consumer] = left
            if left == 0:
                ready.append(consumer)
    return order, indegree


# ---------------------------------------------------------------- a raw GraphDef, as loaded
def check_structure(graph_def: graph_pb2.GraphDef) -> None:
    """Unique names; every input names an existing node and, where the op is known, one of its
    outputs. Raises GraphError; copies nothing."""
    nodes: Dict[str, node_def_pb2.NodeDef] = {node.name: node for node in graph_def.node}
    if len(nodes) != len(graph_def.node):
        check_unique_names(graph_def)
    outputs: Dict[str, Optional[int]] = {}
    for node in graph_def.node:
        check_attr_kinds(node)
        check_node_inputs(node, tuple(map(parse_ref, node.input)), nodes, outputs)


def check_unique_names(graph_def: graph_pb2.GraphDef) -> None:
    seen: Set[str] = set()
    for node in graph_def.node:
        if node.name in seen:
            raise GraphError(f"duplicate node name '{node.name}'")
        seen.add(node.name)


def check_node_inputs(node: node_def_pb2.NodeDef, refs: Tuple[Ref, ...],
                 nodes: Dict[str, node_def_pb2.NodeDef], outputs: Dict[str, Optional[int]]):
    """Each input names an existing node and one of its outputs (``outputs`` caches counts)."""
    for index, ref in enumerate(refs):
        producer = nodes.get(ref.node)
        if producer is None:
            kind = "control input" if ref.control else "input"
            raise GraphError(f"node '{node.name}' has {kind} '{node.input[index]}' but no node "
                             f"'{ref.node}' exists")
        if ref.control or ref.port == 0:
            continue
        if ref.node not in outputs:
            outputs[ref.node] = num_outputs(producer)
        if outputs[ref.node] is not None and ref.port >= outputs[ref.node]:
            raise GraphError(f"node '{node.name}' reads '{node.input[index]}' but {producer.op} "
                             f"'{ref.node}' has {outputs[ref.node]} output(s)")
