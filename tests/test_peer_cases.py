"""Our peers' test graphs, re-created as small frozen graphs with random values, through tfsurgery.

Each case names the peer test it comes from:
- TF  = tensorflow/python/tools/optimize_for_inference_test.py
- GT  = tensorflow/tools/graph_transforms/fold_old_batch_norms_test.cc / fold_batch_norms_test.cc
- T2O = onnx/tensorflow-onnx tests/test_backend.py
Every case asserts the ops that must be gone (or stay) and that the outputs match the original.
"""
import numpy as np
import pytest
import tensorflow as tf

from conftest import ops, optimize, report_of
from tfsurgery.models.common import BuiltModel
from tfsurgery.models.tf1 import v1_graph

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
    assert result.verification.passed and result.verification.max_error < 1e-5


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
    assert result.verification.passed and result.verification.max_error < 1e-5


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_fold_fused_batch_norm(data_format):
    """TF testFoldFusedBatchNorms; GT TestFoldFusedBatchNorms."""
    with v1_graph() as graph:
        x = conv_input(data_format=data_format)
        y = tf.nn.conv2d(x, const([1, 2, 2, 2]), [1, 1, 1, 1], "SAME", data_format=data_format)
        y = tf.raw_ops.FusedBatchNormV3(x=y, scale=const([2], 0.5, 1.5), offset=const([2]),
                                        mean=const([2]), variance=const([2], 0.5, 2.0),
                                        epsilon=1e-5, data_format=data_format,
                                        is_training=False)[0]
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert "FusedBatchNormV3" not in ops(result.graph_def)
    assert result.verification.passed and result.verification.max_error < 1e-5


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
    assert result.verification.passed and result.verification.max_error == 0
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
    assert result.settings == {"keep_prob": 1.0} and result.inputs == ["input"]
    assert result.verification.passed and result.verification.max_error < 1e-6


def test_tf2_dropout_with_a_rate_tensor_and_noise_shape():
    """T2O test_nn_dropout: tf.nn.dropout(x, rate) with a tensor rate, and noise_shape."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 4, 3], name="input")
        rate = tf.compat.v1.placeholder(tf.float32, [], name="dropout_rate")
        y = tf.nn.dropout(x * const([3]), rate=rate, noise_shape=[2, 1, 3])
        tf.identity(y, name="output")
    result = optimize(built(graph))
    assert not {"RandomUniform", "GreaterEqual"} & set(ops(result.graph_def))
    assert result.settings == {"dropout_rate": 0.0}
    assert result.verification.passed and result.verification.max_error < 1e-6


def test_constant_rate_dropout_is_checked_against_its_expected_value():
    """T2O test_dropout with a constant rate: the original is random; the reference is the
    original with each mask at its expected value, built by the verifier."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        y = tf.nn.dropout(x * const([3]), rate=0.4)
        tf.identity(y + const([3]), name="output")
    result = optimize(built(graph))
    assert "RandomUniform" not in ops(result.graph_def)
    assert "expected or neutral" in result.verification.reference
    assert result.verification.passed and result.verification.max_error < 1e-6
