"""A constant subgraph TensorFlow refuses to evaluate is named in the report with TensorFlow's
reason — and does not stop the other constant subgraphs from folding."""
import numpy as np
import tensorflow as tf

from tfsurgery import api

import oracle


def test_one_refused_constant_does_not_stop_the_others():
    r = np.random.default_rng(2)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="input")
        variance = tf.constant(r.uniform(0.5, 2, 3), tf.float32)
        gamma = tf.constant(r.standard_normal(3), tf.float32)
        scale = tf.math.rsqrt(variance + 1e-3) * gamma            # Keras 3's BN scale
        tf.identity(x * scale, name="output")
        bad = tf.gather(tf.constant([1.0, 2.0, 3.0]), tf.constant([10]), name="bad_gather")
        tf.add(x, bad, name="side")
    original = graph.as_graph_def()
    source = api.Source(original, "t", inputs=["input"], outputs=["output"])
    result = api.optimize(source, api.choose_transforms())
    folding = next(r for r in result.reports if r.name == "fold-constants")
    assert "mul" in folding.rewritten                      # the good subgraph folded
    reasons = dict(folding.skipped)
    assert "indices[0] = 10 is not in [0, 3)" in reasons["bad_gather"]
    assert reasons["bad_gather"].startswith("TensorFlow refused to evaluate it: ")
    assert "Rsqrt" not in {n.op for n in result.graph_def.node}
    oracle.assert_same_outputs(original, result.graph_def, ["input"], ["output"], seed=4)


def test_a_weight_or_bias_that_is_a_graph_output_keeps_its_value():
    """Folding scales the conv's weights and reuses its bias constant in place — unless the
    constant is itself a graph output: then it stays as it was and the fold writes copies."""
    r = np.random.default_rng(5)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 3], name="input")
        kernel = tf.constant(r.standard_normal((3, 3, 3, 4)), tf.float32, name="kernel")
        bias = tf.constant(r.standard_normal(4), tf.float32, name="bias")
        z = tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias)
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            z, tf.constant(r.uniform(0.5, 2, 4), tf.float32), tf.constant(r.standard_normal(4),
                                                                           tf.float32),
            mean=tf.constant(r.standard_normal(4), tf.float32),
            variance=tf.constant(r.uniform(0.5, 2, 4), tf.float32), is_training=False)
        tf.nn.relu(y, name="output")
    original = graph.as_graph_def()
    outputs = ["output", "kernel", "bias"]
    source = api.Source(original, "t", inputs=["input"], outputs=outputs)
    result = api.optimize(source, api.choose_transforms(bn_fold=True))
    assert "FusedBatchNormV3" not in {n.op for n in result.graph_def.node}
    oracle.assert_same_outputs(original, result.graph_def, ["input"], outputs, seed=6)
