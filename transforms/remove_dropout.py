"""remove-dropout: dropout left in the inference path becomes what it is at inference, the identity.

Dropout inside a training ``tf.cond`` is already gone after remove-switch-merge. What is left is
dropout applied unconditionally (``tf.nn.dropout`` in an inference graph), which makes results random.
Its shape, in every TF version we know:

    mask  = f(RandomUniform(...), rate)          # GreaterEqual / Add+Floor / Cast chains
    x'    = x * (1/keep)  or  x / keep           # the scaling op
    out   = x' * mask     or  SelectV2(mask, x', 0)

``out`` is replaced by ``x``; the random machinery then has no consumer and is pruned.
"""
from __future__ import annotations

from typing import Optional, Set

from tfsurgery.constants import constant_valued_nodes
from tfsurgery.graph import Graph, Ref
from tfsurgery.ops import PLACEHOLDER_OPS, UNIFORM_RANDOM_OPS
from tfsurgery.contract import Options, TransformReport, transform

# Ops a dropout mask passes through on its way from RandomUniform to the data.
MASK_OPS = frozenset({"Add", "AddV2", "Sub", "Mul", "Floor", "GreaterEqual", "Greater", "Less",
                      "LessEqual", "Cast", "Identity", "Sign"})
SCALE_OPS = frozenset({"Mul", "RealDiv", "Div"})


def mask_cone(graph: Graph, random_node: str, constant: Set[str]) -> Set[str]:
    """Nodes computed from the random tensor alone (plus constants): the dropout mask."""
    cone, stack = {random_node}, [random_node]
    while stack:
        for consumer in graph.consumer_nodes(stack.pop()):
            if consumer in cone or graph.op(consumer) not in MASK_OPS:
                continue
            others = [r for r in graph.inputs(consumer) if r.node not in cone]
            if all(_is_scalar_like(graph, r, constant) for r in others):
                cone.add(consumer)
                stack.append(consumer)
    return cone


def _is_scalar_like(graph: Graph, ref: Ref, constant: Set[str]) -> bool:
    """A constant (computed from constants, e.g. the ``max - min`` range of a random_uniform),
    or a scalar placeholder such as TF1's ``keep_prob``."""
    if ref.node in constant or graph.is_const(ref):
        return True
    node = graph.node(graph.resolve(ref).node)
    return node.op in PLACEHOLDER_OPS and \
        "shape" in node.attr and len(node.attr["shape"].shape.dim) == 0 and \
        not node.attr["shape"].shape.unknown_rank


def unscaled_input(graph: Graph, scaled: Ref, constant: Set[str]) -> Optional[Ref]:
    """For x' = x * c or x / c, return x."""
    if graph.op(scaled) not in SCALE_OPS:
        return None
    a, b = graph.inputs(scaled.node)
    if _is_scalar_like(graph, b, constant):
        return a
    if graph.op(scaled) == "Mul" and _is_scalar_like(graph, a, constant):
        return b
    return None


def dropout_applications(graph: Graph, cone: Set[str], constant: Set[str]):
    """(node applying the mask, the data x it should be replaced by) for one mask cone."""
    for name in list(cone):
        for consumer in graph.consumer_nodes(name):
            if consumer in cone:
                continue
            inputs = graph.inputs(consumer)
            op = graph.op(consumer)
            if op == "SelectV2" or op == "Select":
                if inputs[0].node in cone and graph.is_const(inputs[2]):
                    yield consumer, unscaled_input(graph, inputs[1], constant)
            elif op == "Mul":
                data = [r for r in inputs if r.node not in cone]
                if len(data) == 1:
                    yield consumer, unscaled_input(graph, data[0], constant)


@transform("remove-dropout")
def remove_dropout(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("remove-dropout")
    random = graph.nodes_with_ops(UNIFORM_RANDOM_OPS)
    if not random:
        return report
    constant = constant_valued_nodes(graph)     # a rate inside a v1 loop comes through Enter
    for node in random:
        if node.name not in graph:
            continue
        cone = mask_cone(graph, node.name, constant)
        for apply_node, data in list(dropout_applications(graph, cone, constant)):
            report.matched += 1
            if data is None:
                report.skip(apply_node, "random mask without a recognisable x*scale input")
                continue
            if apply_node in options.protected:      # keep the output's name: an Identity of x
                dtype = graph.node(apply_node).attr["T"]
                graph.remove([apply_node])
                graph.new_node("Identity", apply_node, [data], {"T": dtype})
            else:
                graph.rewire(apply_node, data)
            report.rewritten.append(apply_node)
    if report.rewritten:
        report.notes.append(f"{len(report.rewritten)} dropout(s) outside any training cond replaced "
                            "by the identity (their inference-mode value)")
    return report
