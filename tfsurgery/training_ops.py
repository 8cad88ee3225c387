"""Moved to ``tfsurgery.training`` (``tfsurgery.training.ops``); this name keeps working."""
from tfsurgery.training.ops import *  # noqa: F401,F403
from tfsurgery.training.ops import DOMAIN, OPS, native_onnx_model, op_function  # noqa: F401
