"""Builders of the graphs tfsurgery is tested, benchmarked and demonstrated on."""
from tfsurgery.models.common import BuiltModel

__all__ = ["BuiltModel"]
