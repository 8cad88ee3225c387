"""equalize-cross-layer: balance the per-channel weight ranges of two consecutive linear layers
(Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias Correction", 2019).

For ``conv1 → [BiasAdd] → [Relu | LeakyRelu | Identity | nothing] → conv2`` with constant
weights, channel ``i`` of conv1's output (= conv2's input channel ``i``) may be scaled by any
``s_i > 0`` without changing conv2's output:

    conv2(act(conv1(x; W1) + b1); W2) = conv2(act(conv1(x; W1 / s) + b1 / s); W2 · s)

because conv1 and its bias are linear in the output channel, conv2 is linear in the input channel,
and act(y / s) = act(y) / s for a positive s (ReLU and LeakyReLU are positively homogeneous; the
identity trivially). Zero padding stays zero. With ``r1_i`` the range (max |w|) of conv1's output
channel ``i`` and ``r2_i`` that of conv2's input channel ``i``,

    s_i = sqrt(r1_i · r2_i) / r2_i      makes both ranges sqrt(r1_i · r2_i)

so one int8 grid fits both layers' channels. A conv is often conv2 of one pair and conv1 of the
next (MobileNet's depthwise → pointwise → depthwise …): the pairs are swept until the scales settle.

Layers: Conv2D (HWIO, output channel axis 3, input axis 2), DepthwiseConv2dNative (H W C M:
output channel c·M + m, input channel c) and MatMul (in × out, or out × in with transpose_b),
NHWC or NCHW alike (weights do not depend on the data format; a bias Add must broadcast along
the activation's channel axis).

ReLU6 clips at 6: scaling channel i by 1/s moves the clip to 6/s in the original's units, which
changes values unless the clip is never reached. A channel is scaled only where that is proven:
when conv1 reads a ReLU6 output (every input value in [0, 6]), channel i's pre-activation is at
most ``u_i = b_i + 6 · Σ max(w, 0)`` over its kernel — if u_i < 6 it never clips, for any input,
and stays below the clip after scaling when s_i ≥ u_i / 6. Other channels keep s = 1. A caller
may also give ``activation_max`` (per channel, the largest value entering that ReLU6 on its own
rows): then an unproven channel whose max × (1 + margin) stays below 6 may scale too (s_i ≥ that
/ 6) — evidence, not proof, which verification on other rows must back. A ReLU6 pair where no
channel may move is refused. The result is verified in float against the original like every
transform.

Refused (graph untouched, with why): weights or bias that are not constants; a conv1, bias or
activation read by anything else or that is a graph output (scaling would change what the other
reader sees); a MatMul with transpose_a; a dtype other than float32/float64; ReLU6 as above.
Not in the default pipeline: the int8 path runs it (``--int8-equalize``).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np

from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.graph import Graph

LINEAR = ("Conv2D", "DepthwiseConv2dNative", "MatMul")
HOMOGENEOUS = ("Relu", "LeakyRelu", "Identity")       # act(y / s) = act(y) / s for s > 0
CLIP = "Relu6"
BIASES = ("BiasAdd", "Add", "AddV2")
FLOATS = ("float32", "float64")


@dataclasses.dataclass
class EqualizeParams:
    sweeps: int = 20                        # passes over all pairs (stops when scales settle)
    # ReLU6 node → per-channel max of its input on a caller's rows: evidence for channels no
    # bound proves below the clip (None: only proven channels scale)
    activation_max: Optional[Dict[str, Tuple[float, ...]]] = None
    margin: float = 0.25                    # a channel's max × (1 + margin) must stay below 6


@dataclasses.dataclass
class Pair:
    conv1: str
    bias: Optional[str]
    act: Optional[str]
    conv2: str
    scale: Optional[np.ndarray] = None      # cumulative s per channel
    bound: Optional[np.ndarray] = None      # ReLU6 pairs: proven max of each pre-activation


@transform("equalize-cross-layer", default=False, params=EqualizeParams)
def equalize_cross_layer(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("equalize-cross-layer")
    params = options.params_for(equalize_cross_layer)
    pairs = []
    for conv2 in graph.names_with_ops(LINEAR):
        found = _pair_ending_at(graph, conv2, options, params, report)
        if found is not None:
            pairs.append(found)
    if not pairs:
        return report
    weights = {name: _float(graph.const_value(graph.inputs(name)[1]))
               for pair in pairs for name in (pair.conv1, pair.conv2)}
    biases = {pair.bias: _float(graph.const_value(graph.inputs(pair.bias)[1]))
              for pair in pairs if pair.bias}
    for pair in pairs:
        pair.scale = np.ones(_out_channels(graph, pair.conv1, weights[pair.conv1]))
    for _ in range(params.sweeps):
        moved = 0.0
        for pair in pairs:
            s = _balancing_scale(graph, pair, weights) * pair.scale
            s = _allowed(graph, pair, s, params) / pair.scale        # this sweep's step
            weights[pair.conv1] = _scale_out(graph, pair.conv1, weights[pair.conv1], 1 / s)
            weights[pair.conv2] = _scale_in(graph, pair.conv2, weights[pair.conv2], s)
            if pair.bias:
                biases[pair.bias] = _scale_bias(graph, pair, biases[pair.bias], 1 / s)
            pair.scale = pair.scale * s
            moved = max(moved, float(np.max(np.abs(np.log(s)))))
        if moved < 1e-4:
            break
    for name, value in weights.items():
        _set_weight(graph, name, 1, value, options.protected)
    for name, value in biases.items():
        _set_weight(graph, name, 1, value, options.protected)
    for pair in pairs:
        report.matched += 1
        for rescaled in (pair.conv1, pair.bias, pair.act):   # each channel now ×1/s: the same
            if rescaled:                                      # names, other values
                report.changed(rescaled)
        r1 = _out_ranges(graph, pair.conv1, weights[pair.conv1])
        r2 = _in_ranges(graph, pair.conv2, weights[pair.conv2])
        held = int(np.sum(pair.scale == 1.0))
        note = f"; {held} channel(s) held at s=1 (the ReLU6 clip)" if pair.act and \
            graph.op(pair.act) == CLIP and held else ""
        report.rewritten.append(
            f"{pair.conv1} → {pair.conv2}: {len(pair.scale)} channels, s in "
            f"[{pair.scale.min():.3g}, {pair.scale.max():.3g}], range ratio r1/r2 now in "
            f"[{np.min(_ratio(r1, r2)):.3g}, {np.max(_ratio(r1, r2)):.3g}]{note}")
    return report


def _pair_ending_at(graph: Graph, conv2: str, options: Options, params: EqualizeParams,
                    report: TransformReport) -> Optional[Pair]:
    """The pair whose conv2 is ``conv2`` (None when there is none, or it is refused)."""
    chain: List[str] = []
    ref = graph.inputs(conv2)[0]
    act = bias = None
    if graph.op(ref) in HOMOGENEOUS + (CLIP,) and not ref.port:
        act = ref.node
        chain.append(act)
        ref = graph.inputs(act)[0]
    if graph.op(ref) in BIASES and not ref.port:
        bias = ref.node
        chain.append(bias)
        ref = graph.inputs(bias)[0]
    if graph.op(ref) not in LINEAR or ref.port:
        return None
    conv1 = ref.node
    chain.append(conv1)
    report_name = f"{conv1} → {conv2}"
    problem = _why_not(graph, conv1, bias, act, conv2, chain, options, params)
    if problem:
        report.matched += 1
        report.skip(report_name, problem)
        return None
    pair = Pair(conv1, bias, act, conv2)
    if act is not None and graph.op(act) == CLIP:
        pair.bound = upper_bound(graph, conv1, bias)
    return pair


def _why_not(graph: Graph, conv1, bias, act, conv2, chain, options, params) -> Optional[str]:
    for name in (conv1, conv2):
        if graph.const_value(graph.inputs(name)[1]) is None:
            return f"the weights of {name} are not a constant"
        if graph.op(name) == "MatMul" and graph.attr(name, "transpose_a"):
            return f"{name} is a MatMul with transpose_a (its channels are not the last axis)"
    for name in chain + [conv2]:
        dtype = graph.attr(name, "T")
        if dtype is not None and dtype.name not in FLOATS:
            return f"{name} computes in {dtype.name}, not float32/float64"
    for name in chain:
        readers = graph.reader_count(name)
        if readers != 1 or name in options.protected:
            return (f"{name} is read by {readers} inputs or is a graph output: scaling its "
                    "channels would change what the others see")
    if bias is not None:
        value = graph.const_value(graph.inputs(bias)[1])
        if value is None:
            return f"the bias of {bias} is not a constant"
        if graph.inputs(bias)[0].node != conv1:
            return f"{bias} adds {conv1} as its second operand"
        channels = _out_channels(graph, conv1, graph.const_value(graph.inputs(conv1)[1]))
        if (value.shape != (channels,)) if graph.op(bias) == "BiasAdd" else \
                _bias_view(graph, conv1, value, channels) is None:
            return f"the bias of {bias} (shape {list(value.shape)}) is not one per channel"
    if _out_channels(graph, conv1, graph.const_value(graph.inputs(conv1)[1])) != \
            _in_channels(graph, conv2, graph.const_value(graph.inputs(conv2)[1])):
        return f"{conv1}'s output channels are not {conv2}'s input channels"
    if act is not None and graph.op(act) == CLIP:
        bound = upper_bound(graph, conv1, bias)
        maxima = (params.activation_max or {}).get(act)
        proven = bound is not None and np.any(bound < 6)
        if not proven and maxima is None:
            why = ("its input is not a ReLU6 output, so no bound is known" if bound is None
                   else f"every channel's bound b + 6·Σw⁺ is ≥ 6 (least {bound.min():.3g})")
            return (f"{act} is a ReLU6: scaling a channel by 1/s moves its clip from 6 to 6/s, "
                    f"and no channel is proven never to reach it ({conv1}: {why})")
        limit = 6 / (1 + params.margin)
        if not proven and np.all(np.asarray(maxima) >= limit):
            return (f"{act} is a ReLU6 whose every channel reaches the clip on the rows "
                    f"measured (max ≥ {limit:.3g}) and none is proven below it: scaling any "
                    "of them would change values")
    return None


def upper_bound(graph: Graph, conv1: str, bias: Optional[str]) -> Optional[np.ndarray]:
    """The largest value each output channel of conv1 (+ bias) can take when conv1 reads a ReLU6
    output (inputs in [0, 6]; zero padding too): b + 6 · Σ max(w, 0) over the channel's kernel.
    None when conv1's input is not known to be bounded."""
    source = graph.resolve(graph.inputs(conv1)[0])
    if graph.op(source) != CLIP or source.port:
        return None
    w = _float(graph.const_value(graph.inputs(conv1)[1]))
    m = _out_matrix(graph, conv1, w)
    positive = np.clip(m.reshape(-1, m.shape[-1]), 0, None).sum(axis=0)
    b = np.zeros(m.shape[-1])
    if bias is not None:            # one per channel or one for all (checked before)
        b = b + _float(graph.const_value(graph.inputs(bias)[1])).reshape(-1)
    return b + 6 * positive


def _balancing_scale(graph: Graph, pair: Pair, weights) -> np.ndarray:
    """s_i = sqrt(r1_i r2_i) / r2_i = sqrt(r1_i / r2_i); 1 where either range is zero."""
    r1 = _out_ranges(graph, pair.conv1, weights[pair.conv1])
    r2 = _in_ranges(graph, pair.conv2, weights[pair.conv2])
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.sqrt(r1 / r2)
    return np.where((r1 > 0) & (r2 > 0) & np.isfinite(s), s, 1.0)


def _allowed(graph: Graph, pair: Pair, s: np.ndarray, params: EqualizeParams) -> np.ndarray:
    """The cumulative scales ReLU6 allows: a channel proven (or, given ranges, seen) below the
    clip may scale as long as its largest value over s stays below it too; the others keep 1."""
    if pair.act is None or graph.op(pair.act) != CLIP:
        return s
    top = np.full(len(s), np.inf) if pair.bound is None else pair.bound * (1 + 1e-6)
    maxima = (params.activation_max or {}).get(pair.act)
    if maxima is not None:
        seen = np.asarray(maxima, dtype=np.float64) * (1 + params.margin)
        top = np.where(top < 6, top, seen)
    free = top < 6
    return np.where(free, np.maximum(s, np.maximum(top, 0) / 6), 1.0)


# --- each layer's channels ---------------------------------------------------------------------
def _float(value: np.ndarray) -> np.ndarray:
    return np.array(value, dtype=np.float64)


def _out_matrix(graph: Graph, name: str, w: np.ndarray) -> np.ndarray:
    """Weights as [..., output channel]."""
    op = graph.op(name)
    if op == "DepthwiseConv2dNative":
        return w.reshape(w.shape[0], w.shape[1], -1)        # channel c·M + m
    if op == "MatMul" and graph.attr(name, "transpose_b"):
        return w.T
    return w


def _out_channels(graph: Graph, name: str, w: np.ndarray) -> int:
    return _out_matrix(graph, name, np.asarray(w)).shape[-1]


def _out_ranges(graph: Graph, name: str, w: np.ndarray) -> np.ndarray:
    m = _out_matrix(graph, name, w)
    return np.max(np.abs(m.reshape(-1, m.shape[-1])), axis=0)


def _scale_out(graph: Graph, name: str, w: np.ndarray, factor: np.ndarray) -> np.ndarray:
    scaled = _out_matrix(graph, name, w) * factor
    if graph.op(name) == "MatMul" and graph.attr(name, "transpose_b"):
        return scaled.T
    return scaled.reshape(w.shape)


def _in_axis(graph: Graph, name: str) -> int:
    op = graph.op(name)
    if op == "MatMul":
        return 1 if graph.attr(name, "transpose_b") else 0
    return 2                                   # HWIO and H W C M alike


def _in_channels(graph: Graph, name: str, w: np.ndarray) -> int:
    return np.asarray(w).shape[_in_axis(graph, name)]


def _in_ranges(graph: Graph, name: str, w: np.ndarray) -> np.ndarray:
    moved = np.moveaxis(w, _in_axis(graph, name), -1)
    return np.max(np.abs(moved.reshape(-1, moved.shape[-1])), axis=0)


def _scale_in(graph: Graph, name: str, w: np.ndarray, factor: np.ndarray) -> np.ndarray:
    shape = [1] * w.ndim
    shape[_in_axis(graph, name)] = -1
    return w * factor.reshape(shape)


def _channel_last(graph: Graph, conv1: str) -> bool:
    return graph.op(conv1) == "MatMul" or \
        graph.attr(conv1, "data_format", "NHWC") in ("NHWC", "NDHWC")


def _bias_view(graph: Graph, conv1: str, bias: np.ndarray, channels: int):
    """The shape a per-channel vector takes to scale ``bias`` (None: not one per channel)."""
    channel_last = _channel_last(graph, conv1)
    if bias.ndim == 0 or bias.size == 1:
        return (channels,) if channel_last else (channels, 1, 1)
    if channel_last:
        return bias.shape if bias.shape[-1] == channels and bias.size == channels else None
    return bias.shape if bias.ndim >= 3 and bias.shape[-3] == channels and \
        bias.size == channels else None


def _scale_bias(graph: Graph, pair: Pair, bias: np.ndarray, factor: np.ndarray) -> np.ndarray:
    if graph.op(pair.bias) == "BiasAdd":
        return bias * factor                   # one per channel, whatever the data format
    view = _bias_view(graph, pair.conv1, bias, len(factor))
    return np.broadcast_to(bias, view) * factor.reshape(view)


def _ratio(r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = r1 / r2
    return ratio[np.isfinite(ratio)] if np.any(np.isfinite(ratio)) else np.ones(1)


def _set_weight(graph: Graph, node: str, index: int, value: np.ndarray, protected) -> None:
    """Input ``index`` of ``node`` becomes ``value`` (its own dtype): the Const is rewritten in
    place when ``node`` is its only reader, else a new Const takes its place for ``node``."""
    ref = graph.inputs(node)[index]
    dtype = graph.const_value(ref).dtype
    const = graph.resolve(ref)
    if ref.node == const.node and graph.op(const) == "Const" and \
            graph.reader_count(const.node) == 1:
        graph.set_const_value(const.node, value.astype(dtype))
    else:
        new = graph.add_const(f"{node}/equalized", value.astype(dtype),
                              device=graph.node(node).device)
        graph.set_input(node, index, new)
        old = ref.node
        while old in graph and old not in protected and not graph.reader_count(old) and \
                graph.op(old) in ("Identity", "Const"):
            inputs = graph.inputs(old)
            graph.remove([old])           # the old weights (through their Identity) are dead
            old = inputs[0].node if inputs else None
