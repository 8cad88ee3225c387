"""fold-pad-into-conv: a zero Pad right before a convolution becomes the conv's padding.

``Conv2D(Pad(x, p), padding=VALID)`` = ``Conv2D(x, padding=EXPLICIT, explicit_paddings=p)``: the
pad's zeros are exactly what explicit padding adds. Every Keras ``ZeroPadding2D`` before a strided
conv is this pattern (ResNet50, MobileNetV2, EfficientNet).

A ``SAME`` conv pads its input (the pad's output, of size n + p0 + p1) by SAME's own zeros, so
    Conv2D(Pad(x, p), SAME) = Conv2D(x, EXPLICIT, p + same(n + p0 + p1))
per spatial axis; SAME's amount depends on that size, so the input's static spatial size must be
known (else refused).

When the pad is exactly what ``SAME`` padding adds for the input's static size (Keras'
``correct_pad`` before a stride-2 conv on an even size: one row and column after), the conv becomes
``SAME`` instead: every runtime and converter (TFLite included) knows SAME.

A DepthwiseConv2dNative takes only that SAME form: its CPU kernel accepts explicit padding, but
Grappler's remapper (on in every default runtime: tf.function, a loaded SavedModel, TF Serving)
fuses Depthwise + BiasAdd + Relu6 into ``_FusedDepthwiseConv2dNative``, which aborts the process on
EXPLICIT padding (TF 2.21: "tensor_format.h Check failed ... Invalid index from the dimension").

Refused (with a reason): a pad whose paddings are not a constant, that pads the batch or channel
axis or is negative, a PadV2 whose fill is not zero, a pad that others read too (it must stay),
a pad with control inputs or that is a graph output. MirrorPad never matches: its border is
the image reflected, not zeros. A conv already EXPLICIT adds the pad to its explicit paddings; a
SAME conv whose input size is not static is left alone (its SAME zeros are not known).
"""
from __future__ import annotations

import numpy as np

from tfsurgery.graph import Graph
from tfsurgery.tfsession import StaticShapes
from tfsurgery.contract import Options, TransformReport, transform

CONVS = ("Conv2D", "DepthwiseConv2dNative")
DEPTHWISE_REFUSAL = ("the pad is not what SAME padding adds, and a depthwise conv with EXPLICIT "
                     "padding aborts TensorFlow once Grappler's remapper fuses it with BiasAdd + "
                     "Relu6 (TF 2.21): the pad stays")
ZERO_PADS = ("Pad", "PadV2")


@transform("fold-pad-into-conv", repeat=True)
def fold_pad_into_conv(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("fold-pad-into-conv")
    if not graph.names_with_ops(ZERO_PADS):
        return report                   # the op index says there is no pad: no conv to visit
    shapes = StaticShapes(graph, options.outputs)
    for node in graph.nodes_with_ops(CONVS):
        if node.name not in graph:
            continue
        pad_ref = graph.inputs(node.name)[0]
        if graph.op(pad_ref) not in ZERO_PADS or pad_ref.port:
            continue
        report.matched += 1
        problem = _why_not(graph, node.name, pad_ref.node, options)
        if problem:
            report.skip(node.name, problem)
            continue
        total = _total_padding(graph, node.name, pad_ref.node, shapes)
        if total is None:
            report.skip(node.name, "SAME padding after the pad depends on the input's spatial "
                                   "size, which is not static")
            continue
        form = _padding_form(graph, node.name, pad_ref.node, total, shapes)
        if form == "EXPLICIT" and graph.op(node.name) == "DepthwiseConv2dNative":
            report.skip(node.name, DEPTHWISE_REFUSAL)
            continue
        _fold(graph, node.name, pad_ref.node, form, total)
        report.rewritten.append(f"{node.name}: {pad_ref.node} became its "
                                f"{form.lower() if form != 'EXPLICIT' else 'explicit'} padding")
    return report


def _why_not(graph: Graph, conv: str, pad: str, options: Options):
    """Why the pad cannot become the conv's padding (None when it can)."""
    if graph.attr(conv, "padding") not in ("VALID", "SAME", "EXPLICIT"):
        return f"padding is {graph.attr(conv, 'padding')}"
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


def same_padding(size: int, k: int, stride: int, dilation: int) -> tuple:
    """SAME's (before, after) zeros on an axis of ``size``: the total
    max((ceil(size / stride) - 1) * stride + (k - 1) * dilation + 1 - size, 0), the odd one after
    (TensorFlow's GetWindowedOutputSize)."""
    total = max((-(-size // stride) - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _spatial(graph: Graph, conv: str) -> tuple:
    return (1, 2) if graph.attr(conv, "data_format", "NHWC") == "NHWC" else (2, 3)


def _window(graph: Graph, conv: str, axis: int, k: int) -> tuple:
    strides, dilations = graph.attr(conv, "strides"), graph.attr(conv, "dilations") or [1] * 4
    return k, strides[axis], dilations[axis]


def _input_size(graph: Graph, pad: str, shapes: StaticShapes):
    source = graph.inputs(pad)[0]
    size = shapes.get(source.node) if not source.port else None
    return size if size is not None and len(size) == 4 else None


def _total_padding(graph: Graph, conv: str, pad: str, shapes: StaticShapes):
    """The [4, 2] zeros the conv sees around the pad's input: the pad's, plus SAME's own for
    the padded size on a SAME conv (None when that size is not static)."""
    paddings = graph.const_value(graph.inputs(pad)[1]).astype(np.int64)
    if graph.attr(conv, "padding") == "VALID":
        return paddings
    if graph.attr(conv, "padding") == "EXPLICIT":      # zeros after zeros: the sums
        return paddings + np.reshape(graph.attr(conv, "explicit_paddings"), (4, 2))
    size, kernel = _input_size(graph, pad, shapes), graph.const_value(graph.inputs(conv)[1])
    if size is None or kernel is None:
        return None
    total = paddings.copy()
    for axis, k in zip(_spatial(graph, conv), kernel.shape[:2]):
        if size[axis] is None:
            return None
        total[axis] += same_padding(size[axis] + int(paddings[axis].sum()),
                                    *_window(graph, conv, axis, k))
    return total


def _padding_form(graph: Graph, conv: str, pad: str, total: np.ndarray,
                  shapes: StaticShapes) -> str:
    """VALID for no zeros at all; SAME when ``total`` is exactly what SAME adds for the pad
    input's static size (Keras' ``correct_pad``); else EXPLICIT."""
    if not total.any():
        return "VALID"
    size, kernel = _input_size(graph, pad, shapes), graph.const_value(graph.inputs(conv)[1])
    if size is None or kernel is None:
        return "EXPLICIT"
    for axis, k in zip(_spatial(graph, conv), kernel.shape[:2]):
        if size[axis] is None or \
                tuple(total[axis]) != same_padding(size[axis], *_window(graph, conv, axis, k)):
            return "EXPLICIT"
    return "SAME"


def _fold(graph: Graph, conv: str, pad: str, padding: str, total: np.ndarray) -> None:
    graph.set_input(conv, 0, graph.inputs(pad)[0])
    node = graph.edit_node(conv)
    node.attr["padding"].s = padding.encode()
    if "explicit_paddings" in node.attr:
        del node.attr["explicit_paddings"].list.i[:]
    if padding == "EXPLICIT":
        node.attr["explicit_paddings"].list.i.extend(int(v) for v in total.reshape(-1))
    graph.remove([pad])
