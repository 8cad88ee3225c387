"""Reference graphs verification can compare against, built from the original alone.

Random ops make two runs of a graph differ. Those still present in both graphs get the same fixed
seeds. Those the transforms removed (dropout, noise layers) are replaced in the reference by their
inference meaning, derived here from the original and never from the transform under test:
- a dropout mask ``m`` from a uniform ``u`` — ``floor(keep + u)`` (TF1) or ``u >= rate`` (TF2,
  Keras) — becomes its expected value ``p`` (``keep``, or ``1 - rate``, read from the mask's own
  comparison), so ``x · scale · m`` becomes ``x · scale · p = x``: dropout off;
- any other uniform becomes 1 − machine epsilon (every mask keeps), a normal becomes 0 (noise off).
Augmentation layers served by mistake (RandomFlip, RandomRotation, ... applied by a
``model.export()`` graph) whose draws were removed keep every node in the reference; their draws
become constants *proven* by running the original to make each layer the identity
(tfsurgery.verify.neutral_draws) — remove-augmentation's finder only locates a layer's input and
output, it never decides what the reference computes.
Other random ops that were removed have no neutral value: the check says it cannot compare.
A BatchNorm served in training mode (normalising by the batch's own moments) whose moments the
optimized graph no longer computes is, in the reference, the layer in inference mode: the
readers of its batch moments read the moving statistics its own moving-average update names
(located by use-moving-statistics' finder on the original; the edit is made here). Only a
reference with every training leftover found at its inference behaviour and no batch moment
left is called "the model in inference mode (training=False)".
"""
from __future__ import annotations

import zlib
from typing import Dict, Optional, Tuple

import numpy as np

from tfsurgery.errors import VerificationError
from tfsurgery.graph import Graph, Ref
from tfsurgery.ops import (INTEGER_UNIFORM_RANDOM_OPS, NORMAL_RANDOM_OPS, SEEDED_RANDOM_OPS,
                           UNIFORM_RANDOM_OPS)
from tfsurgery.transforms.remove_augmentation import (find_augmentations,
                                                        may_hold_augmentation)
from tfsurgery.transforms.use_moving_statistics import find_batch_moment_norms, layer_label
from tfsurgery.verify import neutral_draws

UNIFORM_OPS, NORMAL_OPS, SEEDED_OPS = UNIFORM_RANDOM_OPS, NORMAL_RANDOM_OPS, SEEDED_RANDOM_OPS
FIXED_SEED = 87654321
MASK_SCALE_OPS = ("Mul", "Add", "AddV2", "Sub")      # u·(max − min) + min on its way to the mask


def comparable_reference(original, optimized, settings=None,
                         given=None) -> Tuple[object, object, Optional[str]]:
    """The original and optimized graphs made comparable where they hold random ops (see module
    doc): (reference, optimized, note about the reference or None). ``settings`` are the values
    the original is fed besides its inputs (a dropout's ``keep_prob``); ``given``: input values
    the check feeds (--feed, samples), which the neutral draws are proven on too."""
    kept = {n.name: n.op for n in optimized.node}
    random_nodes = [n for n in original.node if n.op in UNIFORM_OPS | NORMAL_OPS | SEEDED_OPS]
    norms = find_batch_moment_norms(Graph(original, check_inputs=False)) \
        if any(n.op == "SquaredDifference" for n in original.node) else []
    restored = [norm for norm in norms if norm.restorable and
                not any(kept.get(name) == "Mean" for name in norm.moment_nodes)]
    if not random_nodes and not restored and not any(n.op in SEEDED_OPS for n in optimized.node):
        return original, optimized, None
    reference, seeded = Graph(original, check_inputs=False), None
    for norm in restored:               # the layer in inference mode: its moving statistics
        reference.rewire(norm.mean, norm.moving_mean)
        reference.rewire(norm.variance, norm.moving_variance)
    neutral, augmentations = [], _augmentations_off(original, reference, random_nodes, kept,
                                                    settings or {})
    proven = neutral_draws.prove_neutral_draws(reference, augmentations, settings or {}, given) \
        if augmentations else {}
    bypassed = set(proven)
    for node in random_nodes:
        if node.name in bypassed:
            continue
        if kept.get(node.name) == node.op:
            seeded = seeded or Graph(optimized, check_inputs=False)
            _fix_seed(reference, node.name)
            _fix_seed(seeded, node.name)
        elif node.op in UNIFORM_OPS | NORMAL_OPS:
            masked = node.op in UNIFORM_OPS and _expect_mask(reference, node.name, settings or {})
            if not masked and node.op in INTEGER_UNIFORM_RANDOM_OPS:
                raise VerificationError(f"cannot compare: random op '{node.name}' ({node.op}) "
                                        "was removed and feeds no dropout mask of a known form")
            if not masked:
                _neutralize(reference, node.name)
            neutral.append(node.name)
        else:
            raise VerificationError(f"cannot compare: random op '{node.name}' ({node.op}) was "
                                    "removed and has no neutral value")
    for node in optimized.node:
        if node.op in SEEDED_OPS and node.name not in kept.keys() & {n.name for n in random_nodes}:
            seeded = seeded or Graph(optimized, check_inputs=False)
            _fix_seed(seeded, node.name)
    notes = [f"its {len(neutral)} random op(s) at their expected or neutral value (dropout "
             "off, noise 0)"] if neutral else []
    if augmentations:
        notes.append("its augmentation at its inference behaviour, every node kept, each draw "
                     "a constant proven to make its layer the identity on test inputs: "
                     + neutral_draws.described(proven, augmentations))
    if restored:
        notes.append("its BatchNorm " + ", ".join(layer_label(n) for n in restored) +
                     " at its moving statistics, not the batch's")
    if (augmentations or restored) and len(restored) == len(norms):
        notes.append("the model in inference mode (training=False)")
    note = "; ".join(notes) or None
    # the optimized graph is copied only where it keeps random ops to seed
    return reference.to_graph_def(), (optimized if seeded is None else seeded.to_graph_def()), \
        note


def _augmentations_off(original, reference: Graph, random_nodes, kept, settings) -> list:
    """Augmentation layers of the original whose draws the optimized graph no longer has, located
    (input, output, draws) by remove-augmentation on a throw-away copy of the original — built
    only where a draw meets the data before any learned layer (read off ``reference``)."""
    if all(kept.get(node.name) == node.op for node in random_nodes) or \
            not may_hold_augmentation(reference):
        return []
    located = Graph(original, check_inputs=False)
    for node in random_nodes:      # dropout masks are dropout's (expected value), not augmentation
        if node.op in UNIFORM_OPS and kept.get(node.name) != node.op:
            _expect_mask(located, node.name, settings)
    sinks = {node.name for node in located if not located.consumer_nodes(node.name)}
    layers, _ = find_augmentations(located, protected=sinks)
    return [layer for layer in layers if not any(kept.get(d) for d in layer.draws)]


def _fix_seed(graph: Graph, name: str) -> None:
    node = graph.edit_node(name)
    node.attr["seed"].i = FIXED_SEED
    node.attr["seed2"].i = zlib.crc32(name.encode()) % (2 ** 31) or 1


def _neutralize(graph: Graph, name: str) -> None:
    """A random op becomes ``Fill(shape, v)``: v = 1 − machine epsilon (uniform), or 0. Not the
    largest value below 1: TF1 dropout's ``floor(keep_prob + u)`` must stay 1 for keep_prob = 1,
    and 1 + (largest below 1) rounds to 2."""
    import tensorflow as tf
    node = graph.node(name)
    dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
    shape = graph.inputs(name)[0]
    index_type = node.attr["T"].type if "T" in node.attr else node.attr["Tshape"].type
    numpy_type = dtype.as_numpy_dtype
    value = np.array(1 - np.finfo(numpy_type).eps if node.op in UNIFORM_OPS else 0, numpy_type)
    constant = _const_beside(graph, name + "/neutral_value", value, shape.node)
    graph.remove([name])
    graph.new_node("Fill", name, [shape, constant],
                   {"T": dtype, "index_type": tf.dtypes.as_dtype(index_type)})




def _const_beside(graph: Graph, name: str, value, anchor: str) -> str:
    """A Const with a control edge from ``anchor``: inside a while loop (or cond) a constant
    must belong to the frame of the nodes it meets, or TensorFlow refuses the graph."""
    name = graph.add_const(name, value)
    node = graph.node(name)
    graph.remove([name])
    node.input.append(f"^{anchor}")
    graph.add_node(node)
    return name


def _expect_mask(graph: Graph, uniform: str, settings: Dict[str, object]) -> bool:
    """Replace the dropout mask a uniform ``u`` feeds by its expected value (module doc). False,
    with nothing changed, when ``u`` feeds no mask of a known form."""
    low, high, current = 0.0, 1.0, uniform          # u' = current is uniform on [low, high)
    discrete = graph.op(uniform) in INTEGER_UNIFORM_RANDOM_OPS   # integers in [minval, maxval)
    if discrete:
        bounds = [_scalar(graph, ref, settings) for ref in graph.inputs(uniform)[1:3]]
        if None in bounds or bounds[1] <= bounds[0]:
            return False
        low, high = bounds
    while True:
        readers = graph.consumers(current)
        if len(readers) != 1:
            return False
        node = graph.node(readers[0].node)
        others = [ref for ref in graph.inputs(node.name) if ref.node != current]
        value = _scalar(graph, others[0], settings) if len(others) == 1 else None
        if value is None:
            return False
        mine_first = readers[0].index == 0
        if node.op in ("Add", "AddV2") and _single_reader_op(graph, node.name) == "Floor":
            keep = _probability(low + value, high + value, at_least=1.0)  # floor(keep + u) = 1
            floor = graph.consumers(node.name)[0].node
            return _replace_by_probability(graph, floor, Ref(node.name), keep)
        if node.op in ("GreaterEqual", "Greater", "Less", "LessEqual") and mine_first:
            if discrete:          # u >= t ⇔ u >= ceil(t); u > t ⇔ u >= floor(t) + 1
                at_least = np.ceil(value) if node.op in ("GreaterEqual", "Less") \
                    else np.floor(value) + 1
                keep = _probability(low, high, at_least=at_least)
            else:
                keep = _probability(low, high, at_least=value)
            keep = keep if node.op.startswith("Greater") else 1.0 - keep
            return _apply_expected(graph, node.name, keep)
        if discrete:              # integer arithmetic on the way: not a form we know
            return False
        if node.op == "Mul" and value > 0:
            low, high = low * value, high * value
        elif node.op in ("Add", "AddV2") or (node.op == "Sub" and mine_first):
            shift = value if node.op != "Sub" else -value
            low, high = low + shift, high + shift
        else:
            return False
        current = node.name


def _probability(low: float, high: float, *, at_least: float) -> float:
    """P(u' >= at_least) for u' uniform on [low, high)."""
    return float(np.clip((high - max(low, at_least)) / (high - low), 0.0, 1.0))


def _apply_expected(graph: Graph, compare: str, keep: float) -> bool:
    """The bool mask ``compare`` is read by a Cast (→ its expected value) or a Select."""
    readers = graph.consumers(compare)
    if len(readers) != 1:
        return False
    reader = graph.node(readers[0].node)
    if reader.op == "Cast":
        return _replace_by_probability(graph, reader.name, Ref(compare), keep)
    if reader.op in ("Select", "SelectV2") and readers[0].index == 0:
        data = graph.inputs(reader.name)[1]
        dtype = reader.attr["T"]
        constant = _const_beside(graph, reader.name + "/expected_mask",
                                 np.array(keep, _numpy(dtype)), data.node)
        graph.remove([reader.name])
        graph.new_node("Mul", reader.name, [data, constant], {"T": dtype})
        return True
    return False


def _replace_by_probability(graph: Graph, mask: str, shaped_like: Ref, keep: float) -> bool:
    """Node ``mask`` becomes Fill(Shape(shaped_like), keep), in the mask's dtype."""
    import tensorflow as tf
    node = graph.node(mask)
    dtype = node.attr["T"] if node.op == "Floor" else node.attr["DstT"]
    producer = graph.node(shaped_like.node)
    boolean = node.op == "Cast" or "T" not in producer.attr       # a Cast reads a bool mask
    shape = graph.new_node("Shape", mask + "/expected_shape", [shaped_like],
                           {"T": tf.bool if boolean else producer.attr["T"], "out_type": tf.int32})
    constant = _const_beside(graph, mask + "/expected_mask", np.array(keep, _numpy(dtype)),
                             shaped_like.node)
    graph.remove([mask])
    graph.new_node("Fill", mask, [shape.name, constant],
                   {"T": tf.dtypes.as_dtype(dtype.type), "index_type": tf.int32})
    return True


def _scalar(graph: Graph, ref: Ref, settings: Dict[str, object]) -> Optional[float]:
    """A scalar constant or fed setting's value, else None."""
    value = graph.const_value(ref)
    if value is None:
        value = settings.get(graph.resolve(ref).node)
    value = None if value is None else np.asarray(value)
    return float(value) if value is not None and value.size == 1 else None


def _single_reader_op(graph: Graph, name: str) -> Optional[str]:
    readers = graph.consumers(name)
    return graph.op(readers[0].node) if len(readers) == 1 else None


def _numpy(dtype_attr):
    import tensorflow as tf
    return tf.dtypes.as_dtype(dtype_attr.type).as_numpy_dtype
