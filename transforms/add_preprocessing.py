"""add-preprocessing: the input pipeline baked into the graph (--input-dtype, --reverse-input-channels,
--mean-values, --scale-values).

The model sees  m = (reverse(x) - mean) / scale   (OpenVINO's order; values in the model's
channel order). The input placeholder keeps its name and takes the raw dtype; after it come
    Cast → Sub(reverse(mean)) → ReverseV2(channel axis) → Mul(1 / scale)
which is the same map (reverse(x) - mean = reverse(x - reverse(mean))), emitted in the order
fold-affine-into-linear can absorb (before a depthwise conv, which cannot absorb a reversal, the
ReverseV2 comes first so that the mean still folds): the Mul and the ReverseV2 fold into the first linear layer's
weights, the Sub into its bias where that is exact; what cannot fold stays, and every other reader
of the input reads m, so its meaning is unchanged.
"""
from __future__ import annotations

import dataclasses

from typing import Dict, Optional

import numpy as np

from tfsurgery.errors import TransformError
from tfsurgery.graph import Graph, Ref
from tfsurgery.image_layout import channel_axis, first_format_reader
from tfsurgery.contract import Options, Preprocessing, TransformReport, transform

@dataclasses.dataclass
class AddPreprocessingParams:
    # input node name → what its raw values become (resolved from the CLI/API options)
    specs: Dict[str, Preprocessing] = dataclasses.field(default_factory=dict)


@transform("add-preprocessing", default=False, params=AddPreprocessingParams)
def add_preprocessing(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("add-preprocessing")
    for name, spec in options.params_for(add_preprocessing).specs.items():
        if name not in graph:
            raise TransformError(f"--input-dtype/--mean-values/...: no input named '{name}'")
        axis = spec.channel_axis if spec.channel_axis is not None else channel_axis(graph, name)
        note, model_input = _rewrite(graph, name, spec, axis)
        report.notes.append(note)
        if model_input.node != name:      # m, what the original's input holds when it is fed m
            report.corresponds(str(model_input), f"{name}:0")
        report.matched += 1
        report.rewritten.append(name)
    return report


def _broadcast_shape(values, axis: Optional[int], rank: Optional[int]) -> tuple:
    if len(values) == 1:
        return ()
    return (len(values),) + (1,) * (rank - 1 - axis)


def _rewrite(graph: Graph, name: str, spec: Preprocessing, axis: Optional[int]):
    """The note saying what was emitted, and the tensor holding m."""
    import tensorflow as tf
    node = graph.node(name)
    model_dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
    rank = graph.attr(name, "shape").rank
    consumers = graph.consumers(name, 0)
    last, steps = Ref(name, 0), []
    if spec.dtype and tf.dtypes.as_dtype(spec.dtype) != model_dtype:
        graph.edit_node(name).attr["dtype"].type = tf.dtypes.as_dtype(spec.dtype).as_datatype_enum
        cast = graph.new_node("Cast", f"{name}/preprocess/cast", [last], {
            "SrcT": tf.dtypes.as_dtype(spec.dtype), "DstT": model_dtype, "Truncate": False})
        last, steps = Ref(cast.name, 0), steps + [f"cast to {model_dtype.name}"]
    # A depthwise conv cannot absorb the reversal, so it goes first there and the mean, next to
    # the conv, can still fold into its bias.
    reverse_first = spec.reverse and graph.op(first_format_reader(graph, name) or name) == \
        "DepthwiseConv2dNative"
    if reverse_first:
        last, steps = _reverse(graph, name, last, axis, model_dtype), steps + [
            f"reverse axis {axis}"]
    if spec.mean is not None and any(spec.mean):
        mean = np.asarray(spec.mean, np.float64)
        if spec.reverse and not reverse_first:
            mean = mean[::-1]                              # x - reverse(mean), reversed next
        const = graph.add_const(f"{name}/preprocess/mean", mean.reshape(
            _broadcast_shape(spec.mean, axis, rank)).astype(model_dtype.as_numpy_dtype))
        sub = graph.new_node("Sub", f"{name}/preprocess/sub_mean", [last, const], {"T": model_dtype})
        last, steps = Ref(sub.name, 0), steps + ["subtract mean"]
    if spec.reverse and not reverse_first:
        last, steps = _reverse(graph, name, last, axis, model_dtype), steps + [
            f"reverse axis {axis}"]
    if spec.scale is not None and any(s != 1 for s in spec.scale):
        inverse = 1.0 / np.asarray(spec.scale, np.float64)
        const = graph.add_const(f"{name}/preprocess/inverse_scale", inverse.reshape(
            _broadcast_shape(spec.scale, axis, rank)).astype(model_dtype.as_numpy_dtype))
        mul = graph.new_node("Mul", f"{name}/preprocess/scale", [last, const], {"T": model_dtype})
        last, steps = Ref(mul.name, 0), steps + ["divide by scale"]
    for consumer in consumers:
        graph.set_input(consumer.node, consumer.index, last)
    values = f"mean={spec.mean or 0}, scale={spec.scale or 1}, reverse={spec.reverse}"
    return (f"{name}: m = (reverse(x) - mean) / scale with {values}; new input signature "
            f"{name}: {spec.dtype or model_dtype.name}{graph.attr(name, 'shape')}; emitted "
            f"{', '.join(steps) or 'nothing'} (fold-affine-into-linear says what folded)"), last


def _reverse(graph: Graph, name: str, last: Ref, axis: int, dtype) -> Ref:
    import tensorflow as tf
    axes = graph.add_const(f"{name}/preprocess/channel_axis", np.asarray([axis], np.int32))
    rev = graph.new_node("ReverseV2", f"{name}/preprocess/reverse_channels", [last, axes],
                         {"T": dtype, "Tidx": tf.int32})
    return Ref(rev.name, 0)
