"""The graph index every transform works on: ``Graph``.

A GraphDef is a flat list of NodeDefs whose inputs are strings (``"name"``, ``"name:k"``,
``"^name"``: see ``refs``). ``Graph`` parses those strings once, keeps a name → node map, a
producer → consumers map and an op → nodes map, and offers the edits transforms need (add,
rewire, remove, prune), keeping every map up to date. Every lookup is a dict access, so a pass
over the graph is linear.

Its neighbours, each readable alone: ``integrity`` (the structure check each edit feeds),
``order`` (order and reachability: a mixin), ``library`` (the function library, and ``Graph``'s
methods over it: a mixin), ``tensors`` (Const values in and out of protos), ``opdefs``
(what TensorFlow's op registry says about a node), ``refs`` (the input-string grammar).
"""
from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import warnings
from collections import defaultdict
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np

from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from tfsurgery.errors import GraphError
from tfsurgery.graph.integrity import (BACK_EDGE_OPS, StructureProof, check_node_inputs,
                                       check_unique_names)
from tfsurgery.graph.library import FunctionLibrary, LibraryMethods
from tfsurgery.graph.order import Reachability
from tfsurgery.graph.opdefs import attr_value, check_attr_kinds, python_value
from tfsurgery.graph.refs import (COLOCATION_ATTR, COLOCATION_PREFIX, Consumer, Ref,
                                  _new_tuple, colocation_targets, parse_ref)
from tfsurgery.graph.tensors import (decode_alike, decode_tensor, encode_tensor,
                                     tensor_nbytes)
from tfsurgery.ops import FORWARDING_OPS

CACHED_VALUE_BYTES = 4096      # decoded Const values up to this size are kept (read-only)


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for a while. Building an index allocates millions of
    small objects that all stay alive; the collector would scan them again and again (half the
    time of indexing a 200k-node graph) to find nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Graph(Reachability, LibraryMethods):
    """An editable, indexed copy of a GraphDef (the caller's GraphDef is never touched)."""

    def __init__(self, graph_def: graph_pb2.GraphDef, *, check_inputs: bool = True):
        self._versions = copy.deepcopy(graph_def.versions)
        self._library = FunctionLibrary(graph_def.library)
        # Copy-on-write: nodes are the caller's until first changed (see ``edit_node``), so an
        # index over a large graph costs little more than the graph itself.
        self.nodes: Dict[str, node_def_pb2.NodeDef] = {n.name: n for n in graph_def.node}
        if check_inputs and len(self.nodes) != len(graph_def.node):
            check_unique_names(graph_def)
        self._owned: Set[str] = set()
        # The op index: a transform finds its few nodes of interest without visiting every
        # NodeDef. op → {node: its position in graph order}, each group in that order; node →
        # the op it is filed under (a dict in the same order as ``nodes``: both see the same
        # inserts and removals). ``edit_node`` may change a node's op: such nodes are filed again
        # before the next query.
        self._by_op: Dict[str, Dict[str, int]] = defaultdict(dict)
        self._ops: Dict[str, str] = {}
        self._positions = itertools.count()     # a node's place in graph order
        self._op_may_change: Set[str] = set()
        self._handed_out: Set[str] = set()      # every node ``edit_node`` gave: read its op itself
        self._refs: Dict[str, Tuple[Ref, ...]] = {}      # node → its inputs, parsed once
        self._consumers: Dict[str, Dict[Tuple[str, int], Ref]] = defaultdict(dict)
        self._colocated: Dict[str, Set[str]] = defaultdict(set)    # target → nodes naming it
        # nodes ``edit_node`` handed out → the colocation targets filed for them (their
        # ``_class`` may change: filed again before the colocations are next used)
        self._colocation_as_filed: Dict[str, List[str]] = {}
        self._values: Dict[str, np.ndarray] = {}          # small Const values, decoded once
        # ``prune``'s proof that every node is needed (see ``_every_node_is_needed``): the roots
        # it was proved for, and the nodes that may have become sinks since (added, or lost a
        # reader); None: no proof yet
        self._needed_roots: Optional[FrozenSet[str]] = None
        self._maybe_sinks: Set[str] = set()
        # Edits so far: a pass that changed nothing is not checked again, and after edits
        # through the index only what they touched is (the proof is told what each edit did).
        self._edits = 0
        self._proof = StructureProof(self.nodes, self._refs, self._consumers, self._ops,
                                     self._colocated, self._by_op)
        with gc_paused():        # a burst of small objects that all live on: nothing to collect
            in_order = self._index_all(check_inputs)
        # inputs, ports and order checked while indexing: sound unless a colocation is broken
        self._proof.indexed(in_order)

    def _index_all(self, check_inputs: bool) -> bool:
        """``_index_edges`` for every node in graph order, in one loop (the hot path of a large
        graph); with ``check_inputs``, each node's attribute kinds and inputs are checked as it
        is filed. Returns whether that was checked and every node reads only nodes before it."""
        nodes, by_op, ops, refs_of = self.nodes, self._by_op, self._ops, self._refs
        consumers = self._consumers
        outputs: Dict[str, Optional[int]] = {}
        in_order = check_inputs
        position = -1
        op_names: Dict[str, str] = {}       # one str per op type, not one per node
        for position, (name, node) in enumerate(nodes.items()):
            op = node.op
            op = op_names.setdefault(op, op)
            by_op[op][name] = position
            ops[name] = op
            refs = tuple(map(parse_ref, node.input))
            # one walk over the inputs files them and notes what a check must look at: an
            # input read before its producer is filed (a later node, itself, or none at all),
            # or at a port above 0
            suspect = False
            for index, ref in enumerate(refs):
                producer = ref.node
                consumers[producer][(name, index)] = ref
                if producer not in refs_of:
                    suspect = True
                    if in_order and (producer not in nodes or
                                     nodes[producer].op not in BACK_EDGE_OPS):
                        in_order = False      # a loop's back edge may read ahead; nothing else
                elif ref.port:
                    suspect = True
            refs_of[name] = refs
            attrs = node.attr
            if COLOCATION_ATTR in attrs:
                self._file_colocations(name, node)
            if check_inputs:
                check_attr_kinds(node, attrs, op)
                if suspect:
                    check_node_inputs(node, refs, nodes, outputs)
        self._positions = itertools.count(position + 1)
        return in_order

    def _index_edges(self, name: str, node: node_def_pb2.NodeDef, attrs,
                     refs: Optional[Tuple[Ref, ...]] = None) -> Tuple[Ref, ...]:
        """File a node (just added, so last in graph order) under its op, its inputs (``refs``:
        already parsed) and its colocation targets."""
        op = node.op
        self._by_op[op][name] = next(self._positions)
        self._ops[name] = op
        if refs is None:
            refs = tuple(map(parse_ref, node.input))
        self._refs[name] = refs
        consumers = self._consumers
        for index, ref in enumerate(refs):
            consumers[ref.node][(name, index)] = ref
        if COLOCATION_ATTR in attrs:
            self._file_colocations(name, node)
        return refs

    def _file_colocations(self, name: str, node: node_def_pb2.NodeDef) -> None:
        self._proof.colocation_added = True
        for target in colocation_targets(node):
            self._colocated[target].add(name)

    # ---------------------------------------------------------------- reading
    def __contains__(self, name: str) -> bool:
        return name in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[node_def_pb2.NodeDef]:
        return iter(list(self.nodes.values()))

    def node(self, name: str) -> node_def_pb2.NodeDef:
        return self.nodes[name]

    def nodes_with_ops(self, ops, *, named=()) -> List[node_def_pb2.NodeDef]:
        """``[node for node in graph if node.op in ops or node.name in named]``, from the op
        index: a snapshot in graph order, as iterating the graph gives, without visiting the
        NodeDefs of other ops."""
        nodes = self.nodes
        return [nodes[name] for name in self.names_with_ops(ops, named=named)]

    def names_with_ops(self, ops, *, named=()) -> List[str]:
        """The names of ``nodes_with_ops(ops, named=named)``, without fetching their NodeDefs."""
        self._refresh_ops()
        groups = [self._by_op[op] for op in set(ops) if self._by_op.get(op)]
        extra = [name for name in named if name in self.nodes]
        if len(groups) == 1 and not extra:
            return list(groups[0])         # one op: its nodes are filed in graph order
        if not groups and not extra:
            return []
        return self._in_graph_order(
            {name for group in groups for name in group}.union(extra))

    def _in_graph_order(self, names: Set[str]) -> List[str]:
        """Sorted by the positions the op index holds: the graph is not walked."""
        by_op, ops = self._by_op, self._ops
        return sorted(names, key=lambda name: by_op[ops[name]][name])

    def _refresh_ops(self) -> None:
        """File again the nodes ``edit_node`` handed out whose op has changed since."""
        for name in self._op_may_change:
            node = self.nodes.get(name)
            if node is not None and node.op != self._ops[name]:
                position = self._by_op[self._ops[name]].pop(name)
                self._ops[name] = node.op       # an existing key: its place in graph order stays
                group = self._by_op[node.op]
                group[name] = position
                self._by_op[node.op] = dict(sorted(group.items(), key=lambda item: item[1]))
        self._op_may_change.clear()

    def op(self, ref) -> Optional[str]:
        """Op type of the node behind a name or Ref (None if missing)."""
        if ref is None:
            return None
        if isinstance(ref, Ref):
            return self._op_of(ref.node)
        if ref in self._ops:
            return self._op_of(ref)
        return self._op_of(parse_ref(ref).node)       # "name:1" or "^name"

    def _op_of(self, name: str) -> Optional[str]:
        """A node's op from the op index (None if there is no such node): a node's NodeDef is
        not touched, nor a str made from it, unless ``edit_node`` handed it out (its op may have
        been changed since it was filed)."""
        if name in self._handed_out:
            node = self.nodes.get(name)
            return node.op if node is not None else None
        return self._ops.get(name)

    def inputs(self, name: str) -> List[Ref]:
        """Data inputs of a node, parsed, in order (control inputs excluded)."""
        return [ref for ref in self._refs[name] if not ref.control]

    def input_refs(self, name: str) -> Tuple[Ref, ...]:
        """Every input of a node, parsed, in order (control inputs included)."""
        return self._refs[name]

    def control_inputs(self, name: str) -> List[str]:
        return [ref.node for ref in self._refs[name] if ref.control]

    def consumers(self, name: str, port: Optional[int] = None, *,
                  control: bool = False) -> List[Consumer]:
        """Who reads node ``name`` (output ``port`` if given); control edges only if asked."""
        found = []
        for (consumer, index), ref in self._consumers.get(name, {}).items():
            if ref.control and not control:
                continue
            if port is not None and (ref.control or ref.port != port):
                continue
            found.append(_new_tuple(Consumer, (consumer, index, ref)))   # (see parse_ref)
        return found

    def consumer_nodes(self, name: str, port: Optional[int] = None) -> Set[str]:
        return {c.node for c in self.consumers(name, port)}

    def reader_slots(self, name: str) -> Iterable[Tuple[str, int]]:
        """(consumer, input index) of every input slot, data or control, that reads ``name``."""
        return self._consumers.get(name, {}).keys()

    def reader_count(self, name: str) -> int:
        """How many input slots (data and control) read node ``name`` — O(1)."""
        return len(self._consumers.get(name, ()))

    def has_control_edges(self) -> bool:
        """Whether any node has a control input."""
        return any(ref.control for refs in self._refs.values() for ref in refs)

    def has_control_consumers(self, name: str) -> bool:
        return any(ref.control for ref in self._consumers.get(name, {}).values())

    def attr(self, name: str, key: str, default=None):
        """A node attribute as a Python value (str for bytes)."""
        attrs = self.nodes[name].attr
        if key not in attrs:
            return default
        return python_value(attrs[key], default)

    def resolve(self, ref) -> Ref:
        """Follow identity-like ops back to the tensor that really produces a value."""
        ref = ref if isinstance(ref, Ref) else parse_ref(ref)
        seen = set()
        while self._op_of(ref.node) in FORWARDING_OPS and ref.node not in seen:
            seen.add(ref.node)
            inputs = self.inputs(ref.node)
            if self._op_of(ref.node) == "IdentityN":
                ref = inputs[ref.port]
            elif ref.port != 0 or not inputs:
                break
            else:
                ref = inputs[0]
        return ref

    def const_value(self, ref, *, through_identity: bool = True) -> Optional[np.ndarray]:
        """The value of a constant tensor (None if it is not a constant)."""
        ref = ref if isinstance(ref, Ref) else parse_ref(ref)
        value = self._values.get(ref.node) if ref.port == 0 else None
        if value is not None:
            return value                  # a cached value is a Const's: nothing to follow
        op = self._op_of(ref.node)
        if op != "Const":                 # only a forwarding op leads on to a constant
            if through_identity and op in FORWARDING_OPS:
                return self.const_value(self.resolve(ref), through_identity=False)
            return None
        if ref.port != 0:
            return None
        # read-only: shared, never edited
        value = decode_tensor(self.nodes[ref.node].attr["value"].tensor)
        if value.nbytes <= CACHED_VALUE_BYTES:
            self._values[ref.node] = value
        return value

    def const_values_alike(self, refs: Sequence[Ref]) -> Optional[np.ndarray]:
        """The values of several constant tensors (through identities, as ``const_value``)
        stacked along a new first axis, read from one buffer, when all are packed Consts of one
        dtype and shape; None otherwise (then ask ``const_value`` for each)."""
        refs = [self.resolve(ref) for ref in refs]
        if not refs or not all(ref.port == 0 and self._op_of(ref.node) == "Const"
                               for ref in refs):
            return None
        nodes = self.nodes
        return decode_alike([nodes[ref.node].attr["value"].tensor for ref in refs])

    def is_const(self, ref) -> bool:
        ref = self.resolve(ref if isinstance(ref, Ref) else parse_ref(ref))
        return ref.port == 0 and self._op_of(ref.node) == "Const"

    # ---------------------------------------------------------------- editing
    def edit_node(self, name: str) -> node_def_pb2.NodeDef:
        """Node ``name``, safe to change: our own copy, never the caller's NodeDef. Change its
        attributes, op or device; its inputs go through ``set_input``/``remove_inputs``/
        ``rewire`` (the index keeps them), and its name stays."""
        self._proof.anything_may_change()   # the next structure check is a full one
        self._op_may_change.add(name)
        self._handed_out.add(name)
        node = self._own(name)
        if name not in self._colocation_as_filed:
            self._colocation_as_filed[name] = colocation_targets(node)
        return node

    def mutable(self, name: str) -> node_def_pb2.NodeDef:
        """``edit_node``'s former name, kept for plugins written against it (warns)."""
        warnings.warn("Graph.mutable is deprecated: use Graph.edit_node", DeprecationWarning,
                      stacklevel=2)
        return self.edit_node(name)

    def _own(self, name: str) -> node_def_pb2.NodeDef:
        self._edits += 1
        self._values.pop(name, None)
        if name not in self._owned:
            copy_ = node_def_pb2.NodeDef()
            copy_.CopyFrom(self.nodes[name])
            self.nodes[name] = copy_
            self._owned.add(name)
        return self.nodes[name]

    def unique_name(self, base: str) -> str:
        if base not in self.nodes:
            return base
        k = 1
        while f"{base}_{k}" in self.nodes:
            k += 1
        return f"{base}_{k}"

    def add_node(self, node: node_def_pb2.NodeDef, *,
                 _refs: Optional[Tuple[Ref, ...]] = None) -> node_def_pb2.NodeDef:
        name = node.name
        if name in self.nodes:
            raise GraphError(f"node '{name}' already exists")
        self.nodes[name] = node
        self._edits += 1
        self._owned.add(name)
        self._maybe_sinks.add(name)
        self._values.pop(name, None)
        self._index_edges(name, node, node.attr, _refs)
        self._proof.node_added(name)
        return node

    def new_node(self, op: str, name: str, inputs: Iterable = (), attrs: Optional[dict] = None,
                 device: str = "") -> node_def_pb2.NodeDef:
        """Create and add ``op`` named ``name`` (made unique) with inputs (str or Ref)."""
        node = node_def_pb2.NodeDef(op=op, name=self.unique_name(name), device=device)
        refs = tuple(ref if isinstance(ref, Ref) else parse_ref(ref) for ref in inputs)
        node.input.extend([str(ref) for ref in refs])
        for key, value in (attrs or {}).items():
            node.attr[key].CopyFrom(value if isinstance(value, attr_value_pb2.AttrValue)
                                    else attr_value(value))
        return self.add_node(node, _refs=refs)

    def add_const(self, name: str, value, dtype=None, device: str = "") -> str:
        """Add a Const holding ``value`` (numpy or scalar); returns its (unique) name."""
        node = node_def_pb2.NodeDef(op="Const", name=self.unique_name(name), device=device)
        node.attr["dtype"].type = encode_tensor(value, dtype, into=node.attr["value"].tensor).dtype
        return self.add_node(node).name

    def const_nbytes(self, name: str) -> int:
        """Size of a Const's value, from its shape and dtype (no decoding)."""
        return tensor_nbytes(self.nodes[name].attr["value"].tensor)

    def set_const_value(self, name: str, value, dtype=None) -> None:
        """Replace a Const's value in place (callers make sure no one else depends on it).
        The node is rebuilt around the new value, so a large old value is never copied."""
        old = self.nodes[name]
        cached = self._values.get(name)
        if dtype is None and cached is not None and isinstance(value, np.ndarray) and \
                value.size > 1 and value.dtype == cached.dtype and value.shape == cached.shape \
                and old.attr["value"].tensor.tensor_content:
            # same dtype and shape, packed: only the bytes change; copying the node and
            # swapping them costs a third of a rebuild (folds rescale weights in place)
            node = node_def_pb2.NodeDef()
            node.CopyFrom(old)
            node.attr["value"].tensor.tensor_content = value.tobytes()
            self._replace_const_node(name, node)
            return
        node = node_def_pb2.NodeDef(name=old.name, op=old.op, device=old.device)
        node.input.extend(old.input)
        for key in old.attr:
            if key != "value":
                node.attr[key].CopyFrom(old.attr[key])
        for field in ("experimental_debug_info", "experimental_type"):
            if old.HasField(field):
                getattr(node, field).CopyFrom(getattr(old, field))
        node.attr["dtype"].type = encode_tensor(value, dtype, into=node.attr["value"].tensor).dtype
        self._replace_const_node(name, node)

    def _replace_const_node(self, name: str, node: node_def_pb2.NodeDef) -> None:
        self._edits += 1         # a new value, no new edge: nothing for the structure check
        self._values.pop(name, None)
        self._owned.add(name)
        self.nodes[name] = node

    def set_input(self, name: str, index: int, new) -> None:
        """Make input ``index`` of node ``name`` read ``new`` (str or Ref)."""
        node = self._own(name)              # a new edge, checked at the next structure check
        refs = self._refs[name]
        self._consumers[refs[index].node].pop((name, index), None)
        self._maybe_sinks.add(refs[index].node)
        new_ref = new if isinstance(new, Ref) else parse_ref(new)
        node.input[index] = str(new_ref)
        self._refs[name] = refs[:index] + (new_ref,) + refs[index + 1:]
        self._consumers[new_ref.node][(name, index)] = new_ref
        self._proof.edge_added(new_ref, name)

    def rewire(self, old, new, *, keep=()) -> int:
        """Every data consumer of tensor ``old`` reads ``new`` instead (except nodes in ``keep``)."""
        old = old if isinstance(old, Ref) else parse_ref(old)
        new = new if isinstance(new, Ref) else parse_ref(new)
        moved = 0
        for consumer in self.consumers(old.node, old.port):
            if consumer.node not in keep:
                self.set_input(consumer.node, consumer.index, new)
                moved += 1
        return moved

    def bypass(self, name: str, source, *, keep_name_as=None) -> None:
        """Readers of ``name`` (port 0, and its control readers) read ``source`` instead, and
        ``name`` goes. ``keep_name_as``, a dtype: ``name`` must keep existing (a graph output),
        so it becomes an Identity of ``source`` with that ``T``, on its device."""
        source = source if isinstance(source, Ref) else parse_ref(source)
        if keep_name_as is not None:
            device = self.nodes[name].device
            self.remove([name])
            self.new_node("Identity", name, [source], {"T": keep_name_as}, device=device)
            return
        self.rewire(name, source)
        self.move_control_consumers(name, source.node)
        self.remove([name])

    def move_control_consumers(self, old: str, new: Optional[str]) -> None:
        """Control edges from ``old`` come from ``new`` instead (dropped if new is None)."""
        for consumer in self.consumers(old, control=True):
            if not consumer.ref.control:
                continue
            node = self.nodes[consumer.node]
            existing = set(node.input)
            if new is None or f"^{new}" in existing or new == consumer.node:
                self.remove_input(consumer.node, consumer.index)
            else:
                self.set_input(consumer.node, consumer.index, Ref(new, 0, True))

    def remove_input(self, name: str, index: int) -> None:
        self.remove_inputs(name, [index])

    def remove_inputs(self, name: str, indices: Iterable[int]) -> None:
        """Drop the inputs at ``indices`` from node ``name`` (one re-index, however many)."""
        node = self._own(name)              # inputs only go: no new edge to check
        refs = self._refs[name]
        for i, ref in enumerate(refs):
            self._consumers[ref.node].pop((name, i), None)
        self._maybe_sinks.update(ref.node for ref in refs)
        dropped = set(indices)
        refs = tuple(ref for i, ref in enumerate(refs) if i not in dropped)
        del node.input[:]
        node.input.extend(str(ref) for ref in refs)
        self._refs[name] = refs
        for i, ref in enumerate(refs):
            self._consumers[ref.node][(name, i)] = ref

    def _refile_colocations(self) -> None:
        """File again the colocation targets of the nodes ``edit_node`` handed out."""
        colocated = self._colocated
        for name, filed in self._colocation_as_filed.items():
            node = self.nodes.get(name)
            now = colocation_targets(node) if node is not None else []
            if node is not None and now != filed:
                for target in filed:
                    holders = colocated.get(target)
                    if holders is not None:
                        holders.discard(name)
                for target in now:
                    colocated[target].add(name)
                self._proof.colocation_added = True
        self._colocation_as_filed.clear()

    def remove(self, names: Iterable[str]) -> None:
        """Delete nodes (their own input edges go with them). Colocation constraints naming a
        deleted node are dropped: TensorFlow refuses a graph whose ``_class`` names a missing node."""
        if self._colocation_as_filed:
            self._refile_colocations()
        removed, still_read = [], []
        self._edits += 1
        nodes, consumers, colocated = self.nodes, self._consumers, self._colocated   # hot loop
        by_op, ops, refs, maybe_sinks = self._by_op, self._ops, self._refs, self._maybe_sinks
        for name in list(names):
            node = nodes.pop(name, None)
            if node is None:
                continue
            removed.append(name)
            if consumers.get(name):
                still_read.append(name)     # (unless its readers go too)
            del by_op[ops.pop(name)][name]
            for index, ref in enumerate(refs.pop(name)):
                consumers[ref.node].pop((name, index), None)
                maybe_sinks.add(ref.node)
            if colocated and COLOCATION_ATTR in node.attr:   # no colocation anywhere: none here
                for target in colocation_targets(node):
                    colocated[target].discard(name)
        self._forget(removed)
        self._proof.removed_while_read(still_read)
        if not colocated:
            return
        for name in removed:
            for holder in sorted(colocated.pop(name, ())):
                if holder in nodes:
                    self._drop_colocation(holder, name)

    def _forget(self, removed: List[str]) -> None:
        """The bookkeeping of removed nodes, in bulk (set operations, not one call per node)."""
        self._owned.difference_update(removed)
        values = self._values
        if values:
            for name in removed:
                values.pop(name, None)

    def _drop_colocation(self, holder: str, target: str) -> None:
        node = self._own(holder)
        gone = COLOCATION_PREFIX + target.encode()
        kept = [s for s in node.attr[COLOCATION_ATTR].list.s if s != gone]
        if kept:
            del node.attr[COLOCATION_ATTR].list.s[:]
            node.attr[COLOCATION_ATTR].list.s.extend(kept)
        else:
            del node.attr[COLOCATION_ATTR]

    # ---------------------------------------------------------------- structure
    @property
    def edited(self) -> bool:
        """Whether anything was changed since the graph was indexed."""
        return self._edits > 0

    def structure_problem(self) -> Optional[str]:
        """What is broken, if anything: an input naming no node or a port the node lacks, a
        colocation naming no node, a cycle outside a while loop. None when the graph is sound.
        After a clean check, only what the edits since touched is looked at (``integrity``)."""
        self._refresh_ops()
        if self._colocation_as_filed:
            self._refile_colocations()
        return self._proof.problem(self._edits)

    def op_histogram(self) -> Dict[str, int]:
        counts: Dict[str, int] = defaultdict(int)
        for node in self.nodes.values():
            counts[node.op] += 1
        return dict(counts)

    def to_graph_def(self, nodes: Optional[Iterable[node_def_pb2.NodeDef]] = None
                     ) -> graph_pb2.GraphDef:
        """The graph as a GraphDef (``nodes``: these NodeDefs instead of the graph's own)."""
        graph_def = graph_pb2.GraphDef()
        graph_def.versions.CopyFrom(self._versions)
        graph_def.library.CopyFrom(self._library.proto)
        graph_def.node.extend(self.nodes.values() if nodes is None else nodes)
        return graph_def
