"""Where a SavedModel's file names come from, proven from its protos before it is loaded.

Two stateful ops of a SavedModel read files by design: its checkpoint ops (``RestoreV2``, ...)
and tables filled from a text file. Each is accepted only where the file name is proven to be
the model's own: a checkpoint op's prefix derived from the saver's own filename tensor (which
the loader feeds with the model's ``variables/``), a table's file name an asset of the model's
own ``assets/``. A name that reaches an op through a function argument is followed to **every**
call site of that function (and, for a function the TF2 loader calls itself, to the object it
binds that argument to); one call site that cannot be followed (a ``While`` body, a tf.data
function, a nested function attribute) or that feeds anything else, and the op is refused.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set, Tuple

from tfsurgery.ops import node_name

TABLE_FROM_FILE_OPS = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})
# checkpoint op → the positions of its inputs that name files
CHECKPOINT_PATH_INPUTS: Dict[str, Tuple[int, ...]] = {
    "RestoreV2": (0,), "SaveV2": (0,), "MergeV2Checkpoints": (0, 1), "Restore": (0,),
    "RestoreSlice": (0,), "Save": (0,), "SaveSlices": (0,)}
# string ops the saver builds its shard names with (TF's own traced save function)
SHARD_NAMING_OPS = frozenset({"Identity", "StringJoin", "ShardedFilename", "StaticRegexFullMatch",
                              "Select", "SelectV2", "Pack"})
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
BRANCH_OPS = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})

Scope = Optional[str]          # None: the graph itself; else a library function's name
CallSite = Optional[Tuple[Scope, List[str]]]     # None: a call whose arguments cannot be mapped


def is_inside(path: Path, directory: Path) -> bool:
    """``path`` (resolved, symlinks followed) lies inside ``directory``."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))
    except (OSError, ValueError):
        return False


def body_name(ref: str) -> str:
    """A function body's input (``"node:output:0"``, ``"^node"``, ``"arg"``) → the node or
    argument it names."""
    return ref.lstrip("^").split(":")[0]


def name_in(ref: str, scope: Scope) -> str:
    """The node (or, in a function, the argument) an input names, in the graph or a body."""
    return node_name(ref) if scope is None else body_name(ref)


def data_inputs(node) -> List[str]:
    return [ref for ref in node.input if not ref.startswith("^")]


class Provenance:
    """The file-name proofs for one graph (a SavedModel's meta graph, or a frozen graph)."""

    def __init__(self, graph_def, *, assets: Optional[Path] = None, asset_nodes=(),
                 saver_filename: str = "", object_graph=None):
        self.nodes = {node.name: node for node in graph_def.node}
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.bodies = {name: {node.name: node for node in f.node_def}
                       for name, f in self.functions.items()}
        self.assets = assets
        self.asset_nodes = frozenset(node_name(name) for name in asset_nodes)
        self.saver_filename = node_name(saver_filename) if saver_filename else ""
        self.bound_assets = _bound_assets(object_graph, self.functions)
        self.call_sites = self._call_sites()

    # ------------------------------------------------------------ the two proofs
    def proven(self, node, scope: Scope) -> bool:
        """``node`` (a table initializer or a checkpoint op) reads only the model's own
        files."""
        if node.op in TABLE_FROM_FILE_OPS:
            inputs = data_inputs(node)
            return len(inputs) > 1 and self._traces(inputs[1], scope, self._is_asset, set())
        positions = CHECKPOINT_PATH_INPUTS.get(node.op)
        if positions is None or not self.saver_filename:
            return False
        inputs = data_inputs(node)
        return all(i < len(inputs) and self._traces(inputs[i], scope, self._is_saver_file, set(),
                                                    SHARD_NAMING_OPS) for i in positions)

    def _is_asset(self, node, scope: Scope) -> bool:
        if scope is None and node.name in self.asset_nodes:
            return True                     # TF1: the loader feeds it the asset's own path
        return node.op == "Const" and self.assets is not None and \
            is_inside(Path(_string_of(node) or "\0"), self.assets)

    def _is_saver_file(self, node, scope: Scope) -> bool:
        return scope is None and node.name == self.saver_filename

    # ------------------------------------------------------------ following a tensor
    def _traces(self, ref: str, scope: Scope, is_source: Callable, seen: Set,
                through: frozenset = frozenset({"Identity"})) -> bool:
        """The tensor ``ref`` in ``scope`` comes only from sources (``is_source``), through
        ``through`` ops (whose other inputs are harmless constants) and function calls."""
        name = name_in(ref, scope)
        if (scope, name) in seen:
            return False                    # a cycle proves nothing
        seen = seen | {(scope, name)}
        body = self.nodes if scope is None else self.bodies[scope]
        node = body.get(name)
        if node is None:
            return scope is not None and self._argument_traces(scope, name, is_source, seen,
                                                               through)
        if is_source(node, scope):
            return True
        if node.op == "ReadVariableOp" and scope is None:
            return self._variable_traces(node, is_source, seen, through)
        if node.op not in through:
            return False
        inputs = data_inputs(node)
        traced = [self._traces(ref, scope, is_source, seen, through) for ref in inputs]
        others = [body.get(name_in(ref, scope)) for ref, ok in zip(inputs, traced) if not ok]
        return any(traced) and all(_harmless_constant(other) for other in others)

    def _argument_traces(self, function: str, argument: str, is_source, seen, through) -> bool:
        """A function argument: proven at every call site, and where the TF2 loader calls the
        function itself, bound to an asset there."""
        names = [arg.name for arg in self.functions[function].signature.input_arg]
        if argument not in names:
            return False
        index = names.index(argument)
        sites = self.call_sites.get(function, [])
        loader_binds = self.bound_assets.get(function)
        if not sites and loader_binds is None:
            return False
        if loader_binds is not None and (index not in loader_binds or
                                         is_source != self._is_asset):
            return False
        for site in sites:
            if site is None:
                return False
            scope, arguments = site
            if index >= len(arguments) or not self._traces(arguments[index], scope, is_source,
                                                           seen, through):
                return False
        return True

    def _variable_traces(self, read, is_source, seen, through) -> bool:
        """TF2 graphs hand an asset's path to its initializer through a variable: proven when
        the variable is a plain handle that is only read and assigned proven values."""
        handle = self.nodes.get(node_name(read.input[0]))
        if handle is None or handle.op != "VarHandleOp":
            return False
        assigned = False
        for node in self.nodes.values():
            if not any(node_name(ref) == handle.name for ref in data_inputs(node)):
                continue
            if node.op == "AssignVariableOp" and node_name(node.input[0]) == handle.name:
                if not self._traces(node.input[1], None, is_source, seen, through):
                    return False
                assigned = True
            elif node.op not in ("ReadVariableOp", "VarIsInitializedOp"):
                return False                # handed elsewhere: anything may write it
        return assigned

    # ------------------------------------------------------------ call sites
    def _call_sites(self) -> Dict[str, List[CallSite]]:
        """Each library function → its call sites, each the scope and the tensors bound to its
        arguments in order (None where the call's arguments cannot be mapped)."""
        sites: Dict[str, List[CallSite]] = {}
        scopes = [(None, self.nodes.values())] + [(name, body.values())
                                                  for name, body in self.bodies.items()]
        for scope, nodes in scopes:
            for node in nodes:
                for function, arguments in _calls(node, self.functions):
                    sites.setdefault(function, []).append(
                        None if arguments is None else (scope, arguments))
        return sites


def _calls(node, functions) -> List[Tuple[str, Optional[List[str]]]]:
    """The functions ``node`` calls, each with the tensors bound to its arguments (None: not
    mappable — loops, tf.data functions, nested function attributes)."""
    found = []
    if node.op in functions:
        found.append((node.op, data_inputs(node)))
    for key, value in node.attr.items():
        named = [value.func] if value.HasField("func") else list(value.list.func)
        for func in named:
            if node.op in CALL_OPS and key == "f":
                arguments = data_inputs(node)
            elif node.op in BRANCH_OPS and key in ("then_branch", "else_branch", "branches"):
                arguments = data_inputs(node)[1:]
            else:
                arguments = None
            found.append((func.name, arguments))
            found += [(name, None) for name in nested_functions(func)]
    return found


def nested_functions(func) -> List[str]:
    """Functions named inside a function attribute's own attributes, at any depth."""
    found = []
    for value in func.attr.values():
        inner = [value.func] if value.HasField("func") else list(value.list.func)
        for item in inner:
            found.append(item.name)
            found += nested_functions(item)
    return found


def _bound_assets(object_graph, functions) -> Dict[str, Set[int]]:
    """TF2: each concrete function the loader may call → the argument positions it binds to one
    of the model's assets (its captured inputs come last)."""
    if object_graph is None:
        return {}
    bound: Dict[str, Set[int]] = {}
    for name, concrete in object_graph.concrete_functions.items():
        if name not in functions:
            continue
        count = len(functions[name].signature.input_arg)
        first = count - len(concrete.bound_inputs)
        bound[name] = {first + i for i, node in enumerate(concrete.bound_inputs)
                       if node < len(object_graph.nodes) and
                       object_graph.nodes[node].WhichOneof("kind") == "asset"}
    return bound


def _string_of(node) -> Optional[str]:
    values = node.attr["value"].tensor.string_val if "value" in node.attr else []
    if len(values) != 1:
        return None
    return values[0].decode(errors="replace")


def _harmless_constant(node) -> bool:
    """A constant beside the saver's file name: numbers, or a suffix that cannot climb out of
    the model's directory."""
    if node is None or node.op != "Const":
        return False
    return not any(b".." in value for value in node.attr["value"].tensor.string_val)
