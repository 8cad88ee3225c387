"""Benchmark section for the deployment formats: per model, the size of each artefact tfsurgery
writes (.pb, SavedModel, ONNX, TFLite; float32 and float16 weights; OpenVINO IR checked at f32
and, where the CPU has bf16, at bf16 — OpenVINO's own default there) with its checked error, and
the optimized model's latency in TensorFlow, onnxruntime, the TFLite interpreter and OpenVINO
(f32, and bf16 where the CPU has it) — each runtime timed in a process of its own by
``tfsurgery.bench.latency``'s worker (the one ``tfsurgery bench`` uses), with the same intra-op thread
count and feeds.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Dict, List

import numpy as np

from benchmarks.common import markdown_table, source_of
from tfsurgery import api
from tfsurgery.bench import latency
from tfsurgery.export import openvino as openvino_export
from tfsurgery.errors import ExportError, VerificationError
from tfsurgery.ops import first_line

WEIGHTS = ("float32", "float16")
FORMATS = ("pb", "saved_model", "onnx", "tflite")
# float16 weights in a deep net with random weights move outputs by a few percent (MobileNetV2:
# 2.6e-2), beyond the CLI's default 1e-2: the benchmark allows 5e-2 and reports what it measured.
TOLERANCE = {"float32": None, "float16": 5e-2}
RUNTIME_FILES = {"tensorflow": "model.pb", "onnxruntime": "model.onnx", "tflite": "model.tflite"}
# OpenVINO (float32 weights only): the one IR, compiled at each precision; bf16 where the CPU has
# it. Each is checked at its own tolerance (openvino_export.TOLERANCES) and timed either way.
OPENVINO_PRECISIONS = ("f32", "bf16")


def artefacts(source: api.Source, work: Path) -> tuple:
    """(weights → format → {bytes, max_error, passed} or {error}, the float32 run's verification
    feeds, its outputs); the artefacts are written under ``work``."""
    table: Dict[str, Dict[str, dict]] = {}
    feeds, outputs = {}, []
    for weights in WEIGHTS:
        folder = work / weights
        folder.mkdir()
        try:
            result = api.optimize(source, api.choose_transforms(bn_fold=True),
                                  checks=api.Checks(tolerance=TOLERANCE[weights]),
                                  options=api.RunOptions(weights=weights))
        except api.VerificationFailed as failed:
            table[weights] = {f: {"error": f"verification failed: {failed}"} for f in FORMATS}
            continue
        row: Dict[str, dict] = {}
        if weights == "float32":
            feeds, outputs = api.feeds_for_checks(result), result.outputs
        api.save(result, folder / "model.pb")
        row["pb"] = _entry(api.pb_artefact(result, folder / "model.pb").as_dict())
        exports = {"saved_model": lambda: api.export_saved_model(source, result,
                                                                 folder / "saved_model"),
                   "onnx": lambda: api.export_onnx(result, folder / "model.onnx"),
                   "tflite": lambda: api.export_tflite(source, result, folder / "model.tflite")}
        for name, export in exports.items():
            try:
                done = export()
            except ExportError as error:
                row[name] = {"error": first_line(error)}
                continue
            row[name] = _entry(done.as_dict())
            if name == "onnx":     # OnnxExport: size from the file (+ external data)
                row[name]["bytes"] = sum(p.stat().st_size for p in folder.glob("model.onnx*"))
        if weights == "float32":
            row.update(_openvino(result, folder))
        table[weights] = row
    return table, feeds, outputs


def _openvino(result, folder: Path) -> Dict[str, dict]:
    """The IR written at f32 (``openvino`` in ``folder``) and checked at each precision the CPU
    runs: {"openvino f32": entry, "openvino bf16": entry} (or why not)."""
    if not openvino_export.installed():
        return {f"openvino {p}": {"error": "OpenVINO not installed"} for p in OPENVINO_PRECISIONS}
    feeds = api.feeds_for_checks(result)
    try:
        done = openvino_export.export(result.graph_def, result.inputs, result.outputs,
                                      folder / "openvino", feeds=feeds, precision="f32",
                                      timeout=result.timeout)
    except ExportError as error:
        return {f"openvino {p}": {"error": first_line(error)} for p in OPENVINO_PRECISIONS}
    rows = {"openvino f32": _entry(done.as_dict())}
    expected = openvino_export.reference(result.graph_def, result.outputs, feeds, result.timeout)
    for precision in OPENVINO_PRECISIONS[1:]:
        if precision not in openvino_export.supported_precisions():
            rows[f"openvino {precision}"] = {"error": f"this CPU has no native {precision}"}
        elif done.passed:
            at = openvino_export.check(folder / "openvino", result.outputs, feeds, expected,
                                       precision=precision, timeout=result.timeout,
                                       tolerance=openvino_export.TOLERANCES[precision])
            rows[f"openvino {precision}"] = dict(_entry(at.as_dict()),
                                                 tolerance=at.tolerance)
    rows["openvino f32"]["tolerance"] = done.tolerance
    return rows


def _entry(data: dict) -> dict:
    return {"bytes": data.get("bytes"), "max_error": data["max_error"], "passed": data["passed"]}


def latencies(work: Path, feeds: Dict[str, np.ndarray], outputs: List[str], *,
              runs: int, timeout: float = 600) -> Dict[str, dict]:
    """The float32 optimized model in each runtime whose artefact exists, one process each
    (tfsurgery.bench.latency's worker, the one ``tfsurgery bench`` uses)."""
    np.savez(work / "feeds.npz", **feeds)
    rows = {}
    for runtime, name in RUNTIME_FILES.items():
        model = work / "float32" / name
        if not model.exists():
            rows[runtime] = {"error": "no artefact"}
            continue
        try:
            (timing,) = latency.measure_in_subprocess(
                runtime, {"optimized": (model, work / "feeds.npz")}, outputs, runs=runs,
                work=work, timeout=timeout)
        except VerificationError as error:
            rows[runtime] = {"error": first_line(error)}
            continue
        rows[runtime] = timing.as_dict()
    rows.update(_openvino_latencies(work, outputs, runs=runs, timeout=timeout))
    return rows


def _openvino_latencies(work: Path, outputs: List[str], *, runs: int,
                        timeout: float) -> Dict[str, dict]:
    """The IR at f32 and at bf16 (where the CPU has it), each in an OpenVINO process of its own
    (two compiled models in one process disturb each other's threads)."""
    directory = work / "float32" / "openvino"
    if not directory.exists():
        return {"openvino f32": {"error": "no artefact"}}
    rows = {}
    for precision in OPENVINO_PRECISIONS:
        name = f"openvino {precision}"
        if precision not in openvino_export.supported_precisions():
            continue
        try:
            (timing,) = latency.measure_in_subprocess(
                "openvino", {name: (directory, work / "feeds.npz")}, outputs, runs=runs,
                work=work, timeout=timeout, precisions={name: precision})
        except VerificationError as error:
            rows[name] = {"error": first_line(error)}
            continue
        rows[name] = timing.as_dict()
    return rows


def deployment(built, *, runs: int = 20) -> dict:
    """Artefact sizes/errors (float32, float16) and per-runtime latency of one model."""
    source = source_of(built)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        table, feeds, outputs = artefacts(source, work)
        timings = latencies(work, feeds, outputs, runs=runs)
    return {"artefacts": table, "latency": timings, "runs": runs}


def render(name: str, section: dict) -> str:
    """Markdown: sizes and errors per format and weights; latency per runtime."""
    rows = []
    for weights, row in section["artefacts"].items():
        for fmt in FORMATS + tuple(k for k in row if k.startswith("openvino")):
            entry = row.get(fmt, {"error": "not run"})
            rows.append([fmt, weights] + ([f"{entry['bytes'] / 1024:.1f} KiB",
                                           f"{entry['max_error']:.2g}",
                                           "yes" if entry["passed"] else "**no**"]
                                          if "error" not in entry else [entry["error"], "", ""]))
    timing = [[runtime, f"{t['median_ms']:.3f} ± {t['spread_ms']:.3f}" if "median_ms" in t
               else t["error"]] for runtime, t in section["latency"].items()]
    return "\n".join([f"#### {name}: deployment artefacts", "",
                      markdown_table(["format", "weights", "size", "max error", "checked"],
                                     rows), "",
                      "Max error: the .pb against the original graph (verification); the "
                      "other formats against the .pb run in TensorFlow. Tolerance: "
                      f"{TOLERANCE['float16']:g} for float16 weights; OpenVINO at its "
                      "inference precision's own: " + ", ".join(
                          f"{p} {openvino_export.TOLERANCES[p]:g}" for p in OPENVINO_PRECISIONS)
                      + ".", "",
                      f"Latency of the optimized float32 model (median ± IQR over "
                      f"{section['runs']} runs, ms; each runtime in its own process):", "",
                      markdown_table(["runtime", "latency"], timing)])
