"""What a deployment export wrote and how it was checked, shared by the SavedModel and TFLite
exporters: the ``Artefact`` record (format, path, size, error against TensorFlow), a staging
directory next to the target (same filesystem, so publishing is a rename), and a deadline for
runtimes that cannot be interrupted from Python (a loaded SavedModel signature, the LiteRT
interpreter)."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional

import numpy as np

from tfsurgery import io
from tfsurgery.verify import check as verify
from tfsurgery.errors import ExportError, InputError

OPTIMIZED_REFERENCE = "the optimized graph in TensorFlow"
ORIGINAL_REFERENCE = "the original graph fed the verifier's NumPy preprocessing"


@dataclasses.dataclass
class Artefact:
    """One written file or directory, and its check against the optimized graph in TensorFlow."""

    format: str                  # "pb", "saved_model", "onnx", "tflite"
    path: Path
    bytes: int
    max_error: float
    tolerance: float
    passed: bool
    checked_by: str              # what ran it: "tf.saved_model.load", "LiteRT interpreter", ...
    weights: str = "float32"
    outputs: List[verify.OutputError] = dataclasses.field(default_factory=list)
    reference: str = OPTIMIZED_REFERENCE     # what its outputs were compared with
    error: Optional[str] = None  # the export itself failed (then only format and error count)
    written: Optional[bool] = None      # set by api.write: published with the whole run, or not

    @classmethod
    def failed(cls, format: str, path, error: str) -> "Artefact":
        """An export that raised before anything could be checked."""
        nan = float("nan")
        return cls(format, Path(path), 0, nan, nan, False, "", error=error)

    def as_dict(self) -> dict:
        if self.error is not None:
            data = {"format": self.format, "passed": False, "error": self.error}
        else:
            data = {"format": self.format, "path": str(self.path), "bytes": int(self.bytes),
                    "weights": self.weights, "max_error": float(self.max_error),
                    "tolerance": float(self.tolerance), "passed": bool(self.passed),
                    "checked_by": self.checked_by, "reference": self.reference,
                    "outputs": [o.as_dict() for o in self.outputs]}
        if self.written is not None:
            data["written"] = self.written
        return data


class Batch:
    """The checked outputs of one run, published together once every check has passed: an
    export that fails later in the run leaves none of the earlier ones behind."""

    def __init__(self):
        self._stages: List[Path] = []
        self._pending: List[Callable[[], None]] = []

    def hold(self, publish: Callable[[], None], stage: Optional[Path] = None) -> None:
        """Keep ``stage`` (what ``publish`` moves into place) until ``publish_all``/``discard``."""
        if stage is not None:
            self._stages.append(stage)
        self._pending.append(publish)

    def holds(self, stage: Path) -> bool:
        return stage in self._stages

    def publish_all(self) -> None:
        for publish in self._pending:
            publish()
        self.discard()

    def discard(self) -> None:
        """Drop whatever was not published, and every staging directory."""
        for stage in self._stages:
            shutil.rmtree(stage, ignore_errors=True)
        self._stages, self._pending = [], []


def publish(publish_fn: Callable[[], None], batch: Optional[Batch] = None,
            stage: Optional[Path] = None) -> None:
    """Publish now, or (with a ``batch``) when the whole run has passed."""
    if batch is None:
        publish_fn()
    else:
        batch.hold(publish_fn, stage)


def compare(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray]) -> tuple:
    """(per-output errors, max error, compared): ``compared`` is False when some output was all
    NaN/Inf in TensorFlow, i.e. nothing real was compared there."""
    errors = [verify.output_error(name, expected[name], np.asarray(actual[name]))
              for name in expected]
    return errors, verify.worst_error(errors), verify.compared_real_numbers(errors)


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@contextlib.contextmanager
def staging(path: Path, batch: Optional[Batch] = None) -> Iterator[Path]:
    """A temporary directory next to ``path``, removed afterwards whatever happens — unless
    ``batch`` holds it for publishing later."""
    directory = io.output_directory(path)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=directory))
    except OSError as error:
        raise InputError(f"{path}: cannot write ({error.strerror})") from None
    try:
        yield stage
    finally:
        if batch is None or not batch.holds(stage):
            shutil.rmtree(stage, ignore_errors=True)


def publish_directory(staged: Path, path: Path, stage: Path) -> None:
    """Rename the staged directory into place; an existing one (``--force``) is moved into the
    stage first, so the target is never half old, half new."""
    try:
        if path.exists():
            os.replace(path, stage / ".replaced")
        os.replace(staged, path)
    except OSError as error:
        raise InputError(f"{path}: cannot write ({error.strerror})") from None


def with_deadline(fn: Callable, timeout: float, what: str):
    """``fn()`` within ``timeout`` seconds, else ``ExportError``. The runtime keeps its thread
    (neither TensorFlow's eager calls nor LiteRT can be cancelled); the tool stops waiting."""
    outcome: Dict[str, object] = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = error
    thread = threading.Thread(target=target, daemon=True, name=f"tfsurgery {what}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ExportError(f"{what} did not finish within {timeout:g} s; give real inputs with "
                          "--feed / --input-shape, or a longer --verify-timeout")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def check_new_directory(path: Path, force: bool, input_path=None) -> None:
    """A directory output: a file there, or a non-empty directory without ``force``, is refused."""
    path = Path(path)
    io.refuse_input(path, input_path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise InputError(f"{path}: directory exists and is not empty (use --force to replace it)")
    directory = io.output_directory(path)
    if not os.access(directory, os.W_OK):
        raise InputError(f"{path}: cannot write (directory {directory} not writable)")


def feeds_by_key(feeds: Mapping[str, np.ndarray], names: Mapping[str, str]) -> Dict[str, np.ndarray]:
    """Verification feeds (keyed by graph input) re-keyed by signature input name."""
    plain = {k.split(":")[0]: v for k, v in feeds.items()}
    return {key: plain[tensor.split(":")[0]] for key, tensor in names.items()}
