"""Benchmark section for int8 speed: per model, in onnxruntime, on this machine's CPU (named),
three models timed side by side:

- **float**: tfsurgery's float ONNX (``--onnx``);
- **tfsurgery int8**: the int8 ONNX ``--quantize int8`` writes, built by its ONNX backend with
  this machine's ``--int8-target auto`` for the MinMax choice, no layer kept float (the other
  choices — Percentile, equalization, bias correction — change ranges, weights and biases, not
  the graph onnxruntime runs); the speed check every int8 run makes is reported too;
- **recipe**: onnxruntime's recommended x86 recipe applied to the same float ONNX in the same
  run: ``quantize_static`` QDQ, per-channel, uint8 activations, int8 weights.

Both int8 models are calibrated (MinMax) on the same seeded random rows. Each repeat times the
three models in one fresh onnxruntime process, interleaved, the order rotating between repeats,
the sessions' intra-op threads not spinning when idle (``int8_speed.time_together``: spinning
threads of an idle session slow the one being timed), batch 1; the ratios are taken
within a repeat (the machine is shared: absolute times wobble, ratios measured together much
less), and their median and range over the repeats reported.

Speed only: the models have random weights, so no accuracy is claimed (the tests measure it).
"""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Dict, List

import numpy as np

from benchmarks.common import markdown_table, source_of
from tfsurgery import api
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.int8 import speed as int8_speed
from tfsurgery.int8 import target as int8_target
from tfsurgery.bench import latency
from tfsurgery.int8.backends import onnx as quantize
from tfsurgery.verify.samples import Samples

CALIBRATION_ROWS = 16
MODELS = ("float", "tfsurgery", "recipe")


def int8_section(built, *, runs: int = 20, repeats: int = 3, timeout: float = 1200) -> dict:
    source = source_of(built)
    result = api.optimize(source, api.choose_transforms(bn_fold=True),
                          checks=api.Checks(verify=False))
    feeds = {name: np.asarray(value)[:1] for name, value in api.feeds_for_checks(result).items()}
    calibration = _random_rows(feeds)
    settings = int8_target.settings()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = {name: work / f"{name}.onnx" for name in MODELS}
        api.export_onnx(result, paths["float"], allow_unverified=True)
        tfsurgery_int8(paths["float"], paths["tfsurgery"], calibration, work, settings)
        check = int8_speed.measure(paths["float"], paths["tfsurgery"], feeds, runs=runs)
        recipe(paths["float"], paths["recipe"], calibration)
        np.savez(work / "feeds.npz", **feeds)
        medians: Dict[str, List[float]] = {name: [] for name in MODELS}
        for repeat in range(repeats):
            order = MODELS[repeat % 3:] + MODELS[:repeat % 3]     # no model always runs first
            timed = int8_speed.time_together({name: paths[name] for name in order}, feeds,
                                             work, runs=runs, timeout=timeout)
            for name, row in timed.items():
                medians[name].append(row.median_ms)
        section = {"cpu": int8_target.cpu_name(), "settings": settings.as_dict(),
                   "runs": runs, "repeats": repeats, "threads": row.threads,
                   "calibration_rows": CALIBRATION_ROWS, "batch": 1,
                   "bytes": {name: path.stat().st_size for name, path in paths.items()},
                   "same_model": same_model(paths["tfsurgery"], paths["recipe"]),
                   "tfsurgery_check": dict(check.as_dict(), line=check.line()),
                   "median_ms": medians}
    section["ratios"] = {
        "tfsurgery_vs_float": _ratios(medians["float"], medians["tfsurgery"]),
        "recipe_vs_float": _ratios(medians["float"], medians["recipe"]),
        "tfsurgery_vs_recipe": _ratios(medians["recipe"], medians["tfsurgery"])}
    return section


def tfsurgery_int8(float_model: Path, out: Path, rows: Samples, work: Path,
                   settings: int8_target.Int8Settings) -> Path:
    """The int8 ONNX as ``--quantize int8`` builds it: its ONNX backend (``quantize.OnnxBackend``,
    this machine's target) for the MinMax choice with no layer kept float — the model the loop
    publishes when that choice passes. (The whole ``api.write`` path is not run here: it also
    tries the other choices and checks the float graph; its memory: docs/int8.md, Memory.)"""
    backend = quantize.OnnxBackend({"plain": float_model}, rows, work, methods=["MinMax"],
                                   corrections=[False], settings=settings)
    built = backend.build(int8_loop.Choice("plain", "MinMax", False), [])
    os.replace(built, out)
    return out


def recipe(float_model: Path, out: Path, calibration: Samples) -> None:
    """onnxruntime's recommended static int8 for x86 CPUs, straight from its API."""
    from onnxruntime import quantization as q
    import onnxruntime as ort
    names = [i.name for i in ort.InferenceSession(
        str(float_model), providers=["CPUExecutionProvider"]).get_inputs()]

    class Rows(q.CalibrationDataReader):
        def __init__(self):
            self._rows = iter(calibration.feeds())

        def get_next(self):
            feeds = next(self._rows, None)
            return None if feeds is None else {
                name: feeds[name.split(":")[0]] for name in names}

    q.quantize_static(str(float_model), str(out), Rows(), quant_format=q.QuantFormat.QDQ,
                      per_channel=True, activation_type=q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8)


def same_model(a: Path, b: Path) -> bool:
    """Whether two ONNX files hold the same nodes and initializers (then any timing difference
    between them is the machine's noise)."""
    import onnx
    first, second = onnx.load(str(a)), onnx.load(str(b))
    return list(first.graph.node) == list(second.graph.node) and \
        list(first.graph.initializer) == list(second.graph.initializer)


def _random_rows(feeds: Dict[str, np.ndarray], count: int = CALIBRATION_ROWS,
                 seed: int = 0) -> Samples:
    rng = np.random.default_rng(seed)
    rows = {name.split(":")[0]: rng.uniform(-1, 1, (count, *np.shape(value)[1:]))
            .astype(np.float32) for name, value in feeds.items()}
    return Samples(rows, {name: False for name in rows}, "random calibration rows")


def _ratios(slower_ms: List[float], faster_ms: List[float]) -> dict:
    """Per repeat, ``slower / faster`` (a speed-up); their median, min and max."""
    values = [s / f for s, f in zip(slower_ms, faster_ms)]
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "each": values}


def render(sections: dict) -> str:
    rows = []
    for name, s in sections.items():
        ms = {m: statistics.median(s["median_ms"][m]) for m in MODELS}
        cells = [f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})"
                 for r in (s["ratios"]["tfsurgery_vs_float"], s["ratios"]["recipe_vs_float"],
                           s["ratios"]["tfsurgery_vs_recipe"])]
        rows.append([name, f"{ms['float']:.2f}", f"{ms['tfsurgery']:.2f}",
                     f"{ms['recipe']:.2f}", *cells,
                     f"{s['bytes']['tfsurgery'] / s['bytes']['float']:.2f}",
                     "yes" if s["same_model"] else "no"])
    first = next(iter(sections.values()))
    return ("## Int8 speed in onnxruntime (random weights: speed only, no accuracy claimed)\n\n"
            f"CPU: {first['cpu']}; tfsurgery's int8 target: {first['settings']['target']} "
            f"(activations {first['settings']['activations']}, weights int8 per-channel"
            f"{', reduce_range' if first['settings']['reduce_range'] else ''}); batch 1, "
            f"{first['threads']} threads, intra-op spinning off; each repeat times the three models "
            f"interleaved in one onnxruntime process ({first['runs']} runs each), "
            f"{first['repeats']} repeats: "
            "median speed-up (range over repeats).\n\n"
            + markdown_table(["model", "float ms", "tfsurgery int8 ms", "recipe ms",
                              "tfsurgery vs float", "recipe vs float", "tfsurgery vs recipe",
                              "size ratio", "same model as recipe"], rows) + "\n"
            + "\nWhere tfsurgery's int8 and the recipe are the same model, their ratio shows "
            "how much this machine's timing wobbles.\n")
