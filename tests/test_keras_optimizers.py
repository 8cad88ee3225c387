"""Keras 3 optimizers built on the ONNX training ops: model.fit vs ONNX reference, step by step."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from onnx.reference import ReferenceEvaluator

from tfsurgery.training import OnnxAdagrad, OnnxAdam, OnnxMomentum
from tfsurgery.training import native_onnx_model

BATCH, SAMPLES = 16, 40  # 3 steps per epoch, the last one a partial batch


def _data_and_model(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SAMPLES, 5)).astype(np.float32)
    y = rng.standard_normal((SAMPLES, 2)).astype(np.float32)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(6, activation="tanh", bias_initializer="random_normal"),
        keras.layers.Dense(2, bias_initializer="random_normal"),
    ])
    return x, y, model


class _StepRecorder(keras.callbacks.Callback):
    """Records, per batch, the op inputs (weights, gradients, state) and the results."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y, self.steps = x, y, []
        self.loss = keras.losses.MeanSquaredError()

    def _snapshot(self):
        opt = self.model.optimizer
        variables = self.model.trainable_variables
        states = [[s.numpy() for s in opt.onnx_state(v)] for v in variables]
        # Regroup per state kind: [V0, V1, ...], [H0, H1, ...]
        per_kind = [list(kind) for kind in zip(*states)]
        return [v.numpy() for v in variables], per_kind

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        if not opt.built:  # keras builds it lazily inside the first train step
            opt.build(self.model.trainable_variables)
        epoch_batch = slice(batch * BATCH, (batch + 1) * BATCH)
        with tf.GradientTape() as tape:
            loss = self.loss(self.y[epoch_batch], self.model(self.x[epoch_batch], training=True))
        grads = tape.gradient(loss, self.model.trainable_variables)
        weights, states = self._snapshot()
        self.steps.append({
            "R": np.asarray(opt.learning_rate.numpy(), np.float32),
            "iterations": int(opt.iterations.numpy()),
            "inputs": [weights, [g.numpy() for g in grads], *states],
        })

    def on_train_batch_end(self, batch, logs=None):
        weights, states = self._snapshot()
        self.steps[-1]["outputs"] = [weights, *states]


ADAM_ATTRS = dict(alpha=0.85, beta=0.95, epsilon=1e-4, norm_coefficient=0.01, norm_coefficient_post=0.02)
CONFIGS = {  # id: (optimizer class, ONNX op, attributes, T offset, jit_compile)
    "momentum": (OnnxMomentum, "Momentum", dict(alpha=0.8, beta=0.7, mode="standard", norm_coefficient=0.0), 0, False),
    "nesterov": (OnnxMomentum, "Momentum", dict(alpha=0.9, beta=0.6, mode="nesterov", norm_coefficient=0.05), 0, False),
    "adagrad": (OnnxAdagrad, "Adagrad", dict(decay_factor=0.3, epsilon=1e-5, norm_coefficient=0.02), 0, False),
    "adam": (OnnxAdam, "Adam", ADAM_ATTRS, 1, False),
    "adam-xla": (OnnxAdam, "Adam", ADAM_ATTRS, 1, True),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_fit_matches_onnx_reference_step_by_step(config):
    optimizer_cls, op_name, attrs, t_offset, jit_compile = config
    x, y, model = _data_and_model(seed=len(attrs) + jit_compile)
    model.compile(optimizer=optimizer_cls(learning_rate=0.05, **attrs), loss="mse", jit_compile=jit_compile)
    recorder = _StepRecorder(x, y)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[recorder])

    n = len(model.trainable_variables)
    reference = ReferenceEvaluator(native_onnx_model(op_name, n, np.float32, **attrs))
    input_names = [i.name for i in reference.proto_.graph.input]
    assert [s["iterations"] for s in recorder.steps] == list(range(6))
    for step in recorder.steps:
        # Documented T mapping: T = keras iterations (+1 for Adam).
        t = np.array(step["iterations"] + t_offset, np.int64)
        feeds = dict(zip(input_names, [step["R"], t, *[a for group in step["inputs"] for a in group]]))
        expected = reference.run(None, feeds)
        actual = [a for group in step["outputs"] for a in group]
        for got, want in zip(actual, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # The run really trained: the weights moved away from their start.
    assert not np.allclose(recorder.steps[0]["inputs"][0][0], recorder.steps[-1]["outputs"][0][0])


def test_onnx_adam_equals_keras_adam():
    """With T = iterations + 1 and no regularisation, ONNX Adam is the Adam of the paper."""
    finals = []
    for optimizer in (OnnxAdam(0.02, alpha=0.8, beta=0.99, epsilon=1e-6), keras.optimizers.Adam(0.02, 0.8, 0.99, 1e-6)):
        x, y, model = _data_and_model(seed=7)
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        finals.append([w.numpy() for w in model.trainable_variables])
    for ours, theirs in zip(*finals):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_config_round_trip():
    optimizer = OnnxMomentum(learning_rate=0.1, alpha=0.5, beta=0.25, mode="nesterov", norm_coefficient=0.01)
    clone = OnnxMomentum.from_config(optimizer.get_config())
    assert (clone.alpha, clone.beta, clone.mode, clone.norm_coefficient) == (0.5, 0.25, "nesterov", 0.01)
    assert float(clone.learning_rate) == pytest.approx(0.1)


def test_unknown_momentum_mode_rejected():
    with pytest.raises(ValueError, match="mode must be one of"):
        OnnxMomentum(mode="heavy-ball")
