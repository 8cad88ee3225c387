"""Benchmark section for int8: per model, tfsurgery's float ONNX against its static QDQ int8
(onnxruntime ``quantize_static``, per-channel weights, MinMax on seeded random calibration
inputs) in onnxruntime — sizes, and latency with each model timed in a process of its own
(``python -m benchmarks.int8 MODEL.onnx FEEDS.npz RUNS``), same threads and feeds.

Latency and size only: the benchmark models have random weights, so agreement measured on them
means nothing and none is reported (the tests measure accuracy on real digits).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import markdown_table, source_of
from tfsurgery import api, latency, quantize
from tfsurgery.ops import first_line
from tfsurgery.samples import Samples

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION_ROWS = 16


def int8_section(built, *, runs: int = 20, timeout: float = 600) -> dict:
    source = source_of(built)
    result = api.optimize(source, api.choose_transforms(bn_fold=True),
                          checks=api.Checks(verify=False))
    feeds = api.feeds_for_checks(result)
    rng = np.random.default_rng(0)
    rows = {name: rng.uniform(-1, 1, (CALIBRATION_ROWS, *np.shape(value)[1:])).astype(
        np.float32) for name, value in feeds.items()}
    calibration = Samples(rows, {name: False for name in rows}, "random calibration rows")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        float_model, int8_model = work / "float.onnx", work / "int8.onnx"
        api.export_onnx(result, float_model, allow_unverified=True)
        quantize._quantize_static(float_model, int8_model, calibration, [],
                                  cache=work / "calibration.json")
        np.savez(work / "feeds.npz", **feeds)
        section = {"runs": runs, "calibration_rows": CALIBRATION_ROWS}
        for name, path in (("float", float_model), ("int8", int8_model)):
            section[name] = {"bytes": path.stat().st_size,
                             **_timed(path, work / "feeds.npz", runs, timeout)}
    if "median_ms" in section["float"] and "median_ms" in section["int8"]:
        section["speedup"] = section["float"]["median_ms"] / section["int8"]["median_ms"]
    section["size_ratio"] = section["int8"]["bytes"] / section["float"]["bytes"]
    return section


def _timed(model: Path, feeds: Path, runs: int, timeout: float) -> dict:
    command = [sys.executable, "-m", "benchmarks.int8", str(model), str(feeds), str(runs)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:g} s"}
    if done.returncode != 0:
        return {"error": first_line(done.stderr)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def render(sections: dict) -> str:
    rows = []
    for name, s in sections.items():
        rows.append([name, f"{s['float'].get('median_ms', float('nan')):.2f}",
                     f"{s['int8'].get('median_ms', float('nan')):.2f}",
                     f"{s.get('speedup', float('nan')):.2f}×",
                     f"{s['float']['bytes'] / 2**20:.1f}", f"{s['int8']['bytes'] / 2**20:.1f}",
                     f"{s['size_ratio']:.2f}"])
    return ("## Int8 in onnxruntime (latency and size only; random weights, no accuracy claimed)"
            "\n\n" + markdown_table(["model", "float ms", "int8 ms", "speedup", "float MiB",
                                     "int8 MiB", "size ratio"], rows) + "\n")


def _worker(model: Path, feeds: Path, runs: int) -> dict:
    run = latency.ort_runner(model, dict(np.load(feeds)))
    (timing,) = latency.summarise("onnxruntime", latency.interleaved({"model": run}, runs),
                                  latency.threads())
    return timing.as_dict()


if __name__ == "__main__":
    print(json.dumps(_worker(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))))
