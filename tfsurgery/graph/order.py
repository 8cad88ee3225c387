"""Order and reachability over the graph index: what the outputs need (``ancestors``,
``prune``) and producers before consumers (``topological_order``). A mixin of ``Graph``
(tfsurgery.graph.index): it reads the index's maps — ``nodes``, ``_refs`` (a node's inputs),
``_consumers``, the op map, the structure proof — and edits only through ``remove``."""
from __future__ import annotations

from typing import Iterable, List, Set, Tuple

from tfsurgery.graph.integrity import BACK_EDGE_OPS, kahn
from tfsurgery.graph.refs import parse_ref


class Reachability:
    """``Graph``'s order and reachability methods."""

    def ancestors(self, outputs: Iterable[str], *, include_control: bool = True) -> Set[str]:
        """Nodes the given node names depend on (themselves included); cycles are fine."""
        keep: Set[str] = set()
        nodes, refs_of = self.nodes, self._refs
        stack = [parse_ref(o).node for o in outputs]
        while stack:
            name = stack.pop()
            if name in keep or name not in nodes:
                continue
            keep.add(name)
            if include_control:
                stack.extend([ref.node for ref in refs_of[name] if ref.node not in keep])
            else:
                stack.extend([ref.node for ref in refs_of[name]
                              if not ref.control and ref.node not in keep])
        return keep

    def prune(self, outputs: Iterable[str], *, keep: Iterable[str] = ()) -> List[str]:
        """Remove every node the outputs (and ``keep``) do not need; returns the removed names."""
        roots = list(outputs) + list(keep)
        if self._every_node_is_needed(roots):
            return []
        needed = self.ancestors(roots)
        dead = [name for name in self.nodes if name not in needed]
        self.remove(dead)
        return dead

    def _every_node_is_needed(self, roots: List[str]) -> bool:
        """A quick proof that every node is needed: without while loops (cycles), a graph in
        which every node but the roots has a reader has only roots as sinks, and every node
        reaches a sink. (A cycle outside a loop, which breaks a graph anyway, would fool it.)
        Once proved for these roots, only the nodes added or left with fewer readers since can
        have become sinks: only they are looked at again."""
        if self._has_any_op(BACK_EDGE_OPS):
            return False
        rooted = frozenset(parse_ref(root).node for root in roots)
        consumers, nodes = self._consumers, self.nodes
        suspects = nodes if rooted != self._needed_roots else \
            [name for name in self._maybe_sinks if name in nodes]
        if not all(consumers.get(name) or name in rooted for name in suspects):
            return False
        self._needed_roots, self._maybe_sinks = rooted, set()
        return True

    def _has_any_op(self, ops) -> bool:
        self._refresh_ops()
        return any(self._by_op.get(op) for op in ops)

    def topological_order(self) -> List[str]:
        """Producers before consumers (Kahn). Nodes on cycles — while loops, whose NextIteration
        feeds a Merge — are appended in graph order instead of failing."""
        return self.ordered()[0]

    def ordered(self) -> Tuple[List[str], bool]:
        """``topological_order()``, and whether it is one: False when cycles (while loops) left
        nodes to be appended in graph order."""
        order, _ = kahn(self.nodes, self._refs, self._consumers)
        if len(order) == len(self.nodes):
            return order, True
        placed = set(order)
        order.extend(name for name in self.nodes if name not in placed)
        return order, False

    def producer_first_order(self) -> Tuple[List[str], bool]:
        """``ordered()``, from the topological positions the structure proof keeps when it
        has them (a sort instead of a walk over every edge); Kahn otherwise, and for graphs with
        while loops (the positions leave their back edges out)."""
        proof = self._proof
        if proof.positions is None or proof.full_check_due or self._has_any_op(BACK_EDGE_OPS):
            return self.ordered()
        return sorted(self.nodes, key=proof.positions.__getitem__), True
