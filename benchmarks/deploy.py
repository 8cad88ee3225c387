"""Benchmark section for the deployment formats: per model, the size of each artefact tfsurgery
writes (.pb, SavedModel, ONNX, TFLite; float32 and float16 weights) with its checked error, and
the optimized model's latency in TensorFlow, onnxruntime and the TFLite interpreter — each runtime
timed in a process of its own by ``tfsurgery.latency``'s worker (the one ``tfsurgery bench``
uses), with the same intra-op thread count and feeds.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Dict, List

import numpy as np

from benchmarks.common import markdown_table, source_of
from tfsurgery import api, latency
from tfsurgery.errors import ExportError, VerificationError
from tfsurgery.ops import first_line

WEIGHTS = ("float32", "float16")
FORMATS = ("pb", "saved_model", "onnx", "tflite")
# float16 weights in a deep net with random weights move outputs by a few percent (MobileNetV2:
# 2.6e-2), beyond the CLI's default 1e-2: the benchmark allows 5e-2 and reports what it measured.
TOLERANCE = {"float32": None, "float16": 5e-2}
RUNTIME_FILES = {"tensorflow": "model.pb", "onnxruntime": "model.onnx", "tflite": "model.tflite"}


def artefacts(source: api.Source, work: Path) -> tuple:
    """(weights → format → {bytes, max_error, passed} or {error}, the float32 run's verification
    feeds, its outputs); the artefacts are written under ``work``."""
    table: Dict[str, Dict[str, dict]] = {}
    feeds, outputs = {}, []
    for weights in WEIGHTS:
        folder = work / weights
        folder.mkdir()
        try:
            result = api.optimize(source, api.choose_transforms(bn_fold=True), weights=weights,
                                  tolerance=TOLERANCE[weights])
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
        table[weights] = row
    return table, feeds, outputs


def _entry(data: dict) -> dict:
    return {"bytes": data.get("bytes"), "max_error": data["max_error"], "passed": data["passed"]}


def latencies(work: Path, feeds: Dict[str, np.ndarray], outputs: List[str], *,
              runs: int, timeout: float = 600) -> Dict[str, dict]:
    """The float32 optimized model in each runtime whose artefact exists, one process each
    (tfsurgery.latency's worker, the one ``tfsurgery bench`` uses)."""
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
        for fmt in FORMATS:
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
                      f"{TOLERANCE['float16']:g} for float16 weights.", "",
                      f"Latency of the optimized float32 model (median ± IQR over "
                      f"{section['runs']} runs, ms; each runtime in its own process):", "",
                      markdown_table(["runtime", "latency"], timing)])
