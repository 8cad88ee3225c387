"""Exporting the training ops: tf2onnx (standard ops, onnxruntime) and the native preview-training node."""


import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf
import tf2onnx
from onnx.reference import ReferenceEvaluator

from tfsurgery.training import ops as training_ops
from tfsurgery.training import native_onnx_model

OPSET = 17
STATES = {"Momentum": 1, "Adagrad": 1, "Adam": 2}
TOLERANCE = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _random_tensors(op, shapes, dtype, rng):
    """X..., G..., then non-negative states (H must be, V may be)."""
    groups = 2 + STATES[op]
    tensors = [rng.standard_normal(s).astype(dtype) for _ in range(groups) for s in shapes]
    return [np.asarray(np.abs(a) if k >= 2 * len(shapes) else a) for k, a in enumerate(tensors)]


def _convert(function):
    model, _ = tf2onnx.convert.from_function(function, input_signature=function.input_signature, opset=OPSET)
    return model


def _ort_session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


EXPORTS = {  # id: (op, tensor shapes, dtype, R dtype, attributes)
    "momentum-nesterov-f64": ("Momentum", [(3, 4), (None,)], np.float64, np.float64,
                              dict(alpha=0.9, beta=0.3, mode="nesterov", norm_coefficient=0.01)),
    "adagrad-f32": ("Adagrad", [(5,), (2, 3)], np.float32, np.float32,
                    dict(decay_factor=0.2, epsilon=1e-4, norm_coefficient=0.02)),
    "adam-f32-r64": ("Adam", [(4, 2), (), (3,)], np.float32, np.float64,
                     dict(alpha=0.8, beta=0.95, epsilon=1e-5, norm_coefficient=0.01, norm_coefficient_post=0.03)),
}


@pytest.mark.parametrize("config", EXPORTS.values(), ids=EXPORTS.keys())
def test_tf2onnx_export_runs_in_onnxruntime(config):
    op, shapes, dtype, r_dtype, attrs = config
    function = training_ops.op_function(op, shapes, tf.as_dtype(dtype), r_dtype=tf.as_dtype(r_dtype), **attrs)
    model = _convert(function)
    assert {node.domain for node in model.graph.node} <= {"", "ai.onnx"}  # standard ops only
    session = _ort_session(model)
    names = [i.name for i in session.get_inputs()]
    reference = ReferenceEvaluator(native_onnx_model(op, len(shapes), dtype, **attrs))

    rng = np.random.default_rng(0)
    concrete = [tuple(d or 7 for d in s) for s in shapes]  # fill dynamic dims
    for t in (0, 1, 9):
        feeds = [np.asarray(0.05, r_dtype), np.asarray(t, np.int64), *_random_tensors(op, concrete, dtype, rng)]
        onnx_out = session.run(None, dict(zip(names, feeds)))
        tf_out = function(*feeds)
        ref_out = reference.run(None, dict(zip([i.name for i in reference.proto_.graph.input], feeds)))
        assert len(onnx_out) == len(tf_out) == len(shapes) * (1 + STATES[op])
        for got, want, ref in zip(onnx_out, tf_out, ref_out):
            assert got.dtype == dtype
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(got, ref, **TOLERANCE[dtype])


@pytest.mark.parametrize("op, attrs", [
    ("Momentum", dict(alpha=0.7, beta=0.2, mode="standard", norm_coefficient=0.1)),
    ("Adagrad", {}),  # ONNX defaults
    ("Adam", dict(alpha=0.85, norm_coefficient_post=0.01)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_node_model_is_valid_and_matches_tf(op, attrs, dtype):
    model = native_onnx_model(op, 2, dtype, shapes=[[2, 3], [4]], **attrs)
    onnx.checker.check_model(model, full_check=True)
    assert {(o.domain, o.version) for o in model.opset_import} >= {(training_ops.DOMAIN, 1)}
    assert model.graph.node[0].domain == training_ops.DOMAIN

    rng = np.random.default_rng(1)
    tensors = _random_tensors(op, [(2, 3), (4,)], dtype, rng)
    r, t = np.asarray(0.1, dtype), np.asarray(3, np.int64)
    names = [i.name for i in model.graph.input]
    expected = ReferenceEvaluator(model).run(None, dict(zip(names, [r, t, *tensors])))
    actual = training_ops.OPS[op](r, t, *tensors, **attrs)
    for got, want in zip(actual, expected, strict=True):
        # onnx.reference's multi-tensor Adam returns float32 even for float64.
        np.testing.assert_allclose(got.numpy(), want, **TOLERANCE[want.dtype.type])


def test_native_node_model_checker_enforces_the_schema():
    with pytest.raises(onnx.checker.ValidationError):  # Momentum's attributes are required
        onnx.checker.check_model(native_onnx_model("Momentum", 1, np.float32, [[3]], alpha=0.9), full_check=True)


# ---------------------------------------------------------------------------
# A whole training step: forward, gradient and the optimizer op in one graph
# ---------------------------------------------------------------------------

BATCH, IN, HIDDEN, OUT = 8, 3, 5, 2
PARAM_SHAPES = [(IN, HIDDEN), (HIDDEN,), (HIDDEN, OUT), (OUT,)]
ADAM = dict(alpha=0.9, beta=0.99, epsilon=1e-6, norm_coefficient=0.001)


def _training_step():
    spec = lambda shape, name: tf.TensorSpec(shape, tf.float32, name=name)  # noqa: E731
    signature = [spec((BATCH, IN), "x"), spec((BATCH, OUT), "y"), spec((), "R"), tf.TensorSpec((), tf.int64, name="T")]
    signature += [spec(s, f"{group}{i}") for group in ("param", "v", "h") for i, s in enumerate(PARAM_SHAPES)]

    @tf.function(input_signature=signature)
    def step(x, y, r, t, *tensors):
        params = list(tensors[:4])
        with tf.GradientTape() as tape:
            tape.watch(params)
            w1, b1, w2, b2 = params
            hidden = tf.matmul(x, w1) + b1
            # Softsign spelled out: tf2onnx has no *Grad ops (TanhGrad, ReluGrad, ...),
            # but this one's gradient is plain arithmetic.
            hidden = hidden / (1.0 + tf.abs(hidden))
            prediction = tf.matmul(hidden, w2) + b2
            loss = tf.reduce_mean(tf.square(prediction - y))
        grads = tape.gradient(loss, params)
        return (loss, *training_ops.adam(r, t, *params, *grads, *tensors[4:], **ADAM))

    return step


def test_training_step_graph_exports_and_trains_in_onnxruntime():
    step = _training_step()
    session = _ort_session(_convert(step))
    names = [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    y = rng.standard_normal((BATCH, OUT)).astype(np.float32)
    params = [rng.standard_normal(s).astype(np.float32) for s in PARAM_SHAPES]
    zeros = [np.zeros(s, np.float32) for s in PARAM_SHAPES]
    tf_state = ort_state = params + zeros + zeros
    losses = []
    for t in range(4):  # feed each runtime its own outputs back
        r, t = np.asarray(0.05, np.float32), np.asarray(t, np.int64)
        tf_out = [o.numpy() for o in step(x, y, r, t, *tf_state)]
        ort_out = session.run(None, dict(zip(names, [x, y, r, t, *ort_state])))
        for got, want in zip(ort_out, tf_out, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        tf_state, ort_state = tf_out[1:], ort_out[1:]
        losses.append(float(ort_out[0]))
    assert losses[-1] < losses[0]  # it does optimise
