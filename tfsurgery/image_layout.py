"""Where an input's channels are: the one assumption preprocessing and its check share.

``--reverse-input-channels`` and per-channel ``--mean-values``/``--scale-values`` act along an
input's channel axis. The graph says where that is only through the ``data_format`` of the first
NHWC/NCHW op that reads the input (through element-wise ops); a rank-2 input has its features last.
The add-preprocessing transform and the verifier's NumPy preprocessing both use the axis decided
here, once, before any transform runs (``tfsurgery.preprocessing.resolve`` stores it in the spec
and states it in the report): a wrong answer would be wrong on both sides alike, so it is never
guessed — no format-bearing reader, no per-channel preprocessing (refused in one line).
"""
from __future__ import annotations

from typing import Optional

from tfsurgery.graph import Graph
from tfsurgery.ops import FORWARDING_OPS

FORMAT_OPS = ("Conv2D", "DepthwiseConv2dNative", "BiasAdd", "MaxPool", "AvgPool",
              "FusedBatchNorm", "FusedBatchNormV3", "Conv2DBackpropInput")
PASS_THROUGH = tuple(FORWARDING_OPS) + ("Pad", "PadV2", "Mul", "Add", "AddV2", "Sub", "RealDiv",
                                        "Relu", "Relu6", "Cast", "ReverseV2")


def channel_axis(graph: Graph, name: str) -> Optional[int]:
    """The channel axis of input ``name``: from the data format of the first format-bearing op
    reached through elementwise ops (rank 4), the last axis for a rank-2 input; None if unknown."""
    shape = graph.attr(name, "shape")
    rank = None if shape is None or shape.rank is None else shape.rank
    if rank == 2:
        return 1
    reader = first_format_reader(graph, name)
    if reader is None:
        return None
    fmt = graph.attr(reader, "data_format", "NHWC")
    return 1 if fmt.startswith("NC") else (rank or len(fmt)) - 1


def first_format_reader(graph: Graph, name: str) -> Optional[str]:
    """The first op with a data format reached from ``name`` through elementwise ops."""
    seen, frontier = set(), [name]
    while frontier:
        node = frontier.pop()
        for reader in graph.consumer_nodes(node):
            op = graph.op(reader)
            if op in FORMAT_OPS:
                return reader
            if op in PASS_THROUGH and reader not in seen:
                seen.add(reader)
                frontier.append(reader)
    return None


def is_image(graph: Graph, name: str) -> bool:
    shape = graph.attr(name, "shape")
    return shape is not None and shape.rank == 4
