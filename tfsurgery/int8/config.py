"""Static int8 (``--quantize int8``) orchestration for ONNX, TFLite and OpenVINO: the request
checked before any work, the samples split into calibration, selection and gate rows, the float
reference taken from the original as verification runs it, cross-layer equalization tried in
float first, then the int8 loop (:mod:`tfsurgery.int8.loop`) with the format's backend
(quantize.py, quantize_tflite.py, quantize_openvino.py) chooses on the selection rows and
judges on the gate rows."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence, Tuple

from tfsurgery import progress
from tfsurgery.int8 import equalize as equalize_mod
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.int8 import speed as int8_speed
from tfsurgery.int8 import target as int8_target
from tfsurgery.int8.backends import onnx as quantize_mod
from tfsurgery.int8.backends import openvino as quantize_openvino
from tfsurgery.int8.backends import tflite as quantize_tflite
from tfsurgery.verify import samples as samples_mod
from tfsurgery.export.artefacts import Batch
from tfsurgery.errors import ExportError, InputError, OnnxCheckFailed, VerificationError
from tfsurgery.result import Result, export_onnx, require_verified, verify_result
from tfsurgery.source import Source, signature_for
from tfsurgery.trust.outside import with_allowed_ops

Int8Thresholds = quantize_mod.Thresholds
Int8Refused = quantize_mod.Int8Refused


def check_int8_request(samples_path, quantize, onnx: bool, nchw_inputs: Sequence[str] = (),
                       *, weights: str = "float32") -> None:
    """Bad --quantize requests, before any work: one line each (exit 2)."""
    if quantize and weights != "float32":
        raise InputError(f"--quantize {quantize} quantizes the float model: drop --store-weights "
                         f"{weights} (--store-weights int8 is storage only, float compute)")
    quantize_mod.check_request(samples_path, quantize, onnx, nchw_inputs)


def check_int8_speed_request(target: str = "auto", min_speedup: Optional[float] = None) -> None:
    """A bad --int8-target or --int8-min-speedup, before any work (exit 2)."""
    int8_target.settings(target)
    int8_speed.check_min_speedup(min_speedup)


TfliteInt8Refused = quantize_tflite.TfliteInt8Refused


@with_allowed_ops
def int8_samples(source: Source, result: Result, samples_path, *, check_samples=None,
                 check_fraction: float = int8_loop.GATE_FRACTION,
                 labels=None) -> int8_loop.Rows:
    """Calibration, selection and gate rows (:func:`int8_loop.split_rows`): --samples cut in
    three, or in two (calibration, selection) with ``check_samples`` as the gate rows (at least
    8). ``labels``: an .npy of each row's class when --samples carries none."""
    specs = samples_mod.input_specs(source.graph_def, result.inputs)
    rows = samples_mod.load(samples_path, specs, labels_path=labels)
    gate = None if check_samples is None else samples_mod.load(check_samples, specs)
    if gate is not None and (rows.labels is None) != (gate.labels is None):
        raise InputError(f"{samples_path} and {check_samples}: give labels in both or neither")
    return int8_loop.split_rows(rows, gate, gate_fraction=check_fraction)


@with_allowed_ops
def float_expected(result: Result, rows: int8_loop.Rows) -> dict:
    """The float reference on the selection and gate rows: ``result.original`` fed what
    verification feeds it besides the inputs (``result.original_extra_feeds``: a keep_prob at
    1, a training flag False) — not the source graph fed only the rows."""
    return {name: int8_loop.float_reference(result.original, result.graph_def,
                                            result.original_extra_feeds, result.outputs,
                                            getattr(rows, name), result.timeout)
            for name in ("selection", "gate")}


EQUALIZE_CHOICES = ("auto", "on", "off")
INT8_CALIBRATION_CHOICES = quantize_mod.CALIBRATION_CHOICES


@with_allowed_ops
def export_int8(source: Source, result: Result, float_model, path, *, rows: int8_loop.Rows,
                thresholds: quantize_mod.Thresholds, batch: Optional[Batch] = None,
                calibration_method: str = "auto", equalize: str = "off",
                bias_correction: str = "off", target: str = "auto",
                min_speedup: Optional[float] = None,
                speed_runs: int = int8_speed.RUNS) -> quantize_mod.Int8Report:
    """Static int8 of the (checked) float ONNX ``float_model``: every choice measured on the
    selection rows of ``rows``, the one chosen judged on its gate rows against the float
    ORIGINAL in TensorFlow; raises ``Int8Refused`` (with its report) when it misses.

    ``calibration_method``: "auto" (MinMax and Percentile tried, the best on the selection rows
    kept) or one of "minmax", "percentile", "entropy". ``equalize``: "auto" also quantizes the cross-layer-equalized
    graph (verified in float against the original, exported next to ``float_model``) and keeps
    it only if it quantizes better; "on" uses it alone (an error when nothing could be
    equalized or it fails its float check); "off" never. ``bias_correction``: "auto" tries
    each attempt with and without bias correction and keeps the best; "on" only with; "off"
    only without. ``target``: the CPU the model is for (``int8_target``: "auto" is this
    machine). The model the gate passes is then timed against ``float_model`` on this machine
    (``speed_runs`` interleaved runs each, in a process of its own) and refused with
    ``int8_speed.Int8TooSlow`` below ``min_speedup``: nothing is written."""
    settings = int8_target.settings(target)                      # bad values: before any work
    int8_speed.check_min_speedup(min_speedup)
    if bias_correction not in EQUALIZE_CHOICES:
        raise InputError(f"--int8-bias-correction {bias_correction}: choose from "
                         f"{', '.join(EQUALIZE_CHOICES)}")
    if equalize not in EQUALIZE_CHOICES:
        raise InputError(f"--int8-equalize {equalize}: choose from {', '.join(EQUALIZE_CHOICES)}")
    quantize_mod.calibration_methods(calibration_method)          # a bad name: before any work
    twin = Path(float_model).with_name("equalized." + Path(float_model).name)

    def as_onnx(equalized: Result, equalization: dict) -> Optional[Path]:
        """The equalized graph's checked float ONNX beside ``float_model`` (None: it failed)."""
        try:
            exported, model = export_onnx(equalized, twin), twin
        except OnnxCheckFailed as failed:
            exported, model = failed.export, None
            equalization["why"] = f"its ONNX differs from TensorFlow by {exported.max_error:.3g}"
        equalization["onnx_max_error"] = float(exported.max_error)
        return model
    candidates, equalization = _candidates(result, rows, equalize, Path(float_model), as_onnx)
    progress.say(f"quantizing to int8 for {settings.summary}: {_sizes(rows)}: {path}")
    try:
        report = quantize_mod.quantize(candidates, Path(path), outputs=result.outputs,
                                       rows=rows, expected=float_expected(result, rows),
                                       thresholds=thresholds, batch=batch,
                                       timeout=result.timeout,
                                       calibration_method=calibration_method,
                                       bias_correction=bias_correction, say=progress.say,
                                       settings=settings,
                                       accept=lambda model, report: time_int8(
                                           float_model, model, report, rows.calibration,
                                           min_speedup, speed_runs))
    except (quantize_mod.Int8Refused, int8_speed.Int8TooSlow) as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report


def time_int8(float_model, int8_model, report: int8_loop.Int8Report, calibration,
              min_speedup: Optional[float], runs: int) -> None:
    """The int8 model against its float ONNX on this machine, on the first calibration row
    (batch 1): into ``report.speed``; ``Int8TooSlow`` (carrying the report) below
    ``min_speedup``."""
    progress.say(f"timing int8 against float ONNX on this machine ({runs} runs each)")
    speed = int8_speed.measure(float_model, int8_model, calibration.row(0), runs=runs,
                               min_speedup=min_speedup)
    report.speed = dict(speed.as_dict(), line=speed.line())
    try:
        int8_speed.require(speed)
    except int8_speed.Int8TooSlow as slow:
        slow.report = report
        raise


def _candidates(result: Result, rows: int8_loop.Rows, equalize: str, plain, as_model
                ) -> Tuple[dict, dict]:
    """The float models int8 starts from — {"plain": ``plain``} and, unless ``equalize`` is
    "off", {"equalized": ``as_model(equalized result, info)``} where equalization worked and
    that gave a model; "on": the equalized one alone (an ``ExportError`` without it) — and
    what equalization did (the report's ``equalization``)."""
    candidates = {"plain": plain}
    equalization: dict = {"asked": equalize}
    if equalize != "off":
        progress.say("cross-layer equalization before int8")
        equalized, equalization = equalized_result(result, rows.calibration, rows.selection)
        equalization["asked"] = equalize
        model = as_model(equalized, equalization) if equalized is not None else None
        if model is not None:
            candidates["equalized"] = model
        if equalize == "on":
            if "equalized" not in candidates:
                raise ExportError(f"--int8-equalize on: {equalization['why']}")
            del candidates["plain"]
    return candidates, equalization


def _sizes(rows: int8_loop.Rows) -> str:
    return ", ".join(f"{count} {name}" for name, count in rows.sizes().items()) + " rows"


@with_allowed_ops
def equalized_result(result: Result, calibration, check_rows=None
                     ) -> Tuple[Optional[Result], dict]:
    """``result`` after equalize-cross-layer, verified in float against the original like every
    transform — or None and why not (nothing equalized, or the check failed). Verification
    runs on the ``calibration`` and ``check_rows`` (the selection rows: never the gate's)."""
    graph_def, report = equalize_mod.equalize(result.graph_def, result.inputs, result.outputs)
    info = {"transform": report.as_dict(), "pairs": len(report.rewritten),
            "refused": len(report.skipped)}
    if not report.rewritten:
        info["why"] = ("no layer pair could be equalized" +
                       (f" ({report.skipped[0][0]}: {report.skipped[0][1]})"
                        if report.skipped else ""))
        return None, info
    rows = [r for r in (calibration, check_rows) if r is not None]
    equalized = dataclasses.replace(result, graph_def=graph_def,
                                    reports=list(result.reports) + [report], verification=None,
                                    verification_error=None, divergence=None,
                                    samples=samples_mod.concatenate(rows))
    try:
        equalized.verification = verify_result(equalized, feeds=result.given or None)
    except VerificationError as error:
        info["why"] = f"the equalized graph could not be verified: {error}"
        return None, info
    info["verification"] = equalized.verification.as_dict()
    if not equalized.verification.passed:
        info["why"] = ("the equalized graph fails verification against the original: "
                       f"{equalized.verification.failure()}")
        return None, info
    return equalized, info


@with_allowed_ops
def export_tflite_int8(source: Source, result: Result, path, *, rows: int8_loop.Rows,
                       thresholds: quantize_mod.Thresholds, int8_io: bool = False,
                       batch: Optional[Batch] = None, equalize: str = "off"):
    """Full-integer TFLite (calibration rows as representative dataset) through the int8 loop:
    the plain/equalized choice and the layers kept float (denylisted in the quantizer) chosen
    on the selection rows, judged in the LiteRT interpreter on the gate rows against the float
    ORIGINAL; raises ``TfliteInt8Refused``. ``equalize`` as for :func:`export_int8` (the
    converter's own calibration, no bias correction)."""
    require_verified(result)
    if equalize not in EQUALIZE_CHOICES:
        raise InputError(f"--int8-equalize {equalize}: choose from {', '.join(EQUALIZE_CHOICES)}")
    candidates, equalization = _candidates(result, rows, equalize, result.graph_def,
                                           lambda equalized, _: equalized.graph_def)
    progress.say(f"converting to full-integer TensorFlow Lite: {_sizes(rows)}: {path}")
    try:
        report = quantize_tflite.export(candidates, signature_for(source, result), path,
                                        outputs=result.outputs, rows=rows,
                                        expected=float_expected(result, rows),
                                        thresholds=thresholds, int8_io=int8_io,
                                        input_path=source.path, batch=batch, say=progress.say)
    except quantize_tflite.TfliteInt8Refused as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report


@with_allowed_ops
def export_openvino_int8(source: Source, result: Result, path, *, rows: int8_loop.Rows,
                         thresholds: quantize_mod.Thresholds, precision: str = "f32",
                         force: bool = False, batch: Optional[Batch] = None,
                         equalize: str = "off"):
    """NNCF int8 OpenVINO IR (``nncf.quantize`` over the calibration rows) through the int8
    loop: NNCF's preset, the plain/equalized graph and the layers kept float (NNCF's ignored
    scope) chosen on the selection rows, judged in OpenVINO (the rest of the model at
    ``precision``) on the gate rows against the float ORIGINAL; raises ``Int8Refused``.
    ``equalize`` as for :func:`export_int8`."""
    require_verified(result)
    if equalize not in EQUALIZE_CHOICES:
        raise InputError(f"--int8-equalize {equalize}: choose from {', '.join(EQUALIZE_CHOICES)}")
    quantize_openvino.require_nncf()
    candidates = {"plain": result.graph_def}
    equalization: dict = {"asked": equalize}
    if equalize != "off":
        progress.say("cross-layer equalization before int8")
        equalized, equalization = equalized_result(result, rows.calibration, rows.selection)
        equalization["asked"] = equalize
        if equalized is not None:
            candidates["equalized"] = equalized.graph_def
        elif equalize == "on":
            raise ExportError(f"--int8-equalize on: {equalization['why']}")
        if equalize == "on":
            del candidates["plain"]
    progress.say(f"quantizing OpenVINO IR with NNCF: {_sizes(rows)}: {path}")
    try:
        report = quantize_openvino.export(candidates, result.inputs, result.outputs, path,
                                          rows=rows, expected=float_expected(result, rows),
                                          thresholds=thresholds, precision=precision,
                                          force=force, input_path=source.path, batch=batch,
                                          timeout=result.timeout, say=progress.say)
    except int8_loop.Int8Refused as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report
