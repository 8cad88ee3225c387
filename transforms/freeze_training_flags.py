"""freeze-training-flags: bool training switches become ``Const False``.

Which placeholders are training flags is the interface's call (``tfsurgery.interface``). Replacing it by a constant is what lets the later transforms see which side of
every ``tf.cond`` is live.
"""
from __future__ import annotations

from tfsurgery.graph import Graph
from tfsurgery.interface import is_training_flag
from tfsurgery.transform import Options, TransformReport, transform


@transform("freeze-training-flags")
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
