"""Before/after latency in TensorFlow and onnxruntime: interleaved runs, median and spread.

Each runtime is measured in a process of its own (``python -m tfsurgery.bench.latency``), so neither
runtime's thread pool spins while the other is timed; the thread counts each used are reported.
Within a process, interleaving (original, optimized, original, ...) makes both variants share
whatever else the machine is doing, so their ratio is fair even when absolute times wobble.
onnxruntime is the exception: each session is timed in a process of its own, as a plain
``InferenceSession`` would run (its intra-op threads spin when idle; two sessions in one process
took a BERT-style model 2.4-4x longer than a plain session, each slowing the other).
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.trust import outside
from tfsurgery.errors import VerificationError
from tfsurgery.ops import first_line, tensor_name

VARIANTS = ("original", "optimized")


@dataclasses.dataclass
class Timing:
    runtime: str
    variant: str
    median_ms: float
    spread_ms: float          # interquartile range
    threads: int = 0          # intra-op threads the runtime used
    skipped: str = ""         # why this variant was not timed (median/spread then None)
    pid: int = 0              # the timing process (each runtime's, or each session's: ONNX)
    batch: int = 0            # rows fed per call (the first input's leading dimension)
    spinning: Optional[bool] = None     # onnxruntime: its idle intra-op threads spin
    runs_ms: Optional[List[float]] = None   # each run's time in run order, where asked for

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if self.runs_ms is None:
            del data["runs_ms"]
        return data


def interleaved(runners: Dict[str, Callable[[], object]], runs: int, warmup: int = 3,
                alternate: bool = False) -> Dict[str, List[float]]:
    """Seconds per call for each runner, the runners taking turns; ``alternate``: every other
    round in reverse order (A B, B A, A B, ...), so that no runner always follows the same
    one (a cache warmed or a clock raised by its neighbour)."""
    for run in runners.values():
        for _ in range(warmup):
            run()
    times: Dict[str, List[float]] = {name: [] for name in runners}
    order = list(runners.items())
    for round_ in range(runs):
        for name, run in (order[::-1] if alternate and round_ % 2 else order):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def summarise(runtime: str, times: Dict[str, List[float]], threads: int,
              keep_runs: bool = False, **how) -> List[Timing]:
    """Median and interquartile range per variant (``keep_runs``: and each run's time);
    ``how``: Timing's other fields (pid, batch, spinning), each a value or a dict by variant."""
    rows = []
    for variant, seconds in times.items():
        in_order = [1000 * s for s in seconds]
        ms = sorted(in_order)
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0], ms[0], ms[0]]
        rows.append(Timing(runtime, variant, statistics.median(ms), q[2] - q[0], threads,
                           runs_ms=in_order if keep_runs else None,
                           **{k: v.get(variant) if isinstance(v, dict) else v
                              for k, v in how.items()}))
    return rows


def threads() -> int:
    return os.cpu_count() or 1


def tf_runner(graph_def, feeds: Dict[str, np.ndarray], outputs: Sequence[str]):
    import tensorflow as tf
    from tfsurgery.cpu_layout import runnable
    outside.refuse(graph_def, outputs, list(feeds), where="the graph to time")
    graph_def = runnable(graph_def)           # NCHW ops on a CPU without oneDNN: as verified
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads(),
                                      inter_op_parallelism_threads=1)
    session = tf.compat.v1.Session(graph=graph, config=config)
    fetches = [graph.get_tensor_by_name(tensor_name(o)) for o in outputs]
    present = {n.name for n in graph_def.node}
    feed = {graph.get_tensor_by_name(tensor_name(k)): v for k, v in feeds.items()
            if k.split(":")[0] in present}
    return lambda: session.run(fetches, feed)


def ort_runner(model_path: Path, feeds: Dict[str, np.ndarray], spinning: bool = True):
    """``spinning=False``: the session's intra-op threads sleep when idle instead of spinning
    (for several sessions timed in one process: an idle one's spinning threads slow the one
    being timed)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {tensor_name(k): v for k, v in feeds.items()}
    feed = {k: v for k, v in feed.items() if k in names}
    return lambda: session.run(None, feed)


def measure_variants(runtime: str, work: Path, runs: int, timeout: float) -> List[Timing]:
    """Both variants of ``work`` in one runtime, in a process of its own."""
    variants = VARIANTS if runtime == "tensorflow" else \
        json.loads((work / "onnx_variants.json").read_text())
    suffix = ".pb" if runtime == "tensorflow" else ".onnx"
    return measure_each(
        runtime, {v: (work / f"{v}{suffix}", work / f"{v}.npz") for v in variants},
        json.loads((work / "outputs.json").read_text()), runs=runs, work=work,
        timeout=timeout)


# Runtimes whose every model is timed in a process of its own: each onnxruntime session and
# each compiled OpenVINO model keeps its own threads, which slow the one being timed.
ONE_PROCESS_PER_MODEL = ("onnxruntime", "openvino")


def measure_each(runtime: str, variants: Dict[str, tuple], outputs: Sequence[str], *,
                 runs: int, work: Path, timeout: float = 600,
                 precisions: Optional[Dict[str, Optional[str]]] = None) -> List[Timing]:
    """``measure_in_subprocess`` as a plain session of ``runtime`` runs: onnxruntime and
    OpenVINO one process per variant (one after the other), the others all variants
    interleaved in one process."""
    groups = [{name: spec} for name, spec in variants.items()] \
        if runtime in ONE_PROCESS_PER_MODEL else [variants]
    return [timing for group in groups
            for timing in measure_in_subprocess(runtime, group, outputs, runs=runs, work=work,
                                                timeout=timeout, precisions=precisions)]


def measure_in_subprocess(runtime: str, variants: Dict[str, tuple], outputs: Sequence[str], *,
                          runs: int, work: Path, timeout: float = 600,
                          precisions: Optional[Dict[str, Optional[str]]] = None,
                          ort_spinning: bool = True, alternate: bool = False,
                          keep_runs: bool = False) -> List[Timing]:
    """The one timing worker (``tfsurgery bench`` and the benchmarks alike): each variant's model
    (a .pb, .onnx, .tflite path or an OpenVINO IR directory) fed its own .npz, run interleaved
    ``runs`` times in a fresh process for ``runtime`` ("tensorflow", "onnxruntime", "tflite" or
    "openvino"); the timings come back as JSON. ``precisions``: OpenVINO's inference precision
    per variant (None: OpenVINO's own default). ``ort_spinning``: see :func:`ort_runner`;
    ``alternate``: see :func:`interleaved`; ``keep_runs``: each run's time comes back too."""
    plan = work / f"plan_{runtime}.json"
    plan.write_text(json.dumps({"runtime": runtime, "runs": runs, "outputs": list(outputs),
                                "variants": {name: [str(model), str(feeds)]
                                             for name, (model, feeds) in variants.items()},
                                "precisions": precisions or {},
                                "ort_spinning": ort_spinning, "alternate": alternate,
                                "keep_runs": keep_runs,
                                # the ops acting outside the graph the user allowed (--allow-op)
                                "allowed_ops": sorted(outside.allowed())}))
    command = [sys.executable, "-m", "tfsurgery.bench.latency", str(plan)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        raise VerificationError(f"the {runtime} timing did not finish within {timeout:g} s") \
            from None
    if done.returncode != 0:
        raise VerificationError(f"the {runtime} timing failed: {first_line(done.stderr)}")
    return [Timing(**row) for row in json.loads(done.stdout.strip().splitlines()[-1])]


def tflite_runner(model_path: Path, feeds: Dict[str, np.ndarray]):
    from tfsurgery.export.tflite import interpreter_class
    interpreter = interpreter_class()[0](model_path=str(model_path), num_threads=threads())
    runner = interpreter.get_signature_runner()
    wanted = set(runner.get_input_details())
    feed = {k.split(":")[0]: v for k, v in feeds.items() if k.split(":")[0] in wanted}
    return lambda: runner(**feed)


def openvino_runner(directory: Path, feeds: Dict[str, np.ndarray], outputs: Sequence[str],
                    precision: Optional[str]):
    """The IR compiled for the CPU (latency hint; ``precision`` None: OpenVINO's default)."""
    from tfsurgery.export import openvino as openvino_export
    compiled = openvino_export.compile_ir(directory / openvino_export.XML, precision,
                                          threads=threads())
    return openvino_export.runner(compiled, feeds, outputs)


def _runner(runtime: str, model: Path, feeds: Dict[str, np.ndarray], outputs: Sequence[str],
            precision: Optional[str] = None, ort_spinning: bool = True):
    if runtime == "openvino":
        return openvino_runner(model, feeds, outputs, precision)
    if runtime == "tensorflow":
        import tensorflow as tf
        return tf_runner(tf.compat.v1.GraphDef.FromString(model.read_bytes()), feeds, outputs)
    if runtime == "onnxruntime":
        return ort_runner(model, feeds, ort_spinning)
    return tflite_runner(model, feeds)


def _worker(plan_path: Path) -> List[Timing]:
    plan = json.loads(plan_path.read_text())
    precisions = plan.get("precisions", {})
    spinning = plan.get("ort_spinning", True)
    fed = {name: dict(np.load(feeds)) for name, (_, feeds) in plan["variants"].items()}
    with outside.allowing(plan.get("allowed_ops", ())):
        runners = {name: _runner(plan["runtime"], Path(model), fed[name], plan["outputs"],
                                 precisions.get(name), spinning)
                   for name, (model, _) in plan["variants"].items()}
    times = interleaved(runners, plan["runs"], alternate=plan.get("alternate", False))
    return summarise(plan["runtime"], times, threads(), keep_runs=plan.get("keep_runs", False),
                     pid=os.getpid(), batch={name: rows_of(f) for name, f in fed.items()},
                     spinning=spinning if plan["runtime"] == "onnxruntime" else None)


def rows_of(feeds: Dict[str, np.ndarray]) -> int:
    """The rows of a feed: the leading dimension of its first batched array."""
    return next((int(v.shape[0]) for v in feeds.values() if np.ndim(v) > 0), 1)


if __name__ == "__main__":
    rows = _worker(Path(sys.argv[1]))
    print(json.dumps([row.as_dict() for row in rows]))
