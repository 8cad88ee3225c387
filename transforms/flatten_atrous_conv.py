"""flatten-atrous-conv: SpaceToBatchND → conv → BatchToSpaceND becomes one dilated conv.

TF1's ``tf.nn.atrous_conv2d`` and ``tf.nn.convolution(dilation_rate=r)`` (and Keras'
``Conv2D(dilation_rate=r)`` through it) write a dilated conv as a VALID stride-1 conv on the
space-to-batch form of its input (graph_transforms' ``flatten_atrous_conv``, TFLite's
``identify-dilated-conv``, tf2onnx and OpenVINO all undo it). Along one spatial axis, with block r,
S2B paddings (p0, p1) and B2S crops (c0, c1), for kernel taps t = 0..k-1:

    S2B pads x to x' (p0 zeros before, p1 after) and deals x'[i] to phase i mod r, index i div r;
    the conv on phase j gives   out_j[m] = sum_t W[t] x'[r(m + t) + j];
    B2S interleaves  y[rm + j] = out_j[m],  so  y[q] = sum_t W[t] x'[q + rt]   (dilation r),
    and crops        z[q] = y[q + c0] = sum_t W[t] x[q + (c0 - p0) + rt].

That is the conv with ``dilations = r`` and zero padding (p0 - c0) before, (p1 - c1) after:
VALID when both are 0, SAME when they are SAME's split of (k - 1)·r (stride 1: independent of the
size), else EXPLICIT. The batch axis only carries the phases there and back (the conv treats each
batch entry alone). A 1-D conv (``ExpandDims(axis 1)`` → Conv2D → ``Squeeze``, how TF writes
``conv1d``: WaveNet/TCN stacks) is the same along its one axis; the ExpandDims then reads the input. Per-pixel ops between the conv and the BatchToSpaceND (BiasAdd, an inference
batch norm, Mul/Add by per-channel constants, ReLU-like activations) commute with the rearranging and
stay after the new conv; the batch norm after the BatchToSpaceND is then right after the conv,
where ``fold-batch-norm`` folds it. The last of them (or the conv) takes the BatchToSpaceND's name.

Refused (with the reason): block shapes, paddings or crops that are not constants (TF computes
them at run time when the input's spatial size is unknown), blocks that differ between the two ops
or that touch the batch/channel axis, crops larger than the paddings (that would cut into the
input — not a padding), a conv that is not VALID, stride 1 and undilated, a step between conv and
BatchToSpaceND that is not per-pixel or is read elsewhere. A DepthwiseConv2dNative stays unless
``flatten-atrous-conv.depthwise=true``: TensorFlow's default CPU kernel rejects a dilated depthwise
conv ("does not support dilations") without oneDNN (``TF_ENABLE_ONEDNN_OPTS=0``, non-x86 CPUs); and
even then never with EXPLICIT padding (Grappler's remapper aborts on it, see fold-pad-into-conv).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Union

import numpy as np

from tfsurgery.graph import Graph, Ref
from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.transforms.fold_batch_norm import affine_step, linear_op

CONVS = ("Conv2D", "DepthwiseConv2dNative")
# Ops applied to each value alone: they commute with moving whole pixels between batch and space.
ELEMENTWISE = ("Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Identity")


@dataclasses.dataclass
class FlattenAtrousParams:
    depthwise: bool = False      # a dilated depthwise conv runs only on oneDNN CPUs, GPUs, TFLite


@dataclasses.dataclass
class Atrous:
    """What the pattern says once checked: the conv's new dilations and padding per axis."""
    dilations: List[int]
    padding: str
    explicit: List[int]          # [rank*2] zeros per axis, in data_format order (EXPLICIT only)


@transform("flatten-atrous-conv", params=FlattenAtrousParams)
def flatten_atrous_conv(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("flatten-atrous-conv")
    params = options.params_for(flatten_atrous_conv)
    for s2b in graph.names_with_ops(("SpaceToBatchND",)):
        if s2b not in graph:
            continue
        for reader in sorted(graph.consumer_nodes(s2b)):
            conv, expand = _conv_reading(graph, reader, s2b)
            if conv is None:
                continue
            report.matched += 1
            found = _pattern(graph, s2b, conv, expand, options, params)
            if isinstance(found, str):
                report.skip(conv, found)
                continue
            steps, b2s, atrous = found
            _flatten(graph, s2b, expand or conv, conv, steps, b2s, atrous, options)
            report.rewritten.append(f"{conv}: {s2b} and {b2s} became dilations "
                                    f"{atrous.dilations} ({atrous.padding} padding); "
                                    f"{steps[-1] if steps else conv} is now called {b2s}")
    return report


# ---------------------------------------------------------------- the checks
def _conv_reading(graph: Graph, reader: str, s2b: str) -> tuple:
    """(conv, None) for a conv reading the SpaceToBatchND; (conv, ExpandDims) for a 1-D conv —
    ``ExpandDims(axis 1)`` → Conv2D → ``Squeeze(1)``, as TF writes ``conv1d``; else (None, None)."""
    if graph.inputs(reader)[:1] != [Ref(s2b)]:
        return None, None
    if graph.op(reader) in CONVS:
        return reader, None
    readers = graph.consumer_nodes(reader)
    if graph.op(reader) != "ExpandDims" or len(readers) != 1 or \
            _const_list(graph, graph.inputs(reader)[1]) not in ([1], [-3]):
        return None, None
    (conv,) = readers
    if graph.op(conv) != "Conv2D" or graph.inputs(conv)[0] != Ref(reader) or \
            graph.attr(conv, "data_format", "NHWC") != "NHWC":
        return None, None
    return conv, reader


def _const_list(graph: Graph, ref: Ref):
    value = graph.const_value(ref)
    return None if value is None else [int(v) for v in np.ravel(value)]


def _pattern(graph: Graph, s2b: str, conv: str, expand: Optional[str], options: Options,
             params: FlattenAtrousParams) -> Union[str, tuple]:
    """(per-pixel steps, the BatchToSpaceND, the dilated form) — or why not."""
    problem = _conv_problem(graph, conv)
    if problem:
        return problem
    if expand and (graph.control_inputs(expand) or graph.has_control_consumers(expand)
                   or expand in options.protected):
        return "the ExpandDims before the 1-D conv has control edges or is a graph output"
    steps = _steps_to_batch_to_space(graph, conv, bool(expand), options)
    if isinstance(steps, str):
        return steps
    b2s = steps.pop()
    if graph.control_inputs(s2b) or graph.control_inputs(b2s):
        return "the SpaceToBatchND or BatchToSpaceND has control inputs"
    atrous = _dilated_form(graph, s2b, conv, b2s, bool(expand))
    if isinstance(atrous, str):
        return atrous
    if graph.op(conv) == "DepthwiseConv2dNative":
        if not params.depthwise:
            return ("a dilated DepthwiseConv2dNative runs only with TensorFlow's oneDNN kernels "
                    "(the default CPU kernel rejects dilations): set "
                    "flatten-atrous-conv.depthwise=true where the graph runs on those")
        if atrous.padding == "EXPLICIT":
            return ("the dilated depthwise conv would need EXPLICIT padding, which aborts "
                    "TensorFlow once Grappler's remapper fuses it (TF 2.21)")
    return steps, b2s, atrous


def _conv_problem(graph: Graph, conv: str) -> Optional[str]:
    if graph.attr(conv, "padding") != "VALID":
        return f"the conv between the pair has {graph.attr(conv, 'padding')} padding, not VALID"
    if any(s != 1 for s in graph.attr(conv, "strides")) or \
            any(d != 1 for d in graph.attr(conv, "dilations") or [1]):
        return "the conv between the pair is strided or dilated itself"
    if graph.const_value(graph.inputs(conv)[1]) is None:
        return "the conv's filter is not a constant (its size is needed)"
    return None


def _steps_to_batch_to_space(graph: Graph, conv: str, one_d: bool,
                             options: Options) -> Union[str, List[str]]:
    """The per-pixel ops from the conv to the BatchToSpaceND, that op last (or why not); a 1-D
    conv's Squeeze first."""
    lin = linear_op(graph, conv)
    steps, current = [], conv
    if one_d:
        readers = graph.consumers(conv, control=True)
        squeeze = readers[0].node if len(readers) == 1 else None
        if squeeze is None or graph.op(squeeze) != "Squeeze" or conv in options.protected or \
                graph.attr(squeeze, "squeeze_dims") not in ([1], [-3]):
            return "the 1-D conv's output is not squeezed back on axis 1 alone"
        steps, current = [squeeze], squeeze
    for _ in range(8):
        readers = graph.consumers(current, control=True)
        if len(readers) != 1 or current in options.protected or \
                graph.has_control_consumers(current):
            return f"the output of {current} is read elsewhere too (or is a graph output)"
        reader = readers[0].node
        if graph.op(reader) == "BatchToSpaceND" and readers[0].index == 0:
            return steps + [reader]
        if not _per_pixel(graph, reader, Ref(current), lin):
            return (f"{reader} ({graph.op(reader)}) between the conv and BatchToSpaceND is not a "
                    "per-pixel op with per-channel constants")
        steps.append(reader)
        current = reader
    return "no BatchToSpaceND within 8 per-pixel ops after the conv"


def _per_pixel(graph: Graph, name: str, incoming: Ref, lin) -> bool:
    if graph.op(name) in ELEMENTWISE:
        return graph.inputs(name)[:1] == [incoming]
    return isinstance(affine_step(graph, name, incoming, lin), tuple)


def _dilated_form(graph: Graph, s2b: str, conv: str, b2s: str,
                  one_d: bool) -> Union[str, Atrous]:
    block = graph.const_value(graph.inputs(s2b)[1])
    paddings = graph.const_value(graph.inputs(s2b)[2])
    crops = graph.const_value(graph.inputs(b2s)[2])
    if block is None or paddings is None or crops is None or \
            graph.const_value(graph.inputs(b2s)[1]) is None:
        return ("block shape, paddings or crops are not constants (TensorFlow computes them at "
                "run time when the input's spatial size is unknown)")
    if not np.array_equal(block, graph.const_value(graph.inputs(b2s)[1])):
        return "SpaceToBatchND and BatchToSpaceND blocks differ"
    m = block.size
    if block.ndim != 1 or paddings.shape != (m, 2) or crops.shape != (m, 2):
        return "block, paddings and crops do not have matching shapes"
    fmt = graph.attr(conv, "data_format", "NHWC")
    spatial = (2, 3) if fmt == "NCHW" else (1, 2)
    dilations, explicit = [1, 1, 1, 1], np.zeros((4, 2), np.int64)
    for axis in range(1, 4):       # the conv's axis; S2B's block index (1-D: the rows are new)
        i = axis - 1 - one_d
        r, (p0, p1), (c0, c1) = (1, (0, 0), (0, 0)) if not 0 <= i < m else \
            (int(block[i]), paddings[i], crops[i])
        if axis not in spatial:
            if (r, p0, p1, c0, c1) != (1, 0, 0, 0, 0):
                return "the block pads or splits the channel axis"
            continue
        if r < 1 or c0 > p0 or c1 > p1:
            return (f"crops {[int(c0), int(c1)]} exceed paddings {[int(p0), int(p1)]} on axis "
                    f"{axis}: that cuts into the input, no padding does")
        dilations[axis], explicit[axis] = r, (p0 - c0, p1 - c1)
    kernel = graph.const_value(graph.inputs(conv)[1]).shape[:2]
    same = np.zeros((4, 2), np.int64)
    for axis, k in zip(spatial, kernel):
        total = (k - 1) * dilations[axis]
        same[axis] = total // 2, total - total // 2
    padding = "VALID" if not explicit.any() else \
        "SAME" if np.array_equal(explicit, same) else "EXPLICIT"
    return Atrous(dilations, padding, [int(v) for v in explicit.reshape(-1)])


# ---------------------------------------------------------------- the rewrite
def _flatten(graph: Graph, s2b: str, reader: str, conv: str, steps: List[str], b2s: str,
             atrous: Atrous, options: Options) -> None:
    """``reader`` (the conv, or a 1-D conv's ExpandDims) reads the SpaceToBatchND's input."""
    graph.set_input(reader, 0, graph.inputs(s2b)[0])
    node = graph.edit_node(conv)
    node.attr["padding"].s = atrous.padding.encode()
    node.attr["dilations"].list.i[:] = atrous.dilations
    if "explicit_paddings" in node.attr or atrous.padding == "EXPLICIT":
        node.attr["explicit_paddings"].list.i[:] = \
            atrous.explicit if atrous.padding == "EXPLICIT" else []
    for name in {reader, conv, *steps}:      # their spatial (and batch) sizes change
        if "_output_shapes" in graph.node(name).attr:
            del graph.edit_node(name).attr["_output_shapes"]
    # the last node takes the BatchToSpaceND's name (graph_transforms does the same): its
    # readers, control edges and a graph output of that name read the same values
    last = graph.node(steps[-1] if steps else conv)
    inputs, attrs, device = list(last.input), dict(last.attr), last.device
    graph.remove([b2s, last.name])
    graph.new_node(last.op, b2s, inputs, attrs, device=device)
    if not graph.consumers(s2b, control=True) and s2b not in options.protected:
        graph.remove([s2b])
