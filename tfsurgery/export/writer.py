"""Writing a run's artefacts, together or not at all: each export (ONNX — float or int8 —,
SavedModel, TFLite, the picture) converted and checked in turn and held unpublished; only when
every check passed are they published, then the .pb saved (``write`` → ``Written``, else
``WriteFailed``). The single exports (``export_saved_model``, ``export_tflite``, ``draw``) too."""
from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from tfsurgery import io, picture, progress
from tfsurgery.export import artefacts
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.export import onnx as onnx_export
from tfsurgery.export import openvino as openvino_export
from tfsurgery.int8.backends import onnx as quantize_mod
from tfsurgery.int8.backends import tflite as quantize_tflite
from tfsurgery.export import savedmodel as savedmodel_export
from tfsurgery.export import tflite as tflite_export
from tfsurgery.export.artefacts import Artefact, Batch
from tfsurgery.errors import ExportError, OnnxCheckFailed, WriteFailed
from tfsurgery.int8.speed import Int8TooSlow
from tfsurgery.int8.options import Int8Config
from tfsurgery.int8.config import (Int8Refused, TfliteInt8Refused, check_int8_request, export_int8,
                            export_openvino_int8, export_tflite_int8, int8_samples)
from tfsurgery.result import (Result, export_onnx, export_reference, feeds_for_checks,
                              require_verified, save)
from tfsurgery.source import Source, as_source, signature_for
from tfsurgery.trust.outside import with_allowed_ops


def draw(source: Source, result: Result, path, *, scope: Optional[str] = None,
         batch: Optional[Batch] = None) -> Path:
    """The graph before and after, side by side (needs the ``picture`` extra). Rendered now —
    a graph too big to draw is refused before anything is written — and written now, or with a
    ``batch`` when the whole run has passed."""
    path = Path(path)
    data = picture.drawing(source.graph_def, result.graph_def, path, scope=scope)
    artefacts.publish(lambda: io.write_atomically(path, data), batch)
    return path


def check_drawable(source: Source, scope: Optional[str] = None) -> None:
    """Right after loading: an original too big to draw (in ``scope``) is refused at once."""
    picture.check_drawable(source.graph_def, "the input graph", scope)


def wants_directory(output) -> bool:
    """``-o DIR/`` (a trailing slash) asks for a SavedModel."""
    return output is not None and str(output).endswith(("/", os.sep))


def check_saved_model_target(path, *, force: bool = False, input_path=None) -> None:
    """Before minutes of work: a file there, or a non-empty directory without --force: exit 2."""
    savedmodel_export.check_target(Path(path), force, input_path)


def pb_artefact(result: Result, path) -> Artefact:
    """The written .pb as an artefact: its check is the verification against the original."""
    v = result.verification
    return Artefact("pb", Path(path), artefacts.size_of(Path(path)),
                    v.max_error if v else float("nan"), v.allowed if v else result.tolerance,
                    bool(v and v.passed), "verification" if v
                    else "not verified (--no-verify)", weights=result.weights,
                    outputs=list(v.outputs) if v else [],
                    reference=(artefacts.ORIGINAL_REFERENCE if result.preprocess
                               else "the original graph"))


@with_allowed_ops
def export_saved_model(source: Source, result: Result, path, *, force: bool = False,
                       batch: Optional[Batch] = None, allow_unverified: bool = False) -> Artefact:
    """Write the optimized graph as a SavedModel; loaded back and its signature called on the
    verification inputs; written only if it matches the reference (``export_reference``)
    within the run's tolerance (with a ``batch``: when the whole run has passed)."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"writing the SavedModel {path}")
    return savedmodel_export.export(result.graph_def, signature_for(source, result), path,
                                    feeds=feeds_for_checks(result), tolerance=result.tolerance,
                                    timeout=result.timeout, force=force, input_path=source.path,
                                    weights=result.weights, expected=export_reference(result),
                                    batch=batch)


@with_allowed_ops
def export_tflite(source: Source, result: Result, path, batch: Optional[Batch] = None, *,
                  allow_unverified: bool = False) -> Artefact:
    """Convert with tf.lite.TFLiteConverter (float16 weights with --weights float16, dynamic-range
    int8 weights with --weights int8), run in the
    LiteRT interpreter on the verification inputs; written only if it matches the reference
    (``export_reference``; with a ``batch``: when the whole run has passed)."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"converting to TensorFlow Lite: {path}")
    return tflite_export.export(result.graph_def, signature_for(source, result), path,
                                feeds=feeds_for_checks(result), tolerance=result.tolerance,
                                float16=result.weights == "float16",
                                int8=result.weights == "int8", timeout=result.timeout,
                                input_path=source.path, expected=export_reference(result),
                                batch=batch)


OPENVINO_PRECISIONS = openvino_export.PRECISIONS


def check_openvino_target(path, *, precision: str = "f32", force: bool = False,
                          input_path=None) -> None:
    """Before minutes of work: OpenVINO installed (else one line saying how to get it), the
    precision one this CPU runs natively, the IR directory writable: exit 2 otherwise."""
    openvino_export.check_precision(precision)
    openvino_export.check_target(Path(path), force, input_path)


@with_allowed_ops
def export_openvino(source: Source, result: Result, path, *, precision: str = "f32",
                    tolerance: Optional[float] = None, force: bool = False,
                    batch: Optional[Batch] = None, allow_unverified: bool = False) -> Artefact:
    """Convert with openvino.convert_model and save as IR (``path``/model.xml + model.bin);
    compiled for the CPU at ``precision`` ("f32" unless asked: OpenVINO's own default is bf16
    on CPUs with bf16) and run on the verification inputs; written only if it matches the
    reference (``export_reference``) within ``tolerance`` — default the precision's own
    (``openvino_export.TOLERANCES``) or the run's, whichever is looser."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"converting to OpenVINO IR ({precision}): {path}")
    if tolerance is None:
        tolerance = openvino_export.tolerance_for(precision, result.tolerance)
    return openvino_export.export(result.graph_def, result.inputs, result.outputs, path,
                                  feeds=feeds_for_checks(result), precision=precision,
                                  tolerance=tolerance, timeout=result.timeout, force=force,
                                  input_path=source.path, weights=result.weights,
                                  expected=export_reference(result), batch=batch)


@dataclasses.dataclass
class Int8Targets:
    """Static int8 (``--quantize int8``) of the ONNX and/or TFLite target: ``samples`` (a
    .npz/.npy folder) cut into calibration, selection and gate rows (``check_fraction`` of them
    judge, or all of ``check_samples``), the gate judged against the float original with
    ``thresholds``; ``labels`` (an .npy of each row's class) when the samples carry none.
    ``calibration``, ``equalize``, ``bias_correction``: see :func:`export_int8`;
    ``tflite_io``: the full-integer TFLite model's inputs and outputs, "float32" or "int8".
    ``target``: the CPU the int8 ONNX is for ("auto": this machine; see ``int8_target``);
    ``min_speedup``: refuse an int8 ONNX that runs less than this many times as fast as the
    float ONNX on this machine (None: 1.0; 0: int8 for its size, speed reported only);
    ``modes``: "auto" (static, and dynamic when static misses), "static" or "dynamic".
    Everything but the rows is :attr:`config` (``int8.options.Int8Config``), checked when
    this is made."""

    samples: object = None
    check_samples: object = None
    check_fraction: float = int8_loop.GATE_FRACTION
    labels: object = None
    thresholds: quantize_mod.Thresholds = dataclasses.field(
        default_factory=quantize_mod.Thresholds)
    calibration: str = "auto"
    equalize: str = "auto"
    bias_correction: str = "auto"
    tflite_io: str = "float32"
    target: str = "auto"
    min_speedup: Optional[float] = None
    modes: str = "auto"

    def __post_init__(self):
        self.config      # bad values: one line, exit 2, before any work

    @property
    def config(self) -> Int8Config:
        return Int8Config(self.thresholds, self.calibration, self.equalize,
                          self.bias_correction, self.modes, self.target, self.min_speedup,
                          self.tflite_io)


@dataclasses.dataclass
class Targets:
    """What :func:`write` writes: the frozen graph (``pb``), a ``saved_model`` directory
    (``force``: replace a non-empty one), a ``tflite`` file, an ``onnx`` model (``opset``,
    ``inputs_as_nchw``, ``ort_optimize``: onnxruntime's basic rewrites), each ``int8`` when
    given, an ``openvino`` IR directory (checked at ``openvino_precision``, "f32" unless asked,
    within ``openvino_tolerance``: default that precision's own), and a ``picture`` of the graph
    before and after. ``allow_unverified``: the result was not checked on purpose
    (``--no-verify``)."""

    pb: Optional[Path] = None
    saved_model: Optional[Path] = None
    force: bool = False
    tflite: Optional[Path] = None
    onnx: Optional[Path] = None
    opset: Optional[int] = None
    inputs_as_nchw: Sequence[str] = ()
    ort_optimize: bool = True
    int8: Optional[Int8Targets] = None
    openvino: Optional[Path] = None
    openvino_precision: str = "f32"
    openvino_tolerance: Optional[float] = None
    picture: Optional[Path] = None
    picture_scope: Optional[str] = None
    allow_unverified: bool = False


@dataclasses.dataclass
class Written:
    """What :func:`write` wrote — or, carried by ``WriteFailed``, what it had converted and
    checked when it stopped. ``artefacts``: one record per file, in the report's order (.pb,
    ONNX, SavedModel, TFLite; on a failure the failed ones); ``onnx``: the ONNX conversion (also
    the float model under int8) and ``onnx_record`` its report entry; ``int8``/``tflite_int8``:
    the int8 reports (also a refused one); ``checks``: the SavedModel/TFLite checks passed."""

    artefacts: List[Artefact] = dataclasses.field(default_factory=list)
    onnx: Optional[onnx_export.OnnxExport] = None
    onnx_record: Optional[dict] = None
    int8: Optional[quantize_mod.Int8Report] = None
    tflite_int8: Optional[quantize_tflite.TfliteInt8Report] = None
    openvino_int8: Optional[int8_loop.Int8Report] = None
    checks: List[Artefact] = dataclasses.field(default_factory=list)
    picture: Optional[Path] = None
    published: bool = False

    def report(self) -> dict:
        """The report's entries for the artefacts (``--report-json``: artefacts, onnx, int8,
        tflite_int8)."""
        data: dict = {"artefacts": [a.as_dict() for a in self.artefacts]}
        if self.onnx_record is not None:
            data["onnx"] = self.onnx_record
        if self.int8 is not None:
            data["int8"] = self.int8.as_dict()
        if self.tflite_int8 is not None:
            data["tflite_int8"] = self.tflite_int8.as_dict()
        if self.openvino_int8 is not None:
            data["openvino_int8"] = self.openvino_int8.as_dict()
        return data


@with_allowed_ops
def write(source, result: Result, targets: Targets) -> Written:
    """Write every target of ``targets`` together or not at all: each export is converted and
    checked in turn (ONNX — float, or int8 from the checked float model — then SavedModel, then
    TFLite, then the picture is drawn), held unpublished; only when all passed are they
    published, then the .pb saved. The first failure raises ``WriteFailed`` (its ``stage`` and
    the ``written`` records so far) with nothing written; a result whose check failed or never
    ran raises ``Unverified`` unless ``targets.allow_unverified``."""
    source = as_source(source)
    require_verified(result, allow_unverified=targets.allow_unverified)
    if targets.openvino is not None:          # not installed, a precision the CPU lacks: exit 2
        openvino_export.check_precision(targets.openvino_precision)
    if targets.int8 is not None:              # what the CLI refuses before any work
        check_int8_request(targets.int8.samples, "int8",
                           targets.onnx is not None or targets.tflite is not None
                           or targets.openvino is not None,
                           targets.inputs_as_nchw, weights=result.weights,
                           check_samples=targets.int8.check_samples,
                           labels=targets.int8.labels)
    written = Written()
    batch = Batch()
    # the samples are read once: calibration and check rows for ONNX and TFLite alike
    rows = _int8_rows(source, result, targets.int8) if targets.int8 is not None else None
    try:
        if targets.onnx is not None and targets.int8 is not None:
            _write_int8_onnx(source, result, targets, Path(targets.onnx), rows, written, batch)
        elif targets.onnx is not None:
            _write_onnx(source, result, targets, Path(targets.onnx), written, batch)
        if targets.saved_model is not None:
            _write_checked("SavedModel", written, lambda: export_saved_model(
                source, result, targets.saved_model, force=targets.force, batch=batch,
                allow_unverified=targets.allow_unverified))
        if targets.tflite is not None and targets.int8 is not None:
            _write_tflite_int8(source, result, targets, rows, written, batch)
        elif targets.tflite is not None:
            _write_checked("TFLite", written, lambda: export_tflite(
                source, result, targets.tflite, batch=batch,
                allow_unverified=targets.allow_unverified))
        if targets.openvino is not None and targets.int8 is not None:
            _write_openvino_int8(source, result, targets, rows, written, batch)
        elif targets.openvino is not None:
            _write_checked("OpenVINO", written, lambda: export_openvino(
                source, result, targets.openvino, precision=targets.openvino_precision,
                tolerance=targets.openvino_tolerance, force=targets.force, batch=batch,
                allow_unverified=targets.allow_unverified))
        if targets.picture:          # drawn before anything is written: it may refuse
            draw(source, result, targets.picture, scope=targets.picture_scope, batch=batch)
        batch.publish_all()
        if targets.onnx is not None:
            written.artefacts.insert(0, _onnx_artefact(written, Path(targets.onnx),
                                                       result.weights))
        if targets.pb is not None:
            save(result, targets.pb, input_path=source.path,
                 allow_unverified=targets.allow_unverified)
            written.artefacts.insert(0, pb_artefact(result, targets.pb))
        written.published = True
        written.picture = Path(targets.picture) if targets.picture else None
    finally:
        batch.discard()
        for artefact in written.artefacts:
            artefact.written = written.published
    return written


def _write_onnx(source: Source, result: Result, targets: Targets, path: Path, written: Written,
                batch: Optional[Batch]) -> None:
    """The ONNX conversion and its onnxruntime check, recorded in ``written``."""
    try:
        exported = export_onnx(result, path, opset=targets.opset,
                               inputs_as_nchw=list(targets.inputs_as_nchw),
                               ort_optimize=targets.ort_optimize, input_path=source.path,
                               batch=batch, allow_unverified=targets.allow_unverified)
    except OnnxCheckFailed as failed:
        written.onnx, written.onnx_record = failed.export, failed.export.as_dict()
        raise WriteFailed("ONNX check", str(failed), written) from failed
    except ExportError as error:
        written.onnx_record = {"path": str(path), "passed": False, "error": str(error)}
        raise WriteFailed("ONNX export", str(error), written) from error
    written.onnx, written.onnx_record = exported, exported.as_dict()


def _int8_rows(source: Source, result: Result, int8: Int8Targets):
    return int8_samples(source, result, int8.samples, check_samples=int8.check_samples,
                        check_fraction=int8.check_fraction, labels=int8.labels,
                        thresholds=int8.thresholds)


def _write_int8_onnx(source: Source, result: Result, targets: Targets, path: Path, rows,
                     written: Written, batch: Batch) -> None:
    """The float ONNX (checked as usual) in a scratch directory, then int8 from it, chosen on
    the selection rows and judged on the gate rows against the float original."""
    int8 = targets.int8
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.float.", dir=path.parent) as scratch:
        _write_onnx(source, result, targets, Path(scratch) / path.name, written, None)
        report = _int8_export("int8", written, "int8", lambda: export_int8(
            source, result, Path(scratch) / path.name, path, rows=rows, config=int8.config,
            batch=batch))
    measures = ", ".join(f"{o.measure} {o.value:.4g}" for o in report.outputs)
    written.onnx_record.update(path=str(path), as_int8={      # what the artefact record says
        "weights": "int8", "max_error": float("nan"), "reference": "the float original",
        "checked_by": f"onnxruntime {report.mode} int8 on {report.gate_rows} gate rows "
                      f"against the float original: {measures}"})


def _int8_export(stage: str, written: Written, record: str, export):
    """One int8 export, its report (a refused one too) kept as ``written.<record>``; a refusal
    or a failure raises ``WriteFailed`` at ``stage``."""
    try:
        report = export()
    except (Int8Refused, Int8TooSlow, TfliteInt8Refused) as refused:
        setattr(written, record, refused.report)
        raise WriteFailed(stage, str(refused), written) from refused
    except ExportError as error:
        raise WriteFailed(stage, str(error), written) from error
    setattr(written, record, report)
    return report


def _onnx_artefact(written: Written, path: Path, weights: str) -> Artefact:
    """The published ONNX model (and its external data) as an artefact record."""
    exported = written.onnx
    data = path.with_name(path.name + ".data")
    size = path.stat().st_size + (data.stat().st_size if data.exists() else 0)
    artefact = Artefact("onnx", path, size, exported.max_error, exported.tolerance,
                        exported.passed, "onnxruntime", weights=weights,
                        outputs=list(exported.outputs), reference=exported.reference)
    return dataclasses.replace(artefact, **written.onnx_record.get("as_int8", {}))


ARTEFACT_FORMATS = {"SavedModel": "saved_model", "TFLite": "tflite", "OpenVINO": "openvino"}


def _write_checked(kind: str, written: Written, export) -> None:
    """One checked export (SavedModel, TFLite), recorded in ``written``."""
    try:
        artefact = export()
    except ExportError as error:
        written.artefacts.append(Artefact.failed(ARTEFACT_FORMATS[kind], "", str(error)))
        raise WriteFailed(f"{kind} export", str(error), written) from error
    if not artefact.passed:
        written.artefacts.append(dataclasses.replace(artefact, bytes=0))
        raise WriteFailed(f"{kind} check", check_line(artefact), written)
    written.artefacts.append(artefact)
    written.checks.append(artefact)


def check_line(artefact: Artefact) -> str:
    """How an export was checked, in one line."""
    return (f"{artefact.checked_by}: max error {artefact.max_error:.3g} vs "
            f"{artefact.reference} (tolerance {artefact.tolerance:g})")


def _write_tflite_int8(source: Source, result: Result, targets: Targets, rows,
                       written: Written, batch: Batch) -> None:
    """Full-integer TFLite, chosen on the selection rows and judged on the gate rows against
    the float original."""
    int8 = targets.int8
    report = _int8_export("TFLite int8", written, "tflite_int8", lambda: export_tflite_int8(
        source, result, targets.tflite, rows=rows, config=int8.config, batch=batch))
    written.artefacts.append(Artefact(
        "tflite", Path(targets.tflite), report.bytes, float("nan"), float("nan"), True,
        f"LiteRT int8 on {report.gate_rows} gate rows against the float original",
        weights="int8", reference="the float original"))


def _write_openvino_int8(source: Source, result: Result, targets: Targets, rows,
                         written: Written, batch: Batch) -> None:
    """NNCF int8 OpenVINO IR, chosen on the selection rows and judged on the gate rows against
    the float original."""
    int8 = targets.int8
    try:
        report = export_openvino_int8(source, result, targets.openvino, rows=rows,
                                      config=int8.config,
                                      precision=targets.openvino_precision, force=targets.force,
                                      batch=batch)
    except Int8Refused as refused:
        written.openvino_int8 = refused.report
        raise WriteFailed("OpenVINO int8", str(refused), written) from refused
    except ExportError as error:
        raise WriteFailed("OpenVINO int8", str(error), written) from error
    written.openvino_int8 = report
    written.artefacts.append(Artefact(
        "openvino", Path(targets.openvino), report.int8_bytes, float("nan"), float("nan"), True,
        f"OpenVINO int8 (NNCF; the rest at {targets.openvino_precision}) on {report.gate_rows} "
        "gate rows against the float original", weights="int8",
        reference="the float original"))
