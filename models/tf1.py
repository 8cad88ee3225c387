"""TF1-style frozen graphs: ref variables frozen to Const + `/read` Identity, conds as Switch/Merge.

Every builder makes its graph in a fresh `tf.Graph()` with v1 control flow switched on only while
it builds (see `v1_graph`), initialises its variables from seeded random arrays, and freezes them
with `convert_variables_to_constants`, which is what real frozen TF1 graphs went through.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfsurgery.models.common import BuiltModel, rng

_FUSED_BN = {
    "V1": tf.raw_ops.FusedBatchNorm,
    "V2": tf.raw_ops.FusedBatchNormV2,
    "V3": tf.raw_ops.FusedBatchNormV3,
}
_BN_EPSILON = 1e-3  # tf.layers' default, deliberately not the op's default 1e-4


# --- random parameters ------------------------------------------------------------------------

def random_kernel(r: np.random.Generator, shape: Sequence[int], fan_in: int,
                  gain: float = 1.0, dtype=np.float32) -> np.ndarray:
    """He-normal weights: keeps activations in range through Relu stacks."""
    return (r.standard_normal(shape) * gain * np.sqrt(2.0 / fan_in)).astype(dtype)


def random_bias(r: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    return r.normal(0.0, 0.5, shape).astype(dtype)


def random_bn(r: np.random.Generator, channels: int) -> dict:
    """BN parameters far from their fresh values (1, 0, 0, 1), so folding bugs show."""
    return {
        "gamma": r.uniform(0.5, 1.5, channels).astype(np.float32),
        "beta": r.normal(0.0, 0.5, channels).astype(np.float32),
        "moving_mean": r.normal(0.0, 0.5, channels).astype(np.float32),
        "moving_variance": r.uniform(0.5, 2.0, channels).astype(np.float32),
    }


# --- graph building helpers -------------------------------------------------------------------

@contextlib.contextmanager
def v1_graph() -> Iterator[tf.Graph]:
    """A fresh default graph in which `tf.compat.v1.cond`/`while_loop` emit Switch/Merge/Enter...

    The control-flow switch is process-global, so it is restored on the way out: Keras 3 builders
    that run later in the same process must get v2 control flow again.
    """
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as graph:
            yield graph
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()


def variable(name: str, value: np.ndarray) -> tf.Variable:
    """A TF1 ref variable (VariableV2) initialised to `value`; freezes to Const + `<name>/read`."""
    return tf.compat.v1.get_variable(
        name, shape=value.shape, dtype=tf.as_dtype(value.dtype),
        initializer=tf.compat.v1.constant_initializer(value), use_resource=False)


def freeze(graph: tf.Graph, outputs: Sequence[str]) -> tf.compat.v1.GraphDef:
    """Initialise the variables and turn them into constants, keeping what `outputs` need."""
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return tf.compat.v1.graph_util.convert_variables_to_constants(
            sess, graph.as_graph_def(), list(outputs))


def training_placeholder() -> tf.Tensor:
    return tf.compat.v1.placeholder_with_default(False, [], name="training")


def bn_variables(r: np.random.Generator, channels: int) -> dict:
    """gamma/beta/moving_mean/moving_variance variables in the current variable scope."""
    return {name: variable(name, value) for name, value in random_bn(r, channels).items()}


def fused_bn(x, bn: dict, *, version: str = "V3", is_training: bool = False,
             data_format: str = "NHWC", name: str = "FusedBatchNorm"):
    """One FusedBatchNorm{,V2,V3} op; returns its `y` output.

    Always passes the moving statistics, even with is_training=True (the kernel ignores them
    then), so a training-mode BN looks exactly as foldable as an inference one.
    """
    return _FUSED_BN[version](
        x=x, scale=bn["gamma"], offset=bn["beta"], mean=bn["moving_mean"],
        variance=bn["moving_variance"], epsilon=_BN_EPSILON, data_format=data_format,
        is_training=is_training, name=name)[0]


def bn_under_cond(x, training, bn: dict, version: str = "V3"):
    """The tf.layers pattern: cond(training, batch-statistics BN, moving-statistics BN).

    Both ops are named FusedBatchNorm, so the inference one is `<scope>/cond/FusedBatchNorm_1`
    as in the article.
    """
    def train():
        empty = tf.constant([], tf.float32)  # what nn.fused_batch_norm passes when training
        stats = dict(bn, moving_mean=empty, moving_variance=empty)
        return fused_bn(x, stats, version=version, is_training=True)

    return tf.compat.v1.cond(training, train, lambda: fused_bn(x, bn, version=version),
                             name="cond")


def dropout_under_cond(x, training, rate: float = 0.3):
    return tf.compat.v1.cond(training, lambda: tf.compat.v1.nn.dropout(x, rate=rate),
                             lambda: tf.identity(x), name="cond")


def conv(x, r: np.random.Generator, cout: int, *, data_format: str = "NHWC",
         bias: Optional[str] = "biasadd", kernel=None, strides: int = 1):
    """Conv2D (+ bias) in the current variable scope: `kernel`, `bias` variables.

    bias: "biasadd" -> BiasAdd(conv, b); "add" -> AddV2(conv, b); "add_swapped" -> AddV2(b, conv);
    None -> no bias. For AddV2 in NCHW the bias has shape [C, 1, 1] so it broadcasts.
    """
    cin = x.shape[1 if data_format == "NCHW" else -1]
    if kernel is None:
        kernel = variable("kernel", random_kernel(r, [3, 3, cin, cout], 9 * cin))
    y = tf.nn.conv2d(x, kernel, strides=strides, padding="SAME", data_format=data_format,
                     name="Conv2D")
    return add_bias(y, r, cout, bias, data_format)


def add_bias(y, r: np.random.Generator, channels: int, bias: Optional[str],
             data_format: str = "NHWC"):
    if bias is None:
        return y
    if bias == "biasadd":
        return tf.nn.bias_add(y, variable("bias", random_bias(r, [channels])),
                              data_format=data_format, name="BiasAdd")
    shape = [channels, 1, 1] if data_format == "NCHW" else [channels]
    b = variable("bias", random_bias(r, shape))
    if bias == "add":
        return tf.raw_ops.AddV2(x=y, y=b, name="add")
    if bias == "add_swapped":
        return tf.raw_ops.AddV2(x=b, y=y, name="add")
    raise ValueError(f"unknown bias style {bias!r}")


def dense(x, r: np.random.Generator, units: int, gain: float = 1.0):
    """MatMul + BiasAdd with `kernel`/`bias` variables in the current variable scope."""
    cin = int(x.shape[-1])
    w = variable("kernel", random_kernel(r, [cin, units], cin, gain))
    y = tf.linalg.matmul(x, w, name="MatMul")
    return tf.nn.bias_add(y, variable("bias", random_bias(r, [units])), name="BiasAdd")


def image_input(batch: Optional[int], size: int, channels: int, data_format: str = "NHWC",
                dtype=tf.float32):
    shape = ([batch, channels, size, size] if data_format == "NCHW"
             else [batch, size, size, channels])
    return tf.compat.v1.placeholder(dtype, shape, name="input")


def _built(graph: tf.Graph, outputs=("output",), inputs=("input",),
           training_flag: Optional[str] = None) -> BuiltModel:
    return BuiltModel(freeze(graph, outputs), list(inputs), list(outputs), training_flag)


# --- the article's model ----------------------------------------------------------------------

def article_cnn(seed: int = 0, image_size: int = 16, channels=(4, 8, 8), classes: int = 5,
                bn_version: str = "V3") -> BuiltModel:
    """The article's CNN: three conv -> cond-BN -> Relu -> cond-dropout -> max-pool blocks + dense.

    Names follow the article: `backend/conv_i/{kernel,bias,Conv2D,BiasAdd}`,
    `backend/bn_i/{gamma,beta,moving_mean,moving_variance}`, `backend/bn_i/cond/FusedBatchNorm_1`
    (the inference BN), `head/dense`, `output` (Softmax). `training` defaults to False.
    """
    r = rng(seed)
    with v1_graph() as graph:
        x = image_input(None, image_size, 3)
        training = training_placeholder()
        with tf.compat.v1.variable_scope("backend"):
            for i, cout in enumerate(channels, start=1):
                with tf.compat.v1.variable_scope(f"conv_{i}"):
                    x = conv(x, r, cout)
                with tf.compat.v1.variable_scope(f"bn_{i}"):
                    x = bn_under_cond(x, training, bn_variables(r, cout), bn_version)
                x = tf.nn.relu(x, name=f"relu_{i}")
                with tf.compat.v1.name_scope(f"dropout_{i}"):
                    x = dropout_under_cond(x, training)
                x = tf.nn.max_pool2d(x, 2, 2, "SAME", name=f"pool_{i}")
        with tf.compat.v1.variable_scope("head"):
            x = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))], name="flatten")
            with tf.compat.v1.variable_scope("dense"):
                x = dense(x, r, classes, gain=0.3)  # small logits: a saturated softmax hides errors
        tf.nn.softmax(x, name="output")
    return _built(graph, training_flag="training")


# --- small graphs for transform tests ---------------------------------------------------------

def conv_bn(seed: int = 0, data_format: str = "NHWC", bias: Optional[str] = "biasadd",
            bn_version: str = "V3", is_training: bool = False, batch: int = 2, size: int = 6,
            cin: int = 3, cout: int = 4) -> BuiltModel:
    """input -> Conv2D (+ bias) -> FusedBatchNorm -> Relu -> output.

    NCHW runs on CPU only through oneDNN (on by default on x86 Linux); with
    TF_ENABLE_ONEDNN_OPTS=0 Conv2D fails with "only supports the NHWC tensor format on the CPU".
    """
    r = rng(seed)
    with v1_graph() as graph:
        x = image_input(batch, size, cin, data_format)
        with tf.compat.v1.variable_scope("conv"):
            x = conv(x, r, cout, data_format=data_format, bias=bias)
        with tf.compat.v1.variable_scope("bn"):
            x = fused_bn(x, bn_variables(r, cout), version=bn_version, is_training=is_training,
                         data_format=data_format)
        tf.nn.relu(x, name="output")
    return _built(graph)


def depthwise_bn(seed: int = 0, multiplier: int = 1, data_format: str = "NHWC",
                 bias: Optional[str] = "biasadd", batch: int = 2, size: int = 6,
                 cin: int = 3) -> BuiltModel:
    """input -> DepthwiseConv2dNative (+ bias) -> FusedBatchNormV3 -> Relu -> output.

    The kernel is [3, 3, cin, multiplier]; output channel c = in_channel * multiplier + m.
    NCHW needs oneDNN on CPU, as for `conv_bn`.
    """
    r = rng(seed)
    cout = cin * multiplier
    with v1_graph() as graph:
        x = image_input(batch, size, cin, data_format)
        with tf.compat.v1.variable_scope("depthwise"):
            kernel = variable("kernel", random_kernel(r, [3, 3, cin, multiplier], 9))
            x = tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME",
                                       data_format=data_format, name="depthwise")
            x = add_bias(x, r, cout, bias, data_format)
        with tf.compat.v1.variable_scope("bn"):
            x = fused_bn(x, bn_variables(r, cout), data_format=data_format)
        tf.nn.relu(x, name="output")
    return _built(graph)


def shared_weights_bn(seed: int = 0) -> BuiltModel:
    """Two Conv2D reading the SAME kernel Const (no /read Identity between), each with its own
    BN; output = sum. Folding must copy the kernel, not scale it in place for both."""
    r = rng(seed)
    with v1_graph() as graph:
        x = image_input(2, 6, 3)
        kernel = tf.constant(random_kernel(r, [3, 3, 3, 4], 27), name="shared_kernel")
        branches = []
        for name, stride in (("a", 1), ("b", 2)):
            with tf.compat.v1.variable_scope(name):
                y = tf.nn.conv2d(x, kernel, strides=stride, padding="SAME", name="Conv2D")
                y = fused_bn(y, bn_variables(r, 4))
                branches.append(tf.reduce_mean(y, axis=[1, 2]))
        tf.add(branches[0], branches[1], name="output")
    return _built(graph)


def multi_consumer_bn(seed: int = 0) -> BuiltModel:
    """conv -> BN -> Relu, and the conv output also feeds the final Add: folding must skip."""
    r = rng(seed)
    with v1_graph() as graph:
        x = image_input(2, 6, 3)
        with tf.compat.v1.variable_scope("conv"):
            c = conv(x, r, 4, bias=None)
        with tf.compat.v1.variable_scope("bn"):
            y = tf.nn.relu(fused_bn(c, bn_variables(r, 4)))
        tf.add(y, c, name="output")
    return _built(graph)


def training_bn(seed: int = 0) -> BuiltModel:
    """conv -> FusedBatchNormV3(is_training=True) -> Relu: batch statistics, folding must skip."""
    return conv_bn(seed=seed, is_training=True)


def nonconst_weights_bn(seed: int = 0) -> BuiltModel:
    """conv whose kernel is a second placeholder `kernel` [3, 3, 3, 4], then BN: nothing to fold."""
    r = rng(seed)
    with v1_graph() as graph:
        x = image_input(2, 6, 3)
        kernel = tf.compat.v1.placeholder(tf.float32, [3, 3, 3, 4], name="kernel")
        with tf.compat.v1.variable_scope("conv"):
            y = conv(x, r, 4, kernel=kernel)
        with tf.compat.v1.variable_scope("bn"):
            y = fused_bn(y, bn_variables(r, 4))
        tf.nn.relu(y, name="output")
    return _built(graph, inputs=("input", "kernel"))


def cond_dropout(seed: int = 0, features: int = 8) -> BuiltModel:
    """Dense layers with a TF1 dropout on the inference path (RandomUniform, GreaterEqual, ...,
    no cond: the output is random even with training=False) and a second dropout under a cond."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="input")
        training = training_placeholder()
        with tf.compat.v1.variable_scope("dense_1"):
            x = tf.nn.relu(dense(x, r, 16))
        x = tf.compat.v1.nn.dropout(x, rate=0.25, name="dropout_1")
        with tf.compat.v1.variable_scope("dense_2"):
            x = tf.nn.relu(dense(x, r, 16))
        with tf.compat.v1.name_scope("dropout_2"):
            x = dropout_under_cond(x, training, rate=0.5)
        with tf.compat.v1.variable_scope("dense_3"):
            x = dense(x, r, 4)
        tf.identity(x, name="output")
    return _built(graph, training_flag="training")


def nested_cond(seed: int = 0, features: int = 8) -> BuiltModel:
    """Control flow that a position-based Switch/Merge remover gets wrong.

    - `outer`: cond(training, cond(training, a, b), c) — nested two deep.
    - `shared`: one raw Switch feeding two raw Merges, the second with its inputs in
      (true, false) order, the reverse of what tf.cond emits.
    - `output` also consumes `shared/merge_b:1` (value_index), cast to float.
    """
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="input")
        training = training_placeholder()
        with tf.compat.v1.variable_scope("dense"):
            x = tf.nn.tanh(dense(x, r, features))
        w = [tf.constant(random_kernel(r, [features, features], features), name=f"w{i}")
             for i in range(3)]
        def inner():
            return tf.compat.v1.cond(training, lambda: tf.matmul(x, w[0]),
                                     lambda: tf.matmul(x, w[1]), name="inner")

        with tf.compat.v1.name_scope("outer"):
            y = tf.compat.v1.cond(training, inner, lambda: tf.matmul(x, w[2]), name="cond")
        with tf.compat.v1.name_scope("shared"):
            off, on = tf.raw_ops.Switch(data=y, pred=training, name="switch")
            a = tf.raw_ops.Merge(inputs=[tf.nn.relu(off), tf.nn.tanh(on)], name="merge_a")
            b = tf.raw_ops.Merge(inputs=[tf.sigmoid(on), tf.abs(off)], name="merge_b")
        taken = tf.cast(b.value_index, tf.float32, name="taken")
        tf.add(a.output + b.output, taken, name="output")
    return _built(graph, training_flag="training")


def while_loop(seed: int = 0, features: int = 8, steps: int = 3) -> BuiltModel:
    """A v1 while loop (Enter/Exit/NextIteration/LoopCond) applying a dense tanh `steps` times,
    after a dense layer with a dropout under a training cond."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="input")
        training = training_placeholder()
        with tf.compat.v1.variable_scope("dense"):
            x = tf.nn.relu(dense(x, r, features))
        with tf.compat.v1.name_scope("dropout"):
            x = dropout_under_cond(x, training)
        with tf.compat.v1.variable_scope("loop"):
            w = variable("kernel", random_kernel(r, [features, features], features))
            b = variable("bias", random_bias(r, [features]))
            _, x = tf.compat.v1.while_loop(
                lambda i, h: i < steps,
                lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w) + b)),
                [tf.constant(0), x], name="while")
        tf.identity(x, name="output")
    return _built(graph, training_flag="training")


def mixed_precision_bn(seed: int = 0, batch: int = 2, size: int = 6, cin: int = 3,
                       cout: int = 4) -> BuiltModel:
    """float32 input -> Cast(half) -> Conv2D(half) + BiasAdd -> FusedBatchNormV3(T=half, U=float)
    -> Relu -> Cast(float32) -> output: the Keras mixed-precision shape."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.cast(image_input(batch, size, cin), tf.float16, name="to_half")
        with tf.compat.v1.variable_scope("conv"):
            k = variable("kernel", random_kernel(r, [3, 3, cin, cout], 9 * cin, dtype=np.float16))
            x = tf.nn.conv2d(x, k, 1, "SAME", name="Conv2D")
            x = tf.nn.bias_add(x, variable("bias", random_bias(r, [cout], np.float16)),
                               name="BiasAdd")
        with tf.compat.v1.variable_scope("bn"):
            x = tf.nn.relu(fused_bn(x, bn_variables(r, cout)))
        tf.cast(x, tf.float32, name="output")
    return _built(graph)
