"""Our peers' test graphs, re-created as small frozen graphs with random values, through tfsurgery.

Each case names the peer test it comes from:
- TF  = tensorflow/python/tools/optimize_for_inference_test.py
- GT  = tensorflow/tools/graph_transforms/fold_old_batch_norms_test.cc / fold_batch_norms_test.cc
- GTF = tensorflow/tools/graph_transforms/fold_batch_norms_test.cc
- GTS = graph_transforms' fold_subdivmul_batch_norms_test.cc,
  GTA = graph_transforms' fold_batch_norms_algebraic_test.cc
- T2O = onnx/tensorflow-onnx tests/test_backend.py
- T2OC = onnx/tensorflow-onnx tests/test_cond.py (each built as v1 Switch/Merge and TF2 If/Case)
Every case asserts the ops that must be gone (or stay) and that the outputs match the original.
Loop/cond cases that tests/test_control_flow.py already has (test_fold_cond_keras_learning_phase
in TF2 form, test_while_loop_in_cond and test_cond_in_while_loop in v1 form) are not repeated.
"""
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches, assert_same_numbers, ops, optimize, report_of
from tfsurgery import api
from tfsurgery.models.common import BuiltModel
from tfsurgery.models.tf1 import v1_graph

import oracle

R = np.random.default_rng(7)


def const(shape, low=None, high=None):
    value = R.uniform(low, high, shape) if low is not None else R.standard_normal(shape)
    return tf.constant(value.astype(np.float32))


def built(graph, inputs=("input",), outputs=("output",)):
    return BuiltModel(graph.as_graph_def(), list(inputs), list(outputs))


def conv_input(batch=2, size=6, channels=2, data_format="NHWC"):
    shape = [batch, channels, size, size] if data_format == "NCHW" else [batch, size, size,
                                                                          channels]
    return tf.compat.v1.placeholder(tf.float32, shape, name="input")


def old_batch_norm(graph_def, x, channels, scale_after, name):
    """Append a BatchNormWithGlobalNormalization (removed from TF at GraphDef version 9, so it
    is written as a NodeDef; the graph is marked as produced by version 8, like old graphs)."""
    params = [const([channels]), const([channels], 0.5, 2.0), const([channels]),
              const([channels], 0.5, 1.5)]
    with tf.Graph().as_default() as holder:
        for index, value in enumerate(params):
            tf.constant(value.numpy() if hasattr(value, "numpy") else value,
                        name=f"{name}/param_{index}")
    graph_def.node.extend(holder.as_graph_def().node)
    node = graph_def.node.add(name=name, op="BatchNormWithGlobalNormalization")
    node.input.extend([x] + [f"{name}/param_{i}" for i in range(4)])
    node.attr["T"].type = tf.float32.as_datatype_enum
    node.attr["variance_epsilon"].f = 1e-5
    node.attr["scale_after_normalization"].b = scale_after
    graph_def.versions.producer = 8
    return name


@pytest.mark.parametrize("scale_after", [True, False])
def test_fold_old_batch_norm_into_conv(scale_after):
    """TF testFoldBatchNorms; GT TestFoldOldBatchNorms: Conv2D + BatchNormWithGlobalNormalization."""
    with tf.Graph().as_default() as graph:
        x = conv_input()
        tf.nn.conv2d(x, const([1, 2, 2, 2]), [1, 1, 1, 1], "VALID", name="conv")
    graph_def = graph.as_graph_def()
    bn = old_batch_norm(graph_def, "conv", 2, scale_after, "bn")
    graph_def.node.add(name="output", op="Identity", input=[bn]).attr["T"].type = \
        tf.float32.as_datatype_enum
    result = optimize(BuiltModel(graph_def, ["input"], ["output"]))
    assert "BatchNormWithGlobalNormalization" not in ops(result.graph_def)
    assert ops(result.graph_def).count("Conv2D") == 1
    assert_matches(result, 1e-5)


def test_old_batch_norm_into_depthwise_and_alone():
    """GT TestFoldOldBatchNorms with a depthwise conv, and a BN after nothing foldable."""
    with tf.Graph().as_default() as graph:
        x = conv_input()
        tf.nn.depthwise_conv2d(x, const([2, 2, 2, 2]), [1, 1, 1, 1], "VALID", name="conv")
    graph_def = graph.as_graph_def()
    first = old_batch_norm(graph_def, "conv", 4, True, "bn_1")
    relu = graph_def.node.add(name="relu", op="Relu", input=[first])
    relu.attr["T"].type = tf.float32.as_datatype_enum
    second = old_batch_norm(graph_def, "relu", 4, False, "bn_2")
    graph_def.node.add(name="output", op="Identity", input=[second]).attr["T"].type = \
        tf.float32.as_datatype_enum
    result = optimize(BuiltModel(graph_def, ["input"], ["output"]))
    assert "BatchNormWithGlobalNormalization" not in ops(result.graph_def)
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("op", ["FusedBatchNorm", "FusedBatchNormV3"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("conv", ["conv2d", "depthwise"])
def test_fold_fused_batch_norm(op, data_format, conv):
    """TF testFoldFusedBatchNorms / testFoldFusedBatchNormsV3 (conv2d and depthwise, NHWC and
    NCHW); GT TestFoldFusedBatchNorms, TestFoldFusedBatchNormsAfterDepthwiseConv2dNative."""
    with v1_graph() as graph:
        x = conv_input(data_format=data_format)
        if conv == "conv2d":
            y = tf.nn.conv2d(x, const([1, 2, 2, 2]), [1, 1, 1, 1], "SAME", data_format=data_format)
        else:
            y = tf.nn.depthwise_conv2d(x, const([1, 2, 2, 1]), [1, 1, 1, 1], "SAME",
                                       data_format=data_format)
        y = getattr(tf.raw_ops, op)(x=y, scale=const([2], 0.5, 1.5), offset=const([2]),
                                    mean=const([2]), variance=const([2], 0.5, 2.0), epsilon=1e-5,
                                    data_format=data_format, is_training=False)[0]
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert op not in ops(result.graph_def)
    assert_matches(result, 1e-5)


def test_check_numerics_and_asserts_are_stripped():
    """TF testOptimizeForInference (its CheckNumerics and Identity nodes go)."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        y = tf.debugging.check_numerics(x * const([3]), "x is not finite")
        check = tf.raw_ops.Assert(condition=tf.reduce_all(tf.math.is_finite(y)), data=[y])
        with tf.control_dependencies([check]):
            y = tf.identity(y)
        y = tf.raw_ops.Print(input=y, data=[y], message="y")
        tf.identity(y + const([3]), name="output")
    result = optimize(built(graph))
    assert not {"CheckNumerics", "Assert", "Print", "NoOp"} & set(ops(result.graph_def))
    assert len(report_of(result, "strip-debug").rewritten) == 3
    assert_matches(result, 0.0)
    kept = optimize(built(graph), keep_asserts=True)
    assert {"CheckNumerics", "Assert"} <= set(ops(kept.graph_def))


def test_tf1_dropout_with_a_keep_prob_placeholder():
    """T2O test_dropout: tf.nn.dropout(x, keep_prob) with keep_prob a placeholder."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        keep = tf.compat.v1.placeholder(tf.float32, [], name="keep_prob")
        y = tf.compat.v1.nn.dropout(x * const([3]), keep_prob=keep)
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert not {"RandomUniform", "Floor", "GreaterEqual"} & set(ops(result.graph_def))
    assert result.original_extra_feeds == {"keep_prob": 1.0} and result.inputs == ["input"]
    assert_matches(result, 1e-6, original_feeds={"keep_prob": 1.0})


def test_tf2_dropout_with_a_rate_tensor_and_noise_shape():
    """T2O test_nn_dropout: tf.nn.dropout(x, rate) with a tensor rate, and noise_shape."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 4, 3], name="input")
        rate = tf.compat.v1.placeholder(tf.float32, [], name="dropout_rate")
        y = tf.nn.dropout(x * const([3]), rate=rate, noise_shape=[2, 1, 3])
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert not {"RandomUniform", "GreaterEqual"} & set(ops(result.graph_def))
    assert result.original_extra_feeds == {"dropout_rate": 0.0}
    assert_matches(result, 1e-6, original_feeds={"dropout_rate": 0.0})


def test_constant_rate_dropout_is_checked_against_its_expected_value():
    """T2O test_dropout with a constant rate: the original is random; the reference is the
    original with each mask at its expected value, built by the verifier."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        h = x * const([3])
        y = tf.nn.dropout(h, rate=0.4)
        tf.identity(y + const([3]), name="output")
    result = optimize(built(graph))
    assert "RandomUniform" not in ops(result.graph_def)
    assert "expected or neutral" in result.verification.reference
    # The oracle's own expected value: dropout's mean is its input, fed in its output's place.
    feeds = oracle.random_feeds(graph.as_graph_def(), ["input"], seed=1)
    kept = oracle.run(graph.as_graph_def(), feeds, [h.name])[0]
    assert_matches(result, 1e-6, feeds=feeds, original_feeds={y.name: kept})


# ---------------------------------------------------------------- shared helpers
def check_both(result, feeds_list):
    """Verification passed on its own feeds, and again on each feed set given (data-dependent
    control flow: each side of the predicate)."""
    assert_matches(result, 1e-5)
    for feeds in feeds_list:
        assert_same_numbers(result, tolerance=1e-5, feeds=feeds)   # the oracle on each side
        again = api.verify_result(result, feeds=feeds)
        assert again.passed, again


def conv_const_input(shape):
    """The peers' inputs are Consts; ours are placeholders so the folds meet real inputs."""
    return tf.compat.v1.placeholder(tf.float32, shape, name="input")


# ---------------------------------------------------------------- TF optimize_for_inference_test
def test_optimize_for_inference_constant_graph_with_checks():
    """TF testOptimizeForInference itself: a graph with no inputs at all, CheckNumerics guarding
    Identities by control edges, an unused constant and an unconnected Add."""
    with v1_graph() as graph:
        unused = tf.constant(0.0, name="unused_constant")
        tf.add(unused, unused, name="unconnected_add")
        a, b = const([]), const([])
        with tf.control_dependencies([tf.debugging.check_numerics(a, "a", name="a_check")]):
            a_id = tf.identity(a, name="a_identity")
        with tf.control_dependencies([tf.debugging.check_numerics(b, "b", name="b_check")]):
            b_id = tf.identity(b, name="b_identity")
        add = tf.add(a_id, b_id, name="add")
        tf.add(add, b, name="unused_output_add")
    result = optimize(built(graph, inputs=(), outputs=("add",)))
    left = {n.name: n.op for n in result.graph_def.node}
    assert not {"CheckNumerics", "Identity"} & set(left.values())
    assert not {"unconnected_add", "unused_constant", "unused_output_add"} & set(left)
    assert_matches(result, 0.0)


def phase_train_graph(kind, form):
    """A training switch steering a cond: `phase_train` (Placeholder) or `keras_learning_phase`
    (PlaceholderWithDefault(True)), as v1 Switch/Merge or TF2 If."""
    a, b = R.standard_normal((2, 3)).astype(np.float32)
    context = v1_graph() if form == "v1" else tf.Graph().as_default()
    with context as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        if kind == "placeholder":
            flag = tf.compat.v1.placeholder(tf.bool, [], name="phase_train")
        else:
            flag = tf.compat.v1.placeholder_with_default(True, [], name="keras_learning_phase")
        cond = tf.compat.v1.cond if form == "v1" else tf.cond
        y = cond(flag, lambda: tf.nn.relu(x * a), lambda: tf.nn.relu(x * b))
        tf.identity(y, name="output")
    return built(graph)


@pytest.mark.parametrize("kind, form, value", [
    ("placeholder", "v1", None),                 # TF testConvertPlaceholderToConstant
    ("placeholder", "v1", True),                 # TF testConvertPlaceholderToConstant2
    ("with_default", "v1", None),                # TF testConvertPlaceholderWithDefaultToConstant
    ("with_default", "v2", None),                # TF testConvertPlaceholderWithDefaultToConstant2
])
def test_training_placeholder_becomes_its_inference_value(kind, form, value):
    """TF testConvertPlaceholderToConstant(2), testConvertPlaceholderWithDefaultToConstant(2):
    phase_train=False by default (=True when asked); keras_learning_phase, default True, is
    False at inference."""
    model = phase_train_graph(kind, form)
    name = "phase_train" if kind == "placeholder" else "keras_learning_phase"
    values = {name: value} if value is not None else None
    result = optimize(model, inference_values=values)
    left = set(ops(result.graph_def))
    assert name not in {n.name for n in result.graph_def.node if "Placeholder" in n.op}
    assert not left & {"Switch", "Merge", "If", "StatelessIf"}
    assert result.original_extra_feeds[name] == (value if value is not None else False)
    assert_matches(result, 1e-6, original_feeds={name: value if value is not None else False})


@pytest.mark.parametrize("mode", ["REFLECT", "CONSTANT"])
@pytest.mark.parametrize("resize", [True, False])
def test_resize_and_pad_before_conv(resize, mode):
    """TF testFuseResizePadAndConv, testFuseResizeAndConv, testFusePadAndConv: we have no fused
    resize+pad+conv op; a mirror pad and a resize stay, a zero pad folds into the conv."""
    with v1_graph() as graph:
        y = x = conv_const_input([1, 2, 3, 2])
        if resize:
            y = tf.compat.v1.image.resize_bilinear(y, [12, 4], align_corners=False)
        y = tf.pad(y, [[0, 0], [1, 1], [2, 2], [0, 0]], mode=mode)
        tf.nn.conv2d(y, const([1, 2, 2, 2]), [1, 1, 1, 1], "VALID", name="output")
        del x
    result = optimize(built(graph))
    left = ops(result.graph_def)
    assert ("ResizeBilinear" in left) == resize
    assert ("MirrorPad" in left) == (mode == "REFLECT")
    assert "Pad" not in left or mode != "CONSTANT"
    assert_matches(result, 1e-5)


def decomposed_batch_norm_graph(mode):
    """TF create_base_for_fuse_batchnorm: conv * (rsqrt(var + eps) * gamma) + (beta - mean *
    that), in the peer's MATCH_ALL / MATCH_NO_GAMMA / MATCH_SWITCH_ORDER / MISMATCH_PATTERN /
    MISMATCH_FORMAT forms (the last: NCHW with 6-vectors that broadcast along width)."""
    data_format = "NCHW" if mode == "MISMATCH_FORMAT" else "NHWC"
    n = 6 if data_format == "NCHW" else 2
    with v1_graph() as graph:
        x = conv_const_input([1, 1, 6, 2] if data_format == "NHWC" else [1, 2, 1, 6])
        conv = tf.nn.conv2d(x, const([1, 2, 2, 2]), [1, 1, 1, 1], "SAME",
                            data_format=data_format)
        scale = tf.math.rsqrt(const([n], 0.2, 1.0) + 1e-5)
        if mode != "MATCH_NO_GAMMA":
            scale = scale * const([n], 0.5, 2.0)
        mean = const([n])
        shifted = mean * (const([n]) if mode == "MISMATCH_PATTERN" else scale)
        offset = const([n]) - shifted
        product = conv * scale
        y = offset + product if mode == "MATCH_SWITCH_ORDER" else product + offset
        tf.identity(y, name="output")
    return built(graph)


@pytest.mark.parametrize("mode", ["MATCH_ALL", "MATCH_NO_GAMMA", "MATCH_SWITCH_ORDER",
                                  "MISMATCH_PATTERN", "MISMATCH_FORMAT"])
def test_decomposed_batch_norm(mode):
    """TF testFuseDecomposedBatchNorm_MatchAll / _MatchNoGamma / _MatchSwitchOrder /
    _PatternMismatchCase / _FormatUnsupportedCase. Any per-channel x*s + t folds into the conv
    (so the peer's 'mismatch' folds too: it is still per-channel); values that broadcast along
    width, not channels, must not."""
    result = optimize(decomposed_batch_norm_graph(mode))
    left = ops(result.graph_def)
    arithmetic = [op for op in left if op in ("Add", "AddV2", "Rsqrt", "Mul", "Sub")]
    if mode == "MISMATCH_FORMAT":
        assert "Mul" in arithmetic
    else:
        assert arithmetic == [] and left.count("Conv2D") == 1
    assert_matches(result, 1e-4)


# ---------------------------------------------------------------- graph_transforms
@pytest.mark.parametrize("linear", ["conv2d", "matmul"])
def test_fold_mul_into_linear(linear):
    """GTF TestFoldBatchNormsConv2D, TestFoldBatchNormsMatMul: conv/matmul * per-channel const."""
    with v1_graph() as graph:
        if linear == "conv2d":
            y = tf.nn.conv2d(conv_const_input([1, 1, 6, 2]), const([1, 2, 2, 2]), [1, 1, 1, 1],
                             "VALID")
        else:
            y = tf.matmul(conv_const_input([6, 2]), const([2, 2]))
        tf.multiply(y, const([2], 1.0, 3.0), name="output")
    result = optimize(built(graph))
    assert "Mul" not in ops(result.graph_def)
    assert_matches(result, 1e-5)


def test_shared_conv_output_is_not_folded():
    """GTF TestFoldBatchNormsConv2DShared: one conv read by two Muls (two outputs): folding
    either into the weights would change the other, so both stay."""
    with v1_graph() as graph:
        conv = tf.nn.conv2d(conv_const_input([1, 1, 6, 2]), const([1, 2, 2, 2]), [1, 1, 1, 1],
                            "VALID")
        tf.multiply(conv, const([2]), name="output")
        tf.multiply(conv, const([2]), name="output_2")
    result = optimize(built(graph, outputs=("output", "output_2")))
    assert ops(result.graph_def).count("Mul") == 2
    assert_matches(result, 1e-6)


@pytest.mark.parametrize("split", [True, False])
def test_fold_fused_batch_norm_with_concat(split):
    """GT TestFoldFusedBatchNormsWithConcat: split=True concatenates two convs along channels
    (each conv takes its slice of the BN); split=False along width (each takes all of it)."""
    with v1_graph() as graph:
        first = tf.compat.v1.placeholder(tf.float32, [1, 1, 6, 2] if split else [1, 1, 12, 1],
                                         name="input")
        second = tf.compat.v1.placeholder(tf.float32, first.shape, name="input_1")
        shape = [1, 2, 2, 1] if split else [1, 2, 1, 2]
        convs = [tf.nn.conv2d(x, const(shape), [1, 1, 1, 1], "VALID") for x in (first, second)]
        y = tf.concat(convs, 3 if split else 2)
        y = tf.raw_ops.FusedBatchNorm(x=y, scale=const([2], 0.5, 1.5), offset=const([2]),
                                      mean=const([2]), variance=const([2], 0.5, 2.0),
                                      epsilon=1e-5, is_training=False)[0]
        tf.identity(y, name="output")
    result = optimize(built(graph, inputs=("input", "input_1")))
    assert "FusedBatchNorm" not in ops(result.graph_def)
    assert ops(result.graph_def).count("BiasAdd") == 2
    assert_matches(result, 1e-5)


def test_fold_fused_batch_norm_with_batch_to_space():
    """GT TestFoldFusedBatchNormsWithBatchToSpace: Conv2D → BatchToSpaceND → FusedBatchNorm."""
    with v1_graph() as graph:
        y = tf.nn.conv2d(conv_const_input([2, 1, 3, 2]), const([1, 2, 2, 2]), [1, 1, 1, 1],
                         "VALID")
        y = tf.compat.v1.batch_to_space_nd(y, [1, 2], [[0, 0], [0, 1]])
        y = tf.raw_ops.FusedBatchNorm(x=y, scale=const([2], 0.5, 1.5), offset=const([2]),
                                      mean=const([2]), variance=const([2], 0.5, 2.0),
                                      epsilon=1e-5, is_training=False)[0]
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert "FusedBatchNorm" not in ops(result.graph_def)
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("form", ["sub_div_mul", "algebraic", "moments"])
def test_batch_norm_written_out(form):
    """GTS TestFoldSubDivMulFusedBatchNorms: conv → Sub(mean) → RealDiv(var) → Mul(gamma) →
    BiasAdd(beta) folds whole. GTA TestFoldBatchNormsAlgebraic: conv * (rsqrt(var + eps) * gamma)
    + (beta - mean * that) with [1, 1, 1, C] parameters, then Relu, folds whole.
    GTA TestFoldBatchNormsAlgebraicAndFoldMoments: the statistics are the moments of the conv's
    own output (training-mode BN): data, not constants, so nothing may fold into the weights."""
    with v1_graph() as graph:
        conv = tf.nn.conv2d(conv_const_input([2, 1, 6, 2]), const([1, 2, 2, 2]), [1, 1, 1, 1],
                            "VALID")
        if form == "sub_div_mul":
            y = tf.nn.bias_add((conv - const([2])) / const([2], 0.5, 2.0) * const([2]),
                               const([2]))
        else:
            if form == "moments":
                mean, variance = tf.nn.moments(conv, [1, 2], keepdims=True)
            else:
                mean, variance = const([1, 1, 1, 2]), const([1, 1, 1, 2], 0.2, 1.0)
            scale = tf.math.rsqrt(variance + 0.01) * const([1, 1, 1, 2], 0.5, 2.0)
            y = conv * scale + (const([1, 1, 1, 2]) - mean * scale)
        tf.nn.relu(y, name="output")
    result = optimize(built(graph))
    left = ops(result.graph_def)
    arithmetic = [op for op in left if op in ("Add", "AddV2", "Sub", "RealDiv", "Mul", "Rsqrt")]
    if form == "moments":
        assert "Mean" in left and "Rsqrt" in left and "Mul" in left
    else:
        assert arithmetic == [] and left.count("BiasAdd") == 1
    assert_matches(result, 1e-4)


# ---------------------------------------------------------------- tf2onnx test_backend
@pytest.mark.parametrize("flag", ["placeholder_with_default", "constant"])
def test_layers_dropout_behind_a_training_switch(flag):
    """T2O test_dropout: tf.layers.dropout(x, rate=.1, training=is_training), with is_training a
    PlaceholderWithDefault(False) (older version) or tf.constant(False) — a v1 cond around it."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [1, 6, 6, 3], name="input")
        if flag == "constant":
            training = tf.constant(False)
        else:
            training = tf.compat.v1.placeholder_with_default(False, [], name="is_training")
        y = tf.compat.v1.cond(training, lambda: tf.nn.dropout(tf.identity(x), rate=0.1),
                              lambda: tf.identity(x))
        tf.identity(y * const([3]), name="output")
    result = optimize(built(graph))
    assert not {"RandomUniform", "Switch", "Merge"} & set(ops(result.graph_def))
    assert_matches(result, 1e-6)


@pytest.mark.parametrize("knob", ["keep_prob_with_default", "rate_constant", "rate_with_default"])
def test_dropout_knob_variants(knob):
    """T2O test_nn_dropout (keep_prob = PlaceholderWithDefault(1.0), older version) and
    test_nn_dropout_with_rate (rate = tf.constant(0.), and PlaceholderWithDefault(0.))."""
    with v1_graph() as graph:
        x = tf.identity(tf.compat.v1.placeholder(tf.float32, [1, 6, 6, 3], name="input"))
        if knob == "keep_prob_with_default":
            keep = tf.compat.v1.placeholder_with_default(1.0, [], name="keep_prob")
            y = tf.compat.v1.nn.dropout(x, keep_prob=keep)
        else:
            rate = tf.constant(0.0, name="rate") if knob == "rate_constant" else \
                tf.compat.v1.placeholder_with_default(0.0, [], name="rate")
            y = tf.nn.dropout(x, rate=rate)
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert not {"RandomUniform", "RandomUniformLike"} & set(ops(result.graph_def))
    assert_matches(result, 1e-6)


def test_fold_cond_keras_learning_phase_v1():
    """T2O test_fold_cond_keras_learning_phase as a TF1 graph (Switch/Merge); the TF2 form is in
    tests/test_control_flow.py."""
    two, three = R.uniform(1, 2, 2)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="input")
        phase = tf.compat.v1.placeholder_with_default(False, [], name="keras_learning_phase")
        y = tf.compat.v1.cond(phase, lambda: x * two, lambda: x * three)
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert not {"Switch", "Merge", "PlaceholderWithDefault"} & set(ops(result.graph_def))
    assert_matches(result, 1e-6)


@pytest.mark.parametrize("params", ["constant", "placeholders"])
def test_batch_norm_alone(params):
    """T2O test_fused_batchnorm (constant statistics: becomes Mul + BiasAdd) and test_batchnorm
    (tf.nn.batch_normalization with mean, offset and variance fed: stays, still right)."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [1, 6, 6, 2], name="input")
        if params == "constant":
            y = tf.raw_ops.FusedBatchNormV3(x=x, scale=const([2], 0.5, 1.5), offset=const([2]),
                                            mean=const([2]), variance=const([2], 0.5, 2.0),
                                            epsilon=1e-3, is_training=False)[0]
            inputs = ("input",)
        else:
            fed = [tf.compat.v1.placeholder(tf.float32, [2], name=n)
                   for n in ("mean", "offset", "variance")]
            y = tf.nn.batch_normalization(x, fed[0], tf.abs(fed[2]) + 0.5, fed[1],
                                          const([2], 0.5, 1.5), 1e-3)
            inputs = ("input", "mean", "offset", "variance")
        tf.identity(y, name="output")
    result = optimize(built(graph, inputs=inputs))
    assert "FusedBatchNormV3" not in ops(result.graph_def)
    assert_matches(result, 1e-5)


# ---------------------------------------------------------------- tf2onnx test_cond
def _simple_cond(x, y, cond):
    x, y = x + 1, y + 1
    return cond(x[0] < y[0], lambda: x + y, lambda: x - y)


def _cond_with_const_branch(x, y, cond):
    b = np.array([2, 1, 3], np.float32)
    return cond(tf.constant(True, name="true_const"), lambda: x + y, lambda: tf.constant(b))


def _cond_with_only_const(x, y, cond):
    return cond(x[0] < y[0], lambda: tf.constant(10.0), lambda: tf.constant(10.0))


def _cond_with_multi_merge(x, y, cond):
    x, y = x + 1, y + 1
    return tf.stack(cond(x[0] < y[0], lambda: [x, x + y], lambda: [x, x - y]))


def _cond_with_replicate_output(x, y, cond):
    x, y = x + 1, y + 1
    return tf.stack(cond(x[0] < y[0], lambda: [x, x], lambda: [y, y]))


def _nest_cond(x, y, cond):
    x, y = x + 1, y + 1

    def inner():
        deepest = lambda: cond(x[0] < y[0], lambda: x + y, lambda: tf.square(y))
        middle = lambda: cond(tf.reduce_any(x < y), deepest, deepest)
        return cond(x[0] > y[0], middle, middle)
    return cond(x[0] < y[0], inner, inner)


def _cases(x, y, exclusive=False, default=True):
    x, y = x + 1, y + 1
    pairs = [(tf.reduce_all(x < 1), lambda: x + y), (tf.reduce_all(y > 0), lambda: tf.square(y))]
    if default:
        return tf.case(pairs, default=lambda: x, exclusive=exclusive)
    return tf.case(pairs)


def _case_with_multi_merge(x, y):
    x, y = x + 1, y + 1
    return tf.stack(tf.case([(tf.reduce_all(x < 1), lambda: [x + y, x - y]),
                             (tf.reduce_all(y > 0), lambda: [tf.abs(x), tf.square(y)])],
                            default=lambda: [x, y]))


def _nest_case(x, y):
    x, y = x + 1, y + 1
    inner = lambda: tf.case([(tf.reduce_all(x < 1), lambda: x + y),
                             (tf.reduce_all(y > 0), lambda: tf.square(y))], default=lambda: x - y)
    return tf.case([(x[0] > 0, inner), (x[0] < 0, inner)], default=lambda: x - y)


def _while_loop_in_cond(x, y, cond):
    loop = lambda: tf.compat.v1.while_loop(lambda v: tf.reduce_any(v < 10.0), lambda v: v + 1.0,
                                           [y])
    return cond(x[0] < y[0], lambda: x, loop)


def _cond_with_different_output_shape(x, y, cond):
    """The peer reshapes its input by a fed shape; here the input is [None, 3] and the cond on
    its (static) rank pads it to 20 rows either way."""
    t = tf.reshape(tf.tile(x, [3]), [-1, 3])
    t_shape, rank = tf.shape(t), tf.rank(t)
    pad_d0 = tf.expand_dims(20 - t_shape[0], 0)
    pad_shape = cond(tf.greater(rank, 1), lambda: tf.concat([pad_d0, t_shape[1:]], 0),
                     lambda: tf.expand_dims(20 - t_shape[0], 0))
    return tf.concat([t, tf.zeros(pad_shape)], 0) + y


COND_CASES = {      # peer test name: (builder, folds: the predicate is constant)
    "test_simple_cond": (_simple_cond, False),
    "test_cond_with_const_branch": (_cond_with_const_branch, True),
    "test_cond_with_only_const": (_cond_with_only_const, False),
    "test_cond_with_multi_merge": (_cond_with_multi_merge, False),
    "test_cond_with_replicate_output": (_cond_with_replicate_output, False),
    "test_nest_cond": (_nest_cond, False),
    "test_simple_case": (lambda x, y, cond: _cases(x, y), False),
    "test_case_with_exclusive": (lambda x, y, cond: _cases(x, y, exclusive=True), False),
    "test_case_without_default_branch": (lambda x, y, cond: _cases(x, y, default=False), False),
    "test_case_with_multi_merge": (lambda x, y, cond: _case_with_multi_merge(x, y), False),
    "test_nest_case": (lambda x, y, cond: _nest_case(x, y), False),
    "test_while_loop_in_cond": (_while_loop_in_cond, False),
    "test_cond_with_different_output_shape": (_cond_with_different_output_shape, True),
}
FORMS = [(name, form) for name in COND_CASES for form in ("v1", "v2")
         if not (name == "test_while_loop_in_cond" and form == "v1")]   # v1: test_control_flow


@pytest.mark.parametrize("name, form", FORMS, ids=[f"{n}-{f}" for n, f in FORMS])
def test_tf2onnx_cond_cases(name, form):
    """T2OC: every tf.cond / tf.case test, as v1 Switch/Merge and as TF2 If/Case. A constant
    predicate folds to the taken branch; a data-dependent one stays and computes the same on
    both sides of the predicate."""
    builder, folds = COND_CASES[name]
    context = v1_graph() if form == "v1" else tf.Graph().as_default()
    with context as graph:
        x = tf.compat.v1.placeholder(tf.float32, [3], name="input_1")
        y = tf.compat.v1.placeholder(tf.float32, [3], name="input_2")
        cond = tf.compat.v1.cond if form == "v1" else tf.cond
        tf.identity(builder(x, y, cond), name="output")
    model = built(graph, inputs=("input_1", "input_2"))
    result = optimize(model)
    control = {"Switch", "Merge", "If", "StatelessIf", "Case", "StatelessCase"}
    if folds:
        assert not control & set(ops(result.graph_def))
    else:
        assert control & set(ops(result.graph_def))
    sides = [{"input_1": np.array(v, np.float32), "input_2": np.array([4, 5, 6], np.float32)}
             for v in ([1, 2, 3], [9, -2, 3], [-3, -2, 0.5])]
    check_both(result, sides)


def test_cond_in_while_loop_tf2():
    """T2OC test_cond_in_while_loop in TF2 form (While with a TensorList and an If inside); the
    v1 form is in tests/test_control_flow.py."""
    with tf.Graph().as_default() as graph:
        i = tf.compat.v1.placeholder(tf.int32, [], name="input_1")
        inputs = tf.compat.v1.placeholder(tf.float32, [10], name="input_2")
        input_ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True).unstack(
            tf.identity(inputs))

        def body(i, out_ta):
            x = input_ta.read(i)
            x = tf.cond(x > 0, lambda: x - 1, lambda: x + 3)
            return i + 1, out_ta.write(i, x)

        i_final, out = tf.while_loop(lambda i, *_: tf.logical_and(i < 10, i >= 0), body,
                                     [i, tf.TensorArray(tf.float32, size=0, dynamic_size=True)])
        tf.identity(i_final, name="i")
        tf.identity(out.stack(), name="output_ta")
    model = built(graph, inputs=("input_1", "input_2"), outputs=("i", "output_ta"))
    result = optimize(model, feeds={"input_1": np.array(0, np.int32)})
    assert "While" in ops(result.graph_def) or "StatelessWhile" in ops(result.graph_def)
    check_both(result, [{"input_1": np.array(0, np.int32),
                         "input_2": np.array([2, 16, 5, 1.6, 5, 6, 7, 8, 9, 10], np.float32)}])
