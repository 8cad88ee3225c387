"""freeze-training-flags: bool training switches become ``Const False``.

A training flag is a bool ``Placeholder``/``PlaceholderWithDefault`` with a scalar shape whose name
(last path component) is one of the usual training-switch names, or a name the user passes with
``--training-flag``. Replacing it by a constant is what lets the later transforms see which side of
every ``tf.cond`` is live.
"""
from __future__ import annotations

from tensorflow.core.framework import types_pb2

from tfsurgery.graph import Graph
from tfsurgery.pipeline import Options, TransformReport, register

COMMON_FLAG_NAMES = frozenset({
    "training", "is_training", "istraining", "train", "is_train", "phase_train", "phase",
    "train_phase", "training_phase", "keras_learning_phase", "learning_phase", "training_flag",
    "bn_training", "mode_training",
})
_FLAG_OPS = ("Placeholder", "PlaceholderWithDefault")


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


@register("freeze-training-flags")
def freeze_training_flags(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("freeze-training-flags")
    for node in graph:
        if not is_training_flag(node, options.training_flags):
            continue
        report.matched += 1
        node = graph.mutable(node.name)
        for key in list(node.attr):
            del node.attr[key]
        for index in reversed(range(len(node.input))):   # PlaceholderWithDefault's default value
            graph.remove_input(node.name, index)
        node.op = "Const"
        graph.set_const_value(node.name, False)
        report.rewritten.append(node.name)
    for name in options.training_flags:
        if name not in graph:
            report.notes.append(f"training flag '{name}' not found in the graph")
        elif name not in report.rewritten:
            report.skip(name, "named as a training flag but not a bool placeholder")
    return report
