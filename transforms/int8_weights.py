"""int8-weights (opt-in, ``--store-weights int8``): conv/matmul weights stored as int8, float compute.

The anchors: graph_transforms' ``quantize_weights`` and TFLite's dynamic-range quantization —
smaller files, weights dequantized before float compute. A float32 ``Const`` W of at least
``Int8Params.min_elements`` values that only feeds the weight input of a linear op becomes,
per output channel c (symmetric, no zero point):

    s_c = max|W[..., c]| / 127          q = round(W / s_c) ∈ [-127, 127]   (int8)
    W   = Dequantize(q, min = -127·s, max = 127·s, mode=SCALED, narrow_range, axis=c's axis)

so every consumer still reads a float32 tensor called W (= q·s exactly) and only the stored
bytes shrink to about a quarter. Why ``Dequantize`` rather than ``Cast(q) * s``: it is one op
with one meaning ("these int8 values are W"), TensorFlow runs it on CPU with per-axis scales, the
TFLite converter folds it into the weight it feeds, and the ONNX export folds it before tf2onnx
and writes ``DequantizeLinear`` on int8 initializers itself (``onnx_export.weights_to_int8``);
a Cast and a Mul would be folded back to float by any constant folder that runs again.

The rounding moves each weight by at most s_c/2 (1/254 of its channel's largest weight), hence
the looser verification tolerance in this mode (``api.INT8_WEIGHTS_TOLERANCE``). Biases, shapes
and other small constants stay float32; a constant any other op reads stays float32 too.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from tensorflow.core.framework import attr_value_pb2, types_pb2

from tfsurgery.errors import TransformError
from tfsurgery.graph import Graph
from tfsurgery.contract import Options, TransformReport, transform

QMAX = 127                      # symmetric, narrow range: -127..127 (no -128)
# op → (weight input index, the weight's output-channel axis or a function of the node's attrs)
WEIGHT_INPUTS = {
    "Conv2D": (1, 3),                       # [h, w, in, out]
    "Conv3D": (1, 4),                       # [d, h, w, in, out]
    "DepthwiseConv2dNative": (1, 2),        # [h, w, in, multiplier]: the input channel's
    "Conv2DBackpropInput": (1, 2),          # [h, w, out, in] (transposed conv)
    "Conv3DBackpropInputV2": (1, 3),        # [d, h, w, out, in]
    "MatMul": (1, None),                    # [in, out], or [out, in] with transpose_b
}


@dataclasses.dataclass
class Int8Params:
    min_elements: int = 1024            # smaller float32 weights stay float32 (as TFLite's)


@transform("int8-weights", default=False, params=Int8Params)
def int8_weights(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("int8-weights")
    min_elements = options.params_for(int8_weights).min_elements
    before = after = 0
    for node in graph.nodes_with_ops({"Const"}):
        axis, reason = _weight_axis(graph, node, min_elements, options)
        if axis is None:
            if reason:
                report.skip(node.name, reason)
            continue
        nbytes = graph.const_nbytes(node.name)
        scales = _store_as_int8(graph, node.name, axis)
        before, after = before + nbytes, after + nbytes // 4 + 8 * scales
        report.rewritten.append(node.name)
    report.matched = len(report.rewritten)
    if not report.matched:
        raise TransformError(
            f"--store-weights int8: the graph has no float32 conv/matmul weight of at least "
            f"{min_elements} values to store as int8"
            + (f" ({report.skipped[0][0]}: {report.skipped[0][1]})" if report.skipped else ""))
    report.notes.append(f"{report.matched} weights stored as int8 with per-channel scales "
                        f"({before / 1024:.1f} KiB → {after / 1024:.1f} KiB)")
    return report


def _weight_axis(graph: Graph, node, min_elements: int, options: Options):
    """(the output-channel axis, "") for a weight to quantize; (None, why not) for a weight
    left float ("" when the constant is no weight at all: nothing to report)."""
    readers = _readers(graph, node.name)
    linear = [(op, attrs, index) for op, attrs, index in readers if op in WEIGHT_INPUTS
              and index == WEIGHT_INPUTS[op][0]]
    if not linear:
        return None, ""
    dims = [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
    count = int(np.prod(dims, dtype=np.int64))
    if node.attr["dtype"].type != types_pb2.DT_FLOAT:
        return None, (f"a {types_pb2.DataType.Name(node.attr['dtype'].type)} weight: only "
                      "float32 weights are stored as int8")
    if count < min_elements:
        return None, ""               # biases-sized: stays float32, as documented
    if len(linear) < len(readers):
        other = next(op for op, _, index in readers if (op, index) not in
                     {(o, i) for o, _, i in linear})
        return None, f"also read by a {other} (not as a weight): stays float32"
    axes = {_axis(op, attrs, len(dims)) for op, attrs, _ in linear}
    if len(axes) != 1 or None in axes:
        return None, "read as a weight along different channel axes: stays float32"
    if node.name in options.protected:
        return None, "a graph input or output"
    if graph.control_inputs(node.name):
        return None, "waits on a control dependency"
    value = graph.const_value(node.name, through_identity=False)
    if not np.all(np.isfinite(value)):
        return None, "holds NaN/Inf: int8 cannot represent it"
    return axes.pop(), ""


def _readers(graph: Graph, name: str, seen=None):
    """(op, attrs, input index) of every op reading ``name``, through Identity chains."""
    seen = set() if seen is None else seen
    found = []
    for consumer in graph.consumers(name):          # control readers keep W's name: fine
        op = graph.op(consumer.node)
        if op in ("Identity", "Snapshot") and consumer.node not in seen:
            seen.add(consumer.node)
            found += _readers(graph, consumer.node, seen)
        else:
            found.append((op, graph.node(consumer.node).attr, consumer.index))
    return found


def _axis(op: str, attrs, rank: int) -> Optional[int]:
    if op == "MatMul":
        return 0 if attrs["transpose_b"].b else 1
    axis = WEIGHT_INPUTS[op][1]
    return axis if axis < rank else None


def quantize(value: np.ndarray, axis: int, group: int = 1):
    """(int8 values, scale per channel along ``axis``): symmetric, q·s ≈ value. ``group``
    consecutive channels share one scale (a depthwise kernel's multiplier channels, which
    TensorFlow's [h, w, in, multiplier] layout keeps under one input channel). A channel of
    zeros gets scale 1 (its int8 values are 0 either way)."""
    moved = np.moveaxis(value.astype(np.float32), axis, -1)
    peak = np.max(np.abs(moved.reshape(-1, moved.shape[-1])), axis=0)
    peak = np.repeat(peak.reshape(-1, group).max(axis=1), group)
    tiny = np.finfo(np.float32).tiny              # a subnormal peak must not make scale 0
    scale = np.where(peak > 0, np.maximum(peak / QMAX, tiny), 1.0).astype(np.float32)
    q = np.clip(np.rint(moved / scale), -QMAX, QMAX).astype(np.int8)
    return np.moveaxis(q, -1, axis), scale


def _store_as_int8(graph: Graph, name: str, axis: int) -> int:
    """Const W → W/int8 (qint8), W/min, W/max + Dequantize named W; returns the channels."""
    node = graph.node(name)
    value, device = graph.const_value(name, through_identity=False), node.device
    q, scale = quantize(value, axis)
    weights = graph.add_const(f"{name}/int8", q, dtype=types_pb2.DT_QINT8, device=device)
    low = graph.add_const(f"{name}/min", -QMAX * scale, device=device)
    high = graph.add_const(f"{name}/max", QMAX * scale, device=device)
    graph.remove([name])                   # consumers' edges to W stay indexed under the name
    graph.new_node("Dequantize", name, [weights, low, high], attrs={
        "T": attr_value_pb2.AttrValue(type=types_pb2.DT_QINT8),
        "dtype": attr_value_pb2.AttrValue(type=types_pb2.DT_FLOAT),
        "mode": attr_value_pb2.AttrValue(s=b"SCALED"),
        "narrow_range": attr_value_pb2.AttrValue(b=True),
        "axis": attr_value_pb2.AttrValue(i=axis)}, device=device)
    return len(scale)
