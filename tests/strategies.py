"""Random TF1-style frozen graphs for the property tests: a hypothesis strategy draws a
``GraphSpec`` (plain data: a list of layer specs), ``build`` turns it into a GraphDef with
``tf.constant`` weights (nothing to freeze) inside ``models.tf1.v1_graph()`` (v1 control flow:
Switch/Merge).

A block is

    [BN on the block input]          bn_before: a BN that is not right after this block's linear op
    linear op                        Conv2D | DepthwiseConv2dNative | two Conv2D sharing one kernel
                                     | two Conv2D (each with the bias below) concatenated along
                                     the channel axis: the BN is split between them
                                     Const; the kernel read directly, through an Identity (frozen
                                     /read), from a placeholder (not constant), or also read by
                                     another op (it must be copied when scaled, not changed in
                                     place)
    [bias]                           BiasAdd | AddV2(z, b) | AddV2(b, z)
    [batch norm]                     FusedBatchNorm{,V2,V3}, optionally inside
                                     cond(training, batch-statistics BN, moving-statistics BN)
                                     | a decomposed per-channel chain of Mul / Add / AddV2 / Sub,
                                     any operand order (Keras 3: x*s + t)
    [relu | relu6]
    [dropout]                        inside cond(training, dropout, identity), or unconditional
    [+ linear output | bias output]  read by something else (an add, or it is a graph output): the
                                     BN must then stay
    [+ block input]                  residual add, when the shapes allow

followed by an optional dense head (flatten or spatial mean → MatMul, transpose_b or not → bias →
decomposed BN → activation). NHWC or NCHW (NCHW runs on CPU through oneDNN). Tensors are tiny
(batch 2, 5x5, 2–6 channels) so a graph builds and runs in milliseconds. Every number (weights,
biases, BN statistics, epsilons, dropout rates) comes from a numpy generator seeded by the spec;
variances are positive, spanning 1e-3..10.

``negated`` conds use ``LogicalNot(training)`` as predicate (branches swapped so the graph computes
the same): the live branch is then the Merge's *second* input.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np
from hypothesis import strategies as st

from tfsurgery.models.common import BuiltModel

BATCH, SIZE = 2, 5
MAX_CHANNELS = 6
BN_OPS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
Steps = Tuple[Tuple[str, bool], ...]        # ((op, operands swapped), ...)


# ---------------------------------------------------------------- specs (plain, printable data)
@dataclasses.dataclass(frozen=True)
class BlockSpec:
    linear: str                       # "conv" | "depthwise" | "shared" | "concat"
    channels: int                     # conv: output channels; depthwise: multiplier
    kernel: str                       # "const" | "identity" | "placeholder" | "also_read"
    second_bn: bool                   # "shared": the second conv has its own BN too
    bias: Optional[str]               # None | "biasadd" | "add" | "add_swapped"
    bn: Optional[str]                 # None | "fused" | "decomposed"
    bn_version: str                   # "V1" | "V2" | "V3"
    bn_cond: bool                     # fused BN inside cond(training, train-BN, inference-BN)
    bn_params_in_branch: bool         # the cond's BN constants created inside its branches
    decomposed: Steps
    param_shape: str                  # "vector" | "broadcast" (rank 4 / [C,1,1]) | "scalar"
    activation: Optional[str]         # None | "relu" | "relu6"
    dropout: Optional[str]            # None | "cond" | "plain"
    residual: bool
    residual_swapped: bool
    extra_consumer: Optional[str]     # None | "add" | "output" | "bias"
    bn_before: bool


@dataclasses.dataclass(frozen=True)
class HeadSpec:
    pool: str                         # "flatten" | "mean" (then the matrix can be square)
    units: int
    transpose_b: bool
    kernel: str                       # as BlockSpec.kernel
    bias: Optional[str]
    decomposed: Steps
    param_shape: str                  # "vector" | "broadcast" ([1, U]) | "scalar"
    activation: Optional[str]
    algebra: Optional[str] = None     # a form simplify-algebra removes, after the bias (ALGEBRA)


# Algebraic no-ops (and near no-ops) simplify-algebra must remove without moving the numbers.
ALGEBRA = {
    "ones_like": lambda tf, y: y * tf.raw_ops.OnesLike(x=y),
    "zeros_like": lambda tf, y: y + tf.raw_ops.ZerosLike(x=y),
    "split": lambda tf, y: tf.raw_ops.Split(axis=1, value=y, num_split=1)[0],
    "minus_neg": lambda tf, y: tf.nn.relu(y) - (-y),            # Sub(Neg) → AddV2
    "plus_neg": lambda tf, y: tf.nn.relu(y) + (-y),             # Add(Neg) → Sub
    "double": lambda tf, y: tf.nn.relu(y) + tf.nn.relu(y),      # merged (p + p stays)
    # remove-noop-shape-ops: shape ops that hand their input through ([batch, units])
    "tile_ones": lambda tf, y: tf.tile(y, [1, 1]),
    "pad_zeros": lambda tf, y: tf.pad(y, [[0, 0], [0, 0]]),
    "slice_whole": lambda tf, y: tf.slice(y, [0, 0], [-1, -1]),
    "strided_whole": lambda tf, y: y[:, :],
    "stack_pick": lambda tf, y: tf.stack([tf.nn.relu(y), y], axis=1)[:, 1],
}
ALGEBRA_GONE = {"OnesLike", "ZerosLike", "Split", "Neg", "Tile", "Pad", "Slice", "StridedSlice",
                "Pack"}


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    data_format: str                  # "NHWC" | "NCHW"
    in_channels: int
    blocks: Tuple[BlockSpec, ...]
    head: Optional[HeadSpec]
    flag: str                         # "default" (PlaceholderWithDefault False) | "placeholder"
    param_reads: str                  # BN parameters / biases read "direct" or via "identity"
    negated: bool                     # conds predicate on LogicalNot(training)
    output_identity: bool             # end with Identity "output", or use the last op's own name
    seed: int


@dataclasses.dataclass
class Built:
    """The graph plus what the property test may expect of its optimized form."""

    model: BuiltModel
    fold_linear: List[str]            # linear ops that must end up read by exactly one BiasAdd
    fold_bn: List[str]                # batch-norm op names that must not survive as batch norms
    may_keep_bn: List[str]            # the only batch norms allowed to survive (unsafe to fold)
    spec: GraphSpec
    # unconditional dropouts: output tensor → input tensor (dropout off: the output IS the
    # input, in expectation) — how the oracle builds its own reference
    no_dropout: dict = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------- strategies
_AFFINE_OPS = ("Mul", "AddV2", "Add", "Sub")


def decomposed_chain():
    """1–3 per-channel affine steps; the Keras 3 shape ``x*s + t`` (Mul then Add/Sub) is common."""
    step = st.tuples(st.sampled_from(_AFFINE_OPS), st.booleans())
    keras = st.tuples(st.booleans(), st.sampled_from(("AddV2", "Add", "Sub")), st.booleans()).map(
        lambda t: (("Mul", t[0]), (t[1], t[2])))
    return st.one_of(keras, st.lists(step, min_size=1, max_size=3).map(tuple))


_PARAM_SHAPES = ("vector", "vector", "broadcast", "scalar")
_ACTIVATIONS = (None, "relu", "relu6")
_BIASES = (None, "biasadd", "add", "add_swapped")


@st.composite
def block_specs(draw) -> BlockSpec:
    linear = draw(st.sampled_from(("conv", "conv", "depthwise", "shared", "concat")))
    channels = draw(st.integers(2, MAX_CHANNELS) if linear != "depthwise" else st.integers(1, 2))
    bn = draw(st.sampled_from((None, "fused", "fused", "decomposed", "decomposed")))
    bn_cond = bn == "fused" and draw(st.booleans())
    bias = draw(st.sampled_from(_BIASES))
    extras = (None, None, None, None, "add", "output") + (("bias",) if bias else ())
    if linear == "concat":              # the first conv's channels differ from the concat's
        extras = (None, None, None, "output")
    return BlockSpec(
        linear=linear, channels=channels,
        kernel=draw(st.sampled_from(("const", "const", "identity", "identity", "placeholder",
                                     "also_read"))),
        second_bn=draw(st.booleans()), bias=bias, bn=bn,
        bn_version=draw(st.sampled_from(("V1", "V2", "V3"))), bn_cond=bn_cond,
        bn_params_in_branch=bn_cond and draw(st.booleans()),
        decomposed=draw(decomposed_chain()) if bn == "decomposed" else (),
        param_shape=draw(st.sampled_from(_PARAM_SHAPES)),
        activation=draw(st.sampled_from(_ACTIVATIONS)),
        dropout=draw(st.sampled_from((None, None, "cond", "plain"))),
        residual=draw(st.booleans()), residual_swapped=draw(st.booleans()),
        extra_consumer=None if linear == "shared" else draw(st.sampled_from(extras)),
        bn_before=draw(st.integers(0, 7)) == 0)


@st.composite
def head_specs(draw) -> HeadSpec:
    has_bn = draw(st.booleans())
    return HeadSpec(
        pool=draw(st.sampled_from(("flatten", "mean"))),
        units=draw(st.integers(2, MAX_CHANNELS)), transpose_b=draw(st.booleans()),
        kernel=draw(st.sampled_from(("const", "identity", "placeholder", "also_read"))),
        bias=draw(st.sampled_from(_BIASES)),
        decomposed=draw(decomposed_chain()) if has_bn else (),
        param_shape=draw(st.sampled_from(_PARAM_SHAPES)),
        activation=draw(st.sampled_from(_ACTIVATIONS)),
        algebra=draw(st.sampled_from((None,) + tuple(sorted(ALGEBRA)))))


@st.composite
def graph_specs(draw, max_blocks: int = 4, negated: bool = False) -> GraphSpec:
    """``negated=True``: every cond predicates on LogicalNot(training), and there is one."""
    data_format = draw(st.sampled_from(("NHWC", "NCHW")))
    in_channels = draw(st.integers(2, MAX_CHANNELS))
    min_blocks = 0 if draw(st.integers(0, 9)) == 0 and not negated else 1
    blocks = list(draw(st.lists(block_specs(), min_size=min_blocks, max_size=max_blocks)))
    if negated and not any(b.bn_cond or b.dropout == "cond" for b in blocks):
        blocks[0] = dataclasses.replace(blocks[0], dropout="cond")
    head = draw(st.none() | head_specs()) if blocks else draw(head_specs())
    return GraphSpec(data_format, in_channels, tuple(blocks), head,
                     flag=draw(st.sampled_from(("default", "placeholder"))),
                     param_reads=draw(st.sampled_from(("direct", "identity"))),
                     negated=negated, output_identity=draw(st.booleans()),
                     seed=draw(st.integers(0, 2 ** 32 - 1)))


# ---------------------------------------------------------------- the builder
def build(spec: GraphSpec) -> Built:
    import tensorflow as tf
    from tfsurgery.models import tf1
    return _Builder(spec, tf, tf1).run()


def _worth_folding(steps) -> bool:
    """fold-batch-norm's rule: any chain is folded, except a lone bias add (already folded)."""
    return len(steps) > 1 or (len(steps) == 1 and steps[0][0] not in ("BiasAdd", "Add", "AddV2"))


class _Builder:
    def __init__(self, spec: GraphSpec, tf, tf1):
        self.spec, self.tf, self.tf1 = spec, tf, tf1
        self.r = np.random.default_rng(spec.seed)
        self.nchw = spec.data_format == "NCHW"
        self.fold_linear: List[str] = []
        self.fold_bn: List[str] = []
        self.may_keep_bn: List[str] = []
        self.no_dropout: dict = {}
        self.outputs: List[str] = []
        self.inputs: List[str] = ["input"]
        self.also_read: list = []
        self.concat_partner: Optional[str] = None     # the second conv of a "concat" block

    # --- constants
    def const(self, value):
        return self.tf.constant(np.asarray(value, np.float32))

    def param(self, value):
        """A BN parameter or bias: a Const, read through an Identity in 'identity' graphs."""
        c = self.const(value)
        return self.tf.identity(c) if self.spec.param_reads == "identity" else c

    def kernel_value(self, shape, fan_in):
        return self.r.standard_normal(shape) * np.sqrt(2.0 / fan_in)

    def bn_values(self, channels):
        r = self.r
        return {"gamma": r.uniform(0.5, 1.5, channels) * r.choice([-1.0, 1.0], channels),
                "beta": r.normal(0.0, 0.5, channels),
                "mean": r.normal(0.0, 0.5, channels),
                "variance": 10.0 ** r.uniform(-3.0, 1.0, channels)}

    def bn_params(self, values):
        return {k: self.param(v) for k, v in values.items()}

    def per_channel(self, channels, kind, rank, *, scale=False):
        """A per-channel constant in a layout that broadcasts along the channel axis."""
        r = self.r
        if scale:
            value = r.uniform(0.3, 2.0, channels) * r.choice([-1.0, 1.0], channels)
        else:
            value = r.normal(0.0, 0.5, channels)
        if kind == "scalar":
            return self.param(value[0])
        if rank == 2:
            return self.param(value.reshape(1, -1) if kind == "broadcast" else value)
        if self.nchw:
            shape = [1, channels, 1, 1] if kind == "broadcast" else [channels, 1, 1]
        else:
            shape = [1, 1, 1, channels] if kind == "broadcast" else [channels]
        return self.param(value.reshape(shape))

    # --- control flow
    def cond(self, training, on_true, on_false):
        tf = self.tf
        if self.spec.negated:
            return tf.compat.v1.cond(tf.logical_not(training), on_false, on_true)
        return tf.compat.v1.cond(training, on_true, on_false)

    # --- layers
    def channels_of(self, x) -> int:
        return int(x.shape[1 if self.nchw and x.shape.rank == 4 else -1])

    def bias(self, z, style, rank=4):
        tf = self.tf
        if style is None:
            return z
        channels = self.channels_of(z)
        if style == "biasadd":
            return tf.nn.bias_add(z, self.param(self.r.normal(0, 0.5, channels)),
                                  data_format=self.spec.data_format if rank == 4 else None)
        b = self.per_channel(channels, "vector", rank)
        return tf.raw_ops.AddV2(x=z, y=b) if style == "add" else tf.raw_ops.AddV2(x=b, y=z)

    def decomposed(self, z, steps, param_shape, rank=4):
        channels = self.channels_of(z)
        for op, swapped in steps:
            c = self.per_channel(channels, param_shape, rank, scale=(op == "Mul"))
            a, b = (c, z) if swapped else (z, c)
            z = getattr(self.tf.raw_ops, op)(x=a, y=b)
        return z

    def fused_bn(self, x, params, version, is_training=False):
        tf = self.tf
        op = {"V1": tf.raw_ops.FusedBatchNorm, "V2": tf.raw_ops.FusedBatchNormV2,
              "V3": tf.raw_ops.FusedBatchNormV3}[version]
        return op(x=x, scale=params["gamma"], offset=params["beta"], mean=params["mean"],
                  variance=params["variance"], epsilon=float(self.r.uniform(1e-5, 1e-2)),
                  data_format=self.spec.data_format, is_training=is_training)[0]

    def bn(self, z, block: BlockSpec, training):
        """Returns (output, name of the inference BN op)."""
        values = self.bn_values(self.channels_of(z))
        if not block.bn_cond:
            y = self.fused_bn(z, self.bn_params(values), block.bn_version)
            return y, y.op.name
        outside = None if block.bn_params_in_branch else self.bn_params(values)
        names = {}

        def train():
            params = outside or self.bn_params(values)
            empty = self.tf.constant([], self.tf.float32)
            return self.fused_bn(z, dict(params, mean=empty, variance=empty), block.bn_version,
                                 is_training=True)

        def infer():
            y = self.fused_bn(z, outside or self.bn_params(values), block.bn_version)
            names["bn"] = y.op.name
            return y

        return self.cond(training, train, infer), names["bn"]

    def activation(self, x, kind):
        return {None: lambda t: t, "relu": self.tf.nn.relu, "relu6": self.tf.nn.relu6}[kind](x)

    def dropout(self, x, kind, training):
        tf = self.tf
        if kind is None:
            return x
        rate = float(self.r.uniform(0.1, 0.6))
        if kind == "plain":
            y = tf.compat.v1.nn.dropout(x, rate=rate)
            self.no_dropout[y.name] = x.name
            return y
        return self.cond(training, lambda: tf.compat.v1.nn.dropout(x, rate=rate),
                         lambda: tf.identity(x))

    def read_kernel(self, value, source: str):
        tf = self.tf
        if source == "placeholder":
            k = tf.compat.v1.placeholder(tf.float32, value.shape, name=f"kernel_{len(self.inputs)}")
            self.inputs.append(k.op.name)
            return k
        k = self.const(value)
        if source == "also_read":
            self.also_read.append(k)
        return tf.identity(k) if source == "identity" else k

    def read_kernel_elsewhere(self, y, x):
        """Make each 'also_read' kernel Const feed a non-constant op too."""
        for k in self.also_read:
            y = y + self.tf.reduce_sum(k * self.tf.reduce_mean(x)) * 0.01
        self.also_read = []
        return y

    def linear(self, x, block: BlockSpec):
        """The block's linear op(s) (+ bias): [(linear op output, biased output), ...]."""
        tf = self.tf
        fmt = self.spec.data_format
        cin = self.channels_of(x)
        if block.linear == "depthwise":
            k = self.read_kernel(self.kernel_value([3, 3, cin, block.channels], 9), block.kernel)
            z = tf.nn.depthwise_conv2d(x, k, [1, 1, 1, 1], "SAME", data_format=fmt)
            return [(z, self.bias(z, block.bias))]
        k = self.read_kernel(self.kernel_value([3, 3, cin, block.channels], 9 * cin),
                             block.kernel)
        if block.linear == "concat":        # z: the first conv; the second gets its own kernel
            z = tf.nn.conv2d(x, k, 1, "SAME", data_format=fmt)
            cout = int(self.r.integers(1, 4))
            partner = tf.nn.conv2d(x, self.const(self.kernel_value([1, 1, cin, cout], cin)), 1,
                                   "SAME", data_format=fmt)
            self.concat_partner = partner.op.name
            y = tf.concat([self.bias(z, block.bias), self.bias(partner, block.bias)],
                          1 if self.nchw else 3)
            return [(z, y)]
        out = []
        for _ in range(2 if block.linear == "shared" else 1):   # "shared": one kernel, two convs
            z = tf.nn.conv2d(x, k, 1, "SAME", data_format=fmt)
            out.append((z, self.bias(z, block.bias)))
        return out

    def block(self, x, block: BlockSpec, training):
        tf = self.tf
        block_input = x
        if block.bn_before:
            values = self.bn_values(self.channels_of(x))
            x = self.fused_bn(x, self.bn_params(values), block.bn_version)
            self.may_keep_bn.append(x.op.name)
        safe = block.extra_consumer is None and block.kernel != "placeholder"
        steps = ((("BiasAdd", False),) if block.bias else ()) + block.decomposed
        if block.linear == "concat":     # the chain after the concat; a kernel read elsewhere
            steps = block.decomposed     # is refused there (a slice of the BN is not copied)
            safe = safe and block.kernel != "also_read"
        branches, biased = [], None
        for i, (z, y) in enumerate(self.linear(x, block)):
            biased = y
            if i == 1 and not block.second_bn:
                pass
            elif block.bn == "fused":
                y, bn_name = self.bn(y, block, training)
                (self.fold_bn if safe else self.may_keep_bn).append(bn_name)
                if safe:
                    self.fold_linear.append(z.op.name)
            elif block.bn == "decomposed":
                y = self.decomposed(y, block.decomposed, block.param_shape)
                if safe and _worth_folding(steps):
                    self.fold_linear.append(z.op.name)
            branches.append((z, y))
        if block.linear == "concat" and branches[0][0].op.name in self.fold_linear:
            self.fold_linear.append(self.concat_partner)
        z = branches[0][0]
        y = branches[0][1] if len(branches) == 1 else tf.add(branches[0][1], branches[1][1])
        y = self.activation(y, block.activation)
        y = self.dropout(y, block.dropout, training)
        if block.extra_consumer == "add":
            y = y + z
        elif block.extra_consumer == "bias":
            y = y + 0.5 * biased
        elif block.extra_consumer == "output":
            self.outputs.append(z.op.name)
        y = self.read_kernel_elsewhere(y, block_input)
        if block.residual and y.shape == block_input.shape:
            y = tf.add(block_input, y) if block.residual_swapped else tf.add(y, block_input)
        return y

    def head(self, x, head: HeadSpec):
        tf = self.tf
        if head.pool == "mean" and x.shape.rank == 4:
            x = tf.reduce_mean(x, axis=[2, 3] if self.nchw else [1, 2])
        else:
            x = tf.reshape(x, [BATCH, -1])
        features = int(x.shape[-1])
        w = self.kernel_value([features, head.units], features) * 0.5
        k = self.read_kernel(w.T if head.transpose_b else w, head.kernel)
        z = tf.linalg.matmul(x, k, transpose_b=head.transpose_b)
        y = self.bias(z, head.bias, rank=2)
        if head.decomposed:
            y = self.decomposed(y, head.decomposed, head.param_shape, rank=2)
            steps = ((("BiasAdd", False),) if head.bias else ()) + head.decomposed
            if _worth_folding(steps) and head.kernel != "placeholder":
                self.fold_linear.append(z.op.name)
        y = self.read_kernel_elsewhere(y, x)
        if head.algebra:
            y = ALGEBRA[head.algebra](tf, y)
        return self.activation(y, head.activation)

    def run(self) -> Built:
        tf, spec = self.tf, self.spec
        with self.tf1.v1_graph() as graph:
            shape = ([BATCH, spec.in_channels, SIZE, SIZE] if self.nchw
                     else [BATCH, SIZE, SIZE, spec.in_channels])
            x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
            if spec.flag == "default":
                training = tf.compat.v1.placeholder_with_default(False, [], name="training")
            else:
                training = tf.compat.v1.placeholder(tf.bool, [], name="training")
            for block in spec.blocks:
                x = self.block(x, block, training)
            if spec.head is not None:
                x = self.head(x, spec.head)
            if spec.output_identity:
                x = tf.identity(x, name="output")
            outputs = [x.op.name] + [o for o in self.outputs if o != x.op.name]
            graph_def = graph.as_graph_def()
        model = BuiltModel(graph_def, self.inputs, outputs, "training")
        return Built(model, self.fold_linear, self.fold_bn, self.may_keep_bn, spec,
                     self.no_dropout)
