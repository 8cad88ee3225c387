"""The graph index every transform works on.

A GraphDef is a flat list of NodeDefs whose inputs are strings: ``"name"``, ``"name:k"`` (output k)
or ``"^name"`` (control dependency). ``Graph`` parses those strings once, keeps a name → node map and a
producer → consumers map, and offers the handful of edits transforms need (add, rewire, remove, prune),
keeping both maps up to date. Every lookup is a dict access, so a pass over the graph is linear.

Tensor values go through TensorFlow's own ``tf.make_ndarray`` / ``tf.make_tensor_proto``.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import itertools
from collections import defaultdict, deque
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional, Set, Tuple

import numpy as np

from tensorflow.core.framework import (attr_value_pb2, graph_pb2, node_def_pb2, tensor_pb2,
                                      tensor_shape_pb2)

from tfsurgery.errors import GraphError
from tfsurgery.ops import FORWARDING_OPS

CACHED_VALUE_BYTES = 4096      # decoded Const values up to this size are kept (read-only)
COLOCATION_ATTR = "_class"      # ["loc:@other_node", ...]: place this node with those
COLOCATION_PREFIX = b"loc:@"
BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})   # a while loop's back edge



class Ref(NamedTuple):
    """One parsed input string: a tensor ``node:port`` or a control edge ``^node``."""

    node: str
    port: int = 0
    control: bool = False

    def __str__(self) -> str:
        return format_ref(self.node, self.port, self.control)

    @property
    def tensor(self) -> "Ref":
        return Ref(self.node, self.port, False)


def parse_ref(text: str) -> Ref:
    """``"a"`` → (a, 0), ``"a:2"`` → (a, 2), ``"^a"`` → control edge from a."""
    # tuple.__new__ makes the Ref without NamedTuple's Python-level __new__: this runs for
    # every input of every node
    if text[:1] == "^":
        return _new_tuple(Ref, (text[1:], 0, True))
    colon = text.rfind(":")
    if colon > 0 and text[colon + 1:].isdigit():
        return _new_tuple(Ref, (text[:colon], int(text[colon + 1:]), False))
    return _new_tuple(Ref, (text, 0, False))


_new_tuple = tuple.__new__


def format_ref(node: str, port: int = 0, control: bool = False) -> str:
    if control:
        return "^" + node
    return node if port == 0 else f"{node}:{port}"


class Consumer(NamedTuple):
    node: str          # the consuming node
    index: int         # position in its input list
    ref: Ref           # what it reads from the producer


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


def _tf():
    import tensorflow as tf  # imported lazily: the index itself is usable without a TF session
    return tf


class Graph:
    """An editable, indexed copy of a GraphDef (the caller's GraphDef is never touched)."""

    def __init__(self, graph_def: graph_pb2.GraphDef, *, check_inputs: bool = True):
        self._versions = copy.deepcopy(graph_def.versions)
        self._library = copy.deepcopy(graph_def.library)
        # Copy-on-write: nodes are the caller's until first changed (see ``mutable``), so an
        # index over a large graph costs little more than the graph itself.
        self.nodes: Dict[str, node_def_pb2.NodeDef] = {n.name: n for n in graph_def.node}
        if check_inputs and len(self.nodes) != len(graph_def.node):
            _check_unique_names(graph_def)
        self._owned: Set[str] = set()
        # The op index: a transform finds its few nodes of interest without visiting every
        # NodeDef. op → {node: its position in graph order}, each group in that order; node →
        # the op it is filed under (a dict in the same order as ``nodes``: both see the same
        # inserts and removals). ``mutable`` may change a node's op: such nodes are filed again
        # before the next query.
        self._by_op: Dict[str, Dict[str, int]] = defaultdict(dict)
        self._ops: Dict[str, str] = {}
        self._positions = itertools.count()     # a node's place in graph order
        self._op_may_change: Set[str] = set()
        self._refs: Dict[str, Tuple[Ref, ...]] = {}      # node → its inputs, parsed once
        self._consumers: Dict[str, Dict[Tuple[str, int], Ref]] = defaultdict(dict)
        self._colocated: Dict[str, Set[str]] = defaultdict(set)    # target → nodes naming it
        self._values: Dict[str, np.ndarray] = {}          # small Const values, decoded once
        # Edits so far, and the count at the last clean structure check: a pass that changed
        # nothing is not checked again, and after edits through the index only what they
        # touched is (a full check walks the whole graph).
        self._edits = 0
        self._sound_at = -1
        self._check_all = False             # the next check walks everything (see ``mutable``)
        # Since the last clean check: producers some edge may read wrongly (removed, or read at
        # a port above 0), and whether a colocation was added; noted as edits happen.
        self._suspects: Set[str] = set()
        self._new_colocation = False
        # A topological position per node (loops' back edges aside), kept while edits allow:
        # proof that no edit closed a cycle, without Kahn over the whole graph (``_place``).
        self._topo: Optional[Dict[str, float]] = None
        self._lowest = 0
        outputs: Dict[str, Optional[int]] = {}
        in_order = check_inputs
        with gc_paused():        # a burst of small objects that all live on: nothing to collect
            for name, node in self.nodes.items():
                attrs = node.attr
                refs = self._index_edges(name, node, attrs)
                if check_inputs:
                    check_attr_kinds(node, attrs, self._ops[name])
                    _check_inputs(node, refs, self.nodes, outputs)
                    in_order = in_order and self._reads_earlier(name, refs)
        if in_order and self._colocation_problem() is None:
            self._topo = dict(zip(self.nodes, itertools.count()))    # graph order (no loop)
            self._sound_at = 0          # inputs, ports, colocation and order checked: sound
            self._new_colocation = False

    def _reads_earlier(self, name: str, refs: Tuple[Ref, ...]) -> bool:
        """Whether a node just indexed reads only nodes indexed before it (or a loop's back
        edge). When all do, as TensorFlow writes graphs, graph order is topological."""
        indexed, nodes = self._refs, self.nodes
        for ref in refs:
            if (ref.node == name or ref.node not in indexed) and \
                    nodes[ref.node].op not in BACK_EDGE_OPS:
                return False
        return True

    def _index_edges(self, name: str, node: node_def_pb2.NodeDef, attrs) -> Tuple[Ref, ...]:
        """File a node (just added, so last in graph order) under its op, its inputs and its
        colocation targets."""
        op = node.op
        self._by_op[op][name] = next(self._positions)
        self._ops[name] = op
        refs = self._refs[name] = tuple(map(parse_ref, node.input))
        consumers = self._consumers
        for index, ref in enumerate(refs):
            consumers[ref.node][(name, index)] = ref
        if COLOCATION_ATTR in attrs:
            self._new_colocation = True
            for target in colocation_targets(node):
                self._colocated[target].add(name)
        return refs

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
        """File again the nodes ``mutable`` handed out whose op has changed since."""
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
        node = self.nodes.get(ref.node if isinstance(ref, Ref) else ref)
        if node is None and not isinstance(ref, Ref):      # "name:1" or "^name"
            node = self.nodes.get(parse_ref(ref).node)
        return node.op if node is not None else None

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
            found.append(Consumer(consumer, index, ref))
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
        value = attrs[key]
        kind = value.WhichOneof("value")
        if kind == "s":
            return value.s.decode(errors="replace")
        if kind == "type":
            return _tf().dtypes.as_dtype(value.type)
        if kind == "shape":
            return _tf().TensorShape(value.shape)
        if kind == "list":
            return list(value.list.i) or [s.decode() for s in value.list.s] or list(value.list.f)
        return getattr(value, kind) if kind else default

    def resolve(self, ref) -> Ref:
        """Follow identity-like ops back to the tensor that really produces a value."""
        ref = ref if isinstance(ref, Ref) else parse_ref(ref)
        seen = set()
        while ref.node in self.nodes and self.nodes[ref.node].op in FORWARDING_OPS \
                and ref.node not in seen:
            seen.add(ref.node)
            inputs = self.inputs(ref.node)
            if self.nodes[ref.node].op == "IdentityN":
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
        node = self.nodes.get(ref.node)
        if node is None:
            return None
        op = node.op
        if op != "Const":                 # only a forwarding op leads on to a constant
            if through_identity and op in FORWARDING_OPS:
                return self.const_value(self.resolve(ref), through_identity=False)
            return None
        if ref.port != 0:
            return None
        value = decode_tensor(node.attr["value"].tensor)      # read-only: shared, never edited
        if value.nbytes <= CACHED_VALUE_BYTES:
            self._values[ref.node] = value
        return value

    def is_const(self, ref) -> bool:
        ref = self.resolve(ref if isinstance(ref, Ref) else parse_ref(ref))
        node = self.nodes.get(ref.node)
        return node is not None and node.op == "Const" and ref.port == 0

    # ---------------------------------------------------------------- editing
    def mutable(self, name: str) -> node_def_pb2.NodeDef:
        """Node ``name``, safe to change: our own copy, never the caller's NodeDef."""
        self._check_all = True              # anything may change: the next check is a full one
        self._op_may_change.add(name)
        return self._own(name)

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

    def add_node(self, node: node_def_pb2.NodeDef) -> node_def_pb2.NodeDef:
        if node.name in self.nodes:
            raise GraphError(f"node '{node.name}' already exists")
        self.nodes[node.name] = node
        self._edits += 1
        self._owned.add(node.name)
        self._values.pop(node.name, None)
        self._index_edges(node.name, node, node.attr)
        self._place(node.name)
        return node

    def _place(self, name: str) -> None:
        """Give a new node a topological position between those of its inputs and its readers
        (when there is no room, or no positions, the next structure check is a full one), and
        note what the next check must look at: producers it reads that are missing or read at
        a port above 0, and itself if its readers read such ports. (A hot path: plain loops.)"""
        if self._topo is None:
            self._check_all = True
            return
        ops, topo, suspects = self._ops, self._topo, self._suspects
        low = high = None
        for ref in self._refs[name]:
            op = ops.get(ref.node)
            if ref.port or op is None:
                suspects.add(ref.node)
            if ref.node == name:                    # a self-loop
                self._lose_order()
                return
            if op is not None and op not in BACK_EDGE_OPS:
                at = topo[ref.node]
                low = at if low is None or at > low else low
        for (reader, _index), ref in self._consumers.get(name, {}).items():
            if ref.port:
                suspects.add(name)
            if reader in ops and ops[name] not in BACK_EDGE_OPS:
                at = topo[reader]
                high = at if high is None or at < high else high
        if low is None:                             # a source: below everything so far
            at = self._lowest = min(self._lowest, high if high is not None else 0) - 1
        else:
            at = low + 1 if high is None else (low + high) / 2
        if (low is not None and not low < at) or (high is not None and not at < high):
            self._lose_order()                      # no room left between them
            return
        topo[name] = at

    def _keep_order(self, producer: str, consumer: str) -> None:
        """A new edge producer → consumer: does it respect the topological positions?"""
        op = self._ops.get(producer)
        if self._topo is None:
            self._check_all = True
        elif op is not None and op not in BACK_EDGE_OPS:
            if not self._topo[producer] < self._topo[consumer]:
                self._lose_order()

    def _lose_order(self) -> None:
        self._topo = None
        self._check_all = True

    def new_node(self, op: str, name: str, inputs: Iterable = (), attrs: Optional[dict] = None,
                 device: str = "") -> node_def_pb2.NodeDef:
        """Create and add ``op`` named ``name`` (made unique) with inputs (str or Ref)."""
        node = node_def_pb2.NodeDef(op=op, name=self.unique_name(name), device=device)
        node.input.extend([str(i) for i in inputs])
        for key, value in (attrs or {}).items():
            node.attr[key].CopyFrom(value if isinstance(value, attr_value_pb2.AttrValue)
                                    else _attr(value))
        return self.add_node(node)

    def add_const(self, name: str, value, dtype=None, device: str = "") -> str:
        """Add a Const holding ``value`` (numpy or scalar); returns its (unique) name."""
        node = node_def_pb2.NodeDef(op="Const", name=self.unique_name(name), device=device)
        node.attr["dtype"].type = encode_tensor(value, dtype, into=node.attr["value"].tensor).dtype
        return self.add_node(node).name

    def const_nbytes(self, name: str) -> int:
        """Size of a Const's value, from its shape and dtype (no decoding)."""
        tensor = self.nodes[name].attr["value"].tensor
        count = int(np.prod([d.size for d in tensor.tensor_shape.dim], dtype=np.int64))
        return count * _tf().dtypes.as_dtype(tensor.dtype).size

    def set_const_value(self, name: str, value, dtype=None) -> None:
        """Replace a Const's value in place (callers make sure no one else depends on it).
        The node is rebuilt around the new value: the old one is never copied."""
        old = self.nodes[name]
        node = node_def_pb2.NodeDef(name=old.name, op=old.op, device=old.device)
        node.input.extend(old.input)
        for key in old.attr:
            if key != "value":
                node.attr[key].CopyFrom(old.attr[key])
        for field in ("experimental_debug_info", "experimental_type"):
            if old.HasField(field):
                getattr(node, field).CopyFrom(getattr(old, field))
        node.attr["dtype"].type = encode_tensor(value, dtype, into=node.attr["value"].tensor).dtype
        self._edits += 1         # a new value, no new edge: nothing for the structure check
        self._values.pop(name, None)
        self._owned.add(name)
        self.nodes[name] = node

    def set_input(self, name: str, index: int, new) -> None:
        """Make input ``index`` of node ``name`` read ``new`` (str or Ref)."""
        node = self._own(name)              # a new edge, checked at the next structure check
        refs = self._refs[name]
        self._consumers[refs[index].node].pop((name, index), None)
        new_ref = new if isinstance(new, Ref) else parse_ref(new)
        node.input[index] = str(new_ref)
        self._refs[name] = refs[:index] + (new_ref,) + refs[index + 1:]
        self._consumers[new_ref.node][(name, index)] = new_ref
        if new_ref.port or new_ref.node not in self.nodes:
            self._suspects.add(new_ref.node)
        self._keep_order(new_ref.node, name)

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
        dropped = set(indices)
        refs = tuple(ref for i, ref in enumerate(refs) if i not in dropped)
        del node.input[:]
        node.input.extend(str(ref) for ref in refs)
        self._refs[name] = refs
        for i, ref in enumerate(refs):
            self._consumers[ref.node][(name, i)] = ref

    def remove(self, names: Iterable[str]) -> None:
        """Delete nodes (their own input edges go with them). Colocation constraints naming a
        deleted node are dropped: TensorFlow refuses a graph whose ``_class`` names a missing node."""
        removed = []
        self._edits += 1
        nodes, consumers, colocated = self.nodes, self._consumers, self._colocated   # hot loop
        by_op, ops, refs = self._by_op, self._ops, self._refs
        for name in list(names):
            node = nodes.pop(name, None)
            if node is None:
                continue
            removed.append(name)
            if consumers.get(name):
                self._suspects.add(name)    # still read (unless its readers go too)
            del by_op[ops.pop(name)][name]
            for index, ref in enumerate(refs.pop(name)):
                consumers[ref.node].pop((name, index), None)
            if colocated and COLOCATION_ATTR in node.attr:   # no colocation anywhere: none here
                for target in colocation_targets(node):
                    colocated[target].discard(name)
        self._forget(removed)
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

    # ---------------------------------------------------------------- function library
    def function(self, name: str):
        """The library's FunctionDef called ``name`` (None if there is none)."""
        for fdef in self._library.function:
            if fdef.signature.name == name:
                return fdef
        return None

    def library(self):
        """The FunctionDefLibrary (read it; change it through the methods here)."""
        return self._library

    def function_names(self) -> Set[str]:
        return {fdef.signature.name for fdef in self._library.function}

    def called_functions(self) -> Set[str]:
        """Library functions the nodes call, directly or through other functions' bodies."""
        bodies = {fdef.signature.name: fdef for fdef in self._library.function}
        pending = [f for node in self.nodes.values() for f in called_by(node, bodies)]
        called: Set[str] = set()
        while pending:
            name = pending.pop()
            if name in called or name not in bodies:
                continue
            called.add(name)
            pending.extend(f for inner in bodies[name].node_def for f in called_by(inner, bodies))
            pending.extend(g.gradient_func for g in self._library.gradient
                           if g.function_name == name)
        return called

    def remove_functions(self, names: Iterable[str]) -> None:
        """Drop functions (and their gradients) from the library."""
        gone = set(names)
        kept = [f for f in self._library.function if f.signature.name not in gone]
        gradients = [g for g in self._library.gradient if g.function_name not in gone]
        del self._library.function[:]
        self._library.function.extend(kept)
        del self._library.gradient[:]
        self._library.gradient.extend(gradients)

    @property
    def edited(self) -> bool:
        """Whether anything was changed since the graph was indexed."""
        return self._edits > 0

    def structure_problem(self) -> Optional[str]:
        """What is broken, if anything: an input naming no node or a port the node lacks, a
        colocation naming no node, a cycle outside a while loop. None when the graph is sound."""
        if self._sound_at == self._edits:
            return None                     # nothing changed since the last clean check
        if self._sound_at >= 0 and not self._check_all:
            problem = self._problem_since_sound()
        else:
            problem = self._structure_problem()
        if problem is None:
            self._sound_at, self._check_all = self._edits, False
            self._suspects.clear()
            self._new_colocation = False
        return problem

    def _problem_since_sound(self) -> Optional[str]:
        """Since a clean check, edits went through the index (no ``mutable``) and kept the
        topological positions (no cycle): only the edges noted as suspect can be wrong."""
        for producer in self._suspects:
            problem = self._producer_problem(producer)
            if problem:
                return problem
        return self._colocation_problem() if self._new_colocation else None

    def _structure_problem(self) -> Optional[str]:
        problem = None if self._edges_look_sound() else self._edge_problem()
        if problem:
            return problem
        problem = self._colocation_problem()
        if problem:
            return problem
        cycle = self._cycle_outside_loops()
        return f"cycle outside a while loop through node '{cycle}'" if cycle else None

    def _colocation_problem(self) -> Optional[str]:
        nodes = self.nodes
        for target, holders in self._colocated.items():
            if holders and target not in nodes:
                return f"node '{min(holders)}' is colocated with missing node '{target}'"
        return None

    def _edges_look_sound(self) -> bool:
        """The quick pass over the edges: every producer read exists (one set difference) and
        each port read above 0 exists. When it has doubts, ``_edge_problem`` names the first."""
        consumers, nodes = self._consumers, self.nodes
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

    def _edge_problem(self) -> Optional[str]:
        for producer in self._consumers:
            problem = self._producer_problem(producer)
            if problem:
                return problem
        return None

    def _producer_problem(self, producer: str) -> Optional[str]:
        """Whether the readers of ``producer`` read a node that exists, at a port it has."""
        readers = self._consumers.get(producer)
        if not readers:
            return None
        node = self.nodes.get(producer)
        if node is None:
            (reader, _), ref = next(iter(readers.items()))
            return f"node '{reader}' reads '{ref}' but no node '{producer}' exists"
        top = max(readers.values()).port          # the Refs differ only in port / control
        if top > 0:
            ports = num_outputs(node)
            if ports is not None and top >= ports:
                return f"'{producer}:{top}' is read but {node.op} '{producer}' has {ports} output(s)"
        return None

    def _cycle_outside_loops(self) -> Optional[str]:
        """A node on a cycle that no NextIteration closes (Kahn without the loops' back edges)."""
        back = set(self.names_with_ops(BACK_EDGE_OPS))
        order, indegree = self._kahn(skip=back)
        if len(order) == len(self.nodes):
            self._topo = dict(zip(order, itertools.count()))     # for the next checks
            self._lowest = 0
            return None
        return min(name for name, d in indegree.items() if d > 0)

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
        if self._none_dead(roots):
            return []
        needed = self.ancestors(roots)
        dead = [name for name in self.nodes if name not in needed]
        self.remove(dead)
        return dead

    def _none_dead(self, roots: List[str]) -> bool:
        """A quick proof that every node is needed: without while loops (cycles), a graph in
        which every node but the roots has a reader has only roots as sinks, and every node
        reaches a sink. (A cycle outside a loop, which breaks a graph anyway, would fool it.)"""
        if self._by_op_present(BACK_EDGE_OPS):
            return False
        rooted = {parse_ref(root).node for root in roots}
        consumers = self._consumers
        return all(consumers.get(name) or name in rooted for name in self.nodes)

    def _by_op_present(self, ops) -> bool:
        self._refresh_ops()
        return any(self._by_op.get(op) for op in ops)

    def topological_order(self) -> List[str]:
        """Producers before consumers (Kahn). Nodes on cycles — while loops, whose NextIteration
        feeds a Merge — are appended in graph order instead of failing."""
        return self.ordered()[0]

    def ordered(self) -> Tuple[List[str], bool]:
        """``topological_order()``, and whether it is one: False when cycles (while loops) left
        nodes to be appended in graph order."""
        order, _ = self._kahn()
        if len(order) == len(self.nodes):
            return order, True
        placed = set(order)
        order.extend(name for name in self.nodes if name not in placed)
        return order, False

    def _kahn(self, skip: Set[str] = frozenset()) -> Tuple[List[str], Dict[str, int]]:
        """Kahn's order over the edges whose producer exists and is not in ``skip``, and the
        in-degrees left (above 0: on or behind a cycle)."""
        nodes, consumers = self.nodes, self._consumers
        indegree = {name: len(refs) for name, refs in self._refs.items()}
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
        graph_def.library.CopyFrom(self._library)
        graph_def.node.extend(self.nodes.values() if nodes is None else nodes)
        return graph_def


# ---------------------------------------------------------------- tensor values
def decode_tensor(tensor: tensor_pb2.TensorProto) -> np.ndarray:
    """``tf.make_ndarray``, read-only. Its packed-bytes case is inlined (most weights): the array
    is a view of the bytes, no second copy, and make_ndarray's own overhead (dtype objects,
    np.prod) costs more than the data for small tensors."""
    content = tensor.tensor_content
    if content:             # what make_ndarray does for packed bytes, minus the copy
        shape = [d.size for d in tensor.tensor_shape.dim]
        return np.frombuffer(content, dtype=_numpy_dtype(tensor.dtype)).reshape(shape)
    value = _tf().make_ndarray(tensor)
    value.flags.writeable = False
    return value


def encode_tensor(value, dtype=None,
                  into: Optional[tensor_pb2.TensorProto] = None) -> tensor_pb2.TensorProto:
    """``tf.make_tensor_proto(value, dtype)`` (written ``into`` that proto if given). A numpy
    array of two or more numbers of a packed type is written as make_tensor_proto writes it
    (shape and raw bytes), without its overhead and without copying the bytes twice."""
    tensor = tensor_pb2.TensorProto() if into is None else into
    if isinstance(value, np.ndarray) and value.size > 1 and \
            (dtype is None or _tf().dtypes.as_dtype(dtype).as_numpy_dtype == value.dtype):
        enum = _packed_enum(value.dtype)
        if enum is not None and value.nbytes < (1 << 31):
            tensor.Clear()
            tensor.dtype = enum
            dims = tensor.tensor_shape.dim
            for size in value.shape:
                dims.add(size=size)       # (in place: no Dim message built and copied in)
            tensor.tensor_content = value.tobytes()
            return tensor
    tensor.CopyFrom(_tf().make_tensor_proto(value, dtype=dtype))
    return tensor


@functools.lru_cache(maxsize=None)
def _numpy_dtype(enum: int) -> np.dtype:
    return np.dtype(_tf().dtypes.as_dtype(enum).as_numpy_dtype)


@functools.lru_cache(maxsize=None)
def _packed_enum(dtype: np.dtype) -> Optional[int]:
    """The DataType enum of a numpy dtype make_tensor_proto packs as bytes (None otherwise)."""
    from tensorflow.python.framework import tensor_util
    try:
        tf_dtype = _tf().dtypes.as_dtype(dtype)
    except TypeError:
        return None
    return tf_dtype.as_datatype_enum if tf_dtype in tensor_util._TENSOR_CONTENT_TYPES else None


def colocation_targets(node: node_def_pb2.NodeDef) -> List[str]:
    """The node names a node's ``_class`` colocation attribute names."""
    if COLOCATION_ATTR not in node.attr:
        return []
    return [s[len(COLOCATION_PREFIX):].decode(errors="replace")
            for s in node.attr[COLOCATION_ATTR].list.s if s.startswith(COLOCATION_PREFIX)]


def called_by(node: node_def_pb2.NodeDef, library_names=()) -> List[str]:
    """Function names a node calls: its ``func`` attributes (If's branches, a call's ``f``,
    While's ``cond``/``body``) and, for a direct call, its op itself if that is a library name."""
    names = [node.op] if node.op in library_names else []
    for value in node.attr.values():
        if value.WhichOneof("value") == "func":
            names.append(value.func.name)
        elif value.WhichOneof("value") == "list":
            names.extend(f.name for f in value.list.func)
    return names


def check_structure(graph_def: graph_pb2.GraphDef) -> None:
    """Unique names; every input names an existing node and, where the op is known, one of its
    outputs. Raises GraphError; copies nothing."""
    nodes: Dict[str, node_def_pb2.NodeDef] = {node.name: node for node in graph_def.node}
    if len(nodes) != len(graph_def.node):
        _check_unique_names(graph_def)
    outputs: Dict[str, Optional[int]] = {}
    for node in graph_def.node:
        check_attr_kinds(node)
        _check_inputs(node, tuple(map(parse_ref, node.input)), nodes, outputs)


def _check_unique_names(graph_def: graph_pb2.GraphDef) -> None:
    seen: Set[str] = set()
    for node in graph_def.node:
        if node.name in seen:
            raise GraphError(f"duplicate node name '{node.name}'")
        seen.add(node.name)


def _check_inputs(node: node_def_pb2.NodeDef, refs: Tuple[Ref, ...],
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


# OpDef attribute types → the AttrValue field that must hold them.
_ATTR_FIELDS = {"string": "s", "int": "i", "float": "f", "bool": "b", "type": "type",
                "shape": "shape", "tensor": "tensor", "func": "func"}


_OP_DEFS: Dict[str, object] = {}


def op_def(op: str):
    """TensorFlow's OpDef of ``op`` (None for an op it does not know), looked up once per op."""
    found = _OP_DEFS.get(op)
    if found is None:
        from tensorflow.python.framework import op_def_registry
        found = op_def_registry.get(op)
        if found is not None:           # unknown ops are asked again: a library may load later
            _OP_DEFS[op] = found
    return found


@functools.lru_cache(maxsize=None)
def _attr_kinds_of(op: str) -> Tuple[Tuple[str, str, str], ...]:
    kinds = []
    for attr in op_def(op).attr:
        wanted = "list" if attr.type.startswith("list(") else _ATTR_FIELDS.get(attr.type)
        if wanted is not None:
            kinds.append((attr.name, wanted, attr.type))
    return tuple(kinds)


def _attr_kinds(op: str) -> Tuple[Tuple[str, str, str], ...]:
    """(attribute, AttrValue field it must hold, its OpDef type) for each attribute ``op``
    defines with a known kind; empty for ops this TensorFlow does not know."""
    kinds = _KINDS.get(op)              # one dict lookup per node on the indexing path
    if kinds is None:
        if op_def(op) is None:
            return ()                   # asked again next time: a library may load later
        kinds = _KINDS[op] = _attr_kinds_of(op)
    return kinds


_KINDS: Dict[str, Tuple[Tuple[str, str, str], ...]] = {}


def check_attr_kinds(node: node_def_pb2.NodeDef, attrs=None, op: Optional[str] = None) -> None:
    """Each attribute the op defines holds a value of the kind its definition says
    (``attrs``, ``op``: ``node.attr``, ``node.op`` if the caller has them already)."""
    attrs = node.attr if attrs is None else attrs
    for name, wanted, type_ in _attr_kinds(node.op if op is None else op):
        if name not in attrs:
            continue
        held = attrs[name].WhichOneof("value")
        if held is not None and held != wanted:
            raise GraphError(f"node '{node.name}' ({node.op}): attribute '{name}' should be "
                             f"a {type_}, not a {held}")


def _output_args(op: str):
    """Per output argument of ``op``: its number attr, its type-list attr (or ""); None for an
    unknown op."""
    definition = op_def(op)
    return None if definition is None else _output_args_of(op)


@functools.lru_cache(maxsize=None)
def _output_args_of(op: str):
    return tuple((arg.number_attr, arg.type_list_attr) for arg in op_def(op).output_arg)


def num_outputs(node: node_def_pb2.NodeDef) -> Optional[int]:
    """How many outputs a node has, from its op's definition (None for unknown ops)."""
    args = _output_args(node.op)
    if args is None:
        return None
    count = 0
    for number_attr, type_list_attr in args:
        if number_attr:
            count += node.attr[number_attr].i
        elif type_list_attr:
            count += len(node.attr[type_list_attr].list.type)
        else:
            count += 1
    return count


def _attr(value) -> attr_value_pb2.AttrValue:
    """Plain Python/TF values → AttrValue for ``Graph.new_node``."""
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, int):
        return attr_value_pb2.AttrValue(i=value)
    if isinstance(value, float):
        return attr_value_pb2.AttrValue(f=value)
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    if isinstance(value, bytes):
        return attr_value_pb2.AttrValue(s=value)
    if isinstance(value, _tf().dtypes.DType):
        return attr_value_pb2.AttrValue(type=value.as_datatype_enum)
    raise TypeError(f"cannot make an attribute from {value!r}")
