"""fold-pad-into-conv: a zero Pad right before a VALID convolution becomes the conv's padding.

``Conv2D(Pad(x, p), padding=VALID)`` = ``Conv2D(x, padding=EXPLICIT, explicit_paddings=p)``: the
pad's zeros are exactly what explicit padding adds. Every Keras ``ZeroPadding2D`` before a strided
conv is this pattern (ResNet50, MobileNetV2, EfficientNet). DepthwiseConv2dNative takes explicit
padding too (TensorFlow 2.21's CPU kernel accepts it; tests/test_simplify.py checks the numbers).

Refused (with a reason): a pad whose paddings are not a constant, that pads the batch or channel
axis or is negative, a PadV2 whose fill is not zero, a pad that others read too (it must stay),
a pad with control inputs or that is a graph output. MirrorPad never matches: its border is
the image reflected, not zeros. A conv already SAME/EXPLICIT is left alone.
"""
from __future__ import annotations

import numpy as np

from tfsurgery.graph import Graph
from tfsurgery.transform import Options, TransformReport, transform

CONVS = ("Conv2D", "DepthwiseConv2dNative")
ZERO_PADS = ("Pad", "PadV2")


@transform("fold-pad-into-conv", repeat=True)
def fold_pad_into_conv(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("fold-pad-into-conv")
    for node in graph:
        if node.op not in CONVS or node.name not in graph:
            continue
        pad_ref = graph.inputs(node.name)[0]
        if graph.op(pad_ref) not in ZERO_PADS or pad_ref.port:
            continue
        report.matched += 1
        problem = _why_not(graph, node.name, pad_ref.node, options)
        if problem:
            report.skip(node.name, problem)
            continue
        _fold(graph, node.name, pad_ref.node)
        report.rewritten.append(f"{node.name}: {pad_ref.node} became its explicit padding")
    return report


def _why_not(graph: Graph, conv: str, pad: str, options: Options):
    """Why the pad cannot become the conv's padding (None when it can)."""
    if graph.attr(conv, "padding") != "VALID":
        return f"padding is {graph.attr(conv, 'padding')}, not VALID"
    inputs = graph.inputs(pad)
    paddings = graph.const_value(inputs[1])
    if paddings is None or paddings.shape != (4, 2):
        return "the pad's paddings are not a constant 4x2 table"
    if graph.op(pad) == "PadV2":
        fill = graph.const_value(inputs[2])
        if fill is None or np.any(fill != 0):
            return "the pad fills with a value that is not zero"
    channels_last = graph.attr(conv, "data_format", "NHWC") == "NHWC"
    spatial = (1, 2) if channels_last else (2, 3)
    others = [axis for axis in range(4) if axis not in spatial]
    if np.any(paddings < 0) or np.any(paddings[others] != 0):
        return "the pad is negative or pads the batch/channel axis"
    if len(graph.consumers(pad, control=True)) != 1 or pad in options.protected:
        return f"the pad '{pad}' has other readers or is a graph output"
    if graph.control_inputs(pad):
        return f"the pad '{pad}' has control inputs"
    return None


def _fold(graph: Graph, conv: str, pad: str) -> None:
    paddings = graph.const_value(graph.inputs(pad)[1])
    graph.set_input(conv, 0, graph.inputs(pad)[0])
    node = graph.mutable(conv)
    node.attr["padding"].s = b"EXPLICIT"
    del node.attr["explicit_paddings"].list.i[:]
    node.attr["explicit_paddings"].list.i.extend(int(v) for v in paddings.reshape(-1))
    graph.remove([pad])
