"""Neutral draws: the reference for augmentation the optimized graph no longer applies.

The reference is the ORIGINAL graph, every node kept, with each random draw of a removed
augmentation layer replaced by a constant of its own shape and dtype — a value its own
distribution offers (a uniform's bounds 0 and 1 or its midpoint, an integer draw's minval /
maxval − 1 / midpoint, a normal's mean 0). Which value makes the layer the identity is not
judged by what kind of layer it is: each candidate is *run* on the original with seeded test
inputs, and accepted only when the layer's output equals its input (within float rounding).
remove-augmentation's finder only says where a layer's input and output are (locating); if it
misjudged a layer, no value proves the identity and the check says it cannot compare.
"""
from __future__ import annotations

import itertools
from typing import Dict, List, Sequence

import numpy as np

from tfsurgery.errors import VerificationError
from tfsurgery.graph import Graph
from tfsurgery.ops import (INTEGER_UNIFORM_RANDOM_OPS, NORMAL_RANDOM_OPS, PLACEHOLDER_OPS,
                           UNIFORM_RANDOM_OPS, node_name, tensor_name)
from tfsurgery.verify.runs import DEFAULT_TIMEOUT, Runner, make_feeds

MAX_TRIES = 81                     # candidate combinations per layer (3 candidates, 4 draws)
PROOF_BATCH = 2                    # the free batch size of the proof's inputs
PROOF_SCALES = (1.0, 100.0)        # standard normal inputs, and wide ones (pixel-like values)


def prove_neutral_draws(reference: Graph, layers, settings: Dict[str, object], given=None,
                        timeout: float = DEFAULT_TIMEOUT) -> Dict[str, float]:
    """For each layer (in graph order), draw name → the constant proven to make it the identity;
    then every such draw in ``reference`` becomes that constant. ``VerificationError`` naming
    the layer when no candidate proves it. Proven on seeded random inputs, the ``given`` values
    (the check's --feed or samples) winning for the inputs they name."""
    graph_def = reference.to_graph_def()
    inputs = [n.name for n in graph_def.node
              if n.op in PLACEHOLDER_OPS and n.name not in {node_name(k) for k in settings}]
    feed_sets = [{**make_feeds(graph_def, inputs, 0, given=given, unknown_dim=PROOF_BATCH,
                                 scale=scale),
                  **settings} for scale in PROOF_SCALES]
    chosen: Dict[str, float] = {}
    with Runner(graph_def, timeout=timeout, label="the original graph (neutral draws)") as run:
        draws = [d for layer in layers for d in layer.draws]
        drawn = dict(zip(draws, run.run(feed_sets[0], draws)))      # each draw's shape, dtype
        for layer in layers:
            chosen.update(_proven(run, reference, layer, drawn, chosen, feed_sets))
    for draw, value in chosen.items():
        _constant_draw(reference, draw, value)
    return chosen


def _proven(run: Runner, graph: Graph, layer, drawn, chosen, feed_sets) -> Dict[str, float]:
    tries = list(itertools.islice(itertools.product(*[candidates(graph, d) for d in layer.draws]),
                                  MAX_TRIES))
    for values in tries:
        if _identity_on(run, layer, {**chosen, **dict(zip(layer.draws, values))}, drawn,
                        feed_sets):
            return dict(zip(layer.draws, values))
    positive = [{k: np.clip(np.abs(v), 0, 1) for k, v in feeds.items()} for feeds in feed_sets]
    only_positive = any(_identity_on(run, layer, {**chosen, **dict(zip(layer.draws, values))},
                                     drawn, positive) for values in tries)
    why = (" (it is the identity only on non-negative inputs: a clip to its value range, which "
           "the layer does not apply at inference)") if only_positive else ""
    raise VerificationError(
        f"cannot compare: no value of its random draws ({', '.join(layer.draws)}) within their "
        f"distributions makes the augmentation layer '{layer.name}' compute the identity on "
        f"test inputs{why}, so the original offers no reference for the graph without it")


def _identity_on(run: Runner, layer, values: Dict[str, float], drawn, feed_sets) -> bool:
    """The layer's output equals its input on every feed set with the draws at ``values``."""
    constants = {tensor_name(d): np.full(np.shape(drawn[d]), v, np.asarray(drawn[d]).dtype)
                 for d, v in values.items()}
    fetches = [f"{ref.node}:{ref.port}" for ref in (layer.entry, layer.exit)]
    return all(is_identity(*run.run({**feeds, **constants}, fetches)) for feeds in feed_sets)


def candidates(graph: Graph, draw: str) -> List[float]:
    """The values a draw's own distribution offers: its bounds, its midpoint; a normal's mean."""
    op = graph.op(draw)
    if op in NORMAL_RANDOM_OPS:
        return [0.0]
    if op in INTEGER_UNIFORM_RANDOM_OPS:
        low, high = (graph.const_value(ref) for ref in graph.inputs(draw)[-2:])
        if low is None or high is None:
            return [0.0]
        low, top = float(np.asarray(low)), float(np.asarray(high)) - 1    # maxval excluded
        return list(dict.fromkeys([low, top, float(np.floor((low + top) / 2)), 0.0]))
    if op in UNIFORM_RANDOM_OPS:
        return [0.0, 1.0, 0.5]
    return []                      # gamma, poisson, ...: no neutral value tried


def is_identity(entry: np.ndarray, exit_: np.ndarray) -> bool:
    """Output equals input: exactly, or within float rounding (an interpolation at identity)."""
    entry, exit_ = np.asarray(entry), np.asarray(exit_)
    if entry.shape != exit_.shape:
        return False
    if entry.dtype.kind != "f":
        return bool(np.array_equal(entry, exit_))
    scale = max(1.0, float(np.max(np.abs(entry), initial=0.0)))
    return bool(np.max(np.abs(entry - exit_), initial=0.0) <= 1e-6 * scale)


def _constant_draw(graph: Graph, name: str, value: float) -> None:
    """The draw becomes Fill(its shape input, value), keeping its name and dtype."""
    import tensorflow as tf
    node = graph.node(name)
    dtype = tf.dtypes.as_dtype(node.attr["dtype" if "dtype" in node.attr else "Tout"].type)
    shape = graph.inputs(name)[0]
    index_type = node.attr["T"].type if "T" in node.attr else node.attr["Tshape"].type
    constant = graph.add_const(name + "/neutral_draw", np.array(value, dtype.as_numpy_dtype))
    constant_node = graph.node(constant)
    graph.remove([constant])
    constant_node.input.append(f"^{shape.node}")        # in the frame of the shape it meets
    graph.add_node(constant_node)
    graph.remove([name])
    graph.new_node("Fill", name, [shape, constant],
                   {"T": dtype, "index_type": tf.dtypes.as_dtype(index_type)})


def described(chosen: Dict[str, float], layers: Sequence) -> str:
    """'random_flip_1 (stateless_random_uniform/StatelessRandomUniformV2=1)' per layer."""
    parts = []
    for layer in layers:
        values = ", ".join(f"{d[len(layer.name) + 1:] if d.startswith(layer.name + '/') else d}"
                           f"={chosen[d]:g}" for d in layer.draws)
        parts.append(f"{layer.name.rsplit('/', 1)[-1]} ({values})")
    return "; ".join(parts)
