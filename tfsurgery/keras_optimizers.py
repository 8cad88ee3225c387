"""Moved to ``tfsurgery.training.keras_optimizers``; this name keeps working."""
from tfsurgery.training.keras_optimizers import OnnxAdagrad, OnnxAdam, OnnxMomentum  # noqa: F401
