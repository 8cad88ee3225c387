"""Static int8 (``--quantize int8``) orchestration for ONNX, TFLite and OpenVINO: the request
checked before any work, the samples split into calibration, selection and gate rows, the float
reference taken from the original as verification runs it, cross-layer equalization tried in
float first, then the int8 loop (:mod:`tfsurgery.int8.loop`) with the format's backend
(quantize.py, quantize_tflite.py, quantize_openvino.py) chooses on the selection rows and
judges on the gate rows."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional, Sequence, Tuple

from tfsurgery import pipeline, progress
from tfsurgery.int8 import equalize as equalize_mod
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.int8 import speed as int8_speed
from tfsurgery.int8 import target as int8_target
from tfsurgery.int8.kinds import VALUES, output_kinds
from tfsurgery.int8.options import MODES, SWITCHES, Int8Config
from tfsurgery.int8.backends import onnx as quantize_mod
from tfsurgery.int8.backends import openvino as quantize_openvino
from tfsurgery.int8.backends import tflite as quantize_tflite
from tfsurgery.verify import samples as samples_mod
from tfsurgery.export.artefacts import Batch
from tfsurgery.errors import ExportError, InputError, OnnxCheckFailed, VerificationError
from tfsurgery.interface import resolve_interface
from tfsurgery.result import Result, export_onnx, require_verified, verify_result
from tfsurgery.source import Source, signature_for
from tfsurgery.trust.outside import with_allowed_ops

Int8Thresholds = quantize_mod.Thresholds
Int8Refused = quantize_mod.Int8Refused


def check_int8_request(samples_path, quantize, onnx: bool, nchw_inputs: Sequence[str] = (),
                       *, weights: str = "float32", check_samples=None, labels=None) -> None:
    """Bad --quantize requests, before any work — before the model is even loaded: one line
    each (exit 2), a file an option names that does not exist among them."""
    if quantize and weights != "float32":
        raise InputError(f"--quantize {quantize} quantizes the float model: drop --store-weights "
                         f"{weights} (--store-weights int8 is storage only, float compute)")
    quantize_mod.check_request(samples_path, quantize, onnx, nchw_inputs)
    for option, path in (("--samples", samples_path), ("--check-samples", check_samples),
                         ("--labels", labels)):
        if quantize and path is not None and not Path(path).exists():
            raise InputError(f"{option} {path}: no such file or directory")


def check_int8_speed_request(target: str = "auto", min_speedup: Optional[float] = None) -> None:
    """A bad --int8-target or --int8-min-speedup, before any work (exit 2)."""
    int8_target.settings(target)
    int8_speed.check_min_speedup(min_speedup)


@with_allowed_ops
def check_int8_rows(source: Source, samples_path, *, thresholds: Int8Thresholds,
                    check_samples=None, check_fraction: float = int8_loop.GATE_FRACTION,
                    labels=None, inputs: Sequence[str] = (), outputs: Sequence[str] = ()
                    ) -> None:
    """The rows counted right after loading, before the float model is optimized, verified
    or calibrated: unreadable samples, or too few gate rows to show the agreement threshold,
    exit 2 in seconds. ``inputs``/``outputs``: the ones the user named (else detected)."""
    inputs, outputs = resolve_interface(source.graph_def, list(inputs) or source.inputs,
                                        list(outputs) or source.outputs,
                                        source.training_flags)
    rows = _split(source.graph_def, inputs, samples_path, check_samples, check_fraction,
                  labels)
    check_gate_rows(source.graph_def, outputs, rows, thresholds,
                    given_gate=check_samples is not None, check_fraction=check_fraction)


def check_gate_rows(graph_def, outputs: Sequence[str], rows: int8_loop.Rows,
                    thresholds: Int8Thresholds, *, given_gate: bool,
                    check_fraction: float = int8_loop.GATE_FRACTION) -> None:
    """Too few gate rows for an output judged by agreement to show ``--int8-min-agreement``
    at 95% confidence even if every row agreed: one line naming the rows needed (exit 2)."""
    threshold = thresholds.min_agreement
    asked = rows.gate.labels is not None or thresholds.given_agreement is not None
    judged = [name for name, kind in output_kinds(graph_def, outputs,
                                                  classes_asked=asked).items()
              if kind != VALUES]
    needed = int8_loop.rows_needed(threshold)
    compared = rows.gate.rows * _per_row(rows.gate)
    if threshold <= 0 or not judged or needed is None or compared >= needed:
        return
    per_row = _per_row(rows.gate)
    gate_rows = math.ceil(needed / per_row)
    give = (f"--check-samples with at least {gate_rows} rows" if given_gate else
            f"at least {math.ceil(gate_rows / check_fraction)} --samples rows (a "
            f"{check_fraction:g} share of them gate), or --check-samples with {gate_rows}")
    raise InputError(f"{judged[0]}: {compared} gate rows cannot show top-1 agreement ≥ "
                     f"{threshold:g} at 95% confidence even if all agree (that takes "
                     f"{needed}); give {give}, or lower --int8-min-agreement (0: no agreement "
                     "gate)")


def _per_row(samples) -> int:
    """Batch elements per row: whole-batch rows hold several."""
    batched = [a for name, a in samples.arrays.items() if samples.batched.get(name)]
    return max(1, int(batched[0].shape[1])) if batched and batched[0].ndim > 1 else 1


TfliteInt8Refused = quantize_tflite.TfliteInt8Refused


@with_allowed_ops
def int8_samples(source: Source, result: Result, samples_path, *, check_samples=None,
                 check_fraction: float = int8_loop.GATE_FRACTION,
                 labels=None, thresholds: Optional[Int8Thresholds] = None) -> int8_loop.Rows:
    """Calibration, selection and gate rows (:func:`int8_loop.split_rows`): --samples cut in
    three, or in two (calibration, selection) with ``check_samples`` as the gate rows (at least
    8). ``labels``: an .npy of each row's class when --samples carries none. With
    ``thresholds``: too few gate rows to show its agreement is an ``InputError`` here, before
    anything is calibrated (:func:`check_gate_rows`)."""
    rows = _split(source.graph_def, result.inputs, samples_path, check_samples,
                  check_fraction, labels)
    if thresholds is not None:
        check_gate_rows(result.graph_def, result.outputs, rows, thresholds,
                        given_gate=check_samples is not None, check_fraction=check_fraction)
    return rows


def _split(graph_def, inputs, samples_path, check_samples, check_fraction, labels):
    specs = samples_mod.input_specs(graph_def, inputs)
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


EQUALIZE_CHOICES = SWITCHES
INT8_CALIBRATION_CHOICES = quantize_mod.CALIBRATION_CHOICES
INT8_MODES = MODES


@with_allowed_ops
def export_int8(source: Source, result: Result, float_model, path, *, rows: int8_loop.Rows,
                config: Int8Config, batch: Optional[Batch] = None) -> quantize_mod.Int8Report:
    """Int8 of the (checked) float ONNX ``float_model`` as ``config`` says: every choice and
    mode measured on the selection rows of ``rows`` (static: calibration method, bias
    correction, the plain or the cross-layer-equalized graph, layers kept float; dynamic when
    static misses), every mode timed against ``float_model`` on this machine, the mode to
    write judged on its gate rows against the float ORIGINAL in TensorFlow. Raises
    ``Int8Refused`` (with its report) when it misses, ``int8_speed.Int8TooSlow`` when it runs
    slower than ``config.required_speedup`` × float: nothing is written."""
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
    candidates, equalization = _candidates(result, rows, config.equalize, Path(float_model),
                                           as_onnx)
    settings = config.settings
    progress.say(f"quantizing to int8 for {settings.summary}: {_sizes(rows)}: {path}")
    try:
        report = quantize_mod.quantize(candidates, Path(path), outputs=result.outputs,
                                       rows=rows, expected=float_expected(result, rows),
                                       thresholds=_with_kinds(config.thresholds, result, rows),
                                       batch=batch, timeout=result.timeout,
                                       calibration_method=config.calibration,
                                       bias_correction=config.bias_correction,
                                       say=progress.say, settings=settings, modes=config.modes,
                                       min_speedup=config.required_speedup,
                                       speed_runs=config.speed_runs)
    except (quantize_mod.Int8Refused, int8_speed.Int8TooSlow) as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report


def _with_kinds(thresholds: Int8Thresholds, result: Result, rows: int8_loop.Rows
                ) -> Int8Thresholds:
    """``thresholds`` knowing each output's kind, read from the original graph
    (:mod:`int8.kinds`): labels or an agreement threshold given let the shape decide where the
    graph shows no class head."""
    asked = rows.selection.labels is not None or thresholds.given_agreement is not None
    kinds = output_kinds(result.graph_def, result.outputs,
                         classes_asked=asked)
    return dataclasses.replace(thresholds, kinds=kinds)


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
    # the tensors equalization rescaled under their own names are not paired by name
    reports = pipeline.Reports(list(result.reports) + [report], pipeline.compose(
        getattr(result.reports, "correspondence", {}), report.correspondence))
    equalized = dataclasses.replace(result, graph_def=graph_def,
                                    reports=reports, verification=None,
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
                       config: Int8Config, batch: Optional[Batch] = None):
    """Full-integer TFLite (calibration rows as representative dataset) through the int8 loop:
    the plain/equalized choice and the layers kept float (denylisted in the quantizer) chosen
    on the selection rows, judged in the LiteRT interpreter on the gate rows against the float
    ORIGINAL; raises ``TfliteInt8Refused``. ``config`` as for :func:`export_int8` (the
    converter's own calibration, no bias correction; dynamic = its dynamic-range int8; TFLite
    models are not timed)."""
    require_verified(result)
    candidates, equalization = _candidates(result, rows, config.equalize, result.graph_def,
                                           lambda equalized, _: equalized.graph_def)
    progress.say(f"converting to full-integer TensorFlow Lite: {_sizes(rows)}: {path}")
    try:
        report = quantize_tflite.export(candidates, signature_for(source, result), path,
                                        outputs=result.outputs, rows=rows,
                                        expected=float_expected(result, rows),
                                        thresholds=_with_kinds(config.thresholds, result, rows),
                                        int8_io=config.tflite_io == "int8",
                                        input_path=source.path, batch=batch, say=progress.say,
                                        modes=config.modes)
    except quantize_tflite.TfliteInt8Refused as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report


@with_allowed_ops
def export_openvino_int8(source: Source, result: Result, path, *, rows: int8_loop.Rows,
                         config: Int8Config, precision: str = "f32",
                         force: bool = False, batch: Optional[Batch] = None):
    """NNCF int8 OpenVINO IR (``nncf.quantize`` over the calibration rows) through the int8
    loop: NNCF's preset, the plain/equalized graph and the layers kept float (NNCF's ignored
    scope) chosen on the selection rows, judged in OpenVINO (the rest of the model at
    ``precision``) on the gate rows against the float ORIGINAL; raises ``Int8Refused``.
    ``config`` as for :func:`export_int8` (static only, not timed)."""
    require_verified(result)
    quantize_openvino.require_nncf()
    equalize = config.equalize
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
                                          thresholds=_with_kinds(config.thresholds, result,
                                                                 rows),
                                          precision=precision,
                                          force=force, input_path=source.path, batch=batch,
                                          timeout=result.timeout, say=progress.say)
    except int8_loop.Int8Refused as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report
