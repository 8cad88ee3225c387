"""Canonical forms: one spelling per function before the ONNX fusions match (issue 48).

The same LayerNorm, GELU or attention reaches TensorFlow in many spellings (tf_keras reduces
over axis ``[2]`` where Keras 3 writes ``[-1]``; ``1 / Sqrt`` for ``Rsqrt``; ``x·x·x`` for
``Pow(x, 3)``; a FusedBatchNorm for a LayerNorm ...). Rather than teach every matcher
(``fuse_*.py``) every spelling, the export rewrites each spelling into one canonical form on a
private copy of the graph, then the matchers — one per function — see only that form.

The interface (other rule files, e.g. ``canonical_attention.py``, plug in the same way):

- A **rule** is a function ``rule(graph: Graph, shapes) -> List[Rewrite]``. ``shapes(ref)``
  answers a tensor's static shape (``onnx_fusion.static_shapes``: a list of ints/None, or None
  when unknown) — asked by the *original* tensor names, so a node a rule added has no answer.
  The rule edits ``graph`` (a copy-on-write ``Graph`` of the export's graph) in place and
  returns one ``Rewrite`` per spelling it replaced: ``(rule, node, what)`` — the node whose
  output now comes out of the canonical form and a short "from → to" for the report.
- Each rule's docstring states why its rewrite is exact (the same function, not an
  approximation); a spelling it cannot prove is left alone.
- The rule files list their rules in a tuple ``RULES``; ``transforms/__init__.py``'s
  ``CANONICAL_RULES`` concatenates them in the order they run (one pass each: a rule may rely
  on the rules before it, e.g. on negative axes).

**Names: the ONNX is converted from the original graph, and the rules keep the names the
splice needs.** The fusions splice into tf2onnx's ONNX by tensor name (``onnx_splice``: a
``Fused`` reads existing ``node:port`` tensors and writes one under its TF name; everything
that then only fed the old output is dead and goes). tf2onnx converts the graph the user gets
(the unfused export and the ``.pb`` are that graph, and ``first_onnx_divergence`` compares its
tensors by name); the canonical copy exists only to be matched. So a rule never renames nor
removes a tensor another node could read: it edits the node whose *output* the canonical form
now computes in place (same name, same port), or rewires inputs to new nodes it adds (named
``<node>/canonical/...``; they exist in no ONNX, so a ``Fused`` that reads one is refused by
the splice, safely). A pattern's inputs and its output are then tensors of the original graph,
present in tf2onnx's model under the same names. The ONNX is still checked against the
original TensorFlow graph (``tfsurgery.export.onnx``), fused or not.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfsurgery.graph import Graph
from tfsurgery.graph.refs import Ref

Shapes = Callable[[Ref], Optional[list]]


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """One spelling replaced by its canonical form: ``rule`` (the rule's name), ``node`` (whose
    output the canonical form now computes), ``what`` ("Mean axes [2] → [-1]")."""
    rule: str
    node: str
    what: str


Rule = Callable[[Graph, Shapes], List[Rewrite]]


def canonical(graph_def, shapes: Shapes,
              rules: Sequence[Rule]) -> Tuple[Graph, List[Rewrite]]:
    """A private ``Graph`` of ``graph_def`` in canonical form (``graph_def`` is not changed)
    and every rewrite made, rule after rule (``rules``: ``transforms.CANONICAL_RULES``)."""
    graph = Graph(graph_def, check_inputs=False)
    rewrites: List[Rewrite] = []
    for rule in rules:
        rewrites += rule(graph, shapes)
    return graph, rewrites


def summary(rewrites: Sequence[Rewrite]) -> Dict[str, int]:
    """``what`` → how many: the report's lines ("Mean axes [2] → [-1]": 10)."""
    counts: Dict[str, int] = {}
    for rewrite in rewrites:
        counts[rewrite.what] = counts.get(rewrite.what, 0) + 1
    return counts


# ---------------------------------------------------------------- helpers for rules
def new_name(graph: Graph, node: str, what: str) -> str:
    """A fresh name for a node a rule adds next to ``node``."""
    return graph.unique_name(f"{node}/canonical/{what}")


def add_const(graph: Graph, node: str, what: str, value) -> Ref:
    return Ref(graph.add_const(new_name(graph, node, what), np.asarray(value)), 0)


def add_node(graph: Graph, op: str, node: str, what: str, inputs, dtype_from: str) -> Ref:
    """A new ``op`` reading ``inputs``, its ``T`` that of node ``dtype_from``."""
    attrs = {"T": graph.node(dtype_from).attr["T"]} if "T" in graph.node(dtype_from).attr \
        else {}
    return Ref(graph.new_node(op, new_name(graph, node, what), inputs, attrs).name, 0)


def become(graph: Graph, node: str, op: str, inputs: Sequence[Ref], keep_attrs=("T",)) -> None:
    """Node ``node`` now computes ``op(inputs)``, under its own name (its readers unchanged);
    attributes other than ``keep_attrs`` go. The old spelling, now read by nothing, leaves the
    copy (a matcher must not see it as another reader of the pattern's input)."""
    old = [ref.node for ref in graph.inputs(node)]
    edited = graph.edit_node(node)
    edited.op = op
    for key in [k for k in edited.attr if k not in keep_attrs and not k.startswith("_")]:
        del edited.attr[key]
    count = len(graph.inputs(node))
    if len(inputs) > count:
        raise ValueError(f"become: {op} reads {len(inputs)} inputs, {node} has {count}")
    for index, ref in enumerate(inputs):
        graph.set_input(node, index, ref)
    if count > len(inputs):
        graph.remove_inputs(node, range(len(inputs), count))
    remove_unread(graph, old)


def remove_unread(graph: Graph, names: Sequence[str]) -> None:
    """Remove the nodes of ``names`` that nothing reads, then their inputs that nothing reads
    any more, and so on (Placeholders stay: they are the graph's inputs)."""
    pending = list(names)
    while pending:
        name = pending.pop()
        if name not in graph or graph.reader_count(name) or graph.op(name) == "Placeholder":
            continue
        pending += [ref.node for ref in graph.input_refs(name)]
        graph.remove([name])
