"""The linear ops weights fold into, seen for folding: where the weights are, which axis of the
output holds the channels, and how to scale the weights along it (``W * s`` over the output
channels). Shared by fold-batch-norm and flatten-atrous-conv.

Conv2D/Conv3D kernels are [h, w, (d,) in, out]; DepthwiseConv2dNative's [h, w, in, multiplier]
(output channel = in * multiplier + m); a transposed conv's filter is [h, w, (d,) out, in];
MatMul's [in, out] ([out, in] with ``transpose_b``). data_format decides the channel axis.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tfsurgery.graph import Graph, Ref

LINEAR_OPS = ("Conv2D", "DepthwiseConv2dNative", "Conv3D", "MatMul", "Conv2DBackpropInput",
              "Conv3DBackpropInputV2")


@dataclasses.dataclass
class Linear:
    """A linear op's view for folding: where its weights are and how output channels lie."""

    name: str
    weight: Ref              # the weight input (as the node reads it)
    weights: Optional[np.ndarray]   # its value, decoded once (None: not a constant)
    rank: int                # rank of the op's output
    channel_axis: int        # output-channel axis of the op's output
    channels: int
    dtype: object            # the op's T attribute (AttrValue)
    scale_weights: callable  # (W, s) -> W * s along the output-channel axis (a new array)


def _data_format_axis(graph: Graph, name: str, rank: int) -> int:
    """Channel axis for NHWC/NDHWC (last) or NCHW/NCDHW (1)."""
    return 1 if graph.attr(name, "data_format", "NHWC").startswith("NC") else rank - 1


def linear_op(graph: Graph, name: str) -> Optional[Linear]:
    op = graph.op(name)
    if op not in LINEAR_OPS:
        return None
    weight_ref = graph.inputs(name)[1]
    weight = graph.const_value(weight_ref)
    shape = weight.shape if weight is not None else None
    dtype = graph.node(name).attr["T"]

    def along(axis):
        def scale(w, s):
            if axis == w.ndim - 1:
                return w * s            # broadcasting runs along the last axis already
            return w * s.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
        return scale

    if op == "MatMul":
        axis = 0 if graph.attr(name, "transpose_b", False) else 1
        return Linear(name, weight_ref, weight, 2, 1, shape[axis] if shape else 0, dtype,
                      along(axis))
    rank = 5 if op.startswith("Conv3D") else 4
    channel_axis = _data_format_axis(graph, name, rank)
    if op == "DepthwiseConv2dNative":       # kernel [h, w, in, multiplier]: channel = in*mult + m
        def scale_depthwise(w, s):
            return w * s.reshape(1, 1, w.shape[2], w.shape[3])
        return Linear(name, weight_ref, weight, 4, channel_axis,
                      shape[2] * shape[3] if shape else 0, dtype, scale_depthwise)
    if op in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):    # kernel [h, w, (d,) out, in]
        return Linear(name, weight_ref, weight, rank, channel_axis,
                      shape[rank - 2] if shape else 0, dtype, along(rank - 2))
    return Linear(name, weight_ref, weight, rank, channel_axis, shape[-1] if shape else 0, dtype,
                  along(rank - 1))
