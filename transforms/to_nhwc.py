"""layout-nhwc: a channels-first (NCHW) graph computed channels-last (NHWC), the same numbers.

Off by default (``--layout NHWC``, ``api.optimize(..., options=RunOptions(layout="NHWC"))``). TensorFlow's default CPU
kernels refuse NCHW convolutions and pooling; the result runs without oneDNN
(``TF_ENABLE_ONEDNN_OPTS=0``) and without the transposes oneDNN adds around each NCHW op.

For a 4-D tensor ``x`` in NCHW its NHWC form is ``x' = transpose(x, [0, 2, 3, 1])``, and NCHW axis
``a`` is NHWC axis ``(0, 3, 1, 2)[a]``. Each op below maps ``x'`` to ``y'`` exactly when its NCHW
form maps ``x`` to ``y`` (values are only moved, never rounded differently by the layout):

    Conv2D, DepthwiseConv2dNative, Conv2DBackpropInput, MaxPool, MaxPoolV2, AvgPool, BiasAdd,
    FusedBatchNorm*, SpaceToDepth, DepthToSpace
        data_format NHWC; strides, ksize, dilations, explicit paddings and constant per-axis
        sizes (MaxPoolV2's ksize/strides, a transposed conv's output shape) permuted like the
        axes. Filters are HWIO in both layouts: no weight changes. (SpaceToDepth's channel
        order is (block row, block column, channel) in both layouts.)
    element-wise ops (Relu, Relu6, Sigmoid, Tanh, Add, Mul, Sub, Maximum, Cast, Identity, ...)
        unchanged; a constant operand broadcast against the 4-D input is made 4-D, transposed,
        and its leading 1s dropped ([C, 1, 1] → [C]); scalars stay. A computed operand must be
        4-D (it gets the transpose) or a scalar: [C, 1, 1] computed at run time is refused.
    ConcatV2, Split, SplitV on axis a → axis (0, 3, 1, 2)[a]
    Pad, PadV2, MirrorPad: the rows of the constant paddings permuted
    Mean, Sum, Max, Min, Prod, All, Any over constant axes: the axes mapped. With keep_dims the
        result is 4-D NHWC; without, the result is the NCHW op's own when the kept axes keep
        their order (N, C after a global pool), else refused.
    Transpose(x, p) with a constant p reading x': Transpose(x', q), q[k] = (0, 3, 1, 2)[p[k]];
        and Transpose(x, (0, 3, 1, 2)) (NHWC → NCHW) whose result would be wanted in NHWC:
        that result is x itself.

Which ops: every NCHW op of the first group, and every op of the others joined to one by a 4-D
tensor, forward and backward, to a fixpoint; then every NHWC → NCHW Transpose feeding an op that
converts, and what joins those. Where a converted tensor meets the rest a Transpose is inserted
— to NHWC entering (a constant is transposed instead), back to NCHW leaving, one per tensor; a
converted graph output keeps its name as that transpose back — so the graph's interface is
unchanged. A Transpose reading a Transpose is composed into one, and one by the identity goes:
the NHWC→NCHW input transpose of a graph converted from ONNX cancels, and so do the pairs it
wraps around NHWC-only ops (Resize). A graph with no NCHW op at all whose NHWC ops each sit in a
transpose pair (as onnx-tf writes every Conv and pool) keeps only the outermost transposes.

Left NCHW, reported with why: a FusedBatchNorm or Split that is a graph output (renaming it
would rename its other outputs), and every op a converted tensor reaches that has no NHWC rule
here — Reshape, Squeeze, Shape, an element-wise op with a computed [C, 1, 1] operand, a
reduction whose kept axes change order — which reads the NCHW tensor through a transpose back
(and, if it feeds the converted part again, a transpose in).
Refused as a whole: a graph with TF1 while loops (constants created here would sit outside the
loop's frame).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set, Tuple, Union

import numpy as np

from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.graph import Graph, Ref, num_outputs, op_def
from tfsurgery.ops import FRAME_OPS, FUSED_BATCH_NORM_OPS
from tfsurgery.tfsession import StaticShapes

TO_NHWC = (0, 2, 3, 1)          # transpose(x_nchw, TO_NHWC) = x_nhwc
TO_NCHW = (0, 3, 1, 2)          # transpose(x_nhwc, TO_NCHW) = x_nchw
NHWC_AXIS = TO_NCHW             # NCHW axis a is NHWC axis NHWC_AXIS[a]

# Ops with a data_format → (the input slot of the image, inputs holding per-axis sizes)
FORMATTED = {"Conv2D": (0, ()), "DepthwiseConv2dNative": (0, ()), "MaxPool": (0, ()),
             "AvgPool": (0, ()), "MaxPoolV2": (0, (1, 2)), "BiasAdd": (0, ()),
             "Conv2DBackpropInput": (2, (0,)), "SpaceToDepth": (0, ()), "DepthToSpace": (0, ()),
             **{op: (0, ()) for op in FUSED_BATCH_NORM_OPS}}
PER_AXIS_ATTRS = ("strides", "ksize", "dilations")
ELEMENTWISE = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Softplus", "Softsign",
    "Identity", "Snapshot", "StopGradient", "Neg", "Abs", "Exp", "Expm1", "Log", "Log1p", "Sqrt",
    "Rsqrt", "Square", "Reciprocal", "Floor", "Ceil", "Round", "Rint", "Sign", "Sin", "Cos",
    "Erf", "Cast",
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "MulNoNan", "Maximum", "Minimum",
    "SquaredDifference", "Pow", "FloorDiv", "FloorMod", "AddN", "ClipByValue", "SelectV2",
    "Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual", "LogicalAnd",
    "LogicalOr", "LogicalNot", "IsNan", "IsFinite"})
NO_BROADCAST = frozenset({"AddN", "ClipByValue"})     # operands: the shape of x, or scalars
SPLITS = {"Split": (1, 0), "SplitV": (0, 2)}          # → (the value's slot, the axis's slot)
PADS = frozenset({"Pad", "PadV2", "MirrorPad"})
REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod", "All", "Any"})
AGNOSTIC = ELEMENTWISE | PADS | REDUCTIONS | frozenset(SPLITS) | {"ConcatV2", "Transpose"}
DT_INT32 = 3
NO_RULE = "has no NHWC rule here (its result may depend on the memory order of its input)"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a node takes part: the input slots that read NHWC tensors once converted, the output
    ports that are NHWC once converted (none: its result is the NCHW op's own), and the input
    slots holding constants to convert."""

    layout_in: Tuple[int, ...]
    layout_out: Tuple[int, ...]
    constants: Tuple[int, ...] = ()
    source: bool = False      # a Transpose NHWC → NCHW whose result becomes NHWC: its input


SOURCE = Plan((), (0,), (1,), source=True)


@transform("layout-nhwc", default=False)
def to_nhwc(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("layout-nhwc")
    seeds = [name for name in graph.names_with_ops(FORMATTED)
             if graph.attr(name, "data_format", "NHWC") == "NCHW"]
    if not seeds and not graph.names_with_ops(["Transpose"]):
        return report
    if graph.names_with_ops(FRAME_OPS):
        for name in seeds:
            report.skip(name, "the graph has TF1 while loops: constants and transposes made here "
                              "would sit outside their frames; the graph keeps NCHW")
        return report
    layout = _Layout(graph, options, report)
    inside = layout.spread(seeds)
    report.matched = len(seeds) + layout.sources
    if inside:
        layout.convert(inside)
    return report


class _Layout:
    def __init__(self, graph: Graph, options: Options, report: TransformReport):
        self.graph, self.options, self.report = graph, options, report
        self.shapes = StaticShapes(graph, options.outputs)
        self.plans: Dict[str, Union[Plan, str]] = {}
        self.perms: Dict[Tuple[Tuple[int, ...], str], str] = {}
        self.transposes: List[str] = []          # made here (to simplify at the end)
        self.sinks: List[str] = []               # converted Transposes (their perm changed)
        self.maybe_unread: Set[str] = set()      # nodes whose readers were taken away
        self.sources = 0

    # ------------------------------------------------------------ which nodes
    def plan(self, name: str) -> Union[Plan, str]:
        """``name``'s Plan, or why it cannot be converted."""
        if name not in self.plans:
            self.plans[name] = _plan(self.graph, name, self.rank, self.options.protected)
        return self.plans[name]

    def rank(self, ref: Ref) -> Optional[int]:
        value = self.graph.const_value(ref)
        if value is not None:
            return value.ndim
        plan = self.plans.get(ref.node)
        if isinstance(plan, Plan) and ref.port in plan.layout_out:
            return 4                                   # what converts is 4-D
        op = self.graph.op(ref.node)
        if op in FORMATTED and op != "BiasAdd":       # (BiasAdd takes any rank from 2 up)
            return 4 if ref.port == 0 else 1
        if op in SPLITS:                               # every piece has the input's rank
            return self.rank(self.graph.inputs(ref.node)[SPLITS[op][0]])
        if ref.port:
            return None
        shape = self.shapes.get(ref.node)
        return len(shape) if shape is not None else None

    def spread(self, seeds: List[str]) -> Set[str]:
        """The seeds that convert, and every op joined to them through an NHWC tensor; then
        the transposes NHWC → NCHW that feed such ops (their input is the NHWC tensor), and
        what those join."""
        graph, inside = self.graph, set()
        for name in seeds:
            plan = self.plan(name)
            if isinstance(plan, str):
                self.report.skip(name, plan)
            else:
                inside.add(name)
        self.grow(inside, list(inside))
        sources = [name for name in graph.names_with_ops(["Transpose"])
                   if name not in inside and self.is_source(name, inside)]
        self.sources = len(sources)
        for name in sources:
            self.plans[name] = SOURCE
            inside.add(name)
        self.grow(inside, sources)
        return inside

    def is_source(self, name: str, inside: Set[str]) -> bool:
        perm = self.graph.const_value(self.graph.inputs(name)[1])
        if perm is None or tuple(np.reshape(perm, -1)) != TO_NCHW:
            return False
        for consumer in self.graph.consumers(name, 0):
            plan = self.plans.get(consumer.node) if consumer.node in inside else \
                self.plan(consumer.node) if self.graph.op(consumer.node) in AGNOSTIC else None
            if isinstance(plan, Plan) and consumer.index in plan.layout_in:
                return True
        return False

    def grow(self, inside: Set[str], work: List[str]) -> None:
        """Add to ``inside`` every op that can convert joined to it by an NHWC tensor."""
        graph = self.graph
        while work:
            name = work.pop()
            plan = self.plans[name]
            joined = [(c.node, c.index, None) for port in plan.layout_out
                      for c in graph.consumers(name, port)]
            joined += [(ref.node, None, ref.port) for ref in
                       (graph.inputs(name)[slot] for slot in plan.layout_in)]
            for other, slot, port in joined:
                if other in inside or graph.op(other) not in AGNOSTIC:
                    continue
                other_plan = self.plan(other)
                if isinstance(other_plan, str):
                    continue
                if (slot is not None and slot in other_plan.layout_in) or \
                        (port is not None and port in other_plan.layout_out):
                    inside.add(other)
                    work.append(other)

    def reads_nhwc(self, ref: Ref, inside: Set[str]) -> bool:
        return ref.node in inside and ref.port in self.plans[ref.node].layout_out

    # ------------------------------------------------------------ rewriting
    def convert(self, inside: Set[str]) -> None:
        graph, report = self.graph, self.report
        protected = self.options.protected
        named_back: Dict[Tuple[str, int], str] = {}     # an output's transpose back keeps its name
        for name in sorted(inside):
            if name in protected and self.plans[name].layout_out:
                moved = self.move_aside(name)
                inside.discard(name)
                inside.add(moved)
                self.plans[moved] = self.plans.pop(name)
                named_back[(moved, 0)] = name
        order = [name for name in (node.name for node in graph) if name in inside]
        for name in order:
            self.rewrite(name)
            report.rewritten.append(f"{named_back.get((name, 0), name)}: {graph.op(name)} "
                                    "computed in NHWC")
        entering: Dict[Ref, Ref] = {}
        for name in order:
            for slot in self.plans[name].layout_in:
                ref = graph.inputs(name)[slot]
                if not self.reads_nhwc(ref, inside):
                    if ref not in entering:
                        entering[ref] = self.to_nhwc(ref, _tensor_type(graph, name, slot, False),
                                                     graph.node(name).device)
                    graph.set_input(name, slot, entering[ref])
        kept: Dict[str, str] = {}
        for name in order:
            for port in self.plans[name].layout_out:
                self.leave(name, port, inside, named_back.get((name, port)), kept)
        for reader, why in kept.items():
            report.skip(reader, why)
        for moved in named_back:               # an output Identity: its transpose back is enough
            self.drop_identity(moved[0])
        made = len(self.transposes)
        self.simplify_transposes()
        self.drop_unread()
        left = sum(1 for name in self.transposes if graph.op(name) == "Transpose")
        report.notes.append(f"{len(inside)} ops computed in NHWC; {made} transposes made at the "
                            f"boundary, {left} left after composing and cancelling")

    def move_aside(self, name: str) -> str:
        """A protected node to convert: the op moves to a new name (the name becomes its
        transpose back to NCHW, made later)."""
        graph = self.graph
        node = type(graph.node(name))()
        node.CopyFrom(graph.node(name))
        node.name = graph.unique_name(f"{name}/nhwc")
        graph.add_node(node)
        for consumer in graph.consumers(name):
            graph.set_input(consumer.node, consumer.index, Ref(node.name, consumer.ref.port))
        graph.move_control_consumers(name, node.name)
        graph.remove([name])
        return node.name

    def drop_identity(self, name: str) -> None:
        graph = self.graph
        if graph.op(name) in ("Identity", "Snapshot") and not graph.control_inputs(name) and \
                not graph.has_control_consumers(name):
            graph.rewire(name, graph.inputs(name)[0])
            graph.remove([name])

    def rewrite(self, name: str) -> None:
        """Attributes and constant inputs in NHWC terms."""
        graph, op = self.graph, self.graph.op(name)
        plan, inputs = self.plans[name], graph.inputs(name)
        if op in FORMATTED:
            node = graph.edit_node(name)
            node.attr["data_format"].s = b"NHWC"
            for key in PER_AXIS_ATTRS:
                if key in node.attr and len(node.attr[key].list.i) == 4:
                    values = list(node.attr[key].list.i)
                    node.attr[key].list.i[:] = [values[axis] for axis in TO_NHWC]
            if "explicit_paddings" in node.attr and len(node.attr["explicit_paddings"].list.i) == 8:
                pairs = np.reshape(list(node.attr["explicit_paddings"].list.i), (4, 2))
                node.attr["explicit_paddings"].list.i[:] = [int(v) for v in
                                                            pairs[list(TO_NHWC)].ravel()]
        if op == "Transpose":
            self.sinks.append(name)
        for slot in plan.constants:
            value = graph.const_value(inputs[slot])
            self.set_constant(name, slot, value[list(TO_NHWC)] if plan.source
                              else _converted_constant(op, value))
        if plan.layout_out and "_output_shapes" in graph.node(name).attr:
            del graph.edit_node(name).attr["_output_shapes"]        # recorded in NCHW

    def set_constant(self, name: str, slot: int, value: np.ndarray) -> None:
        graph = self.graph
        old = graph.inputs(name)[slot]
        source = graph.resolve(old)
        dtype = graph.node(source.node).attr["dtype"].type if graph.op(source.node) == "Const" \
            else None
        const = graph.add_const(f"{name}/nhwc_{slot}", value, dtype=dtype,
                                device=graph.node(name).device)
        graph.set_input(name, slot, const)
        self.maybe_unread.add(old.node)

    def to_nhwc(self, ref: Ref, dtype, device: str) -> Ref:
        """``ref`` entering the converted part: a constant transposed, else a Transpose."""
        graph = self.graph
        value = graph.const_value(ref)
        if value is not None and value.ndim == 4:
            return Ref(graph.add_const(f"{ref.node}/nhwc",
                                       np.ascontiguousarray(np.transpose(value, TO_NHWC)),
                                       device=device), 0)
        return Ref(self.transpose(f"{ref.node}/to_nhwc" + (f"_{ref.port}" if ref.port else ""),
                                  ref, TO_NHWC, dtype, device), 0)

    def leave(self, name: str, port: int, inside: Set[str], named: Optional[str],
              kept: Dict[str, str]) -> None:
        """Readers outside the converted part read ``name:port`` through a transpose back."""
        graph = self.graph
        outside = [c for c in graph.consumers(name, port)
                   if not (c.node in inside and c.index in self.plans[c.node].layout_in)]
        if not outside and named is None:
            return
        back = self.transpose(named or f"{name}/to_nchw" + (f"_{port}" if port else ""),
                              Ref(name, port), TO_NCHW, _tensor_type(graph, name, port, True),
                              graph.node(name).device)
        for consumer in outside:
            graph.set_input(consumer.node, consumer.index, Ref(back, 0))
            plan = self.plans.get(consumer.node)
            why = plan if isinstance(plan, str) else NO_RULE
            kept.setdefault(consumer.node, f"{graph.op(consumer.node)} {why}: it stays NCHW and "
                                           "reads the NCHW tensor through a transpose")

    def transpose(self, name: str, ref: Ref, perm, dtype, device: str) -> str:
        node = self.graph.new_node("Transpose", name, [ref, self.perm(perm)],
                                   {"T": _dtype(dtype), "Tperm": _dtype(DT_INT32)},
                                   device=device)
        self.transposes.append(node.name)
        return node.name

    def perm(self, perm, dtype=np.int32) -> str:
        """A shared constant permutation (of the dtype the Transpose's ``Tperm`` says)."""
        key = (tuple(int(axis) for axis in perm), np.dtype(dtype).name)
        if key not in self.perms or self.perms[key] not in self.graph:
            suffix = "" if key[1] == "int32" else f"_{key[1]}"
            self.perms[key] = self.graph.add_const(
                "layout_nhwc/perm_" + "".join(map(str, key[0])) + suffix,
                np.asarray(key[0], dtype))
        return self.perms[key]

    # ------------------------------------------------------------ transposes that meet
    def simplify_transposes(self) -> None:
        """A Transpose reading a Transpose reads its input by the composed permutation; one by
        the identity goes (an output keeps its name as an Identity)."""
        graph = self.graph
        work = list(self.transposes) + self.sinks
        work += [c.node for name in self.transposes if name in graph
                 for c in graph.consumers(name) if graph.op(c.node) == "Transpose"]
        for name in work:
            while name in graph and graph.op(name) == "Transpose" and self.simplify(name):
                pass

    def simplify(self, name: str) -> bool:
        graph = self.graph
        x, perm_ref = graph.inputs(name)
        perm = graph.const_value(perm_ref)
        if perm is None or perm.ndim != 1:
            return False
        if np.array_equal(perm, np.arange(perm.size)):
            self.bypass(name, x)
            return False
        if graph.op(x.node) != "Transpose" or x.port or graph.control_inputs(x.node):
            return False
        inner_x, inner_perm_ref = graph.inputs(x.node)
        inner_perm = graph.const_value(inner_perm_ref)
        if inner_perm is None or inner_perm.shape != perm.shape:
            return False
        composed = inner_perm[perm]          # transpose(transpose(a, q), p) = transpose(a, q[p])
        graph.set_input(name, 0, inner_x)
        tperm = _dtype(graph.attr(name, "Tperm", DT_INT32)).as_numpy_dtype
        graph.set_input(name, 1, self.perm(composed, tperm))
        self.maybe_unread.update({x.node, perm_ref.node})
        return True

    def bypass(self, name: str, source: Ref) -> None:
        graph = self.graph
        if graph.control_inputs(name):
            return                       # its readers wait for those too: it stays
        self.maybe_unread.add(graph.inputs(name)[1].node)
        if name in self.options.protected:
            graph.bypass(name, source, keep_name_as=_dtype(graph.node(name).attr["T"].type))
            return
        graph.bypass(name, source)
        self.maybe_unread.add(source.node)

    def drop_unread(self) -> None:
        """Constants, identities and transposes nobody reads any more (ours, or left by us)."""
        graph, protected = self.graph, self.options.protected
        work = list(self.maybe_unread) + list(self.perms.values())
        while work:
            name = work.pop()
            if name not in graph or name in protected or graph.reader_count(name) or \
                    graph.op(name) not in ("Const", "Identity", "Transpose"):
                continue
            work.extend(ref.node for ref in graph.input_refs(name))
            graph.remove([name])


# ---------------------------------------------------------------- plans, op by op
def _plan(graph: Graph, name: str, rank, protected) -> Union[Plan, str]:
    op, inputs = graph.op(name), graph.inputs(name)
    if not inputs:
        return "has no inputs"
    if name in protected and len(_output_ports(graph, name)) > 1:
        return ("a graph output with several outputs: renaming it would change its other "
                "outputs' names")
    if op in FORMATTED:
        return _formatted_plan(graph, name, inputs, rank)
    if op in ELEMENTWISE:
        return _elementwise_plan(graph, op, inputs, rank)
    if op in SPLITS:
        value, axis = SPLITS[op]
        if rank(inputs[value]) != 4:
            return "its input is not known to be 4-D"
        if graph.const_value(inputs[axis]) is None:
            return "its axis is not a constant"
        return Plan((value,), _output_ports(graph, name), (axis,))
    if rank(inputs[0]) != 4:
        return "its input is not known to be 4-D"
    if op == "ConcatV2":
        values = inputs[:-1]
        if graph.const_value(inputs[-1]) is None:
            return "its axis is not a constant"
        if any(rank(ref) != 4 for ref in values):
            return "not every input is known to be 4-D"
        return Plan(tuple(range(len(values))), (0,), (len(values),))
    if op in PADS:
        paddings = graph.const_value(inputs[1])
        if paddings is None or paddings.shape != (4, 2):
            return "its paddings are not a constant 4x2 table"
        return Plan((0,), (0,), (1,))
    if op in REDUCTIONS:
        return _reduction_plan(graph, name, inputs)
    if op == "Transpose":
        perm = graph.const_value(inputs[1])
        if perm is None or perm.shape != (4,):
            return "its permutation is not a constant of 4 axes"
        return Plan((0,), (), (1,))
    return NO_RULE


def _formatted_plan(graph: Graph, name: str, inputs: List[Ref], rank) -> Union[Plan, str]:
    data, sizes = FORMATTED[graph.op(name)]
    node = graph.node(name)
    for key in PER_AXIS_ATTRS:
        if key in node.attr and len(node.attr[key].list.i) not in (0, 4):
            return f"its {key} do not have 4 values"
    if rank(inputs[data]) != 4 and graph.op(name) == "BiasAdd":
        return "its input is not known to be 4-D"
    for slot in sizes:
        value = graph.const_value(inputs[slot])
        if value is None or value.shape not in ((4,), (2,)):
            return f"input {slot} (per-axis sizes) is not a constant of 4 (or 2 spatial) values"
    return Plan((data,), (0,), sizes)


def _output_ports(graph: Graph, name: str) -> Tuple[int, ...]:
    return tuple(range(num_outputs(graph.node(name)) or 1))


def _elementwise_plan(graph: Graph, op: str, inputs: List[Ref], rank) -> Union[Plan, str]:
    """4-D computed inputs read NHWC; constants broadcast against them are converted; computed
    scalars stay; a computed operand of another rank broadcasts by the layout: refused."""
    layout_in, constants = [], []
    for slot, ref in enumerate(inputs):
        value = graph.const_value(ref)
        if value is not None:
            if value.ndim > 4 or (op in NO_BROADCAST and value.ndim not in (0, 4)):
                return f"input {slot} is a constant of rank {value.ndim}"
            if value.ndim:
                constants.append(slot)
            continue
        r = rank(ref)
        if r == 4:
            layout_in.append(slot)
        elif r != 0:
            return (f"input {slot} has rank {r}: how it broadcasts depends on the layout" if r
                    is not None else f"the rank of input {slot} is not known")
    if not layout_in:
        return "no computed input is 4-D"
    return Plan(tuple(layout_in), (0,), tuple(constants))


def _reduction_plan(graph: Graph, name: str, inputs: List[Ref]) -> Union[Plan, str]:
    axes = graph.const_value(inputs[1])
    if axes is None or axes.ndim > 1:
        return "its axes are not a constant"
    if graph.attr(name, "keep_dims", False):
        return Plan((0,), (0,), (1,))
    reduced = {int(a) % 4 for a in np.reshape(axes, -1)}
    kept = [axis for axis in range(4) if axis not in reduced]
    if kept != sorted(kept, key=lambda axis: NHWC_AXIS[axis]):
        return (f"without keep_dims its result keeps NCHW axes {kept}, which NHWC orders "
                "differently")
    return Plan((0,), (), (1,))


def _converted_constant(op: str, value: np.ndarray) -> np.ndarray:
    """A constant input of a converted op, in NHWC terms."""
    if op == "ConcatV2" or op in SPLITS:
        return np.asarray(NHWC_AXIS[int(value) % 4], value.dtype)
    if op in FORMATTED:                         # per-axis sizes ([H, W] alone stay)
        return np.ascontiguousarray(value[list(TO_NHWC)]) if value.shape == (4,) else value
    if op in PADS:
        return np.ascontiguousarray(value[list(TO_NHWC)])
    if op in REDUCTIONS:
        return np.asarray([NHWC_AXIS[int(a) % 4] for a in np.reshape(value, -1)],
                          value.dtype).reshape(value.shape)
    if op == "Transpose":
        return np.asarray([TO_NCHW[int(axis)] for axis in value], value.dtype)
    # an element-wise operand broadcast against 4-D tensors
    four = np.reshape(value, (1,) * (4 - value.ndim) + value.shape)
    converted = np.transpose(four, TO_NHWC)
    while op not in NO_BROADCAST and converted.ndim and converted.shape[0] == 1:
        converted = converted[0]
    return np.ascontiguousarray(converted)


def _tensor_type(graph: Graph, name: str, index: int, output: bool):
    """The dtype of input slot (or output port) ``index`` of node ``name``, from its OpDef."""
    node, definition = graph.node(name), op_def(graph.op(name))
    position = 0
    for arg in (definition.output_arg if output else definition.input_arg):
        count = node.attr[arg.number_attr].i if arg.number_attr else \
            len(node.attr[arg.type_list_attr].list.type) if arg.type_list_attr else 1
        if index < position + count:
            if arg.type_list_attr:
                return node.attr[arg.type_list_attr].list.type[index - position]
            if arg.type:
                return arg.type
            if arg.type_attr in node.attr:
                return node.attr[arg.type_attr].type
            return next(a.default_value.type for a in definition.attr if a.name == arg.type_attr)
        position += count
    raise ValueError(f"{name} has no {'output' if output else 'input'} {index}")


def _dtype(enum: int):
    import tensorflow as tf
    return tf.dtypes.as_dtype(enum)
