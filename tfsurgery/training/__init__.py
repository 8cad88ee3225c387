"""ONNX's ``ai.onnx.preview.training`` operators in TensorFlow — a product of its own beside the
inference-graph surgery: Momentum, Adagrad and Adam as ``tf.function``s of ``tf.raw_ops``, with
ONNX's signature and semantics (``tfsurgery.training.ops``), and Keras 3 optimizers built on them
(``tfsurgery.training.keras_optimizers``: ``OnnxMomentum``, ``OnnxAdagrad``, ``OnnxAdam``; Keras
is imported only when one of those is asked for).
"""
from tfsurgery.training.ops import (DOMAIN, OPS, adagrad, adam, momentum,  # noqa: F401
                                    native_onnx_model, op_function)

_KERAS = ("OnnxMomentum", "OnnxAdagrad", "OnnxAdam")


def __getattr__(name):
    if name in _KERAS:
        import sys
        import tfsurgery.training.keras_optimizers  # noqa: F401
        return getattr(sys.modules["tfsurgery.training.keras_optimizers"], name)
    raise AttributeError(f"module 'tfsurgery.training' has no attribute {name!r}")
