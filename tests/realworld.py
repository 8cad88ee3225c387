"""Test-only fixtures, not installed (some hang or give NaN on purpose): small graphs with the
shapes real published graphs have (see ../shared/corpus/PROVENANCE.md).

Each reproduces one pattern that broke the tool on a real graph: a TF1 ``keep_prob`` of unknown
rank, an ``Assert``-guarded scalar input, inputs fed by a FIFOQueue, a loop that random inputs never
end, NaN outputs, a tensor-default ``PlaceholderWithDefault`` bottleneck, an image input whose
free size must survive five poolings, noise left on the inference path. Random weights throughout.
"""
from __future__ import annotations

import tensorflow as tf

from tfsurgery.models.common import BuiltModel, rng
from tfsurgery.models.tf1 import _built, conv, dense, v1_graph


def keep_prob_dropout(seed: int = 0, features: int = 8) -> BuiltModel:
    """TF1 ``tf.nn.dropout(x, keep_prob)`` with ``keep_prob`` a float placeholder of unknown rank
    (the range of random_uniform a Sub of two constants), as in tf2onnx's LSTM test model."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="input")
        keep = tf.compat.v1.placeholder(tf.float32, None, name="keep_prob")
        with tf.compat.v1.variable_scope("dense_1"):
            x = tf.nn.relu(dense(x, r, 16))
        with tf.compat.v1.name_scope("dropout"):
            noise = tf.compat.v1.random_uniform(tf.shape(x), minval=tf.constant(0.0) * 1.0,
                                                maxval=tf.constant(1.0) * 1.0)
            mask = tf.floor(keep + noise)
            x = tf.reshape(tf.math.divide(x, keep) * mask, [-1, 16])   # unknown-rank keep_prob
        with tf.compat.v1.variable_scope("dense_2"):
            x = dense(x, r, 4)
        tf.identity(x, name="output")
    return _built(graph)


def assert_guarded_scale(seed: int = 0) -> BuiltModel:
    """A super-resolution-like graph: a scalar ``scale`` input checked by an Assert (random
    values trip it) that picks a branch."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="input")
        scale = tf.compat.v1.placeholder(tf.float32, [], name="scale")
        check = tf.debugging.Assert(tf.reduce_any(tf.equal(scale, [2.0, 4.0])), [scale],
                                    name="scale_is_2_or_4")
        with tf.control_dependencies([check]):
            scale = tf.identity(scale)
        with tf.compat.v1.variable_scope("conv"):
            y = conv(x, r, 4)
        y = tf.compat.v1.cond(scale > 3.0, lambda: y * 2.0, lambda: y - 1.0)
        tf.identity(y, name="output")
    return _built(graph, inputs=("input", "scale"))


def queue_fed(seed: int = 0, features: int = 6) -> BuiltModel:
    """No placeholder: a FIFOQueue feeds ``QueueDequeueManyV2`` that feeds the model."""
    r = rng(seed)
    with v1_graph() as graph:
        queue = tf.queue.FIFOQueue(16, [tf.float32], shapes=[[features]], name="input_queue")
        x = queue.dequeue_many(4, name="batch")
        with tf.compat.v1.variable_scope("dense"):
            x = dense(x, r, 3)
        tf.identity(x, name="output")
    return _built(graph, inputs=())


def endless_loop(seed: int = 0) -> BuiltModel:
    """A while loop that ends only when its input is negative: random normal feeds are negative
    only half the time, and this graph's input is made positive, so it never ends."""
    del seed
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2], name="input")
        start = tf.abs(x) + 1.0
        _, y = tf.compat.v1.while_loop(lambda i, v: tf.reduce_all(v > 0.0),
                                       lambda i, v: (i + 1, v + 1.0), [0, start])
        tf.identity(y, name="output")
    return _built(graph)


def nan_outputs(seed: int = 0, features: int = 8) -> BuiltModel:
    """Outputs that are NaN for about half the inputs (log of a value that can be negative),
    behind a foldable dense layer."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="input")
        with tf.compat.v1.variable_scope("dense"):
            x = dense(x, r, 6)
        tf.math.log(tf.identity(x) * 1.0, name="output")
    return _built(graph)


def bottleneck_default(seed: int = 0) -> BuiltModel:
    """TF-for-Poets: the classifier head reads a PlaceholderWithDefault whose default is the
    feature tensor (a tensor, not a constant)."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [1, 6], name="input")
        with tf.compat.v1.variable_scope("features"):
            features = tf.nn.relu(dense(x, r, 5))
        bottleneck = tf.compat.v1.placeholder_with_default(features, [None, 5],
                                                           name="BottleneckInputPlaceholder")
        with tf.compat.v1.variable_scope("final"):
            y = dense(bottleneck, r, 3)
        tf.nn.softmax(y, name="output")
    return _built(graph)


def deep_pooling(seed: int = 0, pools: int = 5) -> BuiltModel:
    """An image input of free size whose width is halved ``pools`` times with VALID pooling:
    16 pixels pool down to nothing."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, None, 3], name="input")
        for i in range(pools):
            with tf.compat.v1.variable_scope(f"block_{i}"):
                x = tf.nn.relu(conv(x, r, 4))
                x = tf.nn.max_pool2d(x, 3, 2, "VALID")
        tf.reduce_mean(x, axis=[1, 2], name="output")
    return _built(graph)


def noisy_inference(seed: int = 0, features: int = 8) -> BuiltModel:
    """Gaussian noise left on the inference path: no transform removes it, so verification
    must give it the same seed in both graphs."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="input")
        with tf.compat.v1.variable_scope("dense"):
            x = dense(x, r, 4)
        x = x + tf.random.normal(tf.shape(x), stddev=0.1)
        tf.identity(x, name="output")
    return _built(graph)
