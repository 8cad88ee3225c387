"""float16-weights (opt-in, ``--store-weights float16``): store large float32 weights as float16.

The anchors: graph_transforms' ``round_weights`` (smaller files, same graph) and TFLite's float16
post-training quantization (weights in float16, dequantized to float32 when the model loads). Here
a float32 ``Const`` W with at least ``Float16Params.min_elements`` values becomes

    W/float16 = Const(float16(W))          W = Cast(W/float16 → float32)

so every consumer still reads a float32 tensor called W; only the stored bytes halve. The rounding
error is float16's (relative 2^-11 per weight), which is why verification uses a looser tolerance
in this mode (``verify.FLOAT16_TOLERANCE``). Small constants (biases, shapes, scalars) stay
float32: they cost nothing and are often exact values (epsilons, scales) worth keeping.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from tensorflow.core.framework import attr_value_pb2, types_pb2

from tfsurgery.errors import TransformError
from tfsurgery.graph import Graph
from tfsurgery.contract import Options, TransformReport, transform

FLOAT16_MAX = float(np.finfo(np.float16).max)


@dataclasses.dataclass
class Float16Params:
    min_elements: int = 64              # smaller float32 constants stay float32


@transform("float16-weights", default=False, params=Float16Params)
def float16_weights(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("float16-weights")
    candidates = [node.name for node in graph.nodes_with_ops({"Const"})
                  if _is_large_float32_const(node, options)]
    if not candidates:
        raise TransformError(
            f"--store-weights float16: the graph has no float32 constant of at least "
            f"{options.params_for(float16_weights).min_elements} values to store as float16")
    saved = 0
    for name in candidates:
        reason = _why_not(graph, name, options)
        if reason:
            report.skip(name, reason)
            continue
        saved += graph.const_nbytes(name) // 2
        _store_as_float16(graph, name)
        report.rewritten.append(name)
    report.matched = len(report.rewritten)
    report.notes.append(f"{report.matched} float32 weights stored as float16 "
                        f"({saved / 1024:.1f} KiB saved)")
    return report


def _is_large_float32_const(node, options: Options) -> bool:
    if node.op != "Const" or node.attr["dtype"].type != types_pb2.DT_FLOAT:
        return False
    dims = [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
    return int(np.prod(dims, dtype=np.int64)) >= options.params_for(float16_weights).min_elements


def _why_not(graph: Graph, name: str, options: Options) -> str:
    if name in options.protected:
        return "a graph input or output"
    if graph.control_inputs(name):
        return "waits on a control dependency"
    value = graph.const_value(name, through_identity=False)
    if not np.all(np.isfinite(value)) or np.max(np.abs(value), initial=0.0) > FLOAT16_MAX:
        return f"holds values float16 cannot represent (beyond ±{FLOAT16_MAX:g} or not finite)"
    return ""


def _store_as_float16(graph: Graph, name: str) -> None:
    """Const W → Const W/float16 + Cast named W (consumers and control edges keep reading W)."""
    node = graph.node(name)
    value, device = graph.const_value(name, through_identity=False), node.device
    half = graph.add_const(f"{name}/float16", value.astype(np.float16), device=device)
    graph.remove([name])                   # consumers' edges to W stay indexed under the name
    graph.new_node("Cast", name, [half], attrs={
        "SrcT": attr_value_pb2.AttrValue(type=types_pb2.DT_HALF),
        "DstT": attr_value_pb2.AttrValue(type=types_pb2.DT_FLOAT), "Truncate": False}, device=device)
