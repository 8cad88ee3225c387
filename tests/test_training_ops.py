"""ONNX training ops in TensorFlow vs ONNX's conformance cases and onnx.reference."""

import itertools
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from onnx import helper
from onnx.reference import ReferenceEvaluator

from benchmarks import training as training_bench
from tfsurgery.training import ops as training_ops
from tfsurgery.training import adagrad, adam, momentum, native_onnx_model

GROUPS = {"Momentum": 3, "Adagrad": 3, "Adam": 4}
TOLERANCE = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-12)}

# collect_testcases() imports ONNX's case modules once per process and only
# honours its op filter on that first call, so collect in a fresh interpreter.
_COLLECT = f"""
import pickle, sys
from onnx.backend.test.case.node import collect_testcases
cases = [c for c in collect_testcases() if c.model.graph.node[0].op_type in {list(GROUPS)}]
sys.stdout.buffer.write(pickle.dumps(cases))
"""


@pytest.fixture(scope="module")
def conformance_cases():
    out = subprocess.run([sys.executable, "-c", _COLLECT], check=True, capture_output=True).stdout
    return pickle.loads(out)


def test_all_onnx_conformance_cases_match(conformance_cases):
    names = sorted(c.name for c in conformance_cases)
    assert names == sorted([
        "test_adagrad", "test_adagrad_multiple", "test_adam", "test_adam_multiple",
        "test_momentum", "test_momentum_multiple", "test_nesterov_momentum",
    ])
    for case in conformance_cases:
        node = case.model.graph.node[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        for inputs, expected in case.data_sets:
            actual = training_ops.OPS[node.op_type](*inputs, **attrs)
            assert len(actual) == len(expected), case.name
            for got, want in zip(actual, expected):
                np.testing.assert_allclose(got.numpy(), want, rtol=case.rtol, atol=case.atol, err_msg=case.name)


# ---------------------------------------------------------------------------
# Randomised cases against the native node under onnx.reference
# ---------------------------------------------------------------------------


def _maybe(rng, value):
    """Half the time 0 (the regulariser is then skipped at trace time)."""
    return value if rng.random() < 0.5 else 0.0


def _random_attrs(op, rng):
    if op == "Momentum":  # all attributes are required
        return dict(alpha=rng.uniform(0, 1), beta=rng.uniform(0, 1), mode=rng.choice(["standard", "nesterov"]),
                    norm_coefficient=_maybe(rng, rng.uniform(0, 0.1)))
    if op == "Adagrad":
        attrs = dict(decay_factor=_maybe(rng, rng.uniform(0, 1)), epsilon=10 ** rng.uniform(-8, -2),
                     norm_coefficient=_maybe(rng, rng.uniform(0, 0.1)))
    else:
        attrs = dict(alpha=rng.uniform(0.5, 0.99), beta=rng.uniform(0.5, 0.9999), epsilon=10 ** rng.uniform(-8, -2),
                     norm_coefficient=_maybe(rng, rng.uniform(0, 0.1)),
                     norm_coefficient_post=_maybe(rng, rng.uniform(0, 0.1)))
    # Omitted attributes check that our defaults are ONNX's defaults.
    return {k: v for k, v in attrs.items() if rng.random() < 0.7}


def _broadcastable_to(shape, rng):
    """``shape`` with some leading dims dropped and some dims set to 1."""
    shape = list(shape[rng.integers(0, len(shape) + 1):]) if rng.random() < 0.3 else list(shape)
    return tuple(1 if rng.random() < 0.2 else d for d in shape)


def _random_inputs(op, dtype, t_zero, rng):
    n = int(rng.integers(1, 5))
    full_shapes = [tuple(rng.integers(1, 5, size=rng.integers(0, 4))) for _ in range(n)]
    groups = []
    for g in range(GROUPS[op]):
        group = [rng.standard_normal(_broadcastable_to(s, rng)).astype(dtype) for s in full_shapes]
        if g == 3 or (op == "Adagrad" and g == 2):  # H accumulates squares: non-negative
            group = [np.abs(h) for h in group]
        groups.append(group)
    r = np.asarray(rng.uniform(0.001, 0.5), rng.choice([np.float32, np.float64]))
    t = np.asarray(0 if t_zero else rng.integers(1, 100), np.int64)
    return r, t, groups


def _reference(op, attrs, r, t, groups):
    n, dtype = len(groups[0]), groups[0][0].dtype
    model = native_onnx_model(op, n, dtype, **attrs)
    names = [i.name for i in model.graph.input]
    outputs = ReferenceEvaluator(model).run(None, dict(zip(names, [r, t, *itertools.chain(*groups)])))
    if op == "Adam" and n > 1 and dtype == np.float64:
        # onnx.reference's multi-tensor Adam casts to float32; for full float64
        # precision use one node per tensor (the spec applies them independently).
        per_tensor = [_reference(op, attrs, r, t, [[g[i]] for g in groups]) for i in range(n)]
        outputs = [per_tensor[i][k] for k in range(len(outputs) // n) for i in range(n)]
    return outputs


CASES = list(itertools.product(GROUPS, [np.float32, np.float64], [True, False], range(4)))


@pytest.mark.parametrize(
    "op, dtype, t_zero, seed", CASES,
    ids=[f"{op}-{d.__name__}-{'T0' if z else 'T+'}-{s}" for op, d, z, s in CASES],
)
def test_random_cases_match_onnx_reference(op, dtype, t_zero, seed):
    rng = np.random.default_rng([seed, list(GROUPS).index(op), int(t_zero), dtype().itemsize])
    attrs = _random_attrs(op, rng)
    r, t, groups = _random_inputs(op, dtype, t_zero, rng)
    actual = training_ops.OPS[op](r, t, *itertools.chain(*groups), **attrs)
    expected = _reference(op, attrs, r, t, groups)
    assert len(actual) == len(expected) == len(groups[0]) * (GROUPS[op] - 1)
    for got, want in zip(actual, expected):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, **TOLERANCE[dtype])


@pytest.mark.parametrize("op", list(GROUPS))
def test_t_zero_rule_differs_from_t_positive(op):
    """The T == 0 branch is live in the one traced graph (not constant-folded away)."""
    rng = np.random.default_rng(0)
    attrs = dict(alpha=0.5, beta=0.25, mode="standard", norm_coefficient=0.0) if op == "Momentum" else {}
    attrs |= dict(decay_factor=0.5) if op == "Adagrad" else {}
    tensors = [np.abs(rng.standard_normal(3)) for _ in range(GROUPS[op])]
    step = training_ops.op_function(op, [(3,)], tf.float64, **attrs)
    r = tf.constant(0.1, tf.float64)
    x_new = {}
    for t in (0, 1, 5):
        x_new[t] = step(r, tf.constant(t, tf.int64), *tensors)[0].numpy()
        expected = _reference(op, attrs, r.numpy(), np.int64(t), [[a] for a in tensors])[0]
        np.testing.assert_allclose(x_new[t], expected, rtol=1e-12)
    assert not np.allclose(x_new[0], x_new[1])


def test_graph_is_raw_elementwise_ops_without_control_flow():
    step = training_ops.op_function("Adam", [(2, 3)], norm_coefficient=0.1, norm_coefficient_post=0.1)
    ops = {op.type for op in step.get_concrete_function().graph.get_operations()}
    assert ops <= {"Placeholder", "Const", "Cast", "Greater", "SelectV2", "Pow", "Sqrt",
                   "AddV2", "Sub", "Mul", "RealDiv", "Identity", "NoOp"}, ops


def test_jit_compiled_step_matches_graph_step():
    rng = np.random.default_rng(1)
    tensors = [np.abs(rng.standard_normal((4, 5))).astype(np.float32) for _ in range(8)]
    args = [tf.constant(0.01), tf.constant(3, tf.int64), *tensors]
    plain = training_ops.op_function("Adam", [(4, 5)] * 2, norm_coefficient=0.01)(*args)
    xla = training_ops.op_function("Adam", [(4, 5)] * 2, jit_compile=True, norm_coefficient=0.01)(*args)
    for a, b in zip(plain, xla):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_adam_matches_tf_fused_kernel():
    """ONNX Adam with T = t is TF's ResourceApplyAdam at step t (the benchmark baseline)."""
    rng = np.random.default_rng(2)
    x, g, v = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    h = np.abs(rng.standard_normal((3, 4))).astype(np.float32)
    alpha, beta, eps, lr, t = 0.9, 0.99, 1e-6, 0.01, 3
    ours = adam(np.float32(lr), np.int64(t), x, g, v, h, alpha=alpha, beta=beta, epsilon=eps)
    var, m, s = tf.Variable(x), tf.Variable(v), tf.Variable(h)
    tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=s.handle, beta1_power=np.float32(alpha) ** t,
                                 beta2_power=np.float32(beta) ** t, lr=np.float32(lr), beta1=np.float32(alpha),
                                 beta2=np.float32(beta), epsilon=np.float32(eps), grad=g)
    for got, want in zip(ours, (var, m, s)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_python_scalars_and_keyword_defaults():
    x, g, h = np.ones(2), np.full(2, 0.5), np.zeros(2)
    (x_new, h_new) = adagrad(0.1, 0, x, g, h)  # R, T as Python numbers
    np.testing.assert_allclose(h_new, [0.25, 0.25])
    np.testing.assert_allclose(x_new, 1 - 0.1 * 0.5 / (0.5 + np.float32(1e-6)))


# ---------------------------------------------------------------------------
# Bad calls
# ---------------------------------------------------------------------------

X = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("call, error, message", [
    (lambda: adam(0.1, 1, X, X, X), ValueError, r"Adam expects 4\*n tensors"),
    (lambda: adagrad(0.1, 1), ValueError, r"Adagrad expects 3\*n tensors"),
    (lambda: adagrad(0.1, 1, X, np.ones((4,), np.float32), X), ValueError, "not broadcastable"),
    (lambda: adagrad(np.ones(2, np.float32), 1, X, X, X), ValueError, "R must be a scalar"),
    (lambda: adagrad(0.1, np.ones(1, np.int64), X, X, X), ValueError, "T must be a scalar"),
    (lambda: adagrad(0.1, 1, *[X.astype(np.float16)] * 3), TypeError, "float32 or all float64"),
    (lambda: adagrad(0.1, 1, X, X.astype(np.float64), X), TypeError, "float32 or all float64"),
    (lambda: adagrad(np.int64(1), 1, X, X, X), TypeError, "R must be float32 or float64"),
    (lambda: adagrad(0.1, np.int32(1), X, X, X), TypeError, "T must be int64"),
    (lambda: adagrad(0.1, 1.0, X, X, X), TypeError, "T must be int64"),
    (lambda: momentum(0.1, 1, X, X, X, alpha=0.9, beta=1.0, mode="nesterv", norm_coefficient=0.0),
     ValueError, "mode must be one of"),
])
def test_bad_calls_raise(call, error, message):
    with pytest.raises(error, match=message):
        call()



# ---------------------------------------------------------------------------
# Benchmark plumbing (no timing assertions)
# ---------------------------------------------------------------------------


def test_benchmark_shapes_are_resnet50_trainable_weights():
    shapes = training_bench.resnet50_shapes()
    assert len(shapes) == 214
    assert sum(int(np.prod(s)) for s in shapes) == 25_583_592


def test_benchmark_runs_and_reports_ratios():
    # adam_step_benchmark itself checks that every variant computes the fused kernel's step.
    result = training_bench.adam_step_benchmark(repeats=2, shapes=[(64, 32), (32,), ()])
    assert (result["n_tensors"], result["n_parameters"]) == (3, 64 * 32 + 32 + 1)
    assert set(result["ratio_to_fused"]) == {"onnx", "onnx_jit", "onnx_jit_assign"}
    assert all(np.isfinite(r) and r > 0 for r in result["ratio_to_fused"].values())
