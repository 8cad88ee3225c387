"""Issue 49, the probe: every weight is probed — float16 kernels behind a Cast, biases, the
statistics of a batch norm — a weight that provably cannot move the output (its every path
passes a multiply by constant zeros) is no blind spot, and a probe that raises, a deadline that
ends before every weight was seen, or weights none of which could be probed end in "cannot
verify", never in a pass. TensorFlow in the test's own session is the oracle."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.errors import CannotVerify
from tfsurgery.models.common import rng
from tfsurgery.verify import sensitivity
from models import tf1

import oracle


def neutral_matmul(seed: int = 7):
    """Grappler's constant-folding neutral element: a MatMul whose result is multiplied by
    constant zeros, added to a live dense layer."""
    r = rng(seed)
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="input")
        with tf.compat.v1.variable_scope("live"):
            live = tf.tanh(tf1.dense(x, r, 8))
        with tf.compat.v1.variable_scope("dead"):
            dead = tf.linalg.matmul(x, tf1.variable("kernel", tf1.random_kernel(r, [8, 8], 8)))
        tf.add(live, dead * tf.zeros([8]), name="output")
    return tf1.freeze(graph, ["output"])


def imported(graph_def):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    return graph


def test_a_weight_multiplied_by_constant_zeros_is_not_a_blind_spot():
    graph_def = neutral_matmul()
    layers = sensitivity.weight_layers(imported(graph_def), ["output"])
    assert {layer.name for layer in layers} == {"live/MatMul", "live/BiasAdd"}
    source = api.Source(graph_def, "neutral", inputs=["input"], outputs=["output"])
    result = api.optimize(source)
    check = result.verification
    assert check.passed and not check.blind, check.failure()
    found = check.watching.sensitivity
    assert "dead/MatMul" in found.neutral and "cannot move an output" in check.summary()
    oracle.assert_same_outputs(graph_def, result.graph_def, ["input"], ["output"], rtol=1e-4)
    # the oracle: its kernel really cannot move the output (bit for bit)
    feeds = oracle.random_feeds(graph_def, ["input"], seed=0)
    changed = tf.compat.v1.GraphDef()
    changed.CopyFrom(graph_def)
    const = next(n for n in changed.node if n.name == "dead/kernel")
    const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
        tf.make_ndarray(const.attr["value"].tensor) * 1.05))
    assert np.array_equal(*(oracle.run(g, feeds, ["output"])[0] for g in (graph_def, changed)))


def test_float16_kernels_biases_and_batch_norm_statistics_are_probed():
    model = tf1.mixed_precision_bn()
    layers = sensitivity.weight_layers(imported(model.graph_def), model.outputs)
    kinds = {layer.name: layer.kind for layer in layers}
    assert kinds["conv/Conv2D"] == "kernel" and kinds["conv/BiasAdd"] == "bias"
    assert sum(kind == "normalization" for kind in kinds.values()) == 4
    kernel = next(layer for layer in layers if layer.name == "conv/Conv2D")
    assert kernel.value.dtype == np.float16
    moved = kernel.changed(0.01).astype(np.float64) / kernel.value.astype(np.float64)
    assert np.all(np.abs(moved[kernel.value != 0] - 1.01) < 2e-3)   # rounded to half precision
    result = api.optimize(api.Source(model.graph_def, "half", inputs=model.inputs,
                                     outputs=model.outputs))
    found = result.verification.watching.sensitivity
    assert result.verification.passed and found.probed == found.weights == 6


def test_a_probe_that_raises_is_cannot_verify(monkeypatch):
    graph_def = neutral_matmul()

    def broken(self, change):
        raise RuntimeError("no such kernel")
    monkeypatch.setattr(sensitivity.Layer, "changed", broken)
    with pytest.raises(CannotVerify) as refused:
        api.optimize(api.Source(graph_def, "broken", inputs=["input"], outputs=["output"]))
    assert "could not be probed" in str(refused.value) and \
        refused.value.verification.cannot_verify


def test_a_deadline_that_ends_first_is_cannot_verify_and_unprobeable_weights_are_listed():
    """The probe itself, on a run that notices everything: ``deadline`` 0 leaves weights
    unprobed (an error: "cannot verify" in the check); weights that cannot be fed are listed."""
    layers = [sensitivity.Layer(f"w{i}", f"w{i}:0", None) for i in range(3)]
    for layer in layers:
        layer.const = type("Const", (), {"_tfsurgery_value": np.ones(4, np.float32)})()
    kwargs = dict(relative_error=lambda e, m: float(np.max(np.abs(m - e))))
    noticed = lambda feeds, fetches: [np.float32(2.0)]         # noqa: E731
    found = sensitivity.probe(noticed, layers, 3, {}, ["y"], [np.float32(1.0)], 1e-4, 0.0,
                              deadline=-1.0, **kwargs)
    assert not found.sees and "3 of the 3 weights were not probed" in found.error
    found = sensitivity.probe(noticed, layers, 3, {}, ["y"], [np.float32(1.0)], 1e-4, 0.0,
                              **kwargs)
    assert found.sees and found.probed == 3 and found.complete
    found = sensitivity.probe(noticed, [], 0, {}, ["y"], [np.float32(1.0)], 1e-4, 0.0,
                              unprobeable=["loop/MatMul"], **kwargs)
    # weights inside a loop or cond frame cannot be fed: listed, not (yet) a refusal
    assert found.unprobeable == ["loop/MatMul"] and found.as_dict()["unprobeable"]
