"""tfsurgery: make trained TensorFlow graphs lean for inference, and prove the numbers held.

The public names, importable from here (loaded on first use: ``import tfsurgery`` stays cheap):

- ``tfsurgery.optimize(model, transforms, interface=Interface(...), checks=Checks(...),
  options=RunOptions(...))`` — a path, GraphDef or Source in, a checked ``Result`` out
  (``VerificationFailed`` otherwise), with ``result.save(path)`` and ``result.export_onnx(path)``; ``tfsurgery.api`` has the rest (load,
  SavedModel/TFLite export, bench, inspect);
- ``tfsurgery.write(source, result, Targets(pb=..., onnx=..., saved_model=..., tflite=...))`` —
  every artefact checked, then all written or none (``WriteFailed``); a ``Written`` back;
- ``tfsurgery.transform("name")`` — the decorator that makes a function a transform, and
  ``tfsurgery.TransformReport``, what it returns; ``tfsurgery.Graph``, what it edits;
- ``tfsurgery.VerificationFailed``, ``tfsurgery.Unverified``, ``tfsurgery.CannotVerify`` (a check
  that could not see a layer), ``tfsurgery.InputError``,
  ``tfsurgery.ExportError``, ``tfsurgery.OnnxCheckFailed`` (``export_onnx``'s failed check,
  with its numbers) and ``tfsurgery.UnsafeModel`` (a model that would act outside its graph).
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

_PUBLIC = {"transform": "contract", "TransformReport": "contract", "Options": "contract",
           "Graph": "graph", "VerificationFailed": "errors", "Unverified": "errors",
           "CannotVerify": "errors", "InputError": "errors", "ExportError": "errors",
           "OnnxCheckFailed": "errors",
           "UnsafeModel": "errors"}


_API = ("optimize", "load", "save", "export_onnx", "Interface", "Checks", "RunOptions", "Result",
        "write",
        "Targets", "Int8Targets", "Written", "WriteFailed")


def __getattr__(name):
    """The public names, imported on first use (``import tfsurgery`` stays cheap). Submodules
    are imported with plain import statements, which never ask this function again."""
    import sys
    if name == "api":
        import tfsurgery.api  # noqa: F401
        return sys.modules["tfsurgery.api"]
    if name in _API:
        import tfsurgery.api  # noqa: F401
        return getattr(sys.modules["tfsurgery.api"], name)
    if name in _PUBLIC:
        import tfsurgery.contract  # noqa: F401
        import tfsurgery.errors  # noqa: F401
        import tfsurgery.graph  # noqa: F401
        return getattr(sys.modules["tfsurgery." + _PUBLIC[name]], name)
    raise AttributeError(f"module 'tfsurgery' has no attribute {name!r}")
