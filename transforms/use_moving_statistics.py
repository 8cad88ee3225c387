"""use-moving-statistics: BatchNorm that normalises by the batch at serving uses its moving statistics.

A Keras 3 model whose augmentation layers default to ``training=True`` is exported by
``model.export()`` with its BatchNormalization in training mode too: the served function
normalises each request by the batch's own moments —

    mean = Mean(x, axes)                            axes: every axis but the channel, batch included
    var  = Mean(SquaredDifference(x, StopGradient(mean)), axes)
    y    = (x - mean) · gamma / sqrt(var + eps) + beta

— and also computes the update of the moving averages it would apply in training, which names
the layer's moving statistics by structure, whatever their names:

    moving' = moving · m + mean · (1 - m)           Keras 3 (m, 1 - m: constants summing to 1)
    moving' = moving - (moving - mean) · d          tf_keras / tf.compat.v1 (AssignMovingAvg)

(the assignment itself is dropped when the SavedModel is frozen; the computed update stays). A
batch moment is a training leftover like dropout: where the moving statistic is a constant of the
file, every reader of the batch moment reads it instead (the model in inference mode); said loudly.
Where it is not there, the run is refused naming the BatchNorm (``--disable use-moving-statistics``
keeps the served behaviour). Moments over axes without the batch (LayerNorm, instance norm) are
not batch statistics and are not touched.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.errors import TransformError
from tfsurgery.graph import Graph, Ref

PASS_THROUGH = ("Squeeze", "Reshape", "Identity")      # a moment on its way to the normalisation


@dataclasses.dataclass
class BatchMomentNorm:
    """One normalisation by batch moments: the tensors holding them as the layer reads them, and
    the layer's moving statistics (constant tensors) where the file has them."""

    name: str                          # the layer's scope
    mean: Ref                          # the batch mean, as the normalisation reads it
    variance: Ref
    moving_mean: Optional[Ref]
    moving_variance: Optional[Ref]
    moment_nodes: Tuple[str, str]      # the two Mean ops (gone once the moving ones are used)

    @property
    def restorable(self) -> bool:
        return self.moving_mean is not None and self.moving_variance is not None


def find_batch_moment_norms(graph: Graph) -> List[BatchMomentNorm]:
    """Every ``Mean``/``SquaredDifference`` pair of moments over axes that include the batch
    (axis 0), with the moving statistics its update averages into, where found."""
    found = []
    for mean_op in graph.names_with_ops(["Mean"]):
        axes = graph.const_value(graph.inputs(mean_op)[1])
        if axes is None or 0 not in [int(a) for a in np.ravel(axes)]:
            continue
        x = graph.inputs(mean_op)[0]
        if graph.const_value(x) is not None:
            continue
        variance_op = _variance_of(graph, mean_op, x, axes)
        if variance_op is None:
            continue
        mean, variance = _read_as(graph, mean_op), _read_as(graph, variance_op)
        found.append(BatchMomentNorm(_scope(mean_op), mean, variance,
                                     _moving_of(graph, mean), _moving_of(graph, variance),
                                     (mean_op, variance_op)))
    return found


def _variance_of(graph: Graph, mean_op: str, x: Ref, axes) -> Optional[str]:
    """``Mean(SquaredDifference(x, StopGradient(mean)), axes)``: the batch variance beside it."""
    for reader in graph.consumer_nodes(mean_op):
        if graph.op(reader) not in ("StopGradient", "Identity"):
            continue
        for difference in graph.consumer_nodes(reader):
            if graph.op(difference) != "SquaredDifference" or \
                    x not in graph.inputs(difference):
                continue
            for variance in graph.consumer_nodes(difference):
                other = graph.const_value(graph.inputs(variance)[1]) \
                    if graph.op(variance) == "Mean" else None
                if other is not None and sorted(np.ravel(other).tolist()) == \
                        sorted(np.ravel(axes).tolist()):
                    return variance
    return None


def _read_as(graph: Graph, moment: str) -> Ref:
    """The moment as the layer reads it: through a Squeeze (keepdims False) when there is one."""
    for reader in graph.consumer_nodes(moment):
        if graph.op(reader) == "Squeeze":
            return Ref(reader)
    return Ref(moment)


def _moving_of(graph: Graph, moment: Ref) -> Optional[Ref]:
    """The constant the moving-average update of ``moment`` averages into (module doc)."""
    for consumer in graph.consumers(moment.node, moment.port):
        step = consumer.node
        op, inputs = graph.op(step), graph.inputs(step)
        if op == "Mul":                                  # moving · m + mean · (1 - m)
            rate = _other_const(graph, step, moment)
            for total in graph.consumer_nodes(step):
                if graph.op(total) not in ("Add", "AddV2") or rate is None:
                    continue
                other = next(r for r in graph.inputs(total) if r.node != step)
                if graph.op(other) != "Mul":
                    continue
                a, b = graph.inputs(other.node)
                for moving, momentum in ((a, b), (b, a)):
                    keep = graph.const_value(momentum)
                    if keep is not None and keep.size == 1 and \
                            _constant_like(graph, moving) and \
                            abs(float(keep) + float(rate) - 1.0) < 1e-6:
                        return moving
        if op == "Sub" and inputs[1] == moment and _constant_like(graph, inputs[0]):
            # (moving - mean) · d, subtracted from the moving statistic by the assignment
            if any(graph.op(r) == "Mul" and _other_const(graph, r, Ref(step)) is not None
                   for r in graph.consumer_nodes(step)):
                return inputs[0]
    return None


def _other_const(graph: Graph, mul: str, mine: Ref) -> Optional[float]:
    others = [r for r in graph.inputs(mul) if r != mine]
    value = graph.const_value(others[0]) if len(others) == 1 else None
    return float(value) if value is not None and value.size == 1 else None


def _constant_like(graph: Graph, ref: Ref) -> bool:
    """A constant of the file (a frozen variable) with one value per channel of the moment."""
    value = graph.const_value(ref)
    return value is not None and value.ndim == 1


def _scope(name: str) -> str:
    parts = name.split("/")
    for i, part in enumerate(parts):
        if part in ("moments", "batchnorm"):
            return "/".join(parts[:i])
    return name.rsplit("/", 1)[0]


def layer_label(norm: BatchMomentNorm) -> str:
    return norm.name.rsplit("/", 1)[-1]


def restore(graph: Graph, norm: BatchMomentNorm) -> None:
    """Every reader of the batch moments reads the moving statistics instead."""
    graph.rewire(norm.mean, norm.moving_mean)
    graph.rewire(norm.variance, norm.moving_variance)


@transform("use-moving-statistics")
def use_moving_statistics(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("use-moving-statistics")
    if not graph.names_with_ops(["SquaredDifference"]):
        return report
    live = graph.ancestors(options.outputs) if options.outputs else None
    norms = [norm for norm in find_batch_moment_norms(graph)   # (an unread one is prune's)
             if live is None or norm.mean.node in live or norm.variance.node in live]
    missing = [norm for norm in norms if not norm.restorable]
    if missing:
        raise TransformError(
            f"BatchNorm '{missing[0].name}' (batch mean '{missing[0].moment_nodes[0]}') "
            "normalises by the batch's own statistics at serving "
            "(training mode) and the moving statistics it uses in inference mode are not in the "
            "file (no moving-average update of a constant); --disable use-moving-statistics "
            "keeps the served behaviour")
    done = []
    for norm in norms:
        if {norm.mean.node, norm.variance.node} & set(options.protected):
            report.skip(norm.name, "its batch moments are an output of the graph; kept")
            continue
        restore(graph, norm)
        done.append(norm)
        report.rewritten.append(f"{norm.name}: the batch moments {norm.mean}, {norm.variance} "
                                f"→ the moving statistics {norm.moving_mean}, "
                                f"{norm.moving_variance}")
    report.matched = len(done)
    if done:
        line = (f"the served graph normalised by the batch's own statistics (training mode) in "
                f"{', '.join(layer_label(n) for n in done)}; now the moving statistics, the "
                "layer's inference behaviour — not the served graph's")
        report.notes.append(line)
        report.warnings.append(line)
    return report
