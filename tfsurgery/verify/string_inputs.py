"""Test strings for a string input, built from the graph's own vocabulary.

Random values cannot stand in for a string, but an input that feeds a lookup table (a
``StringLookup``'s, a ``TextVectorization``'s, a TF1 ``index_table_from_*``) names the strings
the model knows: the table's keys, constants in the graph (``LookupTableImportV2`` or
``InitializeTableV2``). Each element is one key, or — when a splitter (``StringSplitV2``,
``RegexSplitWithOffsets``, ...) lies between the input and the lookup — a few keys joined by
spaces, as a sentence. Anything else (an encoded JPEG, a WAV): no strings, the caller says so.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.ops import node_name

log = logging.getLogger("tfsurgery")

LOOKUP_OPS = frozenset({"LookupTableFindV2", "LookupTableFind"})
TABLE_FILL_OPS = frozenset({"LookupTableImportV2", "InitializeTableV2", "InitializeTable"})
SPLIT_OPS = frozenset({"StringSplit", "StringSplitV2", "RegexSplitWithOffsets",
                       "UnicodeDecodeWithOffsets", "WhitespaceTokenizeWithOffsets"})
FORWARDING = frozenset({"Identity", "IdentityN"})
WORDS_PER_SENTENCE = (2, 7)        # a sentence has this many words, at least and fewer than


def table_strings(graph, input_name: str, shape: Sequence[int],
                  rng: np.random.Generator) -> Optional[np.ndarray]:
    """Strings of ``shape`` for string input ``input_name`` drawn from the keys of the table it
    feeds, or None when it feeds none. ``graph``: a GraphDef or a Graph."""
    found = _vocabulary(graph, input_name)
    if found is None:
        return None
    keys, split, _ = found
    size = int(np.prod(shape)) if len(shape) else 1
    if split:
        values = [" ".join(rng.choice(keys, rng.integers(*WORDS_PER_SENTENCE)))
                  for _ in range(size)]
    else:
        values = list(rng.choice(keys, size))
    log.info("input '%s': %s (e.g. %r)", input_name, describe(graph, input_name), values[0])
    return np.array([v.encode() for v in values], dtype=object).reshape(shape)


def describe(graph, input_name: str) -> Optional[str]:
    """What ``table_strings`` draws for the input (for the report), or None."""
    found = _vocabulary(graph, input_name)
    if found is None:
        return None
    keys, split, table = found
    what = (f"sentences of {WORDS_PER_SENTENCE[0]}-{WORDS_PER_SENTENCE[1] - 1} words"
            if split else "one key each")
    return f"{what} from the {len(keys)} keys of the table '{table}'"


def _vocabulary(graph, input_name: str):
    """(the keys, whether a splitter comes first, the table) of the table the input feeds."""
    nodes = {node.name: node for node in (graph.node if hasattr(graph.node, "add") else graph)}
    consumers = _consumers(nodes)
    found = _lookup_reached(nodes, consumers, node_name(input_name))
    if found is None:
        return None
    lookup, split = found
    keys = _table_keys(nodes, consumers, nodes[lookup].input[0])
    return (keys, split, node_name(nodes[lookup].input[0])) if keys else None


def _consumers(nodes) -> Dict[str, List[str]]:
    consumers: Dict[str, List[str]] = {}
    for node in nodes.values():
        for ref in node.input:
            if not ref.startswith("^"):
                consumers.setdefault(node_name(ref), []).append(node.name)
    return consumers


def _lookup_reached(nodes, consumers, start: str):
    """(the first lookup the input's strings reach as keys, whether a splitter came before)."""
    stack, seen = [(start, False)], {start}
    while stack:
        name, split = stack.pop()
        for consumer in consumers.get(name, ()):
            node = nodes[consumer]
            if node.op in LOOKUP_OPS and node_name(node.input[1]) == name:
                return consumer, split
            if consumer not in seen and node.op not in LOOKUP_OPS:
                seen.add(consumer)
                stack.append((consumer, split or node.op in SPLIT_OPS))
    return None


def _table_keys(nodes, consumers, handle: str) -> List[str]:
    """The table's string keys, from the constant that fills it."""
    import tensorflow as tf
    table = node_name(handle)
    while nodes.get(table) is not None and nodes[table].op in FORWARDING:
        table = node_name(nodes[table].input[0])
    for consumer in consumers.get(table, ()):
        node = nodes[consumer]
        if node.op in TABLE_FILL_OPS and nodes.get(node_name(node.input[1])) is not None and \
                nodes[node_name(node.input[1])].op == "Const":
            array = tf.make_ndarray(nodes[node_name(node.input[1])].attr["value"].tensor)
            if array.dtype != object:
                return []
            return sorted({k.decode("utf-8", "replace") for k in array.ravel()} - {""})
    return []


def onnx_hint(graph_def, outputs: Sequence[str], unconvertible) -> str:
    """What to say when tf2onnx refuses the string part (``unconvertible``: the nodes it left
    in, anything with a ``name``): the cut that exports the rest."""
    cut = numeric_cut(graph_def, outputs, [node.name for node in unconvertible])
    return (f"; the string part has no ONNX form: --inputs {cut} (the token ids after the "
            "lookup) exports the numeric model") if cut else ""


def numeric_cut(graph_def, outputs: Sequence[str], unconvertible: Sequence[str],
                tries: int = 64) -> Optional[str]:
    """The first tensor after every node in ``unconvertible`` (the string part: lookups,
    splitters) through which everything the outputs need passes: given as ``--inputs``, the
    rest is the numeric model (token ids in, scores out). None when there is none."""
    nodes = {node.name: node for node in graph_def.node}
    consumers = _consumers(nodes)
    after = None
    for name in unconvertible:
        reach = _descendants(consumers, name)
        after = reach if after is None else after & reach
    valid = []
    for candidate in sorted(after or ())[:tries]:
        needed = _ancestors(nodes, [node_name(o) for o in outputs], stop=candidate)
        if candidate in needed and not needed & set(unconvertible) and \
                not any(nodes[n].op == "Placeholder" for n in needed if n != candidate):
            valid.append(candidate)
    # the earliest: the one with the most of the numeric model after it
    best = max(valid, key=lambda name: len(_descendants(consumers, name)), default=None)
    return None if best is None else best + ":0"


def _descendants(consumers, start: str) -> set:
    seen, stack = set(), [start]
    while stack:
        for consumer in consumers.get(stack.pop(), ()):
            if consumer not in seen:
                seen.add(consumer)
                stack.append(consumer)
    return seen


def _ancestors(nodes, roots, *, stop: str) -> set:
    seen, stack = set(), list(roots)
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        if name != stop:
            stack.extend(node_name(ref) for ref in nodes[name].input if not ref.startswith("^"))
    return seen
