"""The verifier's float32 noise floor counts re-rounded weights (folding recomputes W·s in float32
at every layer) — and still catches a weight that is really wrong.

The oracle is exact arithmetic: both graphs converted to float64 (weights as stored) against the
original in float64. The folded float32 graph is as far from the exact answer as the original
float32 graph is (a few times its own rounding error); a kernel 5% off is far beyond that."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2

import oracle
from conftest import optimize
from tfsurgery.graph import Graph
from tfsurgery.models import keras_models
from tfsurgery.verify import check as verify
from tfsurgery.verify.runs import float_weights, reround


def float64(graph_def):
    """The same graph computing in float64: float attrs and constants widened."""
    wide = type(graph_def)()
    wide.CopyFrom(graph_def)
    for node in wide.node:
        for attr in node.attr.values():
            if attr.type == types_pb2.DT_FLOAT:
                attr.type = types_pb2.DT_DOUBLE
            if attr.list.type:
                attr.list.type[:] = [types_pb2.DT_DOUBLE if t == types_pb2.DT_FLOAT else t
                                     for t in attr.list.type]
            if attr.HasField("tensor") and attr.tensor.dtype == types_pb2.DT_FLOAT:
                attr.tensor.CopyFrom(tf.make_tensor_proto(
                    tf.make_ndarray(attr.tensor).astype(np.float64)))
    return wide


def logits_name(graph_def):
    return next(n.input[0] for n in graph_def.node if n.op == "Softmax")


def error_from_exact(built, graph_def, feeds) -> float:
    """Relative max error of ``graph_def``'s logits (float32) against the original's in float64."""
    exact = oracle.run(float64(built.graph_def), {k: v.astype(np.float64) for k, v in
                                                   feeds.items()}, [logits_name(built.graph_def)])
    got = oracle.run(graph_def, feeds, [logits_name(graph_def)])
    return float(np.max(np.abs(got[0] - exact[0])) / np.max(np.abs(exact[0])))


def test_reround_moves_every_weight_one_step_both_ways():
    weights = {"w": np.random.default_rng(0).standard_normal(1000).astype(np.float32)}
    moved = reround(weights, seed=3)["w"]
    steps = (moved - weights["w"]) / np.spacing(np.abs(weights["w"]))
    assert moved.dtype == np.float32
    assert set(np.unique(np.abs(np.round(steps, 3)))) <= {0.5, 1.0}  # one step (below a 2^k)
    assert 400 < np.count_nonzero(steps > 0) < 600                   # up or down at random


def test_float_weights_are_the_float_tensors_not_scalars():
    with tf.Graph().as_default() as graph:
        tf.constant(np.ones((2, 3), np.float32), name="kernel")
        tf.constant(np.float32(1e-3), name="epsilon")
        tf.constant(np.ones(3, np.int32), name="shape")
    assert list(float_weights(graph)) == ["kernel"]


@pytest.fixture(scope="module")
def efficientnet():
    built = keras_models.keras_application("EfficientNetB0", seed=26)
    return built, optimize(built, verify=False).graph_def


@pytest.mark.slow
def test_efficientnet_fold_passes_at_the_weight_floor_and_a_5_percent_kernel_fails(efficientnet):
    built, folded = efficientnet
    feeds = oracle.random_feeds(built.graph_def, built.inputs, seed=0)
    own = error_from_exact(built, built.graph_def, feeds)         # float32's own error
    assert error_from_exact(built, folded, feeds) < 5 * own       # the fold: rounding, no more

    passed = verify.verify(built.graph_def, folded, built.inputs, built.outputs)
    assert passed.passed, passed.failure()
    assert passed.noise_source in ("inputs", "weights")
    assert passed.noise_floor > 0 and f"from its {passed.noise_source}" in passed.summary()
    assert passed.as_dict()["noise_floor_from"] == passed.noise_source

    kernel = next(n.input[1] for n in folded.node
                  if n.op == "Conv2D" and "block6c_project_conv" in n.name)
    graph = Graph(folded)
    graph.set_const_value(kernel, graph.const_value(kernel) * np.float32(1.05))
    wrong = graph.to_graph_def()
    assert error_from_exact(built, wrong, feeds) > 20 * own       # the oracle: really wrong
    failed = verify.verify(built.graph_def, wrong, built.inputs, built.outputs)
    assert not failed.passed and failed.max_error > failed.allowed, failed.summary()
