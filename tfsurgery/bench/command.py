"""``bench``: the model in every installed runtime, each artefact checked, the fastest checked one
named (runtime_bench.py); latency of the original and the optimized graph, and of the float
result against its int8-weight twin, each runtime in its own process (latency.py,
int8_bench.py)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery import io, progress
from tfsurgery.int8 import bench as int8_bench
from tfsurgery.bench import latency
from tfsurgery.export import openvino as openvino_export
from tfsurgery.bench import runtimes as runtime_bench
from tfsurgery.verify import check as verify_mod
from tfsurgery.errors import InputError, Unverified
from tfsurgery.result import (Result, check_batches, feeds_for_checks, int8_min_elements,
                              require_verified)
from tfsurgery.source import Source, signature_for
from tfsurgery.trust.outside import with_allowed_ops


def check_runs(runs: int) -> None:
    """``bench``'s run count: the one check (the CLI calls it before minutes of work)."""
    if runs < 1:
        raise InputError(f"--runs must be at least 1, not {runs}")


@with_allowed_ops
def bench(source: Source, result: Result, *, runs: int = 50, onnx: bool = True) -> list:
    """Latency of the original and the optimized graph, in TensorFlow and onnxruntime."""
    check_runs(runs)
    feeds = feeds_for_checks(result)
    return before_after(result.original, result.graph_def, result.inputs, result.outputs,
                        result.original_extra_feeds, feeds=feeds, runs=runs, onnx=onnx,
                        original_feeds=(result.preprocess.model_feeds(feeds)
                                        if result.preprocess else None))


def before_after(original, optimized, inputs: Sequence[str], outputs: Sequence[str],
          settings: Dict[str, object] = None, *, feeds: Dict[str, np.ndarray], runs: int = 50,
          onnx: bool = True, timeout: float = 600,
          original_feeds: Optional[Dict[str, np.ndarray]] = None) -> List[latency.Timing]:
    """Latency of the original and optimized graph, in TF and (optionally) onnxruntime, each
    runtime in its own process. ``settings`` are fed to the original only (training flags);
    ``original_feeds`` replace ``feeds`` for the original (preprocessing in the optimized graph:
    the original takes the preprocessed values)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for variant, graph_def in zip(latency.VARIANTS, (original, optimized)):
            (work / f"{variant}.pb").write_bytes(graph_def.SerializeToString())
        extra = {k: np.asarray(v) for k, v in (settings or {}).items()}
        given = {"original": {**(feeds if original_feeds is None else original_feeds), **extra},
                 "optimized": feeds}
        for variant in latency.VARIANTS:
            np.savez(work / f"{variant}.npz", **given[variant])
        (work / "outputs.json").write_text(json.dumps(list(outputs)))
        rows = latency.measure_variants("tensorflow", work, runs, timeout)
        if onnx:
            rows += _onnxruntime_rows(original, optimized, inputs, outputs, given, work, runs,
                                      timeout)
    return rows


def _onnxruntime_rows(original, optimized, inputs, outputs, given, work: Path, runs: int,
                      timeout: float) -> List[latency.Timing]:
    """Both variants in onnxruntime. An original tf2onnx cannot convert (a TF1 training cond
    whose Merge it leaves, say) is reported as not timed; the optimized one must convert."""
    from tfsurgery.export import onnx as onnx_export
    from tfsurgery.errors import ExportError
    skipped = []
    for variant, graph_def in zip(latency.VARIANTS, (original, optimized)):
        try:
            onnx_export.export(graph_def, inputs, outputs, work / f"{variant}.onnx",
                               feeds=given[variant])
        except ExportError as error:
            if variant != "original":
                raise
            skipped.append(latency.Timing("onnxruntime", variant, None, None, latency.threads(),
                                  str(error)))
    (work / "onnx_variants.json").write_text(json.dumps(
        [v for v in latency.VARIANTS if v not in {t.variant for t in skipped}]))
    return skipped + latency.measure_variants("onnxruntime", work, runs, timeout)


RUNTIMES = runtime_bench.RUNTIMES


def check_runtimes(names: Optional[Sequence[str]] = None) -> List[str]:
    """The runtimes to time: those named (each known; OpenVINO installed, else one line saying
    how to get it), or None: all — those not installed are then listed as missing."""
    if not names:
        return list(RUNTIMES)
    unknown = [n for n in names if n not in RUNTIMES]
    if unknown:
        raise InputError(f"--runtimes {','.join(unknown)}: choose from {', '.join(RUNTIMES)}")
    if "openvino" in names:
        openvino_export.require()
    return list(dict.fromkeys(names))


def check_plot(path) -> None:
    """``--plot``: an .svg path that can be written (before minutes of work)."""
    if path is None:
        return
    if Path(path).suffix.lower() != ".svg":
        raise InputError(f"{path}: --plot writes an SVG picture: give a path ending in .svg")
    io.check_writable(Path(path))


@with_allowed_ops
def bench_runtimes(source: Source, result: Result, *, runs: int = 50,
                   runtimes: Optional[Sequence[str]] = None,
                   work: Optional[Path] = None) -> runtime_bench.Bench:
    """The optimized model in every installed runtime (or ``runtimes``): TensorFlow and
    onnxruntime time the original too; TFLite and OpenVINO (f32, and its own default precision
    where that differs) the optimized one. Each artefact is checked at its own tolerance (the
    .pb by the run's verification) before it is timed, each runtime in its own process;
    ``Bench.fastest()`` is the fastest whose check passed. An optimized graph onnxruntime
    cannot take raises ``ExportError``; another runtime's failure is a row saying why.
    ``work``: an existing folder to write the timed artefacts and their feeds in, and leave
    them there (default: a temporary one, removed)."""
    check_runs(runs)
    wanted = check_runtimes(runtimes)
    require_verified(result)
    v = result.verification
    feeds = feeds_for_checks(result)
    progress.say(f"benchmarking in {', '.join(wanted)}: each artefact checked, then timed")
    with tempfile.TemporaryDirectory() as temporary:
        return runtime_bench.bench(
            result.original, result.graph_def, result.inputs, result.outputs,
            signature_for(source, result), feeds=feeds,
            verification=runtime_bench.Check(v.passed, v.max_error, v.allowed, "verification"),
            tolerance=result.tolerance, settings=result.original_extra_feeds,
            original_feeds=result.preprocess.model_feeds(feeds) if result.preprocess else None,
            runs=runs, runtimes=wanted, work=Path(work or temporary), timeout=result.timeout)


def write_bench_plot(bench_result: runtime_bench.Bench, path, *, input_path=None) -> Path:
    """The bench as a bar chart (SVG), written atomically."""
    path = Path(path)
    io.refuse_input(path, input_path)
    io.write_atomically(path, runtime_bench.svg(bench_result).encode())
    return path


@with_allowed_ops
def bench_int8(source: Source, result: Result, int8: Result, *, runs: int = 50,
               onnx: bool = True, tflite: bool = True) -> List[int8_bench.Side]:
    """The float result and its int8-weight twin (``weights="int8"``, both verified) side by
    side in TensorFlow, onnxruntime and TFLite (and, where installed, the float OpenVINO IR
    against its NNCF int8 twin): sizes, latency (each runtime in its own
    process), and the int8 model's error against the float one in the same runtime. The float
    result must have passed its check; the int8 one must have been checked — a miss is timed
    too (nothing is written) and the caller says so."""
    import tempfile
    check_runs(runs)
    if int8.weights != "int8":
        raise InputError("bench_int8 compares with a result optimized with weights='int8'")
    require_verified(result)
    if int8.verification is None:          # measured, passed or not: bench writes nothing
        raise Unverified("bench_int8 needs the int8 result's check: optimize it with verify=True")
    runtimes = [r for r, wanted in zip(int8_bench.RUNTIMES,
                                       (True, onnx, tflite, openvino_export.installed()))
                if wanted]
    progress.say(f"benchmarking float against int8 weights in {', '.join(runtimes)}")
    with tempfile.TemporaryDirectory() as work:
        return int8_bench.bench({"float": result.graph_def, "int8": int8.graph_def},
                                result.inputs, result.outputs, signature_for(source, result),
                                feeds=feeds_for_checks(result),
                                tolerances={"float": result.tolerance, "int8": int8.tolerance},
                                int8_min_elements=int8_min_elements(int8), work=Path(work),
                                runs=runs, runtimes=runtimes, timeout=result.timeout,
                                compare_on=_sample_feeds(result))


def _sample_feeds(result: Result) -> List[Dict[str, object]]:
    """Every batch of the user's samples as full feeds (the rest seeded random, as verification
    made them); none without --samples."""
    if result.samples is None:
        return []
    return [verify_mod.make_feeds(result.graph_def, result.inputs, seed, given=given)
            for _, given, seed in check_batches(result, result.given, 0)]
