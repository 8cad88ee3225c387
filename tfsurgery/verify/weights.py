"""The weights verification probes (``sensitivity``): every float constant of more than one
value, named by the op that uses it — a conv/matmul/einsum kernel (through a Cast to
float16/bfloat16, Conv1D's ExpandDims, a reshape), an embedding table, a bias, a normalization's
scale and statistics — in the order probed, and which of them cannot be probed (inside a loop or
cond frame) or cannot move an output at all (a neutral element).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.ops import IDENTITY_OPS, tensor_name

SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})    # values do not matter
WEIGHT_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul",
                        "BatchMatMulV2", "BatchMatMulV3", "Conv2DBackpropInput",
                        "Conv3DBackpropInputV2"})
PROBE_MAX_LAYERS = 16               # probed one by one at most: beyond, a spread sample
FEED_BYTES = 64 << 20               # kernels fed on every reference run, at most
MAX_WALK = 64                        # nodes walked back from an integer output


# ---------------------------------------------------------------- frames
def branches_and_loops(graph, settings: Optional[Dict[str, object]] = None) -> set:
    """Names of the ops of an imported graph whose tensors may have no value: inside a v1 while
    loop (after an Enter, before an Exit) or a cond branch (after a Switch, before a Merge) —
    only the dead side where the Switch's predicate is a constant or a fed setting."""
    if not settings and hasattr(graph, "_tfsurgery_inside"):     # asked per output, per layer
        return graph._tfsurgery_inside
    found = _branches_and_loops(graph, settings)
    if not settings:
        graph._tfsurgery_inside = found
    return found


def _branches_and_loops(graph, settings) -> set:
    settings = {tensor_name(k): v for k, v in (settings or {}).items()}
    loops, branches = [], []
    for op in graph.get_operations():
        if op.type in ("Enter", "RefEnter"):
            loops += op.outputs
        elif op.type in ("Switch", "RefSwitch") and op.inputs[1].op.type == "LoopCond":
            loops += op.outputs                 # a while loop's body starts here
        elif op.type in ("Switch", "RefSwitch"):
            taken = _predicate(op.inputs[1], settings)
            branches += op.outputs if taken is None else [op.outputs[0 if taken else 1]]
    # a loop body's constants hang on its frame by a control edge (TensorFlow puts them in the
    # frame so) and cannot be fed; a cond branch's hang on its pivot: fed, the dead side would live
    return _reached(loops, control=True) | _reached(branches, control=True)


def _reached(starts, *, control: bool) -> set:
    inside, stack = set(), [reader for t in starts for reader in t.consumers()]
    while stack:
        op = stack.pop()
        if op.name in inside or op.type in ("Merge", "RefMerge", "Exit", "RefExit"):
            continue
        inside.add(op.name)
        stack += [reader for output in op.outputs for reader in output.consumers()]
        if control:
            stack += list(op._control_outputs)
    return inside


def _predicate(tensor, settings) -> Optional[bool]:
    """A Switch predicate's value where it is a constant or a fed setting, else None."""
    tensor = _through_identity(tensor)
    if tensor.op.type == "LogicalNot":          # a cond on ``not training``
        negated = _predicate(tensor.op.inputs[0], settings)
        return None if negated is None else not negated
    if tensor.name in settings:
        return bool(np.asarray(settings[tensor.name]))
    if tensor.op.type == "Const":
        from tensorflow.python.framework import tensor_util
        return bool(tensor_util.MakeNdarray(tensor.op.get_attr("value")))
    return None


def _through_identity(tensor):
    while tensor.op.type in IDENTITY_OPS and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


# ---------------------------------------------------------------- sensitivity
# Ops a weight passes through on its way to the op that uses it: a frozen variable's read, a
# mixed-precision Cast to float16/bfloat16, Conv1D's ExpandDims, a reshape or transpose.
PASS_THROUGH = IDENTITY_OPS | {"Cast", "ExpandDims", "Reshape", "Squeeze", "Transpose"}
KERNEL_OPS = WEIGHT_OPS | {"Einsum", "Conv2DBackpropFilter"}
TABLE_OPS = frozenset({"Gather", "GatherV2", "ResourceGather", "GatherNd"})
NORM_OPS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
BIAS_OPS = frozenset({"BiasAdd", "Add", "AddV2", "Sub"})
# a tensor read by these never moves an output with its values (only its shape, or nothing)
NO_VALUE_OPS = SHAPE_ONLY_OPS | {"ZerosLike", "OnesLike"}
ZERO_MUL_OPS = frozenset({"Mul", "MulNoNan"})
PROBE_CHANNELS = 1                  # single output channels probed per kernel (its first)...
HEAD_CHANNELS = 256                 # ...and every one (up to this) of a kernel nearest an output:
# a head's channels are different quantities (boxes in pixels, scores in [0, 1])


@dataclasses.dataclass
class Layer:
    name: str            # the op that uses the weights (a conv, matmul, einsum, bias, gather...)
    kernel: str          # the tensor they are fed at (the Const's output: scaled, to probe)
    const: object        # the Const op holding them (read only when probed)
    kind: str = "kernel"     # kernel, table, normalization, bias, scale, weight
    channel: Optional[int] = None    # probe one output channel (a slice of ``axis``), or all
    axis: int = -1
    head: bool = False       # a kernel nearest an output: every output channel probed
    reader: str = ""         # the op that uses them

    @property
    def value(self) -> np.ndarray:
        from tensorflow.python.framework import tensor_util
        if not hasattr(self.const, "_tfsurgery_value"):     # shared by a layer's channel probes
            self.const._tfsurgery_value = tensor_util.MakeNdarray(self.const.get_attr("value"))
        return self.const._tfsurgery_value

    @property
    def label(self) -> str:
        return self.name if self.channel is None else f"{self.name} (output channel {self.channel})"

    def changed(self, change: float) -> np.ndarray:
        """The weights with ``change`` more in them (only in the probed channel), in their own
        dtype (a float16/bfloat16 weight rounds the change to its own precision)."""
        value = self.value
        wide = value.astype(np.float64)
        if self.channel is None:
            wide = wide * (1 + change)
        else:
            index = [slice(None)] * wide.ndim
            index[self.axis] = self.channel
            wide[tuple(index)] *= 1 + change
        return wide.astype(value.dtype)


def weight_layers(graph, outputs: Sequence[str] = ()) -> List[Layer]:
    """The weights of an imported graph, in graph order: every float constant of more than one
    value — a conv/matmul/einsum kernel (through a Cast to float16, Conv1D's ExpandDims, a
    reshape), an embedding table, a bias, a normalization's scale and statistics — each named by
    the op that uses it. Not those inside a loop or cond branch (a tensor fed there would leave
    its frame; ``unprobeable``), nor those that provably cannot move ``outputs`` (``neutral``)."""
    layers, neutral, unprobeable = [], [], []
    inside = branches_and_loops(graph)
    matters = _reaching(graph, outputs) if outputs else None
    taken = set()
    for op in graph.get_operations():
        if op.type != "Const" or not op.outputs[0].dtype.is_floating or \
                (op.outputs[0].shape.num_elements() or 0) <= 1:
            continue
        reader, index = _user(op)
        if reader is None:
            continue
        if matters is not None and op.name not in matters or _all_zeros(op.outputs[0]):
            # cannot move an output, or cannot be scaled (zeros: an accumulator's start)
            neutral.append(reader.name)
            continue
        if op.name in inside or not graph.is_feedable(op.outputs[0]) or \
                reader.type in ("Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter"):
            # (a weight read by a Switch goes to one side only: which, the settings decide)
            unprobeable.append(reader.name)
            continue
        name = reader.name if reader.name not in taken else f"{reader.name} (input {index})"
        taken.add(name)
        layers.append(Layer(name, op.outputs[0].name, op, _kind(reader, index),
                            reader=reader.name))
    graph._tfsurgery_neutral, graph._tfsurgery_unprobeable = neutral, unprobeable
    heads = _heads(graph, outputs) if outputs else set()
    for layer in layers:
        layer.head = layer.name in heads
    return layers


def _heads(graph, outputs: Sequence[str]) -> set:
    """Names of the kernel ops nearest an output: reached from one through no other kernel,
    and feeding no other kernel (a residual stream's kernels feed the next block's)."""
    reached, seen = set(), set()
    stack = [graph.get_tensor_by_name(tensor_name(o)).op for o in outputs]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in KERNEL_OPS:
            reached.add(op.name)
            continue
        stack += [t.op for t in op.inputs]
    upstream, stack = set(), [t.op for op in graph.get_operations() if op.type in KERNEL_OPS
                              for t in op.inputs]
    while stack:                       # everything some kernel is computed from
        op = stack.pop()
        if op.name in upstream:
            continue
        upstream.add(op.name)
        stack += [t.op for t in op.inputs]
    return reached - upstream


def _user(const):
    """The first op past PASS_THROUGH ops that reads a constant, and at which input."""
    tensor, seen = const.outputs[0], 0
    while seen < MAX_WALK:
        readers = [(op, i) for op in tensor.consumers()
                   for i, source in enumerate(op.inputs) if source is tensor]
        if not readers:
            return None, None
        op, index = readers[0]
        if op.type not in PASS_THROUGH or len(readers) > 1 or index != 0:
            return op, index
        tensor, seen = op.outputs[0], seen + 1
    return None, None


def _kind(reader, index: int) -> str:
    if reader.type in KERNEL_OPS:
        return "kernel"
    if reader.type in TABLE_OPS and index == 0:
        return "table"
    if reader.type in NORM_OPS:
        return "normalization"
    if reader.type in BIAS_OPS:
        return "bias"
    return "scale" if reader.type == "Mul" else "weight"


def _reaching(graph, outputs: Sequence[str]) -> set:
    """Names of the ops whose values can move ``outputs``: everything they are computed from,
    except through a shape-only read (Shape, ZerosLike, ...) or a multiply by constant zeros —
    a weight whose every path to an output passes one cannot move it (a neutral element)."""
    found, stack = set(), [graph.get_tensor_by_name(tensor_name(o)).op for o in outputs]
    while stack:
        op = stack.pop()
        if op.name in found:
            continue
        found.add(op.name)
        if op.type in NO_VALUE_OPS:
            continue
        if op.type in ZERO_MUL_OPS and any(_all_zeros(t) for t in op.inputs):
            continue
        stack += [t.op for t in op.inputs]
    return found


def _all_zeros(tensor) -> bool:
    tensor = _through_identity(tensor)
    if tensor.op.type != "Const":
        return False
    from tensorflow.python.framework import tensor_util
    value = tensor_util.MakeNdarray(tensor.op.get_attr("value"))
    return value.dtype.kind in "fiu" and bool(np.all(value == 0))


def probed_order(layers: Sequence[Layer]) -> List[Layer]:
    """Every weight in the order probed: spread over the whole depth (``sample_layers``), each
    whole; then single output channels of the kernels (PROBE_CHANNELS each, spread; every one of
    a kernel nearest an output, up to HEAD_CHANNELS)."""
    ordered = sample_layers(layers, len(layers))
    channels = []
    for layer in ordered:
        if layer.kind != "kernel" or layer.value.ndim < 2:
            continue
        axis = 2 if layer.name and _reader_type(layer) == "DepthwiseConv2dNative" else -1
        count = layer.value.shape[axis]
        if count < 2:
            continue
        for channel in sample_layers(list(range(count)),
                                     HEAD_CHANNELS if layer.head else PROBE_CHANNELS):
            channels.append(dataclasses.replace(layer, channel=channel, axis=axis))
    return ordered + channels


def _reader_type(layer: Layer) -> str:
    reader, _ = _user(layer.const)
    return reader.type if reader is not None else ""


def sample_layers(layers: Sequence[Layer], count: int = PROBE_MAX_LAYERS) -> List[Layer]:
    """Up to ``count`` of ``layers`` in the order they are probed: the first, the last, then the
    middles of the gaps left, halving them — so whatever part is probed first is spread
    over the whole depth of the graph (all of them when there are no more than ``count``)."""
    if len(layers) <= 1:
        return list(layers)
    picked, gaps = [0, len(layers) - 1], [(0, len(layers) - 1)]
    while gaps and len(picked) < count:
        halves = []
        for low, high in gaps:
            middle = (low + high) // 2
            if low < middle < high:
                picked.append(middle)
                halves += [(low, middle), (middle, high)]
        gaps = halves
    return [layers[i] for i in picked[:count]]


def kernel_feeds(layers: Sequence[Layer]) -> Dict[str, np.ndarray]:
    """Every probed weight at its own value, to feed the reference on every run (one executor
    for the base run and all the probes); none when that would copy more than FEED_BYTES a run."""
    if sum(layer.value.nbytes for layer in layers if layer.channel is None) > FEED_BYTES:
        return {}
    return {layer.kernel: layer.value for layer in layers}
