"""What a comparison of the outputs alone cannot see, and what verification compares besides.

Random inputs can hide a wrong weight from the outputs: a softmax driven into saturation (top
class 0.99999) squeezes a 5% weight error below any tolerance; an argmax or another integer output
changes only when a row sits near a tie; a ReLU6 clipped everywhere, or dead units, pass nothing
of a change on. So verification also:

1. compares the tensor that feeds each output produced by ``Softmax``/``LogSoftmax``/``Sigmoid``/
   ``Tanh`` ("logits of 'output'"), and for an ``ArgMax``/``TopKV2`` output — or any integer or
   bool output — the float tensors it is computed from (through such an op to its input). They are
   found in each graph separately: outputs keep their names, the tensors feeding them may not.
2. picks the random inputs' scale (1, then 0.1, 0.01) so that the outputs of such heads are not all
   saturated; when they are at every scale, the report says so (the logits were compared).
3. measures its own sensitivity: every weight of the reference (``weight_layers``: each float
   constant of more than one value — conv/matmul/einsum kernels, through a Cast or Conv1D's
   ExpandDims, embedding tables, biases, normalization scales) is run 1% larger, whole, and one
   output channel of each kernel (``probed_order``), on the same inputs: does a compared value
   move beyond the tolerance? All of them, however long it takes up to the run's deadline (the
   report says how long, and that its planned share of the check's time was extended); a
   deadline reached first, a probe that raises, or weights none of which could be probed end
   in "cannot verify". A weight whose every path to an output passes a multiply by constant
   zeros (or only a shape read) cannot move it: not probed, not a blind spot, said. Where a
   change would not show, or the graph has more kernels than PROBE_MAX_LAYERS, it
   widens what it compares: every tensor both graphs have — under the same name, dtype and
   shape, or paired by a transform's declared correspondence (``TransformReport.corresponds``)
   — and probes again; where a weight still does not show, smaller input scales are
   tried, and where none shows it the check says it cannot verify. A tensor a legitimate
   rewrite changed (a conv whose weights took a batch norm's scale) is excused where every
   compared reader of it — the node that took the folded op's name, an affine op — matches.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfsurgery.cpu_layout import INNER_SUFFIX
from tfsurgery.ops import node_name, tensor_name
from tfsurgery.verify.weights import (  # noqa: F401 - part of this module's API
    FEED_BYTES, MAX_WALK, PROBE_CHANNELS, PROBE_MAX_LAYERS, SHAPE_ONLY_OPS, WEIGHT_OPS, Layer,
    branches_and_loops, kernel_feeds, probed_order, sample_layers, weight_layers, _through_identity)

HEAD_OPS = frozenset({"Softmax", "LogSoftmax", "Sigmoid", "Tanh"})
PICK_OPS = frozenset({"ArgMax", "ArgMin", "TopKV2"})
CONTROL_FLOW_OPS = frozenset({"Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter",
                              "Exit", "RefExit", "NextIteration", "LoopCond"})
WEIGHT_INPUT = {"Conv2DBackpropInput": 1, "Conv3DBackpropInputV2": 1}   # else input 1
# A tensor that differs is a rewrite's inside only where the readers that match are linear or
# affine: they can match only if their own weights took the difference (a batch norm folded
# forward into the next conv), never because they clip it away (ReLU6, a saturated softmax).
LINEAR_READERS = WEIGHT_OPS | {"BiasAdd", "Add", "AddV2", "Sub", "Mul", "FusedBatchNorm",
                               "FusedBatchNormV2", "FusedBatchNormV3", "Pad", "PadV2",
                               "MirrorPad", "Reshape", "Transpose"}
LAYOUT_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
                        "Conv3DBackpropInputV2", "MaxPool", "MaxPoolV2", "AvgPool", "MaxPool3D",
                        "AvgPool3D", "BiasAdd", "FusedBatchNorm", "FusedBatchNormV2",
                        "FusedBatchNormV3", "SpaceToDepth", "DepthToSpace"})
SCALES = (1.0, 0.1, 0.01)            # random float inputs' scale, tried in turn
SATURATED = 1e-3                     # a head value this close to its bound is saturated
PROBE_CHANGE = 0.01                  # "would a 1% change in a layer's weights show?"
PROBE_MARGIN = 10       # ...or, under a looser tolerance, a change 10× it (int8 weights: 50%)
PROBE_SHARE = 0.25                   # of the check's own time, spent probing at most
PROBE_MIN_SECONDS = 0.05            # ...but at least this much
PROBE_MIN_LAYERS = 3                # probed whatever the time: the first, the last, the middle
MAX_WIDE = 5000                      # tensors compared when widened


@dataclasses.dataclass
class Watch:
    """A tensor compared besides an output: its label and its name in each graph."""
    label: str
    reference: str
    optimized: str


def watched(reference_graph, optimized_graph, outputs: Sequence[str]) -> Tuple[List[Watch],
                                                                               List[str]]:
    """The logits under each output, paired across the two imported graphs (tf.Graph) by their
    place under the output. Returns (watches, notes about outputs whose logits could not be
    paired)."""
    watches, notes = [], []
    for output in outputs:
        mine = _under(reference_graph, output)
        theirs = dict(_under(optimized_graph, output))
        paired = [(path, name) for path, name in mine if path in theirs]
        if len(paired) < len(mine):
            notes.append(f"the logits of '{output}' have no counterpart in the optimized graph")
        for path, name in paired:
            label = f"logits of '{output}'" if len(mine) == 1 else \
                f"logits of '{output}' ({name})"
            watches.append(Watch(label, name, theirs[path]))
    return watches, notes


def _under(graph, output: str) -> List[Tuple[tuple, str]]:
    """(place, tensor name) of the float tensors an output's values are decided by, where an
    output-only comparison is blind: the input of a saturating head, the float input of an
    argmax/top-k, the float tensors an integer output is computed from."""
    start = _through_identity(graph.get_tensor_by_name(tensor_name(output)))
    if start.dtype.is_floating:
        if start.op.type in HEAD_OPS:
            return _fetchable(graph, [((0,), _through_identity(start.op.inputs[0]))])
        return []
    found, stack, seen = [], [((), start)], set()
    while stack and len(seen) < MAX_WALK:
        path, tensor = stack.pop()
        tensor = _through_identity(tensor)
        if tensor.name in seen or tensor.op.type in SHAPE_ONLY_OPS | CONTROL_FLOW_OPS:
            continue
        seen.add(tensor.name)
        if tensor.dtype.is_floating:
            if tensor.op.type in HEAD_OPS:
                tensor = _through_identity(tensor.op.inputs[0])
            if tensor.op.type not in ("Const", "Placeholder", "PlaceholderWithDefault"):
                found.append((path, tensor))
            continue
        for index, source in enumerate(tensor.op.inputs):
            stack.append((path + (index,), source))
    return sorted(_fetchable(graph, found))


def _fetchable(graph, found) -> List[Tuple[tuple, str]]:
    """Tensors outside loops and cond branches (a dead branch's tensor cannot be fetched)."""
    inside = branches_and_loops(graph)
    return [(path, tensor.name) for path, tensor in found
            if graph.is_fetchable(tensor) and tensor.op.name not in inside]


# ---------------------------------------------------------------- saturation
def saturated(graph, output: str, value) -> bool:
    """Is every value of this head output within SATURATED of its bound (a softmax row's top
    class at 1, a sigmoid at 0 or 1, a tanh at ±1)? Outputs of other ops: False."""
    op = _through_identity(graph.get_tensor_by_name(tensor_name(output))).op.type
    value = np.asarray(value, np.float64)
    if op not in HEAD_OPS or value.size == 0 or value.dtype.kind != "f":
        return False
    finite = value[np.isfinite(value)]
    if op == "Softmax":
        top = np.max(value, axis=-1)
        return bool(np.all(top >= 1 - SATURATED))
    if op == "LogSoftmax":
        return bool(np.all(np.max(value, axis=-1) >= -SATURATED))
    if op == "Sigmoid":
        return bool(np.all((finite <= SATURATED) | (finite >= 1 - SATURATED)))
    return bool(np.all(np.abs(finite) >= 1 - SATURATED))              # Tanh


@dataclasses.dataclass
class Sensitivity:
    """What a 1% change in each weight (and in single output channels of each kernel) does to
    the compared values, on these inputs."""
    layers: int = 0                    # kernels: conv/matmul/einsum ops with constant weights
    probed: int = 0                    # weights (whole) probed
    sampled: int = 0                   # weights to probe (every one)
    unnoticed: List[str] = dataclasses.field(default_factory=list)   # weights whose change hides
    smallest: float = float("inf")     # the smallest relative move of a noticed change
    error: str = ""                    # why probing could not see every weight: "cannot verify"
    change: float = PROBE_CHANGE       # the relative change of the weights probed
    weights: int = 0                   # every weight: kernels, tables, biases, scales
    channels: int = 0                  # single output channels probed (and seen)
    seconds: float = 0.0               # the time the probes took
    budget: float = 0.0                # ...their share of the check's time (extended when more)
    neutral: List[str] = dataclasses.field(default_factory=list)   # cannot move an output
    unprobeable: List[str] = dataclasses.field(default_factory=list)  # inside a loop/branch
    # weights whose change moved the compared tensor they act on within the tolerance
    within: List[str] = dataclasses.field(default_factory=list)
    # single output channels whose change showed nowhere: said, not counted as blind — one
    # channel's gain to the outputs can be small (a small BN scale after it) on a right result
    quiet_channels: List[str] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.probed == self.weights and not self.unnoticed and not self.error

    @property
    def sees(self) -> bool:
        """Every weight's change showed (none raised, none left unprobed)."""
        return not self.unnoticed and not self.error

    def line(self) -> str:
        if not self.weights and not self.error:
            return "no constant weights to probe" + self._neutral()
        if self.unnoticed:
            return (f"a {self.change:.0%} change in the weights of '{self.unnoticed[0]}' would "
                    "not show in the compared values on these inputs")
        if self.error:
            return f"sensitivity not measured ({self.error})"
        extended = f" (beyond its budget of {self.budget:.2g} s: extended)" \
            if self.seconds > self.budget else ""
        return (f"a {self.change:.0%} change in any one of the {self.weights} weights "
                f"({self.layers} conv/matmul/einsum kernels, and their biases, normalization "
                f"scales, embedding tables), or in any of {self.channels} single output channels "
                f"of the kernels, moves the compared values by at least {self.smallest:.3g}; "
                f"probed in {self.seconds:.2f} s{extended}{self._neutral()}")

    def _neutral(self) -> str:
        within = "" if not self.within else \
            (f"; {len(self.within)} moved the compared tensor they act on by no more than the "
             f"tolerance ('{self.within[0]}')")
        if self.quiet_channels:
            within += (f"; {len(self.quiet_channels)} single output channels, biases or "
                       f"normalization parameters moved nothing compared beyond the tolerance "
                       f"('{self.quiet_channels[0]}')")
        if not self.neutral:
            return within
        return within + (f"; {len(self.neutral)} weights cannot move an output (every path to one "
                f"passes a multiply by constant zeros or a shape-only read: '{self.neutral[0]}')")

    def as_dict(self) -> dict:
        return {"layers": self.layers, "weights": self.weights, "probed": self.probed,
                "sampled": self.sampled, "channels": self.channels,
                "unnoticed": self.unnoticed, "neutral": self.neutral,
                "unprobeable": self.unprobeable, "within_tolerance": self.within,
                "quiet_channels": self.quiet_channels,
                "seconds": self.seconds,
                "budget": self.budget,
                "smallest_move": None if self.smallest == float("inf") else self.smallest,
                "complete": self.complete, "error": self.error}


def probe(run, layers: Sequence[Layer], total: int, feeds: Dict[str, np.ndarray],
          fetches: Sequence[str], expected: Sequence[np.ndarray], tolerance: float,
          budget: float, *, relative_error, deadline: float = float("inf"),
          neutral: Sequence[str] = (), unprobeable: Sequence[str] = (),
          stages: Sequence[tuple] = ()) -> Sensitivity:
    """``run(feeds, fetches)``: the reference's open session; ``layers``: every weight, and the
    single channels, in the order probed (``probed_order``); ``total``: the kernels among them;
    ``relative_error(a, b)``: the check's own measure. ``stages``: (feeds, fetches, expected)
    tried in turn for each weight until one moves (the outputs first: one cheap run, the
    intermediate tensors only where they do not move); default the one given. Each weight fed 1% larger
    (PROBE_MARGIN × ``tolerance`` where that is more: a change the tolerance allows cannot
    show); stops at the first whose change would not show. ``budget`` seconds is the share of
    the check's time planned: when it ends before every weight was probed, probing goes on (the
    report says how long it took) until ``deadline`` seconds, after which the check cannot
    verify — so does a probe that raises, and a graph whose weights none could be probed."""
    whole = [layer for layer in layers if layer.channel is None]
    found = Sensitivity(layers=total, weights=len(whole), sampled=len(whole),
                        change=max(PROBE_CHANGE, PROBE_MARGIN * tolerance), budget=budget,
                        neutral=list(neutral), unprobeable=list(unprobeable))
    start = time.perf_counter()
    compared = {tensor_name(name) for _, names, _ in (stages or [(feeds, fetches, expected)])
                for name in names}
    # weights inside a loop or cond branch cannot be fed (``unprobeable``, said in the report):
    # refusing every graph whose weights all sit there refused right results (tf2onnx's cond
    # cases); probing them by rewriting the GraphDef is still to do
    for layer in layers:
        if found.error:
            break
        if time.perf_counter() - start > deadline:
            left = len(whole) - found.probed
            found.error = (f"{left} of the {len(whole)} weights" if left else
                           "some single output channels") + \
                f" were not probed within {deadline:g} s (a longer --verify-timeout gives " \
                "the probes more)"
            break
        try:
            move = _move(run, layer, found.change, stages or [(feeds, fetches, expected)],
                         tolerance, relative_error)
        except Exception as error:          # noqa: BLE001 - any failure: cannot verify
            found.error = f"'{layer.label}' could not be probed: {str(error)[:120]}"
            break
        if not move > tolerance and _acts_on(layer) & compared:
            # the very tensor the weight acts on is compared, and moved no more than the
            # tolerance allows (a small bias beside large logits): within it, not hidden
            found.within.append(layer.label)
            found.probed += layer.channel is None
            continue
        if not move > tolerance and (layer.channel is not None or
                                     layer.kind not in ("kernel", "table")):
            # a single channel (its whole kernel showed already), or a bias / normalization
            # parameter a ReLU can hide on random inputs: said, not counted as blind
            found.quiet_channels.append(layer.label)
            continue
        if not move > tolerance:
            found.unnoticed.append(layer.label)
            break
        if layer.channel is None:
            found.probed += 1
        else:
            found.channels += 1
        found.smallest = min(found.smallest, move)
    found.seconds = time.perf_counter() - start
    return found


def _acts_on(layer: Layer, hops: int = 4) -> set:
    """The tensors a weight acts on directly: its reader's output, and the outputs of the
    linear or affine ops after it (a batch norm's constant offset computed, then added)."""
    if not layer.reader:
        return set()
    op, found = layer.const.graph.get_operation_by_name(layer.reader), set()
    for _ in range(hops):
        if not op.outputs:
            break
        found.add(op.outputs[0].name)
        readers = op.outputs[0].consumers()
        if len(readers) != 1 or readers[0].type not in LINEAR_READERS:
            break
        op = readers[0]
    return found


def _move(run, layer: Layer, change: float, stages, tolerance: float, relative_error) -> float:
    """How far a compared value moves with ``layer`` changed: the first move beyond
    ``tolerance`` found (stage by stage, value by value), else the largest."""
    largest = 0.0
    for feeds, fetches, expected in stages:
        if not fetches:
            continue
        moved = run({**feeds, layer.kernel: layer.changed(change)}, fetches)
        for e, m in zip(expected, moved):
            largest = max(largest, relative_error(e, m))
            if largest > tolerance:
                return largest
    return largest


# ---------------------------------------------------------------- widening
def comparable_tensors(reference_graph, optimized_graph, exclude: Sequence[str],
                       settings: Optional[Dict[str, object]] = None,
                       correspondence: Optional[Dict[str, str]] = None) -> List[Tuple[str, str]]:
    """(optimized tensor, reference tensor) pairs to compare, in the optimized graph's order:
    every tensor a transform declared to stand for one of the original (``correspondence``:
    optimized → reference, any op), and ``name:0`` of every linear or affine op (conv, matmul,
    bias, batch norm, add, mul, pad, reshape: where a layer's change shows first, and what
    excuses a rewrite) both imported graphs have under the same name — each with a float value of
    the same dtype and static shape, outside loops and dead branches. An activation's output is
    left out: it is a function of one compared here. Where a node's data_format differs between
    the graphs (layout-nhwc), 4-D and 5-D tensors are left out: they may hold another layout."""
    inside = branches_and_loops(reference_graph, settings) | \
        branches_and_loops(optimized_graph)
    # "" : a transform said the tensor kept its name but not its values (``changed``)
    declared = {tensor_name(k): tensor_name(v) if v else "" for k, v in
                (correspondence or {}).items()}
    changed = {node_name(k) for k, v in declared.items() if v == ""}
    relaid = False
    pairs = []
    excluded = {tensor_name(n) for n in exclude}
    for op in optimized_graph.get_operations():
        try:
            namesake = reference_graph.get_operation_by_name(op.name)
        except KeyError:
            namesake = None
        if namesake is not None and _relaid(op, namesake):
            relaid = True
        if op.name.split(INNER_SUFFIX)[0] in changed:    # also run channels-last (cpu_layout)
            continue
        for mine in op.outputs:
            source = declared.get(mine.name)
            if source == "":
                continue
            if source is None:
                if namesake is None or mine.value_index or op.type not in LINEAR_READERS:
                    continue
                source = mine.name
            try:
                other = reference_graph.get_tensor_by_name(source)
            except (KeyError, ValueError):
                continue
            if mine.name in excluded or op.name in inside or other.op.name in inside or \
                    not _comparable(mine, other, optimized_graph, reference_graph):
                continue
            pairs.append((mine.name, other.name, mine.shape.rank))
    return [(mine, other) for mine, other, rank in pairs
            if not (relaid and rank in (None, 4, 5))][:MAX_WIDE]


def _comparable(mine, other, optimized_graph, reference_graph) -> bool:
    return mine.dtype.is_floating and mine.dtype == other.dtype and \
        mine.shape.is_compatible_with(other.shape) and optimized_graph.is_fetchable(mine) and \
        reference_graph.is_fetchable(other)


def _relaid(op, namesake) -> bool:
    """Both ops lay their tensors out by a data_format, and not the same one (layout-nhwc). A
    BiasAdd that took a Keras batch norm's AddV2's name has one where the AddV2 has none."""
    mine, theirs = _data_format(op), _data_format(namesake)
    return mine is not None and theirs is not None and mine != theirs


def _data_format(op) -> Optional[bytes]:
    if op.type not in LAYOUT_OPS:
        return None
    try:
        return op.get_attr("data_format")
    except ValueError:
        return None


def excused(optimized_graph, name: str, errors: Dict[str, float],
            bounds: Dict[str, float], already: frozenset = frozenset()) -> bool:
    """The tensor differs inside a rewrite: the compared tensors it reaches through linear or
    affine ops only (the node that took a folded batch norm's name, the conv a scale was folded
    forward into; new nodes in between are passed through) all match, and there is one.
    ``already``: tensors excused so far, which count as matching (a scale folded forward into a
    conv whose batch norm was folded too: the conv differs, excused by its bias's match)."""
    readers = list(optimized_graph.get_tensor_by_name(name).consumers())
    seen, matched = set(), False
    while readers:
        reader = readers.pop()
        if reader.name in seen:
            continue
        seen.add(reader.name)
        if reader.type not in LINEAR_READERS or len(seen) > MAX_WALK:
            return False
        tensor = f"{reader.name}:0"
        if tensor in errors:
            if errors[tensor] > bounds[tensor] and tensor not in already:
                return False
            matched = True
        else:
            readers.extend(reader.outputs[0].consumers())
    return matched


def head_op(graph, output: str) -> bool:
    """Is this output a saturating head's (Softmax, LogSoftmax, Sigmoid, Tanh)?"""
    return _through_identity(graph.get_tensor_by_name(tensor_name(output))).op.type in HEAD_OPS
