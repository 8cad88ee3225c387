"""prune: delete every node the graph's outputs do not need (control dependencies included).

Control edges from an input-less Const or NoOp are dropped first: such a node is ready at once and
has no effect, so waiting for it means nothing (frozen Keras graphs hang every weight on a NoOp that
the output waits for). Edges from anything else — a Const inside a cond branch, say — carry meaning
and stay.
"""
from __future__ import annotations

from tfsurgery.graph import Graph
from tfsurgery.pipeline import Options, TransformReport, register


@register("prune")
def prune(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("prune")
    if not options.outputs:
        report.notes.append("no outputs known: nothing pruned")
        return report
    dropped = drop_pointless_control_edges(graph)
    if dropped:
        report.notes.append(f"{dropped} control edges from input-less Const/NoOp nodes dropped")
    removed = graph.prune(options.outputs, keep=options.inputs)
    report.matched = len(removed)
    report.rewritten.extend(removed)
    return report


def _ready_at_once(graph: Graph, name: str) -> bool:
    node = graph.node(name)
    return node.op in ("Const", "NoOp") and not node.input


def drop_pointless_control_edges(graph: Graph) -> int:
    dropped = 0
    for name in graph.topological_order():        # producers first: a NoOp may become input-less
        pointless = [index for index, text in enumerate(graph.node(name).input)
                     if text.startswith("^") and text[1:] in graph
                     and _ready_at_once(graph, text[1:])]
        if pointless:
            graph.remove_inputs(name, pointless)
            dropped += len(pointless)
    return dropped
