"""The export protocol: one exporter per format, int8 a mode of each.

An exporter is told where to write (``path``) and whether to compute in int8 (the request, or
None for float); it converts the checked result, checks the artefact the way it will be run,
stages it in the run's ``Batch`` (published only when every export passed) and returns its
record — or raises ``WriteFailed`` naming its stage. :func:`tfsurgery.export.writer.write` loops
over the formats a ``Targets`` asks for, in registry order; a new format needs only an
``Exporter`` and :func:`register` (``Targets(more={"name": path})`` asks for it).
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

from tfsurgery.errors import ExportError, OnnxCheckFailed, WriteFailed
from tfsurgery.export import onnx as onnx_export
from tfsurgery.export.artefacts import Artefact, Batch
from tfsurgery.export.formats import check_line, export_openvino, export_saved_model, export_tflite
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.int8.backends import onnx as quantize_mod
from tfsurgery.int8.backends import tflite as quantize_tflite
from tfsurgery.int8.config import (Int8Refused, TfliteInt8Refused, export_int8,
                                   export_openvino_int8, export_tflite_int8)
from tfsurgery.int8.speed import Int8TooSlow
from tfsurgery.result import Result, export_onnx
from tfsurgery.source import Source


@dataclasses.dataclass
class Written:
    """What :func:`write` wrote — or, carried by ``WriteFailed``, what it had converted and
    checked when it stopped. ``artefacts``: one record per file, in the report's order (.pb,
    ONNX, SavedModel, TFLite; on a failure the failed ones); ``onnx``: the ONNX conversion (also
    the float model under int8) and ``onnx_record`` its report entry; ``int8``/``tflite_int8``/
    ``openvino_int8``: the int8 reports (also a refused one); ``checks``: the float artefact
    checks passed (SavedModel, TFLite, OpenVINO)."""

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
        tflite_int8, openvino_int8)."""
        data: dict = {"artefacts": [a.as_dict() for a in self.artefacts]}
        if self.onnx_record is not None:
            data["onnx"] = self.onnx_record
        for name in ("int8", "tflite_int8", "openvino_int8"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name).as_dict()
        return data


@dataclasses.dataclass
class ExportJob:
    """What every exporter is handed: the run's source and checked result, the targets (every
    format's options), where artefacts wait to be published, the record of what was written,
    and the int8 calibration/selection/gate rows (read once for every int8 export)."""

    source: Source
    result: Result
    targets: object          # tfsurgery.export.writer.Targets (the writer imports this module)
    batch: Batch
    written: Written
    rows: Optional[int8_loop.Rows] = None
    # (position in written.artefacts, record made once published), filled by the writer
    deferred: list = dataclasses.field(default_factory=list)


# A record made once the artefact is published (its size on disk), or the record itself.
Record = Union[Artefact, Callable[[], Artefact]]


class Exporter:
    """One format. ``name``: the ``Targets`` field (or ``Targets.more`` key) asking for it;
    ``stage``: how its failures are named; ``has_int8``: whether ``--quantize int8`` applies."""

    name: str = ""
    stage: str = ""
    has_int8: bool = False

    def export(self, job: ExportJob, path: Path, int8: Optional[object]) -> Record:
        """Convert, check, stage; the artefact's record. ``int8``: the request
        (``writer.Int8Targets``) to compute in int8, None for float."""
        raise NotImplementedError


class OnnxExporter(Exporter):
    """tf2onnx, checked in onnxruntime; int8: onnxruntime's quantization of the checked float
    model, chosen on the selection rows and judged on the gate rows."""

    name, stage, has_int8 = "onnx", "ONNX", True

    def export(self, job, path, int8):
        if int8 is None:
            _convert_onnx(job, path, job.batch)
        else:
            _quantize_onnx(job, path, int8)
        return lambda: _onnx_artefact(job.written, path, job.result.weights)


class SavedModelExporter(Exporter):
    """The optimized graph as a SavedModel, loaded back and its signature called."""

    name, stage = "saved_model", "SavedModel"

    def export(self, job, path, int8):
        targets = job.targets
        return _checked(self.stage, "saved_model", job.written, lambda: export_saved_model(
            job.source, job.result, path, force=targets.force, batch=job.batch,
            allow_unverified=targets.allow_unverified))


class TfliteExporter(Exporter):
    """TFLiteConverter, run in the LiteRT interpreter; int8: full-integer, gated."""

    name, stage, has_int8 = "tflite", "TFLite", True

    def export(self, job, path, int8):
        if int8 is None:
            return _checked(self.stage, "tflite", job.written, lambda: export_tflite(
                job.source, job.result, path, batch=job.batch,
                allow_unverified=job.targets.allow_unverified))
        report = _int8_report("TFLite int8", job.written, "tflite_int8", lambda: export_tflite_int8(
            job.source, job.result, path, rows=job.rows, config=int8.config, batch=job.batch))
        return Artefact("tflite", path, report.bytes, float("nan"), float("nan"), True,
                        f"LiteRT int8 on {report.gate_rows} gate rows against the float "
                        "original", weights="int8", reference="the float original")


class OpenvinoExporter(Exporter):
    """OpenVINO IR, compiled at the asked precision and run; int8: NNCF, gated."""

    name, stage, has_int8 = "openvino", "OpenVINO", True

    def export(self, job, path, int8):
        targets = job.targets
        if int8 is None:
            return _checked(self.stage, "openvino", job.written, lambda: export_openvino(
                job.source, job.result, path, precision=targets.openvino_precision,
                tolerance=targets.openvino_tolerance, force=targets.force, batch=job.batch,
                allow_unverified=targets.allow_unverified))
        report = _int8_report("OpenVINO int8", job.written, "openvino_int8",
                              lambda: export_openvino_int8(
                                  job.source, job.result, path, rows=job.rows,
                                  config=int8.config,
                                  precision=targets.openvino_precision, force=targets.force,
                                  batch=job.batch))
        return Artefact(
            "openvino", path, report.int8_bytes, float("nan"), float("nan"), True,
            f"OpenVINO int8 (NNCF; the rest at {targets.openvino_precision}) on "
            f"{report.gate_rows} gate rows against the float original", weights="int8",
            reference="the float original")


EXPORTERS: Dict[str, Exporter] = {e.name: e for e in (
    OnnxExporter(), SavedModelExporter(), TfliteExporter(), OpenvinoExporter())}


def register(exporter: Exporter) -> Exporter:
    """Add a format (or replace one of the same name); written after the ones before it."""
    if not exporter.name or not exporter.stage:
        raise ValueError("an exporter needs a name and a stage")
    EXPORTERS[exporter.name] = exporter
    return exporter


def _convert_onnx(job: ExportJob, path: Path, batch: Optional[Batch]) -> None:
    """The ONNX conversion and its onnxruntime check, recorded in ``job.written``."""
    targets, written = job.targets, job.written
    try:
        exported = export_onnx(job.result, path, opset=targets.opset,
                               inputs_as_nchw=list(targets.inputs_as_nchw),
                               ort_optimize=targets.ort_optimize, input_path=job.source.path,
                               fusions=targets.onnx_fusions,
                               batch=batch, allow_unverified=targets.allow_unverified)
    except OnnxCheckFailed as failed:
        written.onnx, written.onnx_record = failed.export, failed.export.as_dict()
        raise WriteFailed("ONNX check", str(failed), written) from failed
    except ExportError as error:
        written.onnx_record = {"path": str(path), "passed": False, "error": str(error)}
        raise WriteFailed("ONNX export", str(error), written) from error
    written.onnx, written.onnx_record = exported, exported.as_dict()


def _quantize_onnx(job: ExportJob, path: Path, int8) -> None:
    """The float ONNX (checked as usual) in a scratch directory, then int8 from it, chosen on
    the selection rows and judged on the gate rows against the float original."""
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.float.", dir=path.parent) as scratch:
        float_model = Path(scratch) / path.name
        _convert_onnx(job, float_model, None)
        report = _int8_report("int8", job.written, "int8", lambda: export_int8(
            job.source, job.result, float_model, path, rows=job.rows,
            config=int8.config, batch=job.batch))
    measures = ", ".join(f"{o.measure} {o.value:.4g}" for o in report.outputs)
    job.written.onnx_record.update(path=str(path), as_int8={   # what the artefact record says
        "weights": "int8", "max_error": float("nan"), "reference": "the float original",
        "checked_by": f"onnxruntime {report.mode} int8 on {report.gate_rows} gate rows "
                      f"against the float original: {measures}"})


def _int8_report(stage: str, written: Written, record: str, export):
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


def _checked(stage: str, kind: str, written: Written, export) -> Artefact:
    """One float export checked against the reference; a failed one is recorded (``kind``: its
    format) and raises ``WriteFailed``; a passed one is in ``written.checks``."""
    try:
        artefact = export()
    except ExportError as error:
        written.artefacts.append(Artefact.failed(kind, "", str(error)))
        raise WriteFailed(f"{stage} export", str(error), written) from error
    if not artefact.passed:
        written.artefacts.append(dataclasses.replace(artefact, bytes=0))
        raise WriteFailed(f"{stage} check", check_line(artefact), written)
    written.checks.append(artefact)
    return artefact
