"""tfsurgery: make trained TensorFlow graphs lean for inference, and prove the numbers held.

The public names, importable from here (loaded on first use: ``import tfsurgery`` stays cheap):

- ``tfsurgery.api`` — load, optimize (raises ``VerificationFailed``), save, export, bench;
- ``tfsurgery.transform("name")`` — the decorator that makes a function a transform, and
  ``tfsurgery.TransformReport``, what it returns; ``tfsurgery.Graph``, what it edits;
- ``tfsurgery.VerificationFailed``, ``tfsurgery.Unverified``, ``tfsurgery.InputError``.
"""
import os as _os

__version__ = "0.1.0"

# The repository keeps transforms/ and models/ beside this folder; setup.py installs them as
# tfsurgery.transforms and tfsurgery.models (package_dir). A source checkout run without installing
# (scripts/, a git worktree) maps them the same way, so the code never imports them otherwise.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "setup.py")) and \
        _os.path.isfile(_os.path.join(_checkout, "transforms", "__init__.py")):
    __path__.append(_checkout)

_PUBLIC = {"transform": ("tfsurgery.contract", "transform"),
           "TransformReport": ("tfsurgery.contract", "TransformReport"),
           "Options": ("tfsurgery.contract", "Options"),
           "Graph": ("tfsurgery.graph", "Graph"),
           "VerificationFailed": ("tfsurgery.errors", "VerificationFailed"),
           "Unverified": ("tfsurgery.errors", "Unverified"),
           "InputError": ("tfsurgery.errors", "InputError")}


def __getattr__(name):
    if name in _PUBLIC:
        import importlib
        module, attribute = _PUBLIC[name]
        return getattr(importlib.import_module(module), attribute)
    if name == "api":
        import importlib
        return importlib.import_module("tfsurgery.api")
    raise AttributeError(f"module 'tfsurgery' has no attribute {name!r}")
