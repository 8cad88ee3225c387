"""simplify-arithmetic: every rule on a small random graph, the refusals, and random chains of
no-ops thrown at it (the numbers must not move)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from conftest import ops, optimize, property_examples, report_of
from tfsurgery.models.common import BuiltModel

R = np.random.default_rng(11)


def build(body, shape=(2, 3, 4)):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
        tf.identity(body(x * tf.constant(R.standard_normal(shape[-1]).astype(np.float32))),
                    name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


NO_OPS = {
    "x*1": lambda x: x * 1.0,
    "1*x": lambda x: tf.math.multiply(tf.constant(1.0), x),
    "x+0": lambda x: x + 0.0,
    "0+x": lambda x: tf.math.add(tf.constant(0.0), x),
    "x-0": lambda x: x - 0.0,
    "x/1": lambda x: x / 1.0,
    "cast": lambda x: tf.raw_ops.Cast(x=x, DstT=tf.float32),
    "neg-neg": lambda x: -(-x),
    "transpose-identity": lambda x: tf.transpose(x, [0, 1, 2]),
    "transpose-pair": lambda x: tf.transpose(tf.transpose(x, [0, 2, 1]), [0, 2, 1]),
    "reshape-same": lambda x: tf.reshape(x, [2, 3, 4]),
    "reshape-reshape": lambda x: tf.reshape(tf.reshape(x, [6, 4]), [2, 3, 4]) * 2.0,
    "x+zeros[4]": lambda x: x + tf.zeros([4]),
}


@pytest.mark.parametrize("rule", sorted(NO_OPS))
def test_each_no_op_goes_and_the_numbers_hold(rule):
    built = build(NO_OPS[rule])
    result = optimize(built, bn_fold=False)
    assert report_of(result, "simplify-arithmetic").rewritten, rule
    assert not {"Neg", "Cast", "Transpose", "Sub", "RealDiv"} & set(ops(result.graph_def))
    assert ops(result.graph_def).count("Reshape") <= 1
    assert result.verification.passed and result.verification.max_error == 0


def test_transposes_that_do_not_cancel_become_one():
    built = build(lambda x: tf.transpose(tf.transpose(x, [1, 0, 2]), [0, 2, 1]))
    result = optimize(built, bn_fold=False)
    assert ops(result.graph_def).count("Transpose") == 1
    assert result.verification.passed and result.verification.max_error == 0


def test_times_zero_is_never_simplified():
    built = build(lambda x: x * 0.0 + 1.0)
    result = optimize(built, bn_fold=False)
    assert "Mul" in ops(result.graph_def)


def test_a_broadcasting_neutral_constant_is_kept():
    """x[2,3] + zeros[1,1,3]: the result has rank 3, not x's rank 2."""
    built = build(lambda x: x + tf.zeros([1, 1, 3]), shape=(2, 3))
    result = optimize(built, bn_fold=False)
    assert "AddV2" in ops(result.graph_def)
    assert result.verification.passed


def test_unknown_shapes_are_refused_with_a_reason():
    built = build(lambda x: x + tf.zeros([4]), shape=(None, None, 4))
    result = optimize(built, bn_fold=False)
    assert "AddV2" in ops(result.graph_def)
    assert any("not known" in why for _, why in report_of(result, "simplify-arithmetic").skipped)


def test_an_output_that_is_a_no_op_keeps_its_name():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        tf.math.multiply(tf.nn.relu(x), 1.0, name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]), bn_fold=False)
    output = next(n for n in result.graph_def.node if n.name == "output")
    assert output.op == "Identity" and result.verification.passed


@settings(max_examples=property_examples(default=25), deadline=None)
@given(st.lists(st.sampled_from(sorted(NO_OPS)), min_size=1, max_size=6))
def test_random_chains_of_no_ops_change_nothing(chain):
    def body(x):
        for rule in chain:
            x = tf.nn.relu(NO_OPS[rule](x)) - 0.5
        return x
    result = optimize(build(body), bn_fold=False)
    assert result.verification.passed and result.verification.max_error < 1e-6
