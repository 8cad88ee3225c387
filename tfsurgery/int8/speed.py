"""Is the int8 ONNX faster than the float one here? (``--int8-min-speedup``)

Int8 is worth its accuracy risk only when it runs faster, and whether it does depends on the CPU
and on how onnxruntime fuses the quantized graph (docs/int8.md). So every int8 ONNX is timed
against its float ONNX on this machine before it is written: both in one fresh onnxruntime
process (``latency.measure_in_subprocess``), runs interleaved on the same feeds, medians
compared, with the sessions' intra-op threads not spinning when idle: each onnxruntime session
keeps its own threads, and with spinning on, the idle session's threads slow the one being
timed — byte-identical ResNet50 int8 files timed 62 and 81 ms in one process, 23 and 23 ms with
spinning off. (One process per model avoids that too, but then the machine's load drifts
between the two: on this shared 2-core machine that spread the ratio of two identical models
over 0.8–3×.) Below ``--int8-min-speedup`` (default 1.0: int8 not faster than float) it is
refused and nothing is written; ``--int8-min-speedup 0`` writes it for its size, said in one
loud line.
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Dict, Mapping, Optional

import numpy as np

from tfsurgery.int8 import target as int8_target
from tfsurgery.bench import latency
from tfsurgery.errors import ExportError, VerificationError
from tfsurgery.int8.options import MIN_SPEEDUP, check_min_speedup  # noqa: F401

RUNS = 20                 # interleaved runs per model: enough for a median, seconds not minutes
TIMEOUT = 600.0


@dataclasses.dataclass
class Speed:
    """float and int8 medians (ms) on this machine, and what they were measured with."""
    float_ms: float
    int8_ms: float
    float_spread_ms: float    # interquartile ranges
    int8_spread_ms: float
    runs: int
    threads: int
    cpu: str
    min_speedup: Optional[float] = None

    @property
    def speedup(self) -> float:
        return self.float_ms / self.int8_ms if self.int8_ms > 0 else float("inf")

    @property
    def faster(self) -> bool:
        return self.speedup > 1

    @property
    def passed(self) -> bool:
        return self.min_speedup is None or self.speedup >= self.min_speedup

    def line(self) -> str:
        """What the run reports: the speed-up, loudly when int8 is not faster."""
        timed = (f"float {self.float_ms:.3g} ms, int8 {self.int8_ms:.3g} ms (medians of "
                 f"{self.runs} interleaved runs, {self.threads} threads, {self.cpu})")
        if not self.faster:
            why = (" — written for its size only (--int8-min-speedup 0)"
                   if self.min_speedup == 0 else "")
            return (f"WARNING: int8 is NOT faster than float on this machine: "
                    f"{self.speedup:.2f}×{why} — {timed}")
        return f"int8 speed-up {self.speedup:.2f}× over float ONNX: {timed}"

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), speedup=self.speedup, faster=self.faster,
                    passed=self.passed)


class Int8TooSlow(ExportError):
    """The int8 model is slower than ``--int8-min-speedup`` asks: refused, nothing written.
    ``modes``: every mode tried, in one line, when there were several."""

    def __init__(self, speed: Speed, modes: str = ""):
        super().__init__(f"int8 runs {speed.speedup:.2f}× float on this machine, below "
                         f"--int8-min-speedup {speed.min_speedup:g} (float "
                         f"{speed.float_ms:.3g} ms, int8 {speed.int8_ms:.3g} ms; "
                         "--int8-min-speedup 0 writes int8 for its size)"
                         + (f"; modes tried: {modes}" if modes else ""))
        self.speed = speed
        self.report = None          # the int8 report, when the caller has one


def measure(float_model: Path, int8_model: Path, feeds: Mapping[str, np.ndarray], *,
            runs: int = RUNS, min_speedup: Optional[float] = None,
            timeout: float = TIMEOUT) -> Speed:
    """Both ONNX models timed in one onnxruntime process on ``feeds`` (keyed by TF tensor
    names, as the checks feed them). Raises ``ExportError`` when the timing fails."""
    models = {"float": Path(float_model), "int8": Path(int8_model)}
    with tempfile.TemporaryDirectory(prefix="int8-speed.") as scratch:
        try:
            timing = time_together(models, feeds, Path(scratch), runs=runs, timeout=timeout)
        except VerificationError as error:
            raise ExportError(f"cannot time int8 against float: {error}") from None
    return Speed(timing["float"].median_ms, timing["int8"].median_ms,
                 timing["float"].spread_ms, timing["int8"].spread_ms, runs,
                 timing["int8"].threads, int8_target.cpu_name(), min_speedup)


def against_float(float_model: Path, models: Dict[str, Path],
                  feeds: Mapping[str, np.ndarray], *, runs: int = RUNS,
                  timeout: float = TIMEOUT) -> Dict[str, Speed]:
    """Each of ``models`` (int8 ONNX files by mode) against ``float_model``, all timed in one
    onnxruntime process, interleaved (:func:`time_together`). Raises ``ExportError``."""
    if "float" in models:
        raise ValueError("'float' names the float model")
    with tempfile.TemporaryDirectory(prefix="int8-speed.") as scratch:
        try:
            timing = time_together({"float": Path(float_model), **{
                name: Path(model) for name, model in models.items()}}, feeds, Path(scratch),
                runs=runs, timeout=timeout)
        except VerificationError as error:
            raise ExportError(f"cannot time int8 against float: {error}") from None
    cpu, base = int8_target.cpu_name(), timing["float"]
    return {name: Speed(base.median_ms, timing[name].median_ms, base.spread_ms,
                        timing[name].spread_ms, runs, timing[name].threads, cpu)
            for name in models}


def time_together(models: Dict[str, Path], feeds: Mapping[str, np.ndarray], work: Path, *,
                  runs: int = RUNS, timeout: float = TIMEOUT) -> Dict[str, latency.Timing]:
    """Each model's timing in onnxruntime: all in one fresh process, runs interleaved in the
    order given, intra-op threads not spinning when idle. Raises ``VerificationError`` when the
    timing fails."""
    np.savez(work / "feeds.npz", **{k: np.asarray(v) for k, v in feeds.items()})
    rows = latency.measure_in_subprocess(
        "onnxruntime", {name: (model, work / "feeds.npz") for name, model in models.items()},
        [], runs=runs, work=work, timeout=timeout, ort_spinning=False)
    return {row.variant: row for row in rows}


def require(speed: Speed) -> Speed:
    """``speed``, or ``Int8TooSlow`` when it misses its ``min_speedup``."""
    if not speed.passed:
        raise Int8TooSlow(speed)
    return speed
