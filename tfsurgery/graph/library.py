"""A graph's function library: the FunctionDefs its nodes call (tf.function bodies, If/While
branches, gradients), read and pruned.

``FunctionLibrary`` owns a copy of the GraphDef's ``FunctionDefLibrary``; ``Graph`` hands it out
through ``graph.function(name)``, ``graph.called_functions()`` and the like.
"""
from __future__ import annotations

import copy
from typing import Iterable, List, Set

from tensorflow.core.framework import function_pb2, node_def_pb2


class FunctionLibrary:
    """A copy of a ``FunctionDefLibrary`` (the caller's is never touched)."""

    def __init__(self, library: function_pb2.FunctionDefLibrary):
        self.proto = copy.deepcopy(library)

    def function(self, name: str):
        """The FunctionDef called ``name`` (None if there is none)."""
        for fdef in self.proto.function:
            if fdef.signature.name == name:
                return fdef
        return None

    def names(self) -> Set[str]:
        return {fdef.signature.name for fdef in self.proto.function}

    def called_by_nodes(self, nodes: Iterable[node_def_pb2.NodeDef]) -> Set[str]:
        """Functions the nodes call, directly or through other functions' bodies, and the
        gradients of those."""
        bodies = {fdef.signature.name: fdef for fdef in self.proto.function}
        pending = [f for node in nodes for f in called_by(node, bodies)]
        called: Set[str] = set()
        while pending:
            name = pending.pop()
            if name in called or name not in bodies:
                continue
            called.add(name)
            pending.extend(f for inner in bodies[name].node_def for f in called_by(inner, bodies))
            pending.extend(g.gradient_func for g in self.proto.gradient
                           if g.function_name == name)
        return called

    def remove(self, names: Iterable[str]) -> None:
        """Drop functions (and their gradients)."""
        gone = set(names)
        kept = [f for f in self.proto.function if f.signature.name not in gone]
        gradients = [g for g in self.proto.gradient if g.function_name not in gone]
        del self.proto.function[:]
        self.proto.function.extend(kept)
        del self.proto.gradient[:]
        self.proto.gradient.extend(gradients)


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


class LibraryMethods:
    """``Graph``'s function-library methods (tfsurgery.graph.index): over its ``_library`` (a
    ``FunctionLibrary``) and its ``nodes``."""

    def function(self, name: str):
        """The library's FunctionDef called ``name`` (None if there is none)."""
        return self._library.function(name)

    def library(self):
        """The FunctionDefLibrary (read it; change it through the methods here)."""
        return self._library.proto

    def edit_function(self, name: str):
        """The FunctionDef called ``name``, to change in place (the library is this graph's
        own copy); None if there is none."""
        return self._library.function(name)

    def function_names(self) -> Set[str]:
        return self._library.names()

    def called_functions(self) -> Set[str]:
        """Library functions the nodes call, directly or through other functions' bodies."""
        return self._library.called_by_nodes(self.nodes.values())

    def remove_functions(self, names: Iterable[str]) -> None:
        """Drop functions (and their gradients) from the library."""
        self._library.remove(names)
