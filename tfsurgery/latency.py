"""Before/after latency in TensorFlow and onnxruntime: interleaved runs, median and spread.

Interleaving (original, optimized, original, ...) makes both variants share whatever else the
machine is doing, so their ratio is fair even when absolute times wobble.
"""
from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import numpy as np

from tfsurgery.ops import tensor_name


@dataclasses.dataclass
class Timing:
    runtime: str
    variant: str
    median_ms: float
    spread_ms: float          # interquartile range

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def interleaved(runners: Dict[str, Callable[[], object]], runs: int, warmup: int = 3) -> Dict[
        str, List[float]]:
    """Seconds per call for each runner, the runners taking turns."""
    for run in runners.values():
        for _ in range(warmup):
            run()
    times: Dict[str, List[float]] = {name: [] for name in runners}
    for _ in range(runs):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def summarise(runtime: str, times: Dict[str, List[float]]) -> List[Timing]:
    rows = []
    for variant, seconds in times.items():
        ms = sorted(1000 * s for s in seconds)
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0], ms[0], ms[0]]
        rows.append(Timing(runtime, variant, statistics.median(ms), q[2] - q[0]))
    return rows


def tf_runner(graph_def, feeds: Dict[str, np.ndarray], outputs: Sequence[str]):
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    session = tf.compat.v1.Session(graph=graph)
    fetches = [graph.get_tensor_by_name(tensor_name(o)) for o in outputs]
    feed = {graph.get_tensor_by_name(tensor_name(k)): v for k, v in feeds.items()
            if k.split(":")[0] in {n.name for n in graph_def.node}}
    return lambda: session.run(fetches, feed)


def ort_runner(model_path: Path, feeds: Dict[str, np.ndarray]):
    import onnxruntime as ort
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {tensor_name(k): v for k, v in feeds.items()}
    feed = {k: v for k, v in feed.items() if k in names}
    return lambda: session.run(None, feed)


def bench(original, optimized, inputs: Sequence[str], outputs: Sequence[str],
          training_flags: Sequence[str] = (), *, runs: int = 50, onnx: bool = True,
          seed: int = 0) -> List[Timing]:
    """Latency of the original and optimized graph, in TF and (optionally) onnxruntime."""
    from tfsurgery import onnx_export, verify
    feeds = verify.make_feeds(original, inputs, seed)
    flags = {name: np.bool_(False) for name in training_flags}
    rows = summarise("tensorflow", interleaved({
        "original": tf_runner(original, {**feeds, **flags}, outputs),
        "optimized": tf_runner(optimized, feeds, outputs)}, runs))
    if onnx:
        with tempfile.TemporaryDirectory() as tmp:
            runners = {}
            for variant, graph_def in (("original", original), ("optimized", optimized)):
                path = Path(tmp) / f"{variant}.onnx"
                onnx_export.export(graph_def, inputs, outputs, path, feeds=feeds)
                runners[variant] = ort_runner(path, feeds)
            rows += summarise("onnxruntime", interleaved(runners, runs))
    return rows
