"""Benchmark: one ONNX-Adam step over ResNet-50's parameters vs TF's fused Adam.

Compares, in the same run with interleaved repeats (median wall time):

* ``fused``: ``tf.raw_ops.ResourceApplyAdam`` once per variable, in one
  ``tf.function`` (the baseline; in-place updates of resource variables);
* ``onnx``: ``training_ops`` Adam as a functional ``tf.function``
  (tensors in, new tensors out);
* ``onnx_jit``: the same with ``jit_compile=True`` (XLA fuses the
  element-wise chain per tensor);
* ``onnx_jit_assign``: XLA-compiled step that reads resource variables,
  applies the op and assigns the results back (what ``OnnxAdam`` does
  under ``model.fit(jit_compile=True)``).

All variants start from the same state; after the warm-up step they are
checked to agree with the fused kernel before anything is timed.

Run ``python -m benchmarks.training`` to print the result as JSON.
"""

import argparse
import json
import statistics
import time

import numpy as np
import tensorflow as tf

from tfsurgery.training import ops as training_ops

ALPHA, BETA, EPSILON, LR = 0.9, 0.999, 1e-6, 1e-3


def resnet50_shapes():
    """Shapes of ResNet-50's trainable weights (214 tensors, ~25.6 M values)."""
    model = tf.keras.applications.ResNet50(weights=None)
    return [tuple(w.shape) for w in model.trainable_weights]


def _fused_step(xs, vs, hs, gs, t):
    """TF's fused kernel, one ResourceApplyAdam per variable."""

    @tf.function
    def step():
        power1 = tf.raw_ops.Pow(x=np.float32(ALPHA), y=t)
        power2 = tf.raw_ops.Pow(x=np.float32(BETA), y=t)
        for x, v, h, g in zip(xs, vs, hs, gs):
            tf.raw_ops.ResourceApplyAdam(
                var=x.handle, m=v.handle, v=h.handle,
                beta1_power=power1, beta2_power=power2, lr=np.float32(LR),
                beta1=np.float32(ALPHA), beta2=np.float32(BETA), epsilon=np.float32(EPSILON), grad=g,
            )

    return step


def _onnx_step(shapes, tensors, jit_compile):
    fn = training_ops.op_function("Adam", shapes, tf.float32, jit_compile=jit_compile,
                                  alpha=ALPHA, beta=BETA, epsilon=EPSILON)
    r, t = tf.constant(LR, tf.float32), tf.constant(1, tf.int64)
    return lambda: fn(r, t, *tensors)


def _onnx_assign_step(shapes, xs, vs, hs, gs):
    fn = training_ops.op_function("Adam", shapes, tf.float32, alpha=ALPHA, beta=BETA, epsilon=EPSILON)
    r, t = tf.constant(LR, tf.float32), tf.constant(1, tf.int64)
    states = [*xs, *vs, *hs]

    @tf.function(jit_compile=True)
    def step():
        reads = [tf.raw_ops.ReadVariableOp(resource=s.handle, dtype=tf.float32) for s in states]
        outputs = fn(r, t, *reads[: len(xs)], *gs, *reads[len(xs):])
        for s, value in zip(states, outputs):
            tf.raw_ops.AssignVariableOp(resource=s.handle, value=value)

    return step


def _check_same_update(fused_state, others):
    """Guard: after one step from the same state every variant matches the fused kernel."""
    expected = [v.numpy() for v in fused_state]
    for name, values in others.items():
        for got, want in zip(values, expected, strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6, err_msg=name)


def adam_step_benchmark(repeats=10, shapes=None, seed=0):
    """Median time of one Adam step per variant and ratios to the fused kernel.

    ``shapes`` defaults to ResNet-50's trainable weight shapes.
    """
    shapes = shapes or resnet50_shapes()
    rng = np.random.default_rng(seed)

    def random(shape, positive=False):
        value = rng.standard_normal(shape, dtype=np.float32)
        return np.abs(value) if positive else value

    # x, v, h start values (h non-negative); g constant tensors.
    values = {k: [random(s, positive=(k == "h")) for s in shapes] for k in "xvh"}
    gs = [tf.constant(random(s)) for s in shapes]

    def variables():
        return [[tf.Variable(a) for a in values[k]] for k in "xvh"]

    xs, vs, hs = ([tf.constant(a) for a in values[k]] for k in "xvh")
    fused_vars, assigned_vars = variables(), variables()
    variants = {
        "fused": _fused_step(*fused_vars, gs, tf.constant(1.0)),
        "onnx": _onnx_step(shapes, [*xs, *gs, *vs, *hs], jit_compile=False),
        "onnx_jit": _onnx_step(shapes, [*xs, *gs, *vs, *hs], jit_compile=True),
        "onnx_jit_assign": _onnx_assign_step(shapes, *assigned_vars, gs),
    }
    # Warm-up (tracing, XLA compilation), then check all compute the same step.
    warm = {name: step() for name, step in variants.items()}
    _check_same_update(
        sum(fused_vars, []),
        {"onnx": warm["onnx"], "onnx_jit": warm["onnx_jit"], "onnx_jit_assign": sum(assigned_vars, [])},
    )
    del warm

    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, step in variants.items():  # interleaved
            start = time.perf_counter()
            result = step()
            times[name].append(time.perf_counter() - start)
            del result
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "n_tensors": len(shapes),
        "n_parameters": int(sum(np.prod(s) for s in shapes)),
        "repeats": repeats,
        "median_seconds": medians,
        "ratio_to_fused": {name: medians[name] / medians["fused"] for name in variants if name != "fused"},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(adam_step_benchmark(repeats=args.repeats), indent=2))


if __name__ == "__main__":
    main()
