"""Builders of the graphs tfsurgery is tested, benchmarked and demonstrated on."""
from models.common import BuiltModel

__all__ = ["BuiltModel"]
