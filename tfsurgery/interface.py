"""A graph's interface: its inputs (placeholders to feed), outputs, and training flags.

A training flag is a bool ``Placeholder``/``PlaceholderWithDefault`` with a scalar shape whose name
(last path component) is one of the usual training-switch names, or a name the user passes with
``--training-flag``.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from tensorflow.core.framework import types_pb2

from tfsurgery.errors import InputError
from tfsurgery.graph import num_outputs, parse_ref
from tfsurgery.ops import FEEDABLE_PLACEHOLDER_OPS, NOT_OUTPUT_OPS, PLACEHOLDER_OPS

COMMON_FLAG_NAMES = frozenset({
    "training", "is_training", "istraining", "train", "is_train", "phase_train", "phase",
    "train_phase", "training_phase", "keras_learning_phase", "learning_phase", "training_flag",
    "bn_training", "mode_training",
})
_FLAG_OPS = PLACEHOLDER_OPS


def is_training_flag(node, extra_names=()) -> bool:
    """Is this NodeDef a bool scalar placeholder that switches training on and off?"""
    if node.op not in _FLAG_OPS:
        return False
    dtype = node.attr["dtype"].type if "dtype" in node.attr else node.attr["T"].type
    if dtype != types_pb2.DT_BOOL:
        return False
    if node.name in extra_names:
        return True
    shape = node.attr["shape"].shape if "shape" in node.attr else None
    if shape is not None and not shape.unknown_rank and len(shape.dim) > 0:
        return False
    return node.name.rsplit("/", 1)[-1].lower() in COMMON_FLAG_NAMES


def find_training_flags(graph_def, extra_names=()):
    return [n.name for n in graph_def.node if is_training_flag(n, extra_names)]


def detect_inputs(graph_def, training_flags: Sequence[str] = ()) -> List[str]:
    """Placeholders that must be fed and are not training flags (a PlaceholderWithDefault has a
    value of its own and is not counted)."""
    return [n.name for n in graph_def.node
            if n.op in FEEDABLE_PLACEHOLDER_OPS and not is_training_flag(n, training_flags)]


def detect_outputs(graph_def) -> List[str]:
    """Nodes nothing consumes (excluding Const, NoOp and other leftovers that compute nothing)."""
    consumed = {parse_ref(text).node for node in graph_def.node for text in node.input}
    return [n.name for n in graph_def.node
            if n.name not in consumed and n.op not in NOT_OUTPUT_OPS]


def resolve_interface(graph_def, inputs: Sequence[str] = (), outputs: Sequence[str] = (),
                      training_flags: Sequence[str] = ()) -> Tuple[List[str], List[str]]:
    """Check user-given input/output names against the graph, or detect them."""
    graph = {node.name: node for node in graph_def.node}      # a light index: names only
    for kind, given in (("input", inputs), ("output", outputs)):
        missing = [g for g in given if parse_ref(g).node not in graph]
        if missing:
            raise InputError(f"unknown {kind} name {', '.join(map(repr, missing))}: "
                             "no such node in the graph")
        for name in given:
            ref = parse_ref(name)
            ports = num_outputs(graph[ref.node])
            if ports is not None and ref.port >= ports:
                raise InputError(f"{kind} '{name}': {graph[ref.node].op} node '{ref.node}' has "
                                 f"{ports} output(s)")
    for name in inputs:
        op = graph[parse_ref(name).node].op
        if op not in PLACEHOLDER_OPS:
            raise InputError(f"input '{name}' is a {op} node, not a Placeholder to feed")
    inputs = list(inputs) or detect_inputs(graph_def, training_flags)
    outputs = list(outputs) or detect_outputs(graph_def)
    if not outputs:
        raise InputError("could not find the graph's outputs; name them with --outputs")
    return inputs, outputs
