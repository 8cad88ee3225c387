"""fold-affine-into-linear: a per-channel affine map right BEFORE a linear op folds into its weights.

For a linear op y = sum_c W[.., c, ..] * x[c] over input channels c:
    W ⊛ (x * s)        = (W * s) ⊛ x            (s scales W along its INPUT-channel axis; exact)
    W ⊛ (x / s)        = (W / s) ⊛ x
    W ⊛ reverse_c(x)   = reverse_c(W) ⊛ x       (the input channels of W permuted)
    W ⊛ (x + a)        = W ⊛ x + (W ⊛ a)        (only when no zero padding touches x: a MatMul,
                                                  or a VALID conv read directly, no Pad between)
The same holds for Conv3D (weights [d, h, w, in, out]) and for the transposed convs
Conv2DBackpropInput / Conv3DBackpropInputV2, whose data is their third input and whose filter
[h, w, (d,) out, in] runs over the data's channels along its LAST axis. A shift before a transposed
conv never folds (a constant input gives a border-dependent output: fewer taps reach the edges),
nor before a Conv3D that pads.
A zero border in the model's space is not a zero border in the raw space, so an additive constant
before a padded conv stays; a scale before it moves after it so that the scale still folds:
    (x * s) + a        = (x + a / s) * s        (s nonzero; Keras Rescaling then Normalization)
A scalar scale before a Transpose (an NHWC input turned NCHW for an NCHW conv) moves after it,
    Transpose(x * s)   = Transpose(x) * s       (exact: the same products, moved)
so that it folds too. Multiplicative maps and channel reversal pass a constant zero Pad (0 * s = 0; the channel axis
itself unpadded). Keras Rescaling/Normalization at the input, the
preprocessing ``add-preprocessing`` emits, and a batch norm after a ReLU before a Dense layer
(the Mul + Add that fold-batch-norm leaves) are the common cases.

Safety: each affine op must have one reader (the linear op, or the Pad before it); weights and
constants must be Const; a shared weight constant is copied; ``transpose_a`` MatMuls are left.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from tfsurgery.graph import Graph, Ref
from tfsurgery.contract import Options, TransformReport, transform

LINEAR_OPS = ("Conv2D", "DepthwiseConv2dNative", "MatMul", "Conv3D", "Conv2DBackpropInput",
              "Conv3DBackpropInputV2")
TRANSPOSED = ("Conv2DBackpropInput", "Conv3DBackpropInputV2")   # inputs: sizes, filter, data
SCALE_OPS = ("Mul", "RealDiv")
SHIFT_OPS = ("Add", "AddV2", "Sub", "BiasAdd")
MAX_STEPS = 16


@transform("fold-affine-into-linear", repeat=True, constants_by_value=True)
def fold_affine_into_linear(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("fold-affine-into-linear")
    for node in graph.nodes_with_ops(LINEAR_OPS):
        if node.name in graph:
            for _ in range(MAX_STEPS):
                if not _fold_one(graph, node.name, options, report):
                    break
    report.skipped = list(dict.fromkeys(report.skipped))    # a shift retried after a scale moved
    return report


# ---------------------------------------------------------------- the linear op's view
def _rank(graph: Graph, lin: str) -> int:
    op = graph.op(lin)
    return 2 if op == "MatMul" else 5 if op.startswith("Conv3D") else 4


def _data_index(graph: Graph, lin: str) -> int:
    return 2 if graph.op(lin) in TRANSPOSED else 0


def _input_axis(graph: Graph, lin: str, rank: int) -> Optional[int]:
    """Channel axis of the linear op's data input (None for a transpose_a MatMul)."""
    if graph.op(lin) == "MatMul":
        return None if graph.attr(lin, "transpose_a", False) else 1
    return 1 if graph.attr(lin, "data_format", "NHWC").startswith("NC") else rank - 1


def _weight_in_axis(graph: Graph, lin: str) -> int:
    """Axis of the weights over input channels: HWIO/[h,w,in,mult] → 2; DHWIO → 3; a transposed
    conv's [h,w,(d,)out,in] → the last; MatMul → 0 (or 1)."""
    op = graph.op(lin)
    if op == "MatMul":
        return 1 if graph.attr(lin, "transpose_b", False) else 0
    if op in TRANSPOSED:
        return _rank(graph, lin) - 1
    return _rank(graph, lin) - 2


def _channel_vector(value: np.ndarray, rank: int, axis: int, channels: int) -> Optional[np.ndarray]:
    """A constant that broadcasts along the channel axis only, as a length-C vector (or None)."""
    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1) if value.size > 1 else value.reshape(()),
                           (channels,)).astype(np.float64)


def _affine_operand(graph: Graph, name: str):
    """(data input, constant value) of a binary op with one constant operand (data first)."""
    a, b = graph.inputs(name)[:2]
    if graph.op(name) in ("Sub", "RealDiv", "BiasAdd"):
        return (a, graph.const_value(b)) if graph.is_const(b) and not graph.is_const(a) else None
    if graph.is_const(b) and not graph.is_const(a):
        return a, graph.const_value(b)
    if graph.is_const(a) and not graph.is_const(b):
        return b, graph.const_value(a)
    return None


def _has_constant_operand(graph: Graph, name: str) -> bool:
    if graph.op(name) in ("ReverseV2", "GatherV2"):
        return all(graph.is_const(ref) for ref in graph.inputs(name)[1:])
    return _affine_operand(graph, name) is not None


def _sole_reader(graph: Graph, name: str, reader: str) -> bool:
    return ([c.node for c in graph.consumers(name, control=True)] == [reader]
            and not graph.has_control_consumers(name))


# ---------------------------------------------------------------- one step
def _fold_one(graph: Graph, lin: str, options: Options, report: TransformReport) -> bool:
    """Fold the op feeding ``lin`` (through a zero Pad for scales/reversals). True if it did."""
    data = graph.inputs(lin)[_data_index(graph, lin)]
    pad = data.node if graph.op(data) == "Pad" and data.port == 0 else None
    producer = graph.inputs(pad)[0] if pad else data
    op = graph.op(producer)
    if op == "Transpose" and producer.port == 0:
        return _scale_after_transpose(graph, producer.node, pad or lin, options, report)
    if op not in SCALE_OPS + SHIFT_OPS + ("ReverseV2", "GatherV2") or producer.port != 0:
        return False
    if pad and not _zero_pad(graph, pad, lin):
        return False
    if not _has_constant_operand(graph, producer.node):
        return False                    # x * y, a residual x + y: not an affine map
    weight = graph.const_value(graph.inputs(lin)[1])
    if weight is None:
        report.skip(producer.node, f"{lin}: weights are not a constant")
        return False
    rank = _rank(graph, lin)
    axis = _input_axis(graph, lin, rank)
    if axis is None:
        report.skip(producer.node, f"{lin}: MatMul with transpose_a")
        return False
    if not _sole_reader(graph, producer.node, pad or lin) or producer.node in options.protected:
        report.skip(producer.node, f"other nodes read its output besides {pad or lin}")
        return False
    channels = weight.shape[_weight_in_axis(graph, lin)]
    if op == "GatherV2":
        return _fold_gather(graph, lin, producer.node, weight, rank, axis, report)
    if op == "ReverseV2":
        return _fold_reverse(graph, lin, producer.node, weight, rank, axis, report)
    folded = _fold_affine(graph, lin, producer.node, weight, rank, axis, channels, report,
                          options.protected, pad)
    if not folded and op in SHIFT_OPS:
        return _scale_after_shift(graph, producer.node, rank, axis, channels, options, report)
    return folded


def _scale_after_shift(graph, shift, rank, axis, channels, options, report) -> bool:
    """(x * s) + a → (x + a / s) * s for the shift that cannot fold: the scale now reads the
    shift and feeds the linear op, where the next step folds it. True if it moved."""
    data, a = _affine_operand(graph, shift)
    scale = data.node
    if graph.op(scale) not in SCALE_OPS or data.port != 0 or scale in options.protected \
            or shift in options.protected or not _sole_reader(graph, scale, shift):
        return False
    found = _affine_operand(graph, scale)
    s = None if found is None else _channel_vector(found[1], rank, axis, channels)
    if s is None or not np.all(s) or _channel_vector(a, rank, axis, channels) is None:
        return False
    factor = 1.0 / s if graph.op(scale) == "RealDiv" else s
    if np.all(factor == factor[0]):
        factor = factor[:1].reshape(())     # a scalar scale keeps a scalar shift scalar
    else:
        factor = _along_channels(factor, a.ndim, rank, axis)
    new_a = graph.add_const(f"{shift}/over_scale", (a.astype(np.float64) / factor).astype(a.dtype))
    shift_inputs, scale_inputs = graph.inputs(shift), graph.inputs(scale)
    graph.rewire(Ref(shift, 0), Ref(scale, 0))
    graph.set_input(shift, 1 - shift_inputs.index(data), new_a)
    graph.set_input(shift, shift_inputs.index(data), found[0])
    graph.set_input(scale, scale_inputs.index(found[0]), Ref(shift, 0))
    report.rewritten.append(f"{scale} ({graph.op(scale)}) moved after {shift}, to fold")
    return True


def _scale_after_transpose(graph, transpose, reader, options, report) -> bool:
    """Transpose(x * s) → Transpose(x) * s for a scalar constant s: the scale then reads the
    Transpose and feeds the linear op (or its Pad), where the next step folds it."""
    data = graph.inputs(transpose)[0]
    scale = data.node
    if graph.op(scale) not in SCALE_OPS or data.port != 0 or scale in options.protected or \
            transpose in options.protected or not _sole_reader(graph, scale, transpose) or \
            not _sole_reader(graph, transpose, reader) or graph.control_inputs(transpose):
        return False
    found = _affine_operand(graph, scale)
    if found is None or found[1].size != 1 or graph.control_inputs(scale):
        return False                    # a per-channel scale would need its axis moved too
    x = found[0]
    data_index = graph.inputs(scale).index(x)
    graph.rewire(Ref(transpose, 0), Ref(scale, 0))
    graph.set_input(transpose, 0, x)
    graph.set_input(scale, data_index, Ref(transpose, 0))
    report.rewritten.append(f"{scale} ({graph.op(scale)}) moved after {transpose}, to fold")
    return True


def _along_channels(vector: np.ndarray, ndim: int, rank: int, axis: int) -> np.ndarray:
    """A length-C ``vector`` shaped to broadcast along the channel axis of a rank-``rank``
    tensor, with at least ``ndim`` dimensions (those of the constant it divides)."""
    shape = [1] * max(ndim, rank - axis)
    shape[-(rank - axis)] = -1
    return vector.reshape(shape)


def _zero_pad(graph: Graph, pad: str, lin: str) -> bool:
    paddings = graph.const_value(graph.inputs(pad)[1])
    rank = _rank(graph, lin)
    axis = _input_axis(graph, lin, rank)
    return (paddings is not None and _sole_reader(graph, pad, lin) and axis is not None
            and paddings.shape == (rank, 2) and not paddings[axis].any())


def _fold_reverse(graph, lin, name, weight, rank, axis, report) -> bool:
    axes = graph.const_value(graph.inputs(name)[1])
    if axes is None or sorted(int(a) % rank for a in np.ravel(axes)) != [axis]:
        report.skip(name, f"{lin}: reverses an axis other than the channel axis only")
        return False
    if graph.op(lin) == "DepthwiseConv2dNative":     # channel c feeds only outputs c*mult+m
        report.skip(name, f"{lin}: a depthwise conv cannot absorb a channel reversal (it "
                          "would permute its output channels too)")
        return False
    _write_weights(graph, lin, np.flip(weight, axis=_weight_in_axis(graph, lin)))
    _bypass(graph, name)
    report.matched += 1
    report.rewritten.append(f"{name} → {lin} (input channels reversed)")
    return True


def _fold_gather(graph, lin, name, weight, rank, axis, report) -> bool:
    """x[..., idx] before the layer: input channel c of the layer reads raw channel idx[c], so
    W'[j] = sum of W[c] over c with idx[c] = j (a permutation just permutes W)."""
    indices = graph.const_value(graph.inputs(name)[1])
    gather_axis = graph.const_value(graph.inputs(name)[2])
    if indices is None or indices.ndim != 1 or gather_axis is None \
            or int(gather_axis) % rank != axis or graph.attr(name, "batch_dims", 0) != 0:
        report.skip(name, f"{lin}: not a constant 1-D gather on the channel axis")
        return False
    if graph.op(lin) == "DepthwiseConv2dNative":
        report.skip(name, f"{lin}: a depthwise conv cannot absorb a channel gather")
        return False
    source = _static_dim(graph, graph.inputs(name)[0], axis)
    if source is None or indices.min() < 0 or indices.max() >= source:
        report.skip(name, f"{lin}: the gathered input's channel count is unknown")
        return False
    w_axis = _weight_in_axis(graph, lin)
    moved = np.moveaxis(weight.astype(np.float64), w_axis, 0)
    folded = np.zeros((source,) + moved.shape[1:])
    np.add.at(folded, indices.astype(np.int64), moved)
    _write_weights(graph, lin, np.moveaxis(folded, 0, w_axis).astype(weight.dtype))
    _bypass(graph, name)
    report.matched += 1
    report.rewritten.append(f"{name} → {lin} (input channels gathered)")
    return True


def _static_dim(graph: Graph, ref: Ref, axis: int):
    """A static dimension of a tensor, from its producer's _output_shapes or a placeholder."""
    node = graph.node(ref.node)
    if "_output_shapes" in node.attr and len(node.attr["_output_shapes"].list.shape) > ref.port:
        dims = node.attr["_output_shapes"].list.shape[ref.port].dim
    elif "shape" in node.attr:
        dims = node.attr["shape"].shape.dim
    else:
        return None
    return dims[axis].size if len(dims) > axis and dims[axis].size > 0 else None


def _fold_affine(graph, lin, name, weight, rank, axis, channels, report, protected,
                 pad=None) -> bool:
    found = _affine_operand(graph, name)
    op = graph.op(name)
    value = None if found is None else _channel_vector(found[1], rank, axis, channels)
    if value is None:
        report.skip(name, f"{lin}: not a per-channel constant {op}")
        return False
    if op in SCALE_OPS:
        if op == "RealDiv" and not np.all(value):
            report.skip(name, "division by zero")
            return False
        scale = 1.0 / value if op == "RealDiv" else value
        _write_weights(graph, lin, _scale_in(graph, lin, weight, scale))
    else:
        shift = -value if op == "Sub" else value
        border = _border(graph, lin, found[0], shift, pad)
        if isinstance(border, str):
            report.skip(name, f"{lin}: {border}")
            return False
        if lin in protected:
            report.skip(name, f"{lin} is a graph output: no bias can follow it")
            return False
        _add_bias(graph, lin, _weight_sum(graph, lin, weight, shift))
        if border is not None:       # zero border of x + a = a border of -a around x, then + a
            _pad_with(graph, lin, name, border, -float(shift[0]), pad)
    graph.rewire(Ref(name, 0), found[0])
    graph.remove([name])
    report.matched += 1
    report.rewritten.append(f"{name} ({op}) → {lin}")
    return True


def _border(graph: Graph, lin: str, data: Ref, shift: np.ndarray, pad: Optional[str]):
    """How zero padding touches the shifted input: None (it does not), the [rank, 2] paddings a
    scalar shift can carry as a PadV2 value, or the reason the shift cannot fold (a str)."""
    padding = None if graph.op(lin) == "MatMul" else graph.attr(lin, "padding")
    if graph.op(lin) in TRANSPOSED:
        return "a shift before a transposed conv reaches the output's border unevenly"
    if pad is None and padding in (None, "VALID"):
        return None
    if _rank(graph, lin) == 5:
        return f"{padding} padding or a Pad before a Conv3D: the zero border is not zero " \
               "before the shift"
    if pad is None and padding != "SAME":
        return f"{padding} padding: the zero border is not zero before the shift"
    if not np.all(shift == shift[0]):
        return ("a per-channel shift before zero padding (the zero border is not zero before "
                "the shift; a PadV2 value is one scalar)")
    if pad is not None:
        return graph.const_value(graph.inputs(pad)[1])
    paddings = _same_paddings(graph, lin, data)
    return "SAME padding with an unknown spatial size" if paddings is None else paddings


def _same_paddings(graph: Graph, lin: str, data: Ref) -> Optional[np.ndarray]:
    """TensorFlow's SAME padding as explicit [4, 2] paddings, from the static input size."""
    nchw = graph.attr(lin, "data_format", "NHWC").startswith("NC")
    spatial = (2, 3) if nchw else (1, 2)
    kernel = graph.const_value(graph.inputs(lin)[1]).shape[:2]
    strides, dilations = graph.attr(lin, "strides"), graph.attr(lin, "dilations") or [1] * 4
    paddings = np.zeros((4, 2), np.int32)
    for k, axis in zip(kernel, spatial):
        size = _static_dim(graph, _shape_source(graph, data), axis)
        if size is None:
            return None
        out = -(-size // strides[axis])
        total = max((out - 1) * strides[axis] + (k - 1) * dilations[axis] + 1 - size, 0)
        paddings[axis] = total // 2, total - total // 2
    return paddings


def _shape_source(graph: Graph, ref: Ref) -> Ref:
    """Back through shape-preserving elementwise ops to a tensor with a known static shape."""
    while graph.op(ref) in ("Cast", "Sub", "Add", "AddV2", "Mul", "RealDiv", "ReverseV2",
                            "Identity") and "_output_shapes" not in graph.node(ref.node).attr:
        data = [r for r in graph.inputs(ref.node)[:1] if not graph.is_const(r)]
        if not data:
            break
        ref = data[0]
    return ref


def _pad_with(graph: Graph, lin: str, name: str, paddings: np.ndarray, value: float,
              pad: Optional[str]) -> None:
    """``lin`` reads PadV2(shifted input, paddings, value) (replacing ``pad``), VALID."""
    dtype = graph.node(lin).attr["T"]
    source = graph.inputs(pad)[0] if pad else Ref(name, 0)
    pads = graph.add_const(f"{lin}/shift_paddings", np.asarray(paddings, np.int32))
    border = graph.add_const(f"{lin}/shift_border", np.asarray(value, dtype_numpy(dtype)))
    padv2 = graph.new_node("PadV2", f"{pad or lin}/shift_pad", [source, pads, border],
                           {"T": dtype, "Tpaddings": _int32()}, device=graph.node(lin).device)
    graph.set_input(lin, _data_index(graph, lin), Ref(padv2.name, 0))
    if pad:
        graph.remove([pad])
    else:
        graph.edit_node(lin).attr["padding"].s = b"VALID"


def _int32():
    import tensorflow as tf
    return tf.int32


def _bypass(graph: Graph, name: str) -> None:
    """Readers of ``name`` read its data input instead; ``name`` goes."""
    graph.rewire(Ref(name, 0), graph.inputs(name)[0])
    graph.remove([name])


# ---------------------------------------------------------------- the math on weights
def _scale_in(graph, lin, weight, scale):
    axis = _weight_in_axis(graph, lin)
    shape = [1] * weight.ndim
    shape[axis] = -1
    return (weight.astype(np.float64) * scale.reshape(shape)).astype(weight.dtype)


def _weight_sum(graph, lin, weight, shift) -> np.ndarray:
    """W ⊛ shift for a constant input: one value per output channel."""
    w = weight.astype(np.float64)
    op = graph.op(lin)
    if op == "MatMul":
        return (w @ shift) if graph.attr(lin, "transpose_b", False) else shift @ w
    if op == "Conv2D":
        return np.einsum("hwio,i->o", w, shift)
    if op == "Conv3D":
        return np.einsum("dhwio,i->o", w, shift)
    return np.einsum("hwim,i->im", w, shift).reshape(-1)      # depthwise: channel = in*mult+m


def _write_weights(graph: Graph, lin: str, weights: np.ndarray) -> None:
    """In place if the constant is this op's alone, else as a copy."""
    ref = graph.resolve(graph.inputs(lin)[1])
    if graph.op(ref) == "Const" and _sole_reader(graph, ref.node, lin) \
            and graph.inputs(lin)[1] == ref:
        graph.set_const_value(ref.node, weights)
    else:
        copy = graph.add_const(f"{lin}/folded_weights", weights, device=graph.node(lin).device)
        graph.set_input(lin, 1, copy)


def _add_bias(graph: Graph, lin: str, delta: np.ndarray) -> None:
    """Add ``delta`` to the bias after ``lin``: its own BiasAdd constant, or a new BiasAdd."""
    readers = graph.consumers(lin, control=True)
    if len(readers) == 1 and graph.op(readers[0].node) in ("BiasAdd",) \
            and readers[0].index == 0 and _sole_reader_bias(graph, readers[0].node):
        bias_ref = graph.inputs(readers[0].node)[1]
        bias = graph.const_value(bias_ref)
        new = (bias.astype(np.float64) + delta).astype(bias.dtype)
        copy = graph.add_const(f"{readers[0].node}/folded_bias", new)
        graph.set_input(readers[0].node, 1, copy)
        return
    dtype = graph.node(lin).attr["T"]
    const = graph.add_const(f"{lin}/folded_bias", delta.astype(dtype_numpy(dtype)))
    attrs = {"T": dtype}
    if graph.op(lin) != "MatMul":      # BiasAdd names 5-D layouts by their 4-D names
        attrs["data_format"] = "NCHW" if graph.attr(lin, "data_format", "NHWC").startswith(
            "NC") else "NHWC"
    raw = graph.new_node("BiasAdd", f"{lin}/folded_shift", [lin, const], attrs,
                         device=graph.node(lin).device)
    graph.rewire(Ref(lin, 0), Ref(raw.name, 0), keep={raw.name})


def _sole_reader_bias(graph: Graph, bias_add: str) -> bool:
    """The BiasAdd after the linear op adds a constant (so the shift joins that constant)."""
    return graph.is_const(graph.inputs(bias_add)[1])


def dtype_numpy(attr) -> type:
    import tensorflow as tf
    return tf.dtypes.as_dtype(attr.type).as_numpy_dtype

