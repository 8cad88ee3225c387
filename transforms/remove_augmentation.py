"""remove-augmentation: random augmentation served by mistake becomes what it is at inference.

Keras' tutorials put RandomFlip, RandomRotation, RandomZoom, ... inside the model, and
``model.export()`` serves them *applied*: every request is flipped, rotated and zoomed by a
seeded draw. A random draw that meets the data before any learned layer is a training leftover.
It is recognized by what the ops compute, where a draw meets the data:

    a choice       y = Select(draw <= p, f(x), x)            RandomFlip
    a parameter    y = T(x, θ(draw))                          rotation, zoom, translation
                                                             (ImageProjectiveTransform), contrast
                                                             (x·c), brightness (x + δ)

and the layer is replaced by its inference behaviour, the identity: its output reads ``x``.
Where the layer ends (the clip after a contrast) is the smallest name scope around that point
with one data input, one data output, the draw and no learned op; without one, only a choice or
a projective transform (each exactly the identity on its own) is replaced, and anything else is
kept and said. A layer that changes the image size (a random crop) is kept: its inference
behaviour differs between Keras versions (Keras 3: none; tf_keras: a center crop).
A draw that meets the data after a learned layer (a VAE's sampling layer) is intended: kept,
and the report says the served graph stays random.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set, Tuple

from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.graph import Graph, Ref
from tfsurgery.ops import PLACEHOLDER_OPS, RANDOM_OPS
from tfsurgery.tfsession import StaticShapes

METADATA_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})      # read a shape, not the data
LEARNED_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul",
                         "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2DBackpropInput"})
CHOICE_OPS = frozenset({"Select", "SelectV2"})
PROJECTIVE_OPS = frozenset({"ImageProjectiveTransformV2", "ImageProjectiveTransformV3"})


@dataclasses.dataclass
class Augmentation:
    """One augmentation layer: its output ``exit`` is replaced by its input ``entry``."""

    name: str                   # the layer's scope, or the node where the draw meets the data
    entry: Ref
    exit: Ref
    draws: List[str]            # the random ops that drove it


def forward_closure(graph: Graph, starts, *, stop=frozenset()) -> Set[str]:
    """Nodes computed from ``starts`` (data edges), not passing through ops in ``stop``."""
    seen, stack = set(starts), list(starts)
    while stack:
        for consumer in graph.consumer_nodes(stack.pop()):
            if consumer not in seen and graph.op(consumer) not in stop:
                seen.add(consumer)
                stack.append(consumer)
    return seen


def meeting_points(graph: Graph, roots) -> Tuple[List[str], Set[str], Set[str]]:
    """Nodes the ``roots`` need where a draw meets the data, in graph order; and the data and
    random sets."""
    live = graph.ancestors(roots)
    draws = [n.name for n in graph.nodes_with_ops(RANDOM_OPS) if n.name in live]
    if not draws:
        return [], set(), set()
    inputs = [n.name for n in graph.nodes_with_ops(PLACEHOLDER_OPS)]
    data = forward_closure(graph, inputs, stop=METADATA_OPS)
    random = forward_closure(graph, draws)
    points = [name for name in graph.topological_order()
              if name in data and name in live and graph.op(name) not in METADATA_OPS and
              any(r.node in random and r.node not in data for r in graph.inputs(name)) and
              any(r.node in data for r in graph.inputs(name))]
    return points, data, random


def find_augmentations(graph: Graph, outputs=(), protected=frozenset()
                       ) -> Tuple[List[Augmentation], List[Tuple[str, str]]]:
    """Replace every augmentation layer of ``graph`` by the identity, in place: the layers
    replaced, and (node, reason) for random draws meeting the data that were kept.
    ``protected``: nodes whose names must stay (the outputs)."""
    replaced, kept, settled = [], [], set()
    shapes = None
    roots = list(outputs) or [node.name for node in graph if not graph.consumer_nodes(node.name)]
    while True:
        points, data, random = meeting_points(graph, roots)
        points = [p for p in points if p not in settled]
        if not points:
            return replaced, kept
        point = points[0]
        learned = _learned_before(graph, point)
        if learned:
            kept.append((point, f"a random draw meets the data after the learned layer "
                                f"'{learned}' (a sampling layer?): intended, kept — the "
                                "served graph stays random"))
            settled.add(point)
            continue
        shapes = shapes or StaticShapes(graph, list(outputs))
        layer, why = _layer_at(graph, point, data, random)
        if layer is not None:
            layer, why = _checked_size(shapes, layer)
        if layer is None:
            kept.append((point, why))
            settled.add(point)
            continue
        _replace(graph, layer, protected)
        replaced.append(layer)


def may_hold_augmentation(graph: Graph) -> bool:
    """Read-only: does a random draw meet the data before any learned layer (what
    find_augmentations would look at)? Dropout and noise after a conv do not."""
    roots = [node.name for node in graph if not graph.consumer_nodes(node.name)]
    return any(not _learned_before(graph, point) for point in meeting_points(graph, roots)[0])


def _learned_before(graph: Graph, point: str) -> Optional[str]:
    """A learned op (conv, matmul) the data passes through before ``point``, if any."""
    ancestors = graph.ancestors([point], include_control=False)
    return next((n for n in sorted(ancestors) if graph.op(n) in LEARNED_OPS), None)


def _layer_at(graph: Graph, point: str, data: Set[str],
              random: Set[str]) -> Tuple[Optional[Augmentation], str]:
    parts = point.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        scope = "/".join(parts[:cut])
        layer = _scoped_layer(graph, scope, data, random)
        if layer is not None:
            return layer, ""
    op = graph.op(point)
    if op in CHOICE_OPS:
        condition, chosen, other = graph.inputs(point)
        entry = _identity_branch(graph, chosen, other, data, random)
        if entry is not None:
            return Augmentation(point, entry, Ref(point), _draws_of(graph, condition.node)), ""
    if op in PROJECTIVE_OPS:
        image, parameters = graph.inputs(point)[:2]
        return Augmentation(point, image, Ref(point), _draws_of(graph, parameters.node)), ""
    return None, ("a random draw meets the data here, but no layer around it has one input and "
                  "one output, and the op alone is not a choice or a projective transform: kept")


def _scoped_layer(graph: Graph, scope: str, data: Set[str],
                  random: Set[str]) -> Optional[Augmentation]:
    """The layer under ``scope``: one data tensor in, one out, a draw, no learned op."""
    prefix = scope + "/"
    members = {node.name for node in graph if node.name.startswith(prefix)}
    if any(graph.op(m) in LEARNED_OPS for m in members):
        return None
    draws = sorted(m for m in members if graph.op(m) in RANDOM_OPS)
    entries = {r for m in members if m in data and graph.op(m) not in METADATA_OPS
               for r in graph.inputs(m) if r.node not in members and r.node in data}
    exits = {r for m in members if m in data
             for consumer in graph.consumer_nodes(m) if consumer not in members
             for r in graph.inputs(consumer) if r.node == m}
    if not draws or len(entries) != 1 or len(exits) != 1:
        return None
    (entry,), (exit_,) = entries, exits
    if exit_.node not in random:
        return None
    return Augmentation(scope, entry, exit_, draws)


def _identity_branch(graph: Graph, a: Ref, b: Ref, data: Set[str],
                     random: Set[str]) -> Optional[Ref]:
    """Of a choice between ``a`` and ``b``, the untouched input x when the other is f(x)."""
    for x, fx in ((a, b), (b, a)):
        if x.node in data and x.node not in random and \
                x.node in graph.ancestors([fx.node], include_control=False) and x != fx:
            return x
    return None


def _draws_of(graph: Graph, name: str) -> List[str]:
    return sorted(n for n in graph.ancestors([name], include_control=False)
                  if graph.op(n) in RANDOM_OPS)


def _checked_size(shapes, layer: Augmentation) -> Tuple[Optional[Augmentation], str]:
    """The identity keeps the image size; a layer that changes it is not replaced."""
    before, after = _static_shape(shapes, layer.entry), _static_shape(shapes, layer.exit)
    if before is not None and after is not None and (len(before) != len(after) or any(
            a is not None and b is not None and a != b for a, b in zip(before[1:], after[1:]))):
        return None, (f"'{layer.name}' changes the image size {before[1:]} → {after[1:]} (a "
                      "random crop or resize): its inference behaviour differs between Keras "
                      "versions (Keras 3: none, tf_keras: a center crop); kept")
    return layer, ""


def _static_shape(shapes, ref: Ref) -> Optional[List]:
    return shapes.get(ref.node) if not ref.port and ref.node in shapes else None


def _replace(graph: Graph, layer: Augmentation, protected=frozenset()) -> None:
    """Readers of the layer's output read its input; an output's name is kept (an Identity)."""
    exit_node = graph.node(layer.exit.node)
    if layer.exit.node in protected:
        dtype = exit_node.attr["T"] if "T" in exit_node.attr else exit_node.attr["dtype"]
        graph.bypass(layer.exit.node, layer.entry, keep_name_as=dtype.type)
    else:
        graph.rewire(layer.exit, layer.entry)


def layer_names(layers: List[Augmentation]) -> str:
    return ", ".join(layer.name.rsplit("/", 1)[-1] for layer in layers)


@transform("remove-augmentation")
def remove_augmentation(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("remove-augmentation")
    if not graph.nodes_with_ops(RANDOM_OPS):
        return report
    layers, kept = find_augmentations(graph, options.outputs, options.protected)
    report.matched = len(layers) + len(kept)
    report.rewritten.extend(layer.exit.node for layer in layers)
    for node, why in kept:
        report.skip(node, why)
    if layers:
        line = (f"the served graph applied random augmentation ({layer_names(layers)}: random "
                "draws changed every input); replaced by the identity, its inference behaviour — "
                "the result no longer answers as the served graph (verification says what it "
                "was compared with)")
        report.notes.append(line)
        report.warnings.append(line)
    for node, why in kept:
        if "sampling" in why:
            report.warnings.append(f"'{node}': {why}")
    return report

