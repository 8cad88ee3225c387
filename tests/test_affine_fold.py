"""fold-affine-into-linear: per-channel scale / shift / channel reversal before a linear op folded
into its weights (and bias, where exact); verified numerically against the original."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api

import oracle
from tfsurgery.graph import Graph
from tfsurgery.contract import Options
from tfsurgery.transforms.fold_affine_into_linear import fold_affine_into_linear

RNG = np.random.default_rng(11)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def tf1_source(build):
    with tf.Graph().as_default() as g:
        build(tf.compat.v1.placeholder)
    return api.Source(g.as_graph_def(), label="t", inputs=["x"], outputs=["out"])


def optimized(source, bn_fold=True):
    """Optimized, verified — and checked by the tests' own oracle against the source."""
    result = api.optimize(source, api.choose_transforms(bn_fold=bn_fold))
    oracle.assert_same_outputs(source.graph_def, result.graph_def, source.inputs,
                               source.outputs, rtol=1e-4)
    assert result.verification.passed, result.verification.failure()
    return result


def ops(graph_def):
    return [n.op for n in graph_def.node if n.op != "Const"]


def skips(result):
    return [reason for rep in result.reports for _, reason in rep.skipped]


def keras_source(layers, input_shape, seed=0):
    from tfsurgery.models import keras_models
    model = tf.keras.Sequential([tf.keras.Input(input_shape)] + layers)
    built = keras_models._keras3_built(model, seed)
    return api.Source(built.graph_def, label="keras", inputs=built.inputs, outputs=built.outputs)


def test_keras_rescaling_before_valid_conv_folds_completely():
    source = keras_source([tf.keras.layers.Rescaling(1 / 127.5, offset=-1.0),
                           tf.keras.layers.Conv2D(4, 3, padding="valid"),
                           tf.keras.layers.Flatten()], (6, 6, 3))
    left = ops(optimized(source).graph_def)
    assert "Mul" not in left and "AddV2" not in left and "Add" not in left


def test_keras_normalization_before_dense_folds_completely():
    norm = tf.keras.layers.Normalization(mean=_r(5), variance=np.abs(_r(5)) + 0.5)
    source = keras_source([norm, tf.keras.layers.Dense(3)], (5,))
    left = ops(optimized(source).graph_def)
    assert not {"Mul", "RealDiv", "Sub", "Maximum", "Sqrt"} & set(left), left


def test_bn_after_relu_before_dense_folds_into_the_dense():
    source = keras_source([tf.keras.layers.Dense(6), tf.keras.layers.ReLU(),
                           tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(3)], (4,))
    left = ops(optimized(source).graph_def)
    assert left.count("MatMul") == 2 and "Mul" not in left and "Sub" not in left, left


def test_shift_before_same_conv_stays_with_reason():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 6, 6, 3], name="x")
        y = tf.nn.conv2d((x + _r(3)) * _r(3), _r(3, 3, 3, 4), 1, "SAME")
        tf.identity(y, name="out")
    result = optimized(tf1_source(build))
    left = ops(result.graph_def)
    assert "Mul" not in left and left.count("AddV2") == 1
    assert any("per-channel shift before zero padding" in reason for reason in skips(result))


def test_scale_and_reversal_pass_a_zero_pad():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 6, 6, 3], name="x")
        y = tf.reverse(x, [3]) * _r(3)
        y = tf.pad(y, [[0, 0], [1, 2], [2, 1], [0, 0]])
        tf.identity(tf.nn.conv2d(y, _r(3, 3, 3, 4), 2, "VALID"), name="out")
    left = ops(optimized(tf1_source(build)).graph_def)
    # the zero pad stays a zero border: a Pad, or (fold-pad-into-conv) the conv's own padding
    assert "Mul" not in left and "ReverseV2" not in left


def test_nchw_conv_and_transpose_b_matmul():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 3, 6, 6], name="x")
        y = tf.nn.conv2d(x * _r(3, 1, 1) - _r(1, 3, 1, 1), _r(3, 3, 3, 4), 1, "VALID",
                         data_format="NCHW")
        y = tf.reshape(y, [-1, 64])
        tf.identity(tf.matmul(y * _r(64), _r(5, 64), transpose_b=True), name="out")
    left = ops(optimized(tf1_source(build)).graph_def)
    assert "Mul" not in left and "Sub" not in left, left


def test_affine_with_a_second_reader_stays():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 4], name="x")
        scaled = x * _r(4)
        tf.identity(tf.matmul(scaled, _r(4, 3)) + tf.reduce_sum(scaled), name="out")
    result = optimized(tf1_source(build))
    assert "Mul" in ops(result.graph_def)
    assert any("other nodes read" in reason for reason in skips(result))


def test_shared_weight_is_copied_not_changed():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 4], name="x")
        w = tf.constant(_r(4, 4), name="w")
        tf.identity(tf.matmul(x * _r(4), w) + tf.matmul(x, w), name="out")
    source = tf1_source(build)
    result = optimized(source, bn_fold=False)
    assert "Mul" not in ops(result.graph_def)
    assert sum(n.op == "Const" and n.attr["value"].tensor.tensor_shape.dim[0].size == 4
               and len(n.attr["value"].tensor.tensor_shape.dim) == 2
               for n in result.graph_def.node) == 2


def test_caller_graph_untouched_and_non_constant_weights_left():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 4], name="x")
        w = placeholder(tf.float32, [4, 3], name="w")
        tf.identity(tf.matmul(x * 2.0, w), name="out")
    source = tf1_source(build)
    before = source.graph_def.SerializeToString()
    graph = Graph(source.graph_def)
    report = fold_affine_into_linear(graph, Options(inputs=["x", "w"], outputs=["out"]))
    assert report.matched == 0 and "not a constant" in report.skipped[0][1]
    assert source.graph_def.SerializeToString() == before


def test_constant_gather_on_channels_folds():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 6, 6, 3], name="x")
        y = tf.gather(x, [2, 0, 1, 2], axis=3)          # permutation plus a duplicate
        tf.identity(tf.nn.conv2d(y, _r(3, 3, 4, 5), 1, "SAME"), name="out")
    left = ops(optimized(tf1_source(build)).graph_def)
    assert "GatherV2" not in left and left.count("Conv2D") == 1


@pytest.mark.parametrize("layer", ["conv", "depthwise"])
def test_scalar_shift_before_same_conv_becomes_a_padv2_border(layer):
    def build(placeholder):
        x = placeholder(tf.float32, [None, 7, 7, 3], name="x")
        y = x - 3.5
        if layer == "conv":
            y = tf.nn.conv2d(y, _r(3, 3, 3, 4), 2, "SAME")
        else:
            y = tf.nn.depthwise_conv2d(y, _r(3, 3, 3, 2), [1, 2, 2, 1], "SAME")
        tf.identity(y, name="out")
    left = ops(optimized(tf1_source(build)).graph_def)
    assert "Sub" not in left and "PadV2" in left, left


def test_scalar_shift_through_a_zero_pad_becomes_a_padv2_border():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 6, 6, 3], name="x")
        y = tf.pad(x + 2.0, [[0, 0], [3, 3], [3, 3], [0, 0]])
        tf.identity(tf.nn.conv2d(y, _r(7, 7, 3, 4), 2, "VALID"), name="out")
    left = ops(optimized(tf1_source(build)).graph_def)
    assert "AddV2" not in left and "Pad" not in left and "PadV2" in left, left


@pytest.mark.parametrize("data_format, scale_op", [("NHWC", "Mul"), ("NCHW", "Mul"),
                                                   ("NHWC", "RealDiv")])
def test_scale_before_a_shift_that_stays_moves_after_it_and_folds(data_format, scale_op):
    """Keras Rescaling then Normalization before a SAME conv: (x * s) - m. The per-channel shift
    cannot pass the zero border, so it stays as x - m / s; the scale folds into the weights."""
    nchw = data_format == "NCHW"
    channel_shape = (3, 1, 1) if nchw else (3,)

    def build(placeholder):
        x = placeholder(tf.float32, [None, 3, 6, 6] if nchw else [None, 6, 6, 3], name="x")
        s = np.abs(_r(*channel_shape)) + 0.5
        scaled = x * s if scale_op == "Mul" else x / s
        y = tf.nn.conv2d(scaled - _r(*channel_shape), _r(3, 3, 3, 4), 1, "SAME",
                         data_format=data_format)
        tf.identity(y, name="out")
    result = optimized(tf1_source(build))
    assert ops(result.graph_def) == ["Placeholder", "Sub", "Conv2D", "Identity"]
    moved = [line for rep in result.reports for line in rep.rewritten if "moved after" in line]
    assert len(moved) == 1
    reasons = skips(result)
    assert len(reasons) == len(set(reasons))


def test_scale_with_another_reader_does_not_move():
    def build(placeholder):
        x = placeholder(tf.float32, [None, 6, 6, 3], name="x")
        scaled = x * _r(3)
        y = tf.nn.conv2d(scaled - _r(3), _r(3, 3, 3, 4), 1, "SAME")
        tf.identity(y + tf.reduce_sum(scaled), name="out")
    left = ops(optimized(tf1_source(build)).graph_def)
    assert left.count("Mul") == 1 and left.count("Sub") == 1


def test_batch_norm_parameters_stored_in_any_encoding_fold():
    """A batch norm's parameters are read from one buffer when all four are packed alike; a
    broadcast fill (one float_val), a parameter behind an Identity, or one of another shape
    each take the one-by-one path — the fold is the same either way."""
    channels = 4

    def build(placeholder):
        x = placeholder(tf.float32, [None, 6, 6, 3], name="x")
        for i, (mean, offset) in enumerate([
                (tf.constant(_r(channels)), tf.constant(_r(channels))),          # packed alike
                (tf.constant(0.25, shape=[channels]), tf.identity(tf.constant(_r(channels)))),
                (tf.identity(tf.constant(_r(channels))), tf.constant(_r(channels)))]):
            z = tf.nn.conv2d(x if i == 0 else y, tf.constant(_r(3, 3, x.shape[-1] if i == 0
                                                             else channels, channels)),
                             [1, 1, 1, 1], "SAME")
            y, *_ = tf.compat.v1.nn.fused_batch_norm(
                z, tf.constant(_r(channels) + 2.0), offset, mean=mean,
                variance=tf.constant(np.abs(_r(channels)) + 0.1), is_training=False)
        tf.identity(tf.nn.relu(y), name="out")

    source = tf1_source(build)
    fills = [n.name for n in source.graph_def.node if n.op == "Const" and
             n.attr["value"].tensor.float_val and not n.attr["value"].tensor.tensor_content]
    assert fills                                # the broadcast fill really is one float_val
    result = optimized(source)
    assert "FusedBatchNormV3" not in ops(result.graph_def)
    assert ops(result.graph_def).count("Conv2D") == 3
