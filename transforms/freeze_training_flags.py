"""freeze-training-flags: training switches and dropout knobs become constants.

Which placeholders are switches is the interface's call (``tfsurgery.interface``): bool training
flags (``training``, ``is_training``, ``keras_learning_phase``, ... or ``--training-flag NAME``)
become ``Const False``; float placeholders that only steer dropout (``keep_prob`` → 1.0, a dropout
``rate`` → 0.0) and any ``--training-flag NAME=VALUE`` become that constant. Replacing them is what
lets the later transforms see which side of every ``tf.cond`` is live and that dropout is off.
Verification feeds the original the same values.
"""
from __future__ import annotations

import numpy as np

from tfsurgery.graph import Graph
from tfsurgery.interface import is_training_flag
from tfsurgery.ops import PLACEHOLDER_OPS
from tfsurgery.contract import Options, TransformReport, transform


@transform("freeze-training-flags")
def freeze_training_flags(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("freeze-training-flags")
    # a training flag is a placeholder (is_training_flag); a named node may be anything
    for node in graph.nodes_with_ops(PLACEHOLDER_OPS, named=options.inference_values):
        if node.name in options.inference_values:
            value = options.inference_values[node.name]
        elif is_training_flag(node, options.training_flags):
            value = False
        else:
            continue
        if node.op not in PLACEHOLDER_OPS:
            report.skip(node.name, f"named as a training switch but a {node.op}, not a placeholder")
            continue
        report.matched += 1
        default = _default_value(graph, node)
        _make_constant(graph, node.name, value)
        report.rewritten.append(node.name)
        report.notes.append(f"{node.name} = {value}" + _overridden(default, value))
    for name in list(options.training_flags) + list(options.inference_values):
        if name not in graph:
            report.notes.append(f"training flag '{name}' not found in the graph")
        elif name not in report.rewritten and not any(n == name for n, _ in report.skipped):
            report.skip(name, "named as a training flag but not a bool placeholder")
    return report


def _default_value(graph: Graph, node):
    """A PlaceholderWithDefault's constant default (None: a plain placeholder, or a default
    computed at run time)."""
    if node.op != "PlaceholderWithDefault":
        return None
    return graph.const_value(graph.inputs(node.name)[0])


def _overridden(default, value) -> str:
    """The note's tail when the inference value is not what the graph computes unfed (a
    ``training`` flag that defaults to True: run as published, the graph trains)."""
    if default is None or np.array_equal(default, np.asarray(value, default.dtype)):
        return ""
    shown = default.item() if default.size == 1 else default.tolist()
    return f" (overrides its default {shown}; the original is checked fed {value} too)"


def _make_constant(graph: Graph, name: str, value) -> None:
    import tensorflow as tf
    node = graph.edit_node(name)
    dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
    for key in list(node.attr):
        del node.attr[key]
    graph.remove_inputs(name, range(len(node.input)))     # PlaceholderWithDefault's default value
    node.op = "Const"
    graph.set_const_value(name, np.asarray(value, dtype.as_numpy_dtype))
