"""freeze-placeholder-defaults: a PlaceholderWithDefault nobody feeds becomes its default.

When nothing feeds it, a ``PlaceholderWithDefault`` is its default tensor — that is what TensorFlow
computes. Unless it is one of the graph's declared inputs, its readers read the default directly
(TF-for-Poets graphs carry a ``BottleneckInputPlaceholder`` whose default is a tensor, which
tf2onnx refuses). One that is a graph output keeps its name as an Identity.
"""
from __future__ import annotations

from tfsurgery.graph import Graph
from tfsurgery.contract import Options, TransformReport, transform


@transform("freeze-placeholder-defaults")
def freeze_placeholder_defaults(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("freeze-placeholder-defaults")
    inputs = {name.split(":")[0] for name in options.inputs}
    for node in graph.nodes_with_ops({"PlaceholderWithDefault"}):
        report.matched += 1
        if node.name in inputs:
            report.skip(node.name, "a declared input: it stays feedable")
            continue
        default = graph.inputs(node.name)[0]
        if node.name in options.protected:
            dtype = node.attr["dtype"]
            graph.remove([node.name])
            graph.new_node("Identity", node.name, [default], {"T": dtype})
        else:
            graph.rewire(node.name, default)
            graph.move_control_consumers(node.name, default.node)
            graph.remove([node.name])
        report.rewritten.append(node.name)
        report.notes.append(f"{node.name}: not an input, replaced by its default value")
    return report
