"""prune: delete every node the graph's outputs do not need (control dependencies included)."""
from __future__ import annotations

from tfsurgery.graph import Graph
from tfsurgery.pipeline import Options, TransformReport, register


@register("prune")
def prune(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("prune")
    if not options.outputs:
        report.notes.append("no outputs known: nothing pruned")
        return report
    removed = graph.prune(options.outputs, keep=options.inputs)
    report.matched = len(removed)
    report.rewritten.extend(removed)
    return report
