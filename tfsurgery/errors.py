"""Every error the tool raises on purpose, in one place (the ground floor: imports nothing).

The CLI maps them to exit statuses: ``InputError`` (and its kin) → 2, a failed check → 1.
"""
from __future__ import annotations


class InputError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


class GraphError(ValueError):
    """A graph that cannot be indexed (duplicate names, dangling inputs, ...)."""


class UnknownTransform(ValueError):
    """A transform name nobody registered."""


class TransformError(ValueError):
    """The graph cannot be transformed as asked, through no fault of the transform (e.g. an output
    that does not exist at inference). The CLI reports it as bad input."""


class StructureError(Exception):
    """A transform left a broken graph (dangling input, bad port, cycle, stale colocation). A bug
    of ours, not the user's: exit status 1, nothing written."""


class VerificationError(Exception):
    """The original and optimized graphs could not be compared."""


class OriginalDoesNotRun(VerificationError):
    """The original graph itself fails on the verification inputs: the user's input is at fault."""


class ExportError(Exception):
    """An export (ONNX, ...) failed or did not match TensorFlow."""
