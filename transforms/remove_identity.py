"""remove-identity: consumers of an Identity read its input directly.

Identity, Snapshot, StopGradient and PreventGradient are no-ops at inference, and so is IdentityN
(Keras' custom-gradient activations such as swish), port by port. An Identity that is
one of the graph's outputs or inputs keeps its name (it is the interface); one with control inputs
keeps its meaning only if those edges move to its consumers, so it is left alone.
"""
from __future__ import annotations

from tfsurgery.graph import Graph, Ref
from tfsurgery.ops import IDENTITY_OPS
from tfsurgery.contract import Options, TransformReport, transform

@transform("remove-identity", repeat=True)
def remove_identity(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("remove-identity")
    protected = options.protected
    for node in graph.nodes_with_ops(IDENTITY_OPS | {"IdentityN"}):
        if node.op == "IdentityN" and node.name not in protected \
                and not graph.control_inputs(node.name):
            report.matched += 1
            sources = graph.inputs(node.name)
            for port, source in enumerate(sources):
                graph.rewire(Ref(node.name, port), source)
            graph.move_control_consumers(node.name, sources[0].node if sources else None)
            graph.remove([node.name])
            report.rewritten.append(node.name)
            continue
        if node.op not in IDENTITY_OPS:
            continue
        report.matched += 1
        if node.name in protected:
            continue
        if graph.control_inputs(node.name):
            report.skip(node.name, "has control inputs that its consumers would lose")
            continue
        source = graph.inputs(node.name)[0]
        if graph.op(source) in ("Switch", "Enter", "Exit", "NextIteration", "Merge"):
            # v1 control flow: the Identity pins a branch/frame; the switch-merge pass owns it.
            continue
        graph.rewire(node.name, source)
        graph.move_control_consumers(node.name, source.node)
        graph.remove([node.name])
        report.rewritten.append(node.name)
    return report
