"""One vocabulary of random ops: a dropout built on integer uniforms (RandomUniformInt) is
removed by remove-dropout AND neutralised in the verifier's reference — checked here by the
tests' own oracle against its expected value, computed by hand."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api, ops
from tfsurgery.interface import find_dropout_knobs

import oracle

KEEP = 0.7          # u in {0..9}, u >= 3 keeps 7 in 10


def integer_dropout(op: str = "GreaterEqual"):
    r = np.random.default_rng(1)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="input")
        h = tf.matmul(tf.identity(x), tf.constant(r.standard_normal((6, 5)), tf.float32))
        u = tf.random.uniform(tf.shape(h), 0, 10, dtype=tf.int32, name="dropout/uniform")
        keep = {"GreaterEqual": lambda: u >= 3, "Greater": lambda: u > 2,
                "Less": lambda: u < 7, "LessEqual": lambda: u <= 6}[op]()
        tf.identity(h * (1 / KEEP) * tf.cast(keep, tf.float32), name="output")
        tf.identity(h, name="no_dropout")       # what the expected mask leaves
    return graph.as_graph_def()


@pytest.mark.parametrize("op", ["GreaterEqual", "Greater", "Less", "LessEqual"])
def test_integer_uniform_dropout_is_removed_and_neutralised(op):
    original = integer_dropout(op)
    source = api.Source(original, "t", inputs=["input"], outputs=["output"])
    result = api.optimize(source, api.choose_transforms())
    assert not ops.RANDOM_OPS & {n.op for n in result.graph_def.node}
    assert "random op(s) at their expected" in result.verification.reference
    # The oracle: with the mask at its expectation (0.7 for each comparison form), the output is
    # h itself — computed from the original's own no-dropout tensor.
    feeds = oracle.random_feeds(original, ["input"], seed=3)
    expected = oracle.run(original, feeds, ["no_dropout"])[0]
    actual = oracle.run(result.graph_def, feeds, ["output"])[0]
    assert oracle.relative_error(expected, actual) < 1e-6


def test_every_module_reads_the_one_set():
    from tfsurgery import interface
    from tfsurgery.verify import reference
    from tfsurgery.transforms import remove_dropout
    assert reference.UNIFORM_OPS is ops.UNIFORM_RANDOM_OPS
    assert interface.RANDOM_OPS is ops.RANDOM_OPS
    assert remove_dropout.UNIFORM_RANDOM_OPS is ops.UNIFORM_RANDOM_OPS
    assert ops.UNIFORM_RANDOM_OPS | ops.NORMAL_RANDOM_OPS <= ops.RANDOM_OPS
    assert find_dropout_knobs(integer_dropout()) == {}
