"""prune: delete every node the graph's outputs do not need (control dependencies included).

Control edges from nodes computed from constants alone (Consts, NoOps, stateless ops of constants)
are dropped first: such a node is ready at once and has no effect, so waiting for it means nothing
(frozen Keras graphs hang every weight on a NoOp that the output waits for; a collapsed cond leaves
its constants waiting on the former predicate). Edges from anything else — a Const inside a live
cond branch waits on a Switch, say — carry meaning and stay.
"""
from __future__ import annotations

from tfsurgery.graph import Graph
from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.constants import constant_nodes


@transform("prune", repeat=True)
def prune(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("prune")
    if not options.outputs:
        report.notes.append("no outputs known: nothing pruned")
        return report
    dropped = drop_pointless_control_edges(graph)
    if dropped:
        report.notes.append(f"{dropped} control edges from constant-only nodes dropped")
    removed = graph.prune(options.outputs, keep=options.inputs)
    report.matched = len(removed)
    report.removed.extend(removed)          # deleted, not rewritten: "removed N nodes"
    return report


def drop_pointless_control_edges(graph: Graph) -> int:
    """Remove control edges from nodes computed from constants alone (see module doc)."""
    if not graph.has_control_edges():
        return 0                            # nothing to look for (finding constants costs)
    pointless = {}                          # reader → indices of its pointless control inputs
    for name in constant_nodes(graph):
        for reader, index in graph.reader_slots(name):
            if graph.input_refs(reader)[index].control:
                pointless.setdefault(reader, []).append(index)
    for reader, indices in pointless.items():
        graph.remove_inputs(reader, indices)
    return sum(map(len, pointless.values()))
