"""Benchmark section for the deployment formats: per model, the size of each artefact tfsurgery
writes (.pb, SavedModel, ONNX, TFLite; float32 and float16 weights) with its checked error, and
the optimized model's latency in TensorFlow, onnxruntime and the TFLite interpreter — each runtime
timed in a process of its own (``python -m benchmarks.deploy RUNTIME WORK RUNS``), with the same
intra-op thread count and feeds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import numpy as np

from benchmarks.common import markdown_table, source_of
from tfsurgery import api, latency
from tfsurgery.errors import ExportError
from tfsurgery.ops import first_line

ROOT = Path(__file__).resolve().parent.parent
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
            feeds, outputs = api.check_feeds(result), result.outputs
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
    """The float32 optimized model in each runtime whose artefact exists, one process each."""
    np.savez(work / "feeds.npz", **feeds)
    (work / "outputs.json").write_text(json.dumps(list(outputs)))
    rows = {}
    for runtime, name in RUNTIME_FILES.items():
        if not (work / "float32" / name).exists():
            rows[runtime] = {"error": "no artefact"}
            continue
        command = [sys.executable, "-m", "benchmarks.deploy", runtime, str(work), str(runs)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        except subprocess.TimeoutExpired:
            rows[runtime] = {"error": f"did not finish within {timeout:g} s"}
            continue
        if done.returncode != 0:
            rows[runtime] = {"error": first_line(done.stderr)}
            continue
        rows[runtime] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def deployment(built, *, runs: int = 20) -> dict:
    """Artefact sizes/errors (float32, float16) and per-runtime latency of one model."""
    source = source_of(built)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        table, feeds, outputs = artefacts(source, work)
        timings = latencies(work, feeds, outputs, runs=runs)
    return {"artefacts": table, "latency": timings, "runs": runs}


def tflite_runner(path: Path, feeds: Dict[str, np.ndarray]):
    from tfsurgery.tflite_export import interpreter_class
    interpreter = interpreter_class()[0](model_path=str(path), num_threads=latency.threads())
    runner = interpreter.get_signature_runner("serving_default")
    feed = {k.split(":")[0]: v for k, v in feeds.items()}
    return lambda: runner(**feed)


def _worker(runtime: str, work: Path, runs: int) -> dict:
    feeds = dict(np.load(work / "feeds.npz"))
    path = work / "float32" / RUNTIME_FILES[runtime]
    if runtime == "tensorflow":
        import tensorflow as tf
        graph_def = tf.compat.v1.GraphDef.FromString(path.read_bytes())
        run = latency.tf_runner(graph_def, feeds, json.loads((work / "outputs.json").read_text()))
    elif runtime == "onnxruntime":
        run = latency.ort_runner(path, feeds)
    else:
        run = tflite_runner(path, feeds)
    (timing,) = latency.summarise(runtime, latency.interleaved({"optimized": run}, runs),
                                  latency.threads())
    return timing.as_dict()


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


if __name__ == "__main__":
    print(json.dumps(_worker(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))))
