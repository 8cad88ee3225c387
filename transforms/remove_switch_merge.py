"""remove-switch-merge: with a constant predicate, every v1 ``tf.cond`` collapses to its live side.

``Switch(data, pred)`` forwards ``data`` on port 1 if ``pred`` else port 0; the other port is *dead*.
Deadness spreads forward: a node with a dead data or control input is dead, except ``Merge``, which is
dead only when all its data inputs are — or, as in TensorFlow's executor, when a dead ``Enter`` feeds
it: a while loop inside a dead branch goes with the branch. A ``Merge`` with exactly one live input forwards it (port 0) and
that input's position (port 1, ``value_index``). So the rewrite is decided by value, never by input
position: consumers of a live Switch port read ``data``, consumers of a Merge read its live input, and
every dead node is deleted. Switches whose predicate is not a constant (while loops, data-dependent
conds) are left alone; a cond inside a loop, whose predicate enters through a constant ``Enter``,
collapses like any other and the loop stays whole.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from tfsurgery.graph import Graph, Ref
from tfsurgery.errors import TransformError
from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.constants import constant_values

SWITCH_OPS = ("Switch", "RefSwitch")
MERGE_OPS = ("Merge", "RefMerge")
ENTER_OPS = ("Enter", "RefEnter")


def constant_switches(graph: Graph) -> dict:
    """Switch name → its live port, for every Switch whose predicate is a constant — or is
    computed from constants only (``LogicalNot(training)``), which TensorFlow then evaluates.
    Inside a while loop the predicate arrives through a constant ``Enter``: the same value in
    every iteration."""
    predicates = {node.name: loop_invariant(graph, graph.inputs(node.name)[1])
                  for node in graph.nodes_with_ops(SWITCH_OPS)}
    values = constant_values(graph, set(predicates.values()))
    live = {}
    for name, predicate in predicates.items():
        value = values.get(str(predicate))
        if value is not None and np.asarray(value).size == 1:
            live[name] = 1 if bool(np.asarray(value).reshape(())) else 0
    return live


def loop_invariant(graph: Graph, ref: Ref) -> Ref:
    """The tensor outside the loop a constant ``Enter`` forwards (the ref itself otherwise)."""
    ref = graph.resolve(ref)
    while graph.op(ref) in ENTER_OPS and graph.attr(ref.node, "is_constant", False):
        ref = graph.resolve(graph.inputs(ref.node)[0])
    return ref


def dead_nodes(graph: Graph, live_port: dict) -> tuple:
    """Spread deadness from the dead ports of constant Switches. Returns (dead nodes, dead tensors)."""
    dead_nodes, dead_tensors = set(), set()
    queue = deque()

    def kill_tensor(ref: Ref):
        if ref not in dead_tensors:
            dead_tensors.add(ref)
            queue.append(ref)

    def kill_node(name: str):
        if name not in dead_nodes:
            dead_nodes.add(name)
            for consumer in graph.consumers(name, control=True):
                kill_tensor(Ref(name, consumer.ref.port, consumer.ref.control))

    for switch, port in live_port.items():
        kill_tensor(Ref(switch, 1 - port))
    while queue:
        ref = queue.popleft()
        readers = [c for c in graph.consumers(ref.node, control=True)
                   if c.ref.control == ref.control and (ref.control or c.ref.port == ref.port)]
        for consumer in readers:
            if consumer.node in dead_nodes:
                continue
            if graph.op(consumer.node) in MERGE_OPS:
                if merge_is_dead(graph, consumer, ref, dead_tensors, dead_nodes):
                    kill_node(consumer.node)
            else:
                kill_node(consumer.node)
    return dead_nodes, dead_tensors


def merge_is_dead(graph: Graph, consumer, ref: Ref, dead_tensors: set, dead_nodes: set) -> bool:
    """As TensorFlow's executor decides: a dead control input never kills a Merge; a dead value
    from an ``Enter`` does (the loop frame it opens is dead, back edge and all); otherwise a Merge
    is dead only when every data input is."""
    if consumer.ref.control:
        return False
    if graph.op(ref.node) in ENTER_OPS:
        return True
    return all(i in dead_tensors or i.node in dead_nodes for i in graph.inputs(consumer.node))


@transform("remove-switch-merge")
def remove_switch_merge(graph: Graph, options: Options) -> TransformReport:
    """Collapse conds round by round: a nested cond's predicate passes through its outer cond's
    Switch, so it becomes a constant only once the outer cond is gone."""
    report = TransformReport("remove-switch-merge")
    dead_total, handled = 0, set()
    while True:
        # A Switch kept alive by a protected reader on its dead side is handled once, not forever.
        live_port = {s: p for s, p in constant_switches(graph).items() if s not in handled}
        if not live_port:
            break
        handled.update(live_port)
        report.matched += len(live_port)
        dead_total += collapse(graph, live_port, options, report)
    if report.matched:
        report.notes.append(f"of the nodes removed, {dead_total} were on dead branches")
    return report


def collapse(graph: Graph, live_port: dict, options: Options, report: TransformReport) -> int:
    """Rewire around the given Switches and the Merges they decide; delete dead nodes."""
    dead, dead_tensors = dead_nodes(graph, live_port)
    dead_outputs = sorted(options.protected & dead)
    if dead_outputs:
        raise TransformError(f"output '{dead_outputs[0]}' is on the dead side of a cond: with the "
                             "training flags False (and other predicates as they are) it is "
                             "never computed")

    def is_dead(ref: Ref) -> bool:
        return ref.node in dead or ref.tensor in dead_tensors

    for switch, port in live_port.items():
        if switch in dead:
            continue
        data = graph.inputs(switch)[0]
        graph.rewire(Ref(switch, port), data)
        graph.move_control_consumers(switch, data.node)
        report.rewritten.append(switch)

    for node in graph.nodes_with_ops(MERGE_OPS):
        if node.name in dead:
            continue
        inputs = graph.inputs(node.name)
        live = [i for i, ref in enumerate(inputs) if not is_dead(ref)]
        if len(live) != 1 or len(live) == len(inputs):
            continue          # a loop's Merge, or a cond whose predicate is not constant (yet)
        collapse_merge(graph, node, inputs[live[0]], live[0], options)
        report.rewritten.append(node.name)

    removable = list(dead)
    graph.remove(removable)
    graph.remove([s for s in live_port if s in graph and not graph.consumers(s, control=True)])
    return len(removable)


def collapse_merge(graph: Graph, merge, live_input: Ref, index: int, options: Options) -> None:
    """Port 0 readers get the live input, port 1 (value_index) readers its position."""
    graph.rewire(Ref(merge.name, 0), live_input)
    if graph.consumers(merge.name, 1):
        value_index = graph.add_const(f"{merge.name}/value_index", np.int32(index))
        graph.rewire(Ref(merge.name, 1), value_index)
    if merge.name in options.protected:       # keep the graph's output name alive
        dtype = merge.attr["T"]
        graph.remove([merge.name])
        graph.new_node("Identity", merge.name, [live_input], {"T": dtype})
    else:
        graph.move_control_consumers(merge.name, live_input.node)
        graph.remove([merge.name])
