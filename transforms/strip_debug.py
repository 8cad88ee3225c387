"""strip-debug: assertions and debug printing go; what they guarded stays.

``CheckNumerics`` passes its input through (the identity at inference), ``Assert`` and
``Print``/``PrintV2`` only check or log. Grappler's debug stripper and optimize_for_inference
remove them too. A CheckNumerics' readers read its input; a Print's readers read its first input;
an Assert (no outputs) is deleted with the control edges it hung on other nodes, and a NoOp that
then waits on nothing is deleted too. An Identity whose only control inputs were such checks is
then an ordinary Identity for remove-identity. ``--keep-asserts`` turns this transform off.
"""
from __future__ import annotations

import dataclasses

from tfsurgery.graph import Graph
from tfsurgery.contract import Options, TransformReport, transform

PASS_THROUGH = frozenset({"CheckNumerics", "CheckNumericsV2", "Print"})
CHECK_ONLY = frozenset({"Assert", "PrintV2"})



@dataclasses.dataclass
class StripDebugParams:
    keep_asserts: bool = False          # --keep-asserts: the checks stay, nothing is stripped


@transform("strip-debug", params=StripDebugParams)
def strip_debug(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("strip-debug")
    if options.params_for(strip_debug).keep_asserts:
        report.notes.append("--keep-asserts: assertions and debug ops kept")
        return report
    for node in graph.nodes_with_ops(PASS_THROUGH | CHECK_ONLY):
        if node.name not in graph:
            continue
        report.matched += 1
        if node.name in options.protected:
            report.skip(node.name, "is a graph output")
            continue
        if node.op in PASS_THROUGH:
            source = graph.inputs(node.name)[0]
            graph.rewire(node.name, source)
            graph.move_control_consumers(node.name, source.node)
        else:
            graph.move_control_consumers(node.name, None)
        graph.remove([node.name])
        report.rewritten.append(node.name)
    report.notes.extend(f"{name}: a NoOp that only waited on checks, removed"
                        for name in _idle_no_ops(graph, options))
    return report


def _idle_no_ops(graph: Graph, options: Options):
    """Delete NoOps with no inputs left that only gave control edges (a tf.group of asserts)."""
    removed = []
    for node in graph.nodes_with_ops({"NoOp"}):
        if not node.input and node.name not in options.protected:
            graph.move_control_consumers(node.name, None)
            graph.remove([node.name])
            removed.append(node.name)
    return removed
