"""How a NodeDef names what it reads.

A NodeDef's inputs are strings: ``"name"`` (output 0 of node ``name``), ``"name:k"`` (output k)
or ``"^name"`` (a control dependency: run after ``name``, read nothing). ``parse_ref`` turns one
into a ``Ref``, ``str(ref)`` / ``format_ref`` turn it back. A node may also name other nodes in
its ``_class`` attribute (``loc:@other``: place me with ``other``); ``colocation_targets`` reads
those names.
"""
from __future__ import annotations

from typing import List, NamedTuple

from tensorflow.core.framework import node_def_pb2

COLOCATION_ATTR = "_class"      # ["loc:@other_node", ...]: place this node with those
COLOCATION_PREFIX = b"loc:@"


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


def colocation_targets(node: node_def_pb2.NodeDef) -> List[str]:
    """The node names a node's ``_class`` colocation attribute names."""
    if COLOCATION_ATTR not in node.attr:
        return []
    return [s[len(COLOCATION_PREFIX):].decode(errors="replace")
            for s in node.attr[COLOCATION_ATTR].list.s if s.startswith(COLOCATION_PREFIX)]
