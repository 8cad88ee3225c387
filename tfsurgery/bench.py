"""``bench``: latency of the original and the optimized graph, and of the float result
against its int8-weight twin, each runtime in its own process (latency.py, int8_bench.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from tfsurgery import int8_bench, latency, progress, verify as verify_mod
from tfsurgery.errors import InputError, Unverified
from tfsurgery.result import (Result, check_batches, feeds_for_checks, int8_min_elements,
                              require_verified)
from tfsurgery.source import Source, signature_for


def check_runs(runs: int) -> None:
    """``bench``'s run count: the one check (the CLI calls it before minutes of work)."""
    if runs < 1:
        raise InputError(f"--runs must be at least 1, not {runs}")


def bench(source: Source, result: Result, *, runs: int = 50, onnx: bool = True) -> list:
    """Latency of the original and the optimized graph, in TensorFlow and onnxruntime."""
    check_runs(runs)
    feeds = feeds_for_checks(result)
    return latency.bench(result.original, result.graph_def, result.inputs, result.outputs,
                         result.original_extra_feeds, feeds=feeds, runs=runs, onnx=onnx,
                         original_feeds=(result.preprocess.model_feeds(feeds)
                                         if result.preprocess else None))


def bench_int8(source: Source, result: Result, int8: Result, *, runs: int = 50,
               onnx: bool = True, tflite: bool = True) -> List[int8_bench.Side]:
    """The float result and its int8-weight twin (``weights="int8"``, both verified) side by
    side in TensorFlow, onnxruntime and TFLite: sizes, latency (each runtime in its own
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
    runtimes = [r for r, wanted in zip(int8_bench.RUNTIMES, (True, onnx, tflite)) if wanted]
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
