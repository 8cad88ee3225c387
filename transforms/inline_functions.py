"""inline-functions: TF2 functional control flow and function calls become plain graph nodes.

TF2 graphs keep ``tf.cond`` as ``If``/``StatelessIf``, ``tf.switch_case`` as ``Case``/
``StatelessCase`` and calls as ``PartitionedCall``/``StatefulPartitionedCall``, with the bodies in
the GraphDef's function library, where no other transform can see them. As Grappler's function
optimizer does, this pass copies a body into the graph in place of its caller:

- a call is always inlined; an ``If``/``Case`` only when its predicate / branch index is a
  constant (after freeze-training-flags), and then only the taken branch;
- the body's arguments become Identities of the caller's inputs, carrying the caller's control
  inputs (as do body nodes without inputs), so nothing runs before the caller would have;
- consumers of caller output ``k`` read the body's ``k``-th result; a caller with control consumers
  (or that is the graph's interface) is replaced by an ``IdentityN`` (``NoOp``) of the same name
  that depends on the results and the body's control outputs;
- functions nobody calls any more are dropped from the library.

Data-dependent conds and ``While`` loops are left as they are (their bodies are functions that TF
runs as written). Nested calls inline round by round.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Tuple

import numpy as np

from tensorflow.core.framework import node_def_pb2

from tfsurgery.constants import constant_values
from tfsurgery.graph import COLOCATION_ATTR, COLOCATION_PREFIX, Graph, Ref, parse_ref
from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.ops import (FUNCTION_CALL_OPS, FUNCTIONAL_CASE_OPS, FUNCTIONAL_IF_OPS,
                           FUNCTIONAL_WHILE_OPS)

CALL_OPS, IF_OPS, CASE_OPS, LOOP_OPS = (FUNCTION_CALL_OPS, FUNCTIONAL_IF_OPS, FUNCTIONAL_CASE_OPS,
                                        FUNCTIONAL_WHILE_OPS)
MAX_ROUNDS = 32          # nesting depth of calls in one graph; real graphs use a handful


@transform("inline-functions")
def inline_functions(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("inline-functions")
    skipped: Dict[str, str] = {}
    if not graph.function_names():
        return report
    with library_scope(graph):
        inline_rounds(graph, options, report, skipped)
    report.skipped.extend(sorted(skipped.items()))
    unused = sorted(graph.function_names() - graph.called_functions())
    if unused:
        graph.remove_functions(unused)
        report.notes.append(f"{len(unused)} unused function(s) dropped from the library")
    return report


def library_scope(graph: Graph):
    """A default TF graph holding the library: TF's FunctionDef reader checks there that the
    functions a body calls exist (and reads direct calls' signatures)."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2
    holder = tf.Graph()
    try:
        with holder.as_default():
            tf.compat.v1.import_graph_def(graph_pb2.GraphDef(library=graph.library()), name="")
    except (ValueError, TypeError, tf.errors.OpError):
        return contextlib.nullcontext()    # each body TF cannot read is then skipped, with why
    return holder.as_default()


def inline_rounds(graph: Graph, options: Options, report: TransformReport,
                  skipped: Dict[str, str]) -> None:
    """Inline round by round: a call inside an inlined body is seen in the next round."""
    for _ in range(MAX_ROUNDS):
        chosen = taken_bodies(graph, skipped)
        if not chosen:
            break
        for call, (function, args) in chosen.items():
            reason = inline(graph, call, function, args, options)
            if reason:
                skipped[call] = reason
            else:
                report.matched += 1
                report.rewritten.append(call)


def taken_bodies(graph: Graph, skipped: Dict[str, str]) -> Dict[str, Tuple[str, List[Ref]]]:
    """Caller node → (function to inline, the caller's data inputs that feed its arguments)."""
    calls, decisions = {}, {}
    for node in graph.nodes_with_ops(CALL_OPS | IF_OPS | CASE_OPS | LOOP_OPS):
        if node.name in skipped:
            continue
        if node.op in CALL_OPS:
            calls[node.name] = (node.attr["f"].func.name, graph.inputs(node.name))
        elif node.op in IF_OPS | CASE_OPS:
            decisions[node.name] = graph.inputs(node.name)[0]
        elif node.op in LOOP_OPS:
            skipped[node.name] = "a functional while loop: kept as it is"
    values = constant_values(graph, decisions.values()) if decisions else {}
    for name, predicate in decisions.items():
        value = values.get(str(predicate))
        if value is None:
            skipped[name] = "predicate / branch index is not a constant: kept as a functional cond"
            continue
        calls[name] = (taken_branch(graph.node(name), np.asarray(value)),
                       graph.inputs(name)[1:])
    return calls


def taken_branch(node: node_def_pb2.NodeDef, value: np.ndarray) -> str:
    """The branch TensorFlow runs: If converts a scalar by value and any other tensor by
    non-emptiness; Case runs the last branch for an index out of range."""
    if node.op in IF_OPS:
        taken = bool(value.reshape(())) if value.ndim == 0 else value.size > 0
        return node.attr["then_branch" if taken else "else_branch"].func.name
    branches = node.attr["branches"].list.func
    index = int(value.reshape(()))
    return branches[index if 0 <= index < len(branches) else -1].name


def inline(graph: Graph, call: str, function: str, args: List[Ref],
           options: Options) -> Optional[str]:
    """Copy ``function``'s body in place of node ``call``; the reason it cannot, or None."""
    fdef = graph.function(function)
    if fdef is None:
        return f"function '{function}' is not in the graph's library"
    if fdef.signature.attr or "_noinline" in fdef.attr and fdef.attr["_noinline"].b:
        return f"function '{function}' is polymorphic or marked _noinline"
    if len(args) != len(fdef.signature.input_arg):
        return f"{len(args)} inputs for the {len(fdef.signature.input_arg)} arguments of '{function}'"
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def
    try:      # TF's own FunctionDef reader: "node:out_arg:k" → "node:flat_port"
        body, flat = function_def_to_graph_def(fdef)
    except (ValueError, KeyError, TypeError) as error:
        return f"TensorFlow cannot read function '{function}': {error}"
    caller = graph.node(call)
    prefix = free_prefix(graph, call, [n.name for n in body.node])
    control = [f"^{c}" for c in graph.control_inputs(call)]
    arg_index = {arg.name: i for i, arg in enumerate(fdef.signature.input_arg)}
    for node in body.node:
        if node.name in arg_index:
            copied = node_def_pb2.NodeDef(op="Identity", name=prefix + node.name,
                                          input=[str(args[arg_index[node.name]])] + control)
            copied.attr["T"].type = node.attr["dtype"].type
        else:
            copied = renamed(node, prefix, control)
        copied.device = copied.device or caller.device
        graph.add_node(copied)
    results = [prefix_ref(flat[fdef.ret[arg.name]], prefix) for arg in fdef.signature.output_arg]
    side_effects = [prefix + name for name in fdef.control_ret.values()]
    replace_caller(graph, caller, results, side_effects, control, options)
    return None


def renamed(node: node_def_pb2.NodeDef, prefix: str, control: List[str]) -> node_def_pb2.NodeDef:
    """A body node under ``prefix``: inputs and colocation renamed; a source node also waits for
    the caller's control inputs."""
    copied = node_def_pb2.NodeDef()
    copied.CopyFrom(node)
    copied.name = prefix + node.name
    del copied.input[:]
    copied.input.extend(str(prefix_ref(text, prefix)) for text in node.input)
    if not any(not parse_ref(text).control for text in node.input):
        copied.input.extend(control)
    if COLOCATION_ATTR in copied.attr:
        targets = [COLOCATION_PREFIX + prefix.encode() + s[len(COLOCATION_PREFIX):]
                   for s in copied.attr[COLOCATION_ATTR].list.s if s.startswith(COLOCATION_PREFIX)]
        del copied.attr[COLOCATION_ATTR].list.s[:]
        copied.attr[COLOCATION_ATTR].list.s.extend(targets)
        if not targets:
            del copied.attr[COLOCATION_ATTR]
    return copied


def prefix_ref(text: str, prefix: str) -> Ref:
    ref = parse_ref(text)
    return Ref(prefix + ref.node, ref.port, ref.control)


def free_prefix(graph: Graph, call: str, names: List[str]) -> str:
    """``call/`` unless some inlined name would clash with an existing node."""
    for k in range(len(graph) + 1):
        prefix = f"{call}/" if k == 0 else f"{call}/inlined_{k}/"
        if not any(prefix + name in graph for name in names):
            return prefix
    raise AssertionError("unreachable: some prefix is always free")


def replace_caller(graph: Graph, caller: node_def_pb2.NodeDef, results: List[Ref],
                   side_effects: List[str], control: List[str], options: Options) -> None:
    """Readers of the caller read the body's results. If someone still needs the caller's name
    (control consumers, the interface), it becomes an IdentityN/NoOp over the results."""
    name = caller.name
    keep_name = name in options.protected or graph.has_control_consumers(name)
    if name not in options.protected:
        for port, result in enumerate(results):
            graph.rewire(Ref(name, port), result)
    graph.remove([name])
    if not keep_name:
        return
    waits = [f"^{n}" for n in side_effects]
    if results:
        stand_in = node_def_pb2.NodeDef(op="IdentityN", name=name,
                                        input=[str(r) for r in results] + waits)
        stand_in.attr["T"].list.type.extend(caller.attr["Tout"].list.type)   # If, Case, calls
    else:
        stand_in = node_def_pb2.NodeDef(op="NoOp", name=name, input=waits or control)
    stand_in.device = caller.device
    graph.add_node(stand_in)

