"""Writing a run's artefacts, together or not at all: every format the ``Targets`` ask for
goes through its exporter (:mod:`tfsurgery.export.exporters`: ONNX, SavedModel, TFLite,
OpenVINO, and any registered one; int8 is a mode of each), converted and checked in turn and
held unpublished; only when every check passed are they published, then the .pb saved (``write``
→ ``Written``, else ``WriteFailed``)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from tfsurgery.export import exporters
from tfsurgery.export import openvino as openvino_export
from tfsurgery.export.artefacts import Batch
from tfsurgery.export.exporters import ExportJob, Written
from tfsurgery.errors import MissingPackage, WriteFailed
from tfsurgery.export.formats import check_line, draw, pb_artefact
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.int8.backends import onnx as quantize_mod
from tfsurgery.int8.config import check_int8_request, int8_samples
from tfsurgery.int8.options import Int8Config
from tfsurgery.result import Result, require_verified, save
from tfsurgery.source import as_source
from tfsurgery.trust.outside import with_allowed_ops

__all__ = ["Int8Targets", "Targets", "Written", "write"]


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
    ``modes``: "auto" (static, and dynamic beside it), "static" or "dynamic". Everything but
    the rows is :attr:`config` (``int8.options.Int8Config``), checked when this is made."""

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
    ``inputs_as_nchw``, ``ort_optimize``: onnxruntime's basic rewrites, ``onnx_fusions``:
    onnxruntime's fused kernels — "auto" those measured faster here, see
    ``export.fusion_choice``), each ``int8`` when
    given, an ``openvino`` IR directory (checked at ``openvino_precision``, "f32" unless asked,
    within ``openvino_tolerance``: default that precision's own), and a ``picture`` of the graph
    before and after. ``more``: a registered format's path by its exporter's name
    (:func:`tfsurgery.export.exporters.register`). ``allow_unverified``: the result was not
    checked on purpose (``--no-verify``)."""

    pb: Optional[Path] = None
    saved_model: Optional[Path] = None
    force: bool = False
    tflite: Optional[Path] = None
    onnx: Optional[Path] = None
    opset: Optional[int] = None
    inputs_as_nchw: Sequence[str] = ()
    ort_optimize: bool = True
    onnx_fusions: Union[bool, str, Sequence[str]] = "auto"     # export.fusion_choice
    int8: Optional[Int8Targets] = None
    openvino: Optional[Path] = None
    openvino_precision: str = "f32"
    openvino_tolerance: Optional[float] = None
    picture: Optional[Path] = None
    picture_scope: Optional[str] = None
    allow_unverified: bool = False
    more: Mapping[str, Path] = dataclasses.field(default_factory=dict)

    def path_for(self, name: str) -> Optional[Path]:
        """Where the format ``name`` is to be written, or None when it is not asked for."""
        path = getattr(self, name, None) if name in BUILT_IN else self.more.get(name)
        return None if path is None else Path(path)

    def requested(self):
        """(exporter, path) for every format asked for, in the registry's order."""
        unknown = set(self.more) - set(exporters.EXPORTERS)
        if unknown:
            raise ValueError(f"no exporter named {', '.join(sorted(unknown))}")
        return [(exporter, self.path_for(name)) for name, exporter in exporters.EXPORTERS.items()
                if self.path_for(name) is not None]


BUILT_IN = ("onnx", "saved_model", "tflite", "openvino")


@with_allowed_ops
def write(source, result: Result, targets: Targets) -> Written:
    """Write every target of ``targets`` together or not at all: each export is converted and
    checked in turn (ONNX — float, or int8 from the checked float model — then SavedModel, then
    TFLite, then the picture is drawn), held unpublished; only when all passed are they
    published, then the .pb saved. The first failure raises ``WriteFailed`` (its ``stage`` and
    the ``written`` records so far) with nothing written; a result whose check failed or never
    ran raises ``Unverified`` unless ``targets.allow_unverified``; a package an export needs
    that is not installed raises ``MissingPackage`` naming it (nothing written either)."""
    source = as_source(source)
    require_verified(result, allow_unverified=targets.allow_unverified)
    requested = targets.requested()
    if targets.openvino is not None:          # not installed, a precision the CPU lacks: exit 2
        openvino_export.check_precision(targets.openvino_precision)
    if targets.int8 is not None:              # what the CLI refuses before any work
        check_int8_request(targets.int8.samples, "int8",
                           any(exporter.has_int8 for exporter, _ in requested),
                           targets.inputs_as_nchw, weights=result.weights,
                           check_samples=targets.int8.check_samples,
                           labels=targets.int8.labels)
    job = ExportJob(source, result, targets, Batch(), Written())
    # the samples are read once: calibration and gate rows for every int8 export alike
    if targets.int8 is not None:
        job.rows = int8_samples(source, result, targets.int8.samples,
                                check_samples=targets.int8.check_samples,
                                check_fraction=targets.int8.check_fraction,
                                labels=targets.int8.labels,
                                thresholds=targets.int8.thresholds)
    try:
        _export_all(job, requested)
        if targets.picture:          # drawn before anything is written: it may refuse
            draw(source, result, targets.picture, scope=targets.picture_scope, batch=job.batch)
        _publish(job)
    finally:
        job.batch.discard()
        for artefact in job.written.artefacts:
            artefact.written = job.written.published
    return job.written


def _export_all(job: ExportJob, requested) -> None:
    """Each requested format through its exporter, in order: int8 where asked and the format
    has it; the records that can only be made once published wait in ``job.deferred``."""
    for exporter, path in requested:
        int8 = job.targets.int8 if exporter.has_int8 else None
        try:
            record = exporter.export(job, path, int8)
        except ImportError as missing:   # a package it needs is not installed: one line, exit 2
            raise MissingPackage.of(missing, f"the {exporter.stage} export") from missing
        if callable(record):
            job.deferred.append((len(job.written.artefacts), record))
            continue
        job.written.artefacts.append(record)
        if not record.passed:            # an exporter that returned a failed check
            raise WriteFailed(f"{exporter.stage} check", check_line(record), job.written)


def _publish(job: ExportJob) -> None:
    """Every staged artefact published, the deferred records made, then the .pb saved."""
    written, targets = job.written, job.targets
    job.batch.publish_all()
    for offset, (index, make) in enumerate(job.deferred):
        written.artefacts.insert(index + offset, make())
    if targets.pb is not None:
        save(job.result, targets.pb, input_path=job.source.path,
             allow_unverified=targets.allow_unverified)
        written.artefacts.insert(0, pb_artefact(job.result, targets.pb))
    written.published = True
    written.picture = Path(targets.picture) if targets.picture else None
