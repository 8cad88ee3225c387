"""Every error the tool raises on purpose, in one place (the ground floor: imports nothing).

The CLI maps them to exit statuses: ``InputError`` (and its kin) → 2, a failed check → 1.
"""
from __future__ import annotations

import re


class InputError(Exception):
    """Bad input from the user: reported as one line, exit status 2. Control characters in the
    message (a newline inside a model's own node name, say) are escaped, so it stays one line."""

    def __init__(self, message="", *args):
        super().__init__(_one_line(message) if isinstance(message, str) else message, *args)


def _one_line(text: str) -> str:
    """``text`` with each control character written as its escape (``\\n``, ``\\x1b``)."""
    return "".join(repr(c)[1:-1] if ord(c) < 32 or ord(c) == 127 else c for c in text)


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


class OnnxUnconvertible(ExportError):
    """tf2onnx cannot convert the graph (or leaves ops it has no conversion for)."""


class OnnxCheckFailed(ExportError):
    """The model converted, but onnxruntime's outputs differ from the reference beyond the
    tolerance (or nothing real could be compared): nothing was written. The numbers ride along:
    ``max_error``, ``tolerance``, ``output`` (the worst output's name), ``reference``,
    ``divergence`` (the first ONNX node that parts from TensorFlow, when found) and ``export``
    (the whole ``onnx_export.OnnxExport`` record)."""

    def __init__(self, message: str, export):
        super().__init__(message)
        self.export = export
        worst = max(export.outputs, key=lambda e: e.max_rel, default=None)
        self.output = worst.name if worst is not None else None
        self.max_error = export.max_error
        self.tolerance = export.tolerance
        self.reference = export.reference
        self.divergence = export.divergence


class VerificationFailed(Exception):
    """The optimized graph did not compute what the original computes — or the two could not be
    compared, which proves nothing either. Raised by ``tfsurgery.api.optimize`` (the CLI: exit 1,
    nothing written). ``verification`` holds the numbers (None when nothing could be compared);
    ``result`` the optimized graph and its report, for inspection — never for saving."""

    def __init__(self, message: str, *, verification=None, result=None):
        super().__init__(message)
        self.verification = verification
        self.result = result

    @property
    def max_error(self) -> float:
        return float("nan") if self.verification is None else self.verification.max_error

    @property
    def allowed(self) -> float:
        return float("nan") if self.verification is None else self.verification.allowed


class Unverified(InputError):
    """Saving or exporting a result whose check failed, or that was never checked, without the
    caller saying so (``allow_unverified=True``, the CLI's ``--no-verify``)."""


class CannotVerify(VerificationFailed, Unverified):
    """The check could not see: a 1% change in some layer's weights shows in nothing it compared
    (the outputs, their logits, the intermediate tensors both graphs have), at any input scale
    it tried — so its passing would prove nothing. The CLI: exit 1, nothing written. Give real
    inputs (``samples``/``--samples``) or accept it (``Checks(accept_blind_spots=True)``,
    ``--accept-blind-spots``)."""


class WriteFailed(ExportError):
    """``api.write`` stopped: an export failed or missed its check, so nothing was written.
    ``stage`` names it ("ONNX check", "SavedModel export", "int8", ...); ``written`` (an
    ``api.Written``) holds what was converted and checked up to there, and the records of the
    failure, for the report. ``__cause__`` is the exporter's own exception, if one was raised."""

    def __init__(self, stage: str, message: str, written=None):
        super().__init__(message)
        self.stage = stage
        self.written = written


class UnsafeModel(InputError):
    """The model would act outside its graph if run or loaded: ops that read or write files,
    print to files or call back into Python (``findings``: one line per node, naming its op), or
    Keras code stored in the file (a ``Lambda`` layer's bytecode). Nothing was run or written.
    Allow ops by name (``--allow-op``, ``RunOptions(allow_ops=...)``) or trust the file
    (``--trust-model``, ``load(..., trust=True)``)."""

    def __init__(self, message="", findings=()):
        super().__init__(message)
        self.findings = list(findings)


# import name → the name pip installs it by, where they differ
PIP_NAMES = {"ai_edge_litert": "ai-edge-litert", "sklearn": "scikit-learn", "PIL": "pillow",
             "google": "protobuf", "keras_hub": "keras-hub", "graphviz_pure": "graphviz-pure"}


class MissingPackage(InputError):
    """A Python package the asked-for work imports is not installed (onnxruntime's transformer
    fusions without sympy, say): one line naming what to ``pip install``, exit status 2.
    ``package`` is that name (None where the ImportError did not say)."""

    def __init__(self, message="", package=None):
        super().__init__(message)
        self.package = package

    @classmethod
    def of(cls, error: ImportError, needed_by: str) -> "MissingPackage":
        """``error`` (raised while ``needed_by`` ran) as one line naming the package."""
        package = missing_module(error)
        if package is None:
            return cls(f"{needed_by} could not import what it needs: {_first_line(error)}")
        pip_name = PIP_NAMES.get(package, package)
        return cls(f"{needed_by} needs the Python package '{pip_name}', which is not installed: "
                   f"pip install {pip_name}", pip_name)


def missing_module(error: BaseException):
    """The top-level module whose import failed, from ``error`` or the errors it was raised
    from or during (onnxruntime re-raises a ModuleNotFoundError as a plain ImportError that
    names the package only in words: "missing 'sympy'")."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ModuleNotFoundError) and error.name:   # (not "cannot import name")
            return error.name.split(".")[0]
        said = re.search(r"No module named '([\w.]+)'|missing '([\w.]+)'|pip install ([\w.-]+)",
                         str(error))
        if said:
            return next(group for group in said.groups() if group).split(".")[0]
        error = error.__cause__ or error.__context__
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
