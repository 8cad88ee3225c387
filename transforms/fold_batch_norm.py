"""fold-batch-norm: batch norm (and any per-channel scale/shift) folded into the linear op before it.

At inference a batch norm is a per-channel affine map,
    BN(z) = (z - mean) * gamma / sqrt(var + eps) + beta = z * s + t,
    s = gamma / sqrt(var + eps),  t = beta - mean * s,
and so are BiasAdd, and Mul/Add/Sub/RealDiv by per-channel constants (Keras 3's decomposed BN).
A chain of them after a linear op z = W ⊛ x composes to one map z * S + B, and
    (W ⊛ x) * S + B = (W * S) ⊛ x + B        (S scales W along its output-channel axis),
so the chain becomes the linear op with scaled weights plus a single BiasAdd. The BiasAdd takes the
name of the chain's last node, so its consumers and the graph's outputs stay valid.

Pattern: linear op (Conv2D, DepthwiseConv2dNative, Conv3D, MatMul, Conv2DBackpropInput,
Conv3DBackpropInputV2 — a transposed conv's filter is [h, w, (d,) out, in]) with a
constant weight, whose output — and every intermediate output of the chain — has exactly one consumer
(a BatchToSpaceND or a Squeeze of spatial axes right after the op is passed: see passes_through).
Skipped, with the reason in the report: training-mode BN, non-constant BN parameters or weights, a
conv/matmul output that others also read, a BN whose channel axis does not match.
A shared weight constant is copied, not changed in place.

Through a concat: a chain after ConcatV2/Concat of linear ops (each maybe followed by its own
BiasAdd) is split along the concat's channel slices and folded into each input (along another
axis each input gets the whole map), also with a BatchToSpaceND between concat and chain and
through concats nested along the same axis. Only when every input is such a linear op with constant,
unshared weights and the concat is its one reader, and nothing else reads the concat; otherwise
the report says why (on the concat).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple, Union

import numpy as np

from tfsurgery.graph import Graph, Ref, attr_value
from tfsurgery.ops import FUSED_BATCH_NORM_OPS
from tfsurgery.contract import Options, TransformReport, transform
# the linear ops' view, re-exported for the transforms that import it from here
from tfsurgery.transforms.linear_ops import (LINEAR_OPS, Linear, _data_format_axis,  # noqa: F401
                                             linear_op)

GLOBAL_NORM = "BatchNormWithGlobalNormalization"     # the pre-fused op of old frozen graphs
BATCH_NORM_OPS = tuple(FUSED_BATCH_NORM_OPS) + (GLOBAL_NORM,)


# ---------------------------------------------------------------- per-channel affine steps
Affine = Tuple[np.ndarray, np.ndarray]          # (scale, shift) vectors over the channels


def per_channel(value: Optional[np.ndarray], lin: Linear) -> Optional[np.ndarray]:
    """A constant that broadcasts along the channel axis only, as a float64 vector (else None)."""
    if value is None or value.ndim > lin.rank or value.dtype.kind not in "fiu":
        return None
    shape = (1,) * (lin.rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != lin.channel_axis % lin.rank):
        return None
    if shape[lin.channel_axis % lin.rank] not in (1, lin.channels):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (lin.channels,))


def batch_norm_step(graph: Graph, name: str, lin: Linear) -> Union[Affine, str]:
    """s = gamma / sqrt(var + eps), t = beta - mean * s  — or why this BN cannot fold."""
    if graph.op(name) == GLOBAL_NORM:
        return global_norm_step(graph, name, lin)
    if graph.attr(name, "is_training", True):
        return "training-mode batch norm (is_training=True)"
    if any(reader.ref.port > 0 for reader in graph.consumers(name)):
        return "the batch norm's statistics outputs are consumed"
    if _data_format_axis(graph, name, lin.rank) != lin.channel_axis % lin.rank:
        return "batch norm data_format does not match the channel axis of its input"
    params = _parameters(graph, graph.inputs(name)[1:5])
    if params is None:
        return "batch-norm parameters (scale, offset, mean, variance) are not all constants"
    gamma, beta, mean, var = params
    scale = gamma / np.sqrt(var + graph.attr(name, "epsilon", 1e-4))
    return scale, beta - mean * scale


def _parameters(graph: Graph, refs: List[Ref]) -> Optional[List[np.ndarray]]:
    """A batch norm's parameters as float64 vectors (None unless all are constants): read from
    one buffer when they are stored alike, as they nearly always are."""
    alike = graph.const_values_alike(refs)
    if alike is not None:
        return list(alike.astype(np.float64))
    params = [graph.const_value(ref) for ref in refs]
    if any(p is None for p in params):
        return None
    return [p.astype(np.float64) for p in params]


def global_norm_step(graph: Graph, name: str, lin: Linear) -> Union[Affine, str]:
    """BatchNormWithGlobalNormalization(t, mean, variance, beta, gamma), channels last:
    s = gamma / sqrt(var + eps) (gamma only with scale_after_normalization), t = beta - mean·s."""
    if lin.channel_axis % lin.rank != lin.rank - 1:
        return "BatchNormWithGlobalNormalization normalizes the last axis, not the channel axis"
    params = _parameters(graph, graph.inputs(name)[1:5])
    if params is None:
        return "batch-norm parameters (mean, variance, beta, gamma) are not all constants"
    mean, var, beta, gamma = params
    scale = 1.0 / np.sqrt(var + graph.attr(name, "variance_epsilon", 1e-3))
    if graph.attr(name, "scale_after_normalization", False):
        scale = scale * gamma
    return scale, beta - mean * scale


def affine_step(graph: Graph, name: str, incoming: Ref, lin: Linear) -> Union[Affine, str, None]:
    """If node ``name`` maps its input ``incoming`` by a per-channel z*a + c, return (a, c);
    a reason string if it is a batch norm that cannot fold; None if it is not affine at all."""
    op = graph.op(name)
    inputs = graph.inputs(name)
    if incoming not in inputs:
        return None
    position = inputs.index(incoming)
    if op in BATCH_NORM_OPS:
        return batch_norm_step(graph, name, lin) if position == 0 else None
    if len(inputs) != 2:
        return None
    if op == "BiasAdd":             # the bias runs along the data_format's channel axis
        bias = graph.const_value(inputs[1])
        same_axis = _data_format_axis(graph, name, lin.rank) == lin.channel_axis % lin.rank
        ok = position == 0 and same_axis and bias is not None and bias.shape == (lin.channels,)
        return (np.ones(lin.channels), bias.astype(np.float64)) if ok else None
    other = per_channel(graph.const_value(inputs[1 - position]), lin)
    if other is None:
        return None
    ones, zeros = np.ones(lin.channels), np.zeros(lin.channels)
    if op in ("Add", "AddV2"):
        return ones, other
    if op == "Sub":
        return (ones, -other) if position == 0 else (-ones, other)
    if op == "Mul":
        return other, zeros
    if op in ("RealDiv", "Div") and position == 0 and np.all(other != 0):
        return 1.0 / other, zeros
    return None


# ---------------------------------------------------------------- the chain and the rewrite
@dataclasses.dataclass
class Chain:
    start: str                         # the tensor the folded BiasAdd will read
    nodes: List[str]
    scale: np.ndarray
    shift: np.ndarray
    blocked: List[Tuple[str, str]]     # (batch-norm node, why it stopped the chain)
    # (node, a, c) per step: it maps its input z to z * a + c
    steps: List[Tuple[str, np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)


# Ops that only move whole pixels around, so a per-channel affine map commutes with them
# (dilated convolutions in TF1/Keras 2 graphs: SpaceToBatchND → Conv2D → BatchToSpaceND).
CHANNEL_PRESERVING_OPS = ("BatchToSpaceND",)


def single_consumer(graph: Graph, name: str, options: Options) -> Optional[str]:
    """The one node reading ``name`` (None if several, none, control readers, or an output)."""
    slots = graph.reader_slots(name)
    if len(slots) != 1 or name in options.protected:
        return None
    ((reader, index),) = slots
    return None if graph.input_refs(reader)[index].control else reader


def passes_through(graph: Graph, name: str, current: str, lin: Linear) -> bool:
    """Whether node ``name``, reading ``current``, commutes with any per-channel map (channels
    last): a BatchToSpaceND moves whole pixels, a Squeeze of size-1 spatial axes drops them (a
    1-D conv is ExpandDims → Conv2D → Squeeze)."""
    op = graph.op(name)
    if op not in CHANNEL_PRESERVING_OPS and op != "Squeeze" or \
            lin.channel_axis != lin.rank - 1 or graph.inputs(name)[:1] != [Ref(current)]:
        return False
    if op in CHANNEL_PRESERVING_OPS:
        return True
    dims = graph.attr(name, "squeeze_dims") or []
    return bool(dims) and all(d % lin.rank not in (0, lin.rank - 1) for d in dims)


def affine_chain(graph: Graph, lin: Linear, options: Options) -> Chain:
    chain = Chain(lin.name, [], np.ones(lin.channels), np.zeros(lin.channels), [])
    current = lin.name
    nxt = single_consumer(graph, current, options)
    if nxt is not None and passes_through(graph, nxt, current, lin):
        chain.start = current = nxt             # a pass-through: the chain starts after it
        nxt = single_consumer(graph, current, options)
    while True:
        if nxt is None:
            if current == chain.start:
                chain.blocked += [(c, f"output of {current} has other consumers")
                                  for c in graph.consumer_nodes(current)
                                  if graph.op(c) in BATCH_NORM_OPS]
            return chain
        step = affine_step(graph, nxt, Ref(current), lin)
        if not isinstance(step, tuple):
            if isinstance(step, str):
                chain.blocked.append((nxt, step))
            return chain
        a, c = step
        chain.scale, chain.shift = chain.scale * a, chain.shift * a + c
        chain.nodes.append(nxt)
        chain.steps.append((nxt, a, c))
        current = nxt
        nxt = single_consumer(graph, current, options)


def scaled_by_all(lin: Linear, chain: Chain) -> Optional[str]:
    """The chain node whose output the linear op's own output equals once its weights took the
    chain's whole scale: the steps up to it only scale, the steps after it only shift (Keras'
    batch norm: Mul, then AddV2). None where there is none (a fused batch norm, a pass-through)."""
    scales = 0
    while scales < len(chain.steps) and not np.any(chain.steps[scales][2]):
        scales += 1
    if not scales or chain.start != lin.name or \
            any(np.any(a != 1) for _, a, _ in chain.steps[scales:]):
        return None
    return chain.steps[scales - 1][0]


def worth_folding(graph: Graph, chain: Chain) -> bool:
    """A lone bias op is already the folded form."""
    if not chain.nodes:
        return False
    return len(chain.nodes) > 1 or graph.op(chain.nodes[0]) not in ("BiasAdd", "Add", "AddV2")


def write_weights(graph: Graph, lin: Linear, weights: np.ndarray,
                  protected: frozenset = frozenset()) -> None:
    """Store the scaled weights: in place if the constant is this op's alone (and not part of
    the graph's interface), else as a copy."""
    const = lin.weight
    owned = (graph.op(const) == "Const" and const.port == 0 and const.node not in protected
             and graph.reader_count(const.node) == 1)      # lin is the one reader
    if owned:
        graph.set_const_value(const.node, weights)
    else:
        copy = graph.add_const(f"{lin.name}/folded_weights", weights,
                               device=graph.node(lin.name).device)
        graph.set_input(lin.name, 1, copy)


def fold_chain(graph: Graph, lin: Linear, chain: Chain, options: Options) -> None:
    last = chain.nodes[-1]
    device = graph.node(last).device
    bias = own_bias(graph, chain, options.protected)
    # the folded parameters (BN statistics, old biases) that only the chain reads go with it,
    # not in a later prune's walk over the whole graph
    chain_nodes = set(chain.nodes)
    inputs = {ref.node for name in chain.nodes for ref in graph.input_refs(name)}
    params = sorted(name for name in inputs - chain_nodes - {bias} - options.protected
                    if graph.op(name) == "Const" and
                    all(reader in chain_nodes for reader, _index in graph.reader_slots(name)))
    graph.remove(chain.nodes + params)
    fold_into(graph, lin, chain.scale, chain.shift, Ref(chain.start), last, device, bias,
              options.protected)


def own_bias(graph: Graph, chain: Chain, protected: frozenset) -> Optional[str]:
    """The Const a BiasAdd opening the chain adds, when nothing else reads it and it is not part
    of the graph's interface: it can hold the folded bias (no new node, nothing left to prune)."""
    first = chain.nodes[0]
    if graph.op(first) != "BiasAdd":
        return None
    ref = graph.inputs(first)[1]
    if ref.port or graph.op(ref) != "Const" or graph.reader_count(ref.node) != 1 or \
            ref.node in protected:
        return None
    return ref.node


def fold_into(graph: Graph, lin: Linear, scale: np.ndarray, shift: np.ndarray, start: Ref,
              name: str, device: str, bias: Optional[str] = None,
              protected: frozenset = frozenset()) -> str:
    """W *= scale; then a BiasAdd called ``name`` adds ``shift`` to tensor ``start`` (``bias``:
    a Const no one else reads, to hold ``shift``; else a new one). ``protected``: the graph's
    interface, whose constants are copied, never changed."""
    weights = lin.weights
    dtype = weights.dtype
    # float32/64 weights: one rounding of W * s in their own type. half/bfloat16: in float32.
    math_type = dtype if dtype in (np.float32, np.float64) else np.float32
    scaled = lin.scale_weights(weights.astype(math_type, copy=False), scale.astype(math_type))
    write_weights(graph, lin, scaled.astype(dtype, copy=False), protected)
    if bias is None:
        bias = graph.add_const(f"{name}/folded_bias", shift.astype(dtype), device=device)
    else:
        graph.set_const_value(bias, shift.astype(dtype))
    fmt = "NCHW" if lin.channel_axis == 1 and lin.rank > 2 else "NHWC"
    return graph.new_node("BiasAdd", name, [start, bias],
                          {"T": lin.dtype, "data_format": DATA_FORMATS[fmt]}, device=device).name


DATA_FORMATS = {fmt: attr_value(fmt) for fmt in ("NCHW", "NHWC")}    # built once, copied


def downstream_batch_norms(graph: Graph, name: str, steps: int = 3) -> List[str]:
    """Batch norms that would fold into ``name``: reached through at most ``steps``
    single-consumer nodes that only add a constant bias or move data (a BN after a residual Add of
    two branches belongs to neither)."""
    found = []
    for _ in range(steps):
        readers = graph.consumer_nodes(name)
        found += [r for r in readers if graph.op(r) in BATCH_NORM_OPS]
        if len(readers) != 1:
            break
        reader = readers.pop()
        others = [ref for ref in graph.inputs(reader) if ref.node != name]
        if not all(graph.is_const(ref) for ref in others) and \
                graph.op(reader) not in BATCH_NORM_OPS:
            break
        name = reader
    return found


# ---------------------------------------------------------------- batch norm after a concat
# Grouped convs, Inception branches and onnx-tf exports concatenate conv outputs and normalize the
# result. Concatenating along the channel axis gives each input a slice of the channels, so
#     BN(concat(z_1, .., z_n)) = concat(z_1 * S[c_1] + B[c_1], .., z_n * S[c_n] + B[c_n])
# and each slice folds into its own linear op; along another axis every input gets all of S, B.
CONCAT_OPS = {"ConcatV2": -1, "Concat": 0}       # the op and the position of its axis input
STEP_OPS = ("BiasAdd", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div") + CHANNEL_PRESERVING_OPS


@dataclasses.dataclass
class ConcatPart:
    concat: str         # the concat it is an input of (the outer one, or one nested in it)
    index: int          # which input of that concat
    lin: Linear
    chain: Chain        # the per-channel steps between the linear op and the concat
    channels: slice     # the concat's channels this part carries


def linear_feeding(graph: Graph, ref: Ref) -> Optional[Linear]:
    """The linear op behind tensor ``ref`` through a few per-channel steps (BiasAdd, Mul, ...)."""
    name = ref.node
    for _ in range(4):
        lin = linear_op(graph, name)
        if lin is not None:
            return lin
        data = [r for r in graph.inputs(name) if not graph.is_const(r)]
        if graph.op(name) not in STEP_OPS or len(data) != 1:
            return None
        name = data[0].node
    return None


def weights_shared(graph: Graph, lin: Linear) -> bool:
    """Whether another node reads the weight constant (or an Identity on the way to it) as data;
    control readers (Keras 3's NoOps) do not see the value."""
    ref = lin.weight
    while len(graph.consumers(ref.node)) == 1 and graph.op(ref) != "Const":
        ref = graph.inputs(ref.node)[ref.port if graph.op(ref) == "IdentityN" else 0]
    return len(graph.consumers(ref.node)) != 1


def concat_part(graph: Graph, concat: str, index: int, ref: Ref, lin: Linear,
                options: Options) -> Union[ConcatPart, str]:
    if not lin.channels:
        return f"weights of {lin.name} are not constant"
    if weights_shared(graph, lin):
        return f"the weights of {lin.name} are shared with other nodes"
    chain = affine_chain(graph, lin, options)
    end = chain.nodes[-1] if chain.nodes else chain.start
    if ref != Ref(end):
        return f"{ref.node} is not {lin.name} followed only by per-channel constants"
    if single_consumer(graph, end, options) != concat:
        return f"the output of {end} is read by more than the concat (or is a graph output)"
    return ConcatPart(concat, index, lin, chain, slice(None))


def concat_values(graph: Graph, concat: str, options: Options) -> List[Tuple[str, int, Ref]]:
    """(concat, input index, tensor) of each value ``concat`` joins, in order. A concat nested
    in it along the same constant axis, read by nothing else, is looked through:
    concat(concat(a, b), c) = concat(a, b, c)."""
    inputs = graph.inputs(concat)
    axis_at = CONCAT_OPS[graph.op(concat)] % len(inputs)
    axis = graph.const_value(inputs[axis_at])
    values = []
    for index, ref in enumerate(inputs):
        if index == axis_at:
            continue
        inner = graph.inputs(ref.node) if graph.op(ref) in CONCAT_OPS else None
        if inner and ref.port == 0 and axis is not None and \
                single_consumer(graph, ref.node, options) == concat and \
                np.array_equal(graph.const_value(inner[CONCAT_OPS[graph.op(ref)] % len(inner)]),
                               axis):
            values += concat_values(graph, ref.node, options)
        else:
            values.append((concat, index, ref))
    return values


def concat_parts(graph: Graph, concat: str,
                 options: Options) -> Union[Tuple[Linear, List[ConcatPart]], str, None]:
    """A channel view of ``concat`` and its parts; why not, if some input cannot take a fold;
    None when no input comes from a linear op at all (then there is nothing to fold into)."""
    inputs = graph.inputs(concat)
    axis_at = CONCAT_OPS[graph.op(concat)] % len(inputs)
    values = concat_values(graph, concat, options)
    lins = [linear_feeding(graph, ref) for _, _, ref in values]
    if not any(lins):
        return None
    nested = [ref.node for _, _, ref in values if graph.op(ref) in CONCAT_OPS]
    if nested:             # along another axis, or read elsewhere too: not one concat
        return (f"input {nested[0]} is itself a concat along another axis or read elsewhere "
                "too")
    if not all(lins):
        return "not every input of the concat is a conv/matmul"
    parts = []
    for (owner, index, ref), lin in zip(values, lins):
        part = concat_part(graph, owner, index, ref, lin, options)
        if isinstance(part, str):
            return part
        parts.append(part)
    first = lins[0]
    if any((lin.rank, lin.channel_axis % lin.rank) != (first.rank, first.channel_axis % first.rank)
           for lin in lins):
        return "the concat's inputs differ in rank or data_format"
    axis = graph.const_value(inputs[axis_at])
    if axis is None or axis.size != 1:
        return "the concat axis is not a constant"
    channel_axis = first.channel_axis % first.rank
    if int(axis.reshape(-1)[0]) % first.rank == channel_axis:    # each input: its own channels
        start = 0
        for part in parts:
            part.channels = slice(start, start + part.lin.channels)
            start += part.lin.channels
        channels = start
    elif len({lin.channels for lin in lins}) == 1:      # another axis: all share the channels
        channels = first.channels
    else:
        return "the concat's inputs have different channel counts"
    view = Linear(concat, None, None, first.rank, channel_axis, channels, first.dtype, None)
    return view, parts


def fold_concat(graph: Graph, concat: str, options: Options, report: TransformReport) -> None:
    """Fold the per-channel chain after ``concat`` into its inputs; when that is unsafe, say why
    (a batch norm there then becomes Mul + BiasAdd like any BN with nothing to fold into)."""
    found = concat_parts(graph, concat, options)
    if found is None:
        return
    if isinstance(found, str):
        refuse_concat(graph, concat, found, options, report)
        return
    view, parts = found
    chain = affine_chain(graph, view, options)
    for bn, why in chain.blocked:
        report.skip(concat, f"{bn} not folded into the concat's inputs: {why}")
    if not worth_folding(graph, chain):
        return
    report.matched += 1
    for part in parts:
        fold_concat_part(graph, part, chain.scale[part.channels],
                         chain.shift[part.channels], options)
        for kept in [part.lin.name, *part.chain.nodes[-1:]]:   # now also scaled by the chain
            report.changed(kept)
    # chain.start is the concat, or the BatchToSpaceND reading it (it moves whole pixels, so the
    # per-channel map commutes with it): that node now yields the normalized values
    rename_concat(graph, chain.start, chain.nodes)
    report.rewritten.append(f"{' + '.join(p.lin.name for p in parts)} <- "
                            f"{' + '.join(chain.nodes)} (split by {concat})")


def refuse_concat(graph: Graph, concat: str, reason: str, options: Options,
                  report: TransformReport) -> None:
    """Report a batch norm, or a per-channel op by a constant, after ``concat`` left unfolded."""
    followers = downstream_batch_norms(graph, concat)
    reader = single_consumer(graph, concat, options)
    if not followers and graph.op(reader) in STEP_OPS and \
            any(graph.is_const(ref) for ref in graph.inputs(reader)):
        followers = [reader]
    for name in followers:
        report.skip(concat, f"{name} not folded into the concat's inputs: {reason}")


def fold_concat_part(graph: Graph, part: ConcatPart, scale: np.ndarray,
                     shift: np.ndarray, options: Options) -> None:
    """Fold (z * a + c) * scale + shift into the part's linear op: W * (a·scale), one BiasAdd."""
    own = part.chain
    total_scale, total_shift = own.scale * scale, own.shift * scale + shift
    if own.nodes:           # the BiasAdd takes the last step's name: the concat still reads it
        fold_chain(graph, part.lin, dataclasses.replace(own, scale=total_scale,
                                                        shift=total_shift), options)
        return
    device = graph.node(part.lin.name).device
    bias = fold_into(graph, part.lin, total_scale, total_shift, Ref(own.start),
                     f"{part.lin.name}/folded_bias_add", device, protected=options.protected)
    graph.set_input(part.concat, part.index, bias)


def rename_concat(graph: Graph, start: str, chain: List[str]) -> None:
    """``start`` (the concat, or the BatchToSpaceND after it), now producing the normalized
    values, takes the last chain node's name."""
    node = graph.node(start)
    inputs, attrs, device = list(node.input), dict(node.attr), node.device
    graph.remove([start] + chain)
    graph.new_node(node.op, chain[-1], inputs, attrs, device=device)


@transform("fold-batch-norm", default=False, repeat=True, constants_by_value=True)
def fold_batch_norm(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("fold-batch-norm")
    if options.outputs:       # unreachable readers (e.g. a dead BN's moments) must not block folds
        report.pruned = graph.prune(options.outputs, keep=options.inputs)   # booked to prune
    blocked = {}
    for node in graph.nodes_with_ops(LINEAR_OPS):
        if node.name not in graph or nothing_to_fold(graph, node.name):
            continue
        lin = linear_op(graph, node.name)
        if lin is None:
            continue
        if not lin.channels:
            for bn in downstream_batch_norms(graph, lin.name):
                blocked[bn] = f"weights of {lin.name} are not constant"
            continue
        chain = affine_chain(graph, lin, options)
        blocked.update(dict(chain.blocked))
        if not worth_folding(graph, chain):
            continue
        report.matched += 1
        fold_chain(graph, lin, chain, options)
        scaled = scaled_by_all(lin, chain)
        if scaled:      # the op's output, its weights scaled: what the scale step computed
            report.corresponds(lin.name, scaled)
        report.rewritten.append(f"{lin.name} <- {' + '.join(chain.nodes)}")
    for node in graph.nodes_with_ops(CONCAT_OPS):
        if node.name in graph:
            fold_concat(graph, node.name, options, report)
    for node in graph.nodes_with_ops(BATCH_NORM_OPS):
        if node.name in blocked:
            report.skip(node.name, blocked[node.name])
            continue
        reason = batch_norm_as_mul_add(graph, node.name)
        if reason:
            report.skip(node.name, reason)
        else:
            report.rewritten.append(f"{node.name} -> Mul + BiasAdd (no conv/matmul before it)")
    return report


# What a chain may hold: per-channel steps, batch norms and the ops it passes through.
CHAIN_OPS = frozenset(BATCH_NORM_OPS + STEP_OPS + ("Squeeze",))
BIAS_OPS = ("BiasAdd", "Add", "AddV2")


def nothing_to_fold(graph: Graph, name: str) -> bool:
    """A structural look before any value is decoded: True when linear op ``name`` has constant
    weights and is read by no batch norm and by at most one bias op that leads nowhere further
    (the already-folded form, as every conv is after a first pass) — then ``affine_chain`` would
    find nothing worth folding and no batch norm to report."""
    reader = name
    for _ in range(2):         # the op, then its one bias op
        readers = [graph.op(slot[0]) for slot in graph.reader_slots(reader)]
        if len(readers) != 1:
            if any(op in BATCH_NORM_OPS for op in readers):
                return False
            break              # no chain can start (or go on) here
        op = readers[0]
        if op not in CHAIN_OPS:
            break
        if op not in BIAS_OPS:
            return False       # a scale or a batch norm: worth the full look
        reader = next(iter(graph.reader_slots(reader)))[0]
    else:
        return False           # a second bias op: the full look
    # non-constant weights: the full path reports the batch norms they block
    return graph.is_const(graph.inputs(name)[1])


def batch_norm_as_mul_add(graph: Graph, name: str) -> Optional[str]:
    """A BN with nothing to fold into becomes y = x * s + t: one Mul and one BiasAdd (named as
    the BN). Returns why not, if it cannot."""
    fmt = graph.attr(name, "data_format", "NHWC")
    x = graph.inputs(name)[0]
    params = [graph.const_value(ref) for ref in graph.inputs(name)[1:5]]
    channels = params[0].shape[0] if params[0] is not None else 0
    rank = 5 if fmt in ("NDHWC", "NCDHW") else 4
    view = Linear(name, x, None, rank, _data_format_axis(graph, name, rank), channels,
                  graph.node(name).attr["T"], None)
    step = batch_norm_step(graph, name, view)
    if isinstance(step, str):
        return step
    dtype = _tf_numpy_dtype(view.dtype)
    scale, shift = step
    shape = [-1] + [1] * (rank - 2) if view.channel_axis == 1 else [-1]
    device = graph.node(name).device
    scale_const = graph.add_const(f"{name}/scale", scale.reshape(shape).astype(dtype),
                                  device=device)
    shift_const = graph.add_const(f"{name}/shift", shift.astype(dtype), device=device)
    graph.remove([name])
    mul = graph.new_node("Mul", f"{name}/mul", [x, scale_const], {"T": view.dtype}, device=device)
    graph.new_node("BiasAdd", name, [Ref(mul.name), shift_const],
                   {"T": view.dtype, "data_format": "NCHW" if view.channel_axis == 1 else "NHWC"},
                   device=device)
    return None


def _tf_numpy_dtype(attr) -> np.dtype:
    import tensorflow as tf
    return tf.dtypes.as_dtype(attr.type).as_numpy_dtype
