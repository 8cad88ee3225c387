"""Keras 3 optimizers (TensorFlow backend) running the ONNX training ops.

Each optimizer keeps the op's per-variable state (Momentum: V; Adagrad: H;
Adam: V, H) in zero-initialised slot variables and, per update, calls the op
with ``R = learning_rate`` and an update count ``T`` derived from keras'
``iterations`` (the number of updates already applied, 0 at the first step):

* ``OnnxMomentum`` and ``OnnxAdagrad``: ``T = iterations`` -- ONNX's 0-based
  count (Momentum's ``beta_adjusted`` is 1 exactly at the first update and
  Adagrad's first update uses the undecayed rate ``R``).
* ``OnnxAdam``: ``T = iterations + 1`` -- the 1-based step of the Adam paper,
  so the first update is already bias-corrected; with ``T = 0`` ONNX skips
  the correction and the first step would be ``R (1 - alpha) / sqrt(1 - beta)``
  long per coordinate (~3.2 R with the defaults) instead of ~R.
  With the norm coefficients at 0 this equals ``keras.optimizers.Adam``.

``onnx_t(iterations)`` applies the mapping; ``onnx_state(variable)`` gives the
slot variables in ONNX order.
"""

import keras
import tensorflow as tf

import tfsurgery.training.ops as training_ops


class _OnnxOptimizer(keras.optimizers.Optimizer):
    op = None  # a training_ops function
    state_names = ()  # slot names in ONNX input order
    t_offset = 0  # ONNX T = keras iterations + t_offset
    attr_names = ()

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._states = [self.add_optimizer_variables(var_list, name) for name in self.state_names]

    def onnx_state(self, variable):
        """The op's state variables for ``variable``, in ONNX order."""
        index = self._get_variable_index(variable)
        return [states[index] for states in self._states]

    def onnx_t(self, iterations):
        return iterations + self.t_offset

    def update_step(self, gradient, variable, learning_rate):
        states = self.onnx_state(variable)
        t = self.onnx_t(tf.convert_to_tensor(self.iterations, tf.int64))
        gradient = tf.cast(gradient, variable.dtype)
        outputs = self.op(learning_rate, t, variable, gradient, *states, **self._attrs())
        for target, value in zip([variable, *states], outputs):
            self.assign(target, value)

    def _attrs(self):
        return {name: getattr(self, name) for name in self.attr_names}

    def get_config(self):
        return {**super().get_config(), **self._attrs()}


class OnnxMomentum(_OnnxOptimizer):
    """SGD with (standard or Nesterov) momentum, as ONNX ``Momentum``."""

    op = staticmethod(training_ops.momentum)
    state_names = ("momentum",)
    attr_names = ("alpha", "beta", "mode", "norm_coefficient")

    def __init__(self, learning_rate=0.01, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0, **kwargs):
        if mode not in training_ops.MOMENTUM_MODES:
            raise ValueError(f"mode must be one of {training_ops.MOMENTUM_MODES}, got {mode!r}")
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.alpha, self.beta, self.mode, self.norm_coefficient = alpha, beta, mode, norm_coefficient


class OnnxAdagrad(_OnnxOptimizer):
    """Adagrad with learning-rate decay, as ONNX ``Adagrad``."""

    op = staticmethod(training_ops.adagrad)
    state_names = ("accumulator",)
    attr_names = ("decay_factor", "epsilon", "norm_coefficient")

    def __init__(self, learning_rate=0.01, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.decay_factor, self.epsilon, self.norm_coefficient = decay_factor, epsilon, norm_coefficient


class OnnxAdam(_OnnxOptimizer):
    """Adam with optional L2 (pre) and post-update regularisation, as ONNX ``Adam``."""

    op = staticmethod(training_ops.adam)
    state_names = ("momentum", "velocity")
    t_offset = 1
    attr_names = ("alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post")

    def __init__(
        self, learning_rate=0.001, alpha=0.9, beta=0.999, epsilon=1e-6,
        norm_coefficient=0.0, norm_coefficient_post=0.0, **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.alpha, self.beta, self.epsilon = alpha, beta, epsilon
        self.norm_coefficient, self.norm_coefficient_post = norm_coefficient, norm_coefficient_post
