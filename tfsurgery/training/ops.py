"""ONNX ``ai.onnx.preview.training`` optimizer ops (Momentum, Adagrad, Adam) in TensorFlow.

Each op takes its inputs in ONNX order -- ``R`` (learning rate, float scalar),
``T`` (update count, int64 scalar), then all X, all G, then all of each state
(V for Momentum, H for Adagrad, V then H for Adam) -- and returns the outputs
in ONNX order as a tuple: all X_new, then each state's new values.

A thin Python wrapper validates the inputs; the math runs in a ``tf.function``
(one per op and attribute set) whose body is made of ``tf.raw_ops`` calls
only, with the attributes baked into the trace as constants.  ``T == 0`` is handled with
an in-graph select, so the traced graph is exportable (see ``op_function``).

Attributes are ONNX FLOAT attributes, i.e. 32-bit: they are rounded to float32
before use so float64 results agree with the native ONNX node.
"""

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

DOMAIN = "ai.onnx.preview.training"
_FLOAT_DTYPES = (tf.float32, tf.float64)
MOMENTUM_MODES = ("standard", "nesterov")


# ----------------------------------------------------------------------------
# Graph bodies: tf.raw_ops only.  ``xs``, ``gs`` and the states are lists of
# tensors of one float dtype; ``r`` is a float scalar and ``t`` an int64 scalar.
# ----------------------------------------------------------------------------


def _const(value, dtype):
    """A Python constant as a numpy scalar of ``dtype`` (raw_ops embed it)."""
    return np.asarray(value, dtype=tf.as_dtype(dtype).as_numpy_dtype)


def _cast(x, dtype):
    return x if x.dtype == dtype else tf.raw_ops.Cast(x=x, DstT=dtype)


def _complement(attr):
    """1 - attr as onnx.reference computes it: in float32, like the attribute."""
    return float(np.float32(1.0) - np.float32(attr))


def _t_positive(t):
    return tf.raw_ops.Greater(x=t, y=_const(0, tf.int64))


def _regularize(x, g, norm_coefficient):
    """G_regularized = norm_coefficient * X + G.

    With a zero coefficient (a trace-time constant) the two ops are skipped
    when that cannot change the broadcast shape; this only differs from ONNX
    when X holds inf/nan (0 * inf = nan).
    """
    if norm_coefficient == 0.0 and _broadcasts_into(x.shape, g.shape):
        return g
    return tf.raw_ops.AddV2(x=tf.raw_ops.Mul(x=_const(norm_coefficient, x.dtype), y=x), y=g)


def _broadcasts_into(shape, target):
    """Whether broadcasting static ``shape`` against ``target`` leaves ``target`` unchanged."""
    if not (shape.is_fully_defined() and target.is_fully_defined()):
        return False
    return tf.broadcast_static_shape(shape, target).as_list() == target.as_list()


def _momentum_body(r, t, xs, gs, vs, *, alpha, beta, mode, norm_coefficient):
    dtype = xs[0].dtype
    lr = _cast(r, dtype)
    # beta_adjusted = T > 0 ? beta : 1
    beta_adjusted = tf.raw_ops.SelectV2(
        condition=_t_positive(t), t=_const(beta, dtype), e=_const(1.0, dtype)
    )
    x_news, v_news = [], []
    for x, g, v in zip(xs, gs, vs):
        g_reg = _regularize(x, g, norm_coefficient)
        v_new = tf.raw_ops.AddV2(
            x=tf.raw_ops.Mul(x=_const(alpha, dtype), y=v),
            y=tf.raw_ops.Mul(x=beta_adjusted, y=g_reg),
        )
        direction = v_new
        if mode == "nesterov":
            direction = tf.raw_ops.AddV2(x=g_reg, y=tf.raw_ops.Mul(x=_const(alpha, dtype), y=v_new))
        x_news.append(tf.raw_ops.Sub(x=x, y=tf.raw_ops.Mul(x=lr, y=direction)))
        v_news.append(v_new)
    return (*x_news, *v_news)


def _adagrad_body(r, t, xs, gs, hs, *, decay_factor, epsilon, norm_coefficient):
    dtype = xs[0].dtype
    # r = R / (1 + T * decay_factor), scalar math in float64 like the reference.
    denominator = tf.raw_ops.AddV2(
        x=_const(1.0, tf.float64),
        y=tf.raw_ops.Mul(x=_cast(t, tf.float64), y=_const(decay_factor, tf.float64)),
    )
    lr = _cast(tf.raw_ops.RealDiv(x=_cast(r, tf.float64), y=denominator), dtype)
    x_news, h_news = [], []
    for x, g, h in zip(xs, gs, hs):
        g_reg = _regularize(x, g, norm_coefficient)
        h_new = tf.raw_ops.AddV2(x=h, y=tf.raw_ops.Mul(x=g_reg, y=g_reg))
        h_adaptive = tf.raw_ops.AddV2(x=tf.raw_ops.Sqrt(x=h_new), y=_const(epsilon, dtype))
        step = tf.raw_ops.RealDiv(x=tf.raw_ops.Mul(x=lr, y=g_reg), y=h_adaptive)
        x_news.append(tf.raw_ops.Sub(x=x, y=step))
        h_news.append(h_new)
    return (*x_news, *h_news)


def _adam_learning_rate(r, t, alpha, beta):
    """R_adjusted = T > 0 ? R * Sqrt(1 - beta**T) / (1 - alpha**T) : R, in float64."""
    positive = _t_positive(t)
    t64 = _cast(t, tf.float64)
    one = _const(1.0, tf.float64)

    def bias_correction(base):
        # 1 - base**T if T > 0 else 1.  Selecting per factor (rather than
        # between R and a 0/0 at T == 0) keeps both branches finite: tf2onnx
        # lowers SelectV2 to cond * a + (1 - cond) * b, where a NaN would leak.
        power = tf.raw_ops.Pow(x=_const(base, tf.float64), y=t64)
        return tf.raw_ops.SelectV2(condition=positive, t=tf.raw_ops.Sub(x=one, y=power), e=one)

    return tf.raw_ops.RealDiv(
        x=tf.raw_ops.Mul(x=_cast(r, tf.float64), y=tf.raw_ops.Sqrt(x=bias_correction(beta))),
        y=bias_correction(alpha),
    )


def _adam_body(r, t, xs, gs, vs, hs, *, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post):
    dtype = xs[0].dtype
    lr = _cast(_adam_learning_rate(r, t, alpha, beta), dtype)
    x_news, v_news, h_news = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g_reg = _regularize(x, g, norm_coefficient)
        v_new = tf.raw_ops.AddV2(
            x=tf.raw_ops.Mul(x=_const(alpha, dtype), y=v),
            y=tf.raw_ops.Mul(x=_const(_complement(alpha), dtype), y=g_reg),
        )
        h_new = tf.raw_ops.AddV2(
            x=tf.raw_ops.Mul(x=_const(beta, dtype), y=h),
            y=tf.raw_ops.Mul(x=_const(_complement(beta), dtype), y=tf.raw_ops.Mul(x=g_reg, y=g_reg)),
        )
        h_sqrt = tf.raw_ops.AddV2(x=tf.raw_ops.Sqrt(x=h_new), y=_const(epsilon, dtype))
        step = tf.raw_ops.Mul(x=lr, y=tf.raw_ops.RealDiv(x=v_new, y=h_sqrt))
        x_new = tf.raw_ops.Sub(x=x, y=step)
        if norm_coefficient_post != 0.0:
            x_new = tf.raw_ops.Mul(x=_const(_complement(norm_coefficient_post), dtype), y=x_new)
        x_news.append(x_new)
        v_news.append(v_new)
        h_news.append(h_new)
    return (*x_news, *v_news, *h_news)


@dataclass(frozen=True)
class _OpSpec:
    name: str
    states: tuple  # names of the per-tensor state inputs after X and G
    body: Callable

    @property
    def groups(self):
        return 2 + len(self.states)


_OPS = {
    spec.name: spec
    for spec in (
        _OpSpec("Momentum", ("V",), _momentum_body),
        _OpSpec("Adagrad", ("H",), _adagrad_body),
        _OpSpec("Adam", ("V", "H"), _adam_body),
    )
}


def _flat_body(spec, attrs):
    """Body over flat (R, T, *tensors) inputs, as ONNX lays them out."""

    def body(r, t, *tensors):
        n = len(tensors) // spec.groups
        groups = [list(tensors[i * n : (i + 1) * n]) for i in range(spec.groups)]
        return spec.body(r, t, *groups, **attrs)

    return body


@functools.lru_cache(maxsize=256)
def _graph(name, attr_items):
    """The tf.function of op ``name`` with its attributes baked in as constants."""
    body = _flat_body(_OPS[name], dict(attr_items))
    return tf.function(lambda r, t, tensors: body(r, t, *tensors), reduce_retracing=True)


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------


def _to_tensor(value, dtype=None):
    if hasattr(value, "dtype"):  # tensors, variables, numpy: keep their dtype
        return tf.convert_to_tensor(value)
    try:  # Python numbers/lists
        return tf.convert_to_tensor(value, dtype=dtype)
    except (TypeError, ValueError):  # e.g. T=1.0: let the dtype checks report it
        return tf.convert_to_tensor(value)


def _check_scalar(tensor, name):
    if tensor.shape.rank not in (None, 0):
        raise ValueError(f"{name} must be a scalar, got shape {tensor.shape}")


def _validate(spec, R, T, tensors):
    if not tensors or len(tensors) % spec.groups:
        layout = ", ".join(f"{g}..." for g in ("X", "G", *spec.states))
        raise ValueError(
            f"{spec.name} expects {spec.groups}*n tensors ({layout}), got {len(tensors)}"
        )
    tensors = [_to_tensor(x) for x in tensors]
    dtype = tensors[0].dtype
    if dtype not in _FLOAT_DTYPES or any(x.dtype != dtype for x in tensors):
        raise TypeError(
            f"{spec.name} tensors must all be float32 or all float64, got {[x.dtype.name for x in tensors]}"
        )
    r = _to_tensor(R, dtype)
    if r.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"R must be float32 or float64, got {r.dtype.name}")
    t = _to_tensor(T, tf.int64)
    if t.dtype != tf.int64:
        raise TypeError(f"T must be int64, got {t.dtype.name}")
    _check_scalar(r, "R")
    _check_scalar(t, "T")
    n = len(tensors) // spec.groups
    for i in range(n):
        shapes = [tensors[i + k * n].shape for k in range(spec.groups)]
        try:
            for shape in shapes[1:]:
                tf.broadcast_static_shape(shapes[0], shape)
        except ValueError:
            raise ValueError(
                f"{spec.name} tensor #{i}: shapes {[s.as_list() if s.rank is not None else None for s in shapes]} "
                "are not broadcastable"
            ) from None
    return r, t, tensors


def _prepare_attrs(op_name, attrs):
    """Validate ``mode`` and round FLOAT attributes to float32, as ONNX stores them."""
    if op_name == "Momentum" and attrs.get("mode") not in MOMENTUM_MODES:
        raise ValueError(f"Momentum mode must be one of {MOMENTUM_MODES}, got {attrs.get('mode')!r}")
    return {k: v if k == "mode" else float(np.float32(v)) for k, v in attrs.items()}


def _run(name, R, T, tensors, attrs):
    attrs = _prepare_attrs(name, attrs)
    r, t, tensors = _validate(_OPS[name], R, T, tensors)
    return _graph(name, tuple(sorted(attrs.items())))(r, t, tensors)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------


def momentum(R, T, *tensors, alpha, beta, mode, norm_coefficient):
    """ONNX Momentum: inputs (R, T, X..., G..., V...) -> (X_new..., V_new...)."""
    attrs = dict(alpha=alpha, beta=beta, mode=mode, norm_coefficient=norm_coefficient)
    return _run("Momentum", R, T, tensors, attrs)


def adagrad(R, T, *tensors, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    """ONNX Adagrad: inputs (R, T, X..., G..., H...) -> (X_new..., H_new...)."""
    attrs = dict(decay_factor=decay_factor, epsilon=epsilon, norm_coefficient=norm_coefficient)
    return _run("Adagrad", R, T, tensors, attrs)


def adam(R, T, *tensors, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    """ONNX Adam: inputs (R, T, X..., G..., V..., H...) -> (X_new..., V_new..., H_new...)."""
    attrs = dict(alpha=alpha, beta=beta, epsilon=epsilon,
                 norm_coefficient=norm_coefficient, norm_coefficient_post=norm_coefficient_post)
    return _run("Adam", R, T, tensors, attrs)


OPS = {"Momentum": momentum, "Adagrad": adagrad, "Adam": adam}


def op_function(op_name, shapes, dtype=tf.float32, r_dtype=None, jit_compile=None, **attrs):
    """A ``tf.function`` with a flat input signature (R, T, *tensors) for one op.

    ``shapes`` holds one shape per optimized tensor (X_i, G_i and states share
    it); attributes default as in the op's function.  Meant for
    ``tf2onnx.convert.from_function`` and benchmarking.
    """
    spec = _OPS[op_name]
    attrs = _prepare_attrs(op_name, {**(OPS[op_name].__kwdefaults__ or {}), **attrs})
    signature = [tf.TensorSpec([], r_dtype or dtype, name="R"), tf.TensorSpec([], tf.int64, name="T")]
    for group in ("X", "G", *spec.states):
        signature += [tf.TensorSpec(shape, dtype, name=f"{group}{i}") for i, shape in enumerate(shapes)]
    return tf.function(_flat_body(spec, attrs), input_signature=signature, jit_compile=jit_compile)


def native_onnx_model(op_name, n_tensors, dtype=np.float32, shapes=None, **attrs):
    """A one-node ONNX model running the native ``ai.onnx.preview.training`` op.

    Inputs are named R, T, X0.., G0.., <state>0..; outputs X0_new.., <state>0_new...
    Attributes not given use ONNX's defaults.  ``shapes`` gives one shape per
    optimized tensor (shared by X_i, G_i and its states; dims may be str/None).
    Without it the tensors have unknown rank: valid ONNX IR and fine for
    ``onnx.reference``, but ``onnx.checker`` insists on graph input/output shapes.
    """
    import onnx
    from onnx import helper

    spec = _OPS[op_name]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    shapes = shapes or [None] * n_tensors

    def values(group, suffix=""):
        return [helper.make_tensor_value_info(f"{group}{i}{suffix}", elem, shapes[i]) for i in range(n_tensors)]

    inputs = [
        helper.make_tensor_value_info("R", elem, []),
        helper.make_tensor_value_info("T", onnx.TensorProto.INT64, []),
    ]
    inputs += [v for group in ("X", "G", *spec.states) for v in values(group)]
    outputs = [v for group in ("X", *spec.states) for v in values(group, "_new")]
    node = helper.make_node(op_name, [v.name for v in inputs], [v.name for v in outputs], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], f"{op_name.lower()}_step", inputs, outputs)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version()), helper.make_opsetid(DOMAIN, 1)],
    )
