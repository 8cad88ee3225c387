"""Test inputs a transformer needs, read from the graph (no ``--samples``).

Random integers stand in badly for token ids: an id outside the embedding table makes TensorFlow
refuse to run (``indices[0,1] = 8 is not in [0, 2)``), and a random padding mask may leave a row
with no valid position at all. So, for each integer or bool input the user does not give:

- **ids**: the input reaches the *indices* of a ``Gather``/``GatherV2``/``ResourceGather`` through
  casts, reshapes and Keras' negative-index wrap (``where(ids < 0, ids + vocab, ids)``): it gets
  ids in ``[0, rows)``, ``rows`` the first dimension of the smallest table it indexes (token ids
  and segment ids alike).
- **mask**: the input reaches a ``Softmax`` through elementwise and shape ops only (a comparison,
  a cast, ``Select``, ``Mul``/``Add`` of an additive mask): it gets 0/1 (False/True), each row a
  valid window of random length, at least one position long — right- and left-padded rows
  (``valid_prefixes``); the first row is all valid.

Everything else keeps the seeded random values of ``runs.make_feeds``, which calls ``find`` once
per graph; the choices come back as report lines (``notes``).
"""
from __future__ import annotations

import dataclasses
from collections import deque
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.graph import Graph
from tfsurgery.ops import node_name

GATHER_OPS = {"Gather", "GatherV2", "ResourceGather"}
# ops an id passes through unchanged in meaning on its way to a Gather's indices
ID_PATH_OPS = {"Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "StridedSlice", "Slice",
               "Transpose", "SelectV2", "Select", "AddV2", "Add", "Minimum", "Maximum",
               "ClipByValue", "Tile", "BroadcastTo"}
# ops a mask passes through on its way to the attention's Softmax (no weights, no reductions)
MASK_PATH_OPS = ID_PATH_OPS | {
    "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd",
    "LogicalOr", "LogicalNot", "Sub", "Mul", "Neg", "RealDiv", "Pack", "ConcatV2"}
MAX_VISITS = 400                # nodes walked per input: the mask's path is short


@dataclasses.dataclass
class TokenInput:
    """What one input gets, and why."""

    kind: str            # "ids" (in [0, rows)) or "mask" (0/1, a valid window per row)
    reason: str
    rows: int = 2

    def values(self, rng: np.random.Generator, shape: Sequence[int], dtype) -> np.ndarray:
        if self.kind == "ids":
            return rng.integers(0, self.rows, size=shape).astype(dtype)
        return valid_prefixes(rng, shape).astype(dtype)

    def note(self, name: str) -> str:
        what = f"ids in [0, {self.rows})" if self.kind == "ids" else \
            "0/1 with a valid window per row, right- and left-padded (at least one position)"
        return f"input '{name}': {what}: {self.reason}"


def valid_prefixes(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """1 over a contiguous window of each row's last axis, 0 elsewhere; lengths random in
    [1, length], the first row full (so the unpadded case is checked too). Then rows alternate
    right padding (a valid prefix) and left padding (a valid suffix); with two rows, the second
    is padded on both sides. Left padding is what a causal model meets first positions with no
    valid key in (a check fed right padding alone cannot see how those rows are masked)."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return np.ones((), dtype=np.int64)
    length = shape[-1]
    rows = int(np.prod(shape[:-1]))
    lengths = rng.integers(1, length + 1, size=rows) if length > 0 else np.zeros(rows, int)
    starts = np.zeros(rows, int)
    if rows:
        lengths[0] = length
    for row in range(1, rows):
        if rows == 2:               # both sides: the pad before is at least one where it fits
            lengths[row] = min(lengths[row], max(length - 2, 1))
            starts[row] = (length - lengths[row] + 1) // 2
        elif row % 2 == 0:
            starts[row] = length - lengths[row]
    positions = np.arange(length)[None, :]
    mask = (positions >= starts[:, None]) & (positions < (starts + lengths)[:, None])
    return mask.reshape(shape).astype(np.int64)


def find(graph, inputs: Sequence[str]) -> Dict[str, TokenInput]:
    """Input name → what it gets, for the integer and bool inputs that index an embedding or
    mask an attention. ``graph``: a Graph or a GraphDef (its answer remembered)."""
    if not isinstance(graph, Graph):
        return _cached_find(graph, inputs)
    found = {}
    for name in inputs:
        node = graph.node(node_name(name)) if node_name(name) in graph else None
        if node is None or not _is_int_or_bool(node):
            continue
        found_here = _as_ids(graph, node.name) or _as_mask(graph, node.name)
        if found_here is not None:
            found[name] = found_here
    return found


def notes(graph, inputs: Sequence[str], given=()) -> List[str]:
    """Report lines: what each found input was given, and why (inputs the user fed: nothing)."""
    fed = {node_name(k) for k in (given or ())}
    return [choice.note(name) for name, choice in find(graph, inputs).items()
            if node_name(name) not in fed]


# ---------------------------------------------------------------- the walks
def _as_ids(graph: Graph, start: str) -> Optional[TokenInput]:
    """Tables (first dimension of a Gather's params) the input indexes, through ID_PATH_OPS."""
    tables = {}
    for consumer in _walk(graph, start, ID_PATH_OPS, stop=GATHER_OPS):
        if consumer.index == 1:                     # the indices, not the params
            rows = _table_rows(graph, consumer.node)
            if rows:
                tables[consumer.node] = rows
    if not tables:
        return None
    smallest = min(tables, key=tables.get)
    more = f" (the smallest of {len(tables)} tables)" if len(tables) > 1 else ""
    return TokenInput("ids", f"it indexes the {tables[smallest]}-row table of "
                             f"'{smallest}'{more}", tables[smallest])


def _as_mask(graph: Graph, start: str) -> Optional[TokenInput]:
    for consumer in _walk(graph, start, MASK_PATH_OPS, stop={"Softmax"}):
        if graph.op(consumer.node) == "Softmax":
            return TokenInput("mask", f"it reaches the attention softmax '{consumer.node}' "
                                      "through elementwise ops only")
    return None


def _walk(graph: Graph, start: str, through, *, stop):
    """Breadth-first over consumers: yields every consumer (node, input index) reached whose op
    is in ``stop`` or ``through``; walks on through ``through`` only."""
    seen, queue, visits = {start}, deque([start]), 0
    while queue and visits < MAX_VISITS:
        name = queue.popleft()
        for consumer in graph.consumers(name):
            visits += 1
            op = graph.op(consumer.node)
            if op in stop:
                yield consumer
            elif op in through and consumer.node not in seen:
                seen.add(consumer.node)
                queue.append(consumer.node)


def _table_rows(graph: Graph, gather: str) -> Optional[int]:
    """Rows of a constant Gather table along the gathered axis (GatherV2's axis must be 0)."""
    inputs = graph.inputs(gather)
    if graph.op(gather) == "GatherV2":
        axis = graph.const_value(inputs[2]) if len(inputs) > 2 else None
        if axis is None or int(axis) != 0:
            return None
    params = graph.resolve(inputs[0])
    if params.port != 0 or graph.op(params.node) != "Const":
        return None
    dims = graph.node(params.node).attr["value"].tensor.tensor_shape.dim
    return int(dims[0].size) if dims and dims[0].size > 0 else None


def _is_int_or_bool(node) -> bool:
    import tensorflow as tf
    if "dtype" not in node.attr:
        return False
    dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
    return dtype.is_integer or dtype.is_bool


_last = [(None, None)]          # (key, what find found): make_feeds asks once per size tried


def _cached_find(graph_def, inputs: Sequence[str]) -> Dict[str, TokenInput]:
    """``find`` on a GraphDef, remembered for the last one asked (by identity, size and end
    nodes: no reference to it is kept, so a large graph is not held in memory)."""
    nodes = graph_def.node
    wanted = {node_name(name) for name in inputs}
    if not any(node.name in wanted and _is_int_or_bool(node) for node in nodes):
        return {}              # no integer or bool input: nothing to find, no index to build
    key = (id(graph_def), len(nodes), nodes[0].name if nodes else "",
           nodes[-1].name if nodes else "", tuple(inputs))
    entry = _last[0]
    if entry[0] != key:
        entry = (key, find(Graph(graph_def, check_inputs=False), inputs))
        _last[0] = entry
    return entry[1]
