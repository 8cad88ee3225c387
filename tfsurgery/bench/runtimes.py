"""``tfsurgery bench``: the model in every runtime that is installed, side by side, each checked.

TensorFlow times the original and the optimized graph; onnxruntime both too (the original where
tf2onnx converts it: the peer, checked like ours); the TFLite interpreter the optimized model;
OpenVINO its IR at f32 and at OpenVINO's own default precision (bf16 on CPUs with native bf16)
when that differs. Every
deployment artefact is written and checked as an export is (ONNX, TFLite and OpenVINO against
the optimized graph in TensorFlow, each at its own tolerance; the optimized .pb by the run's
verification); each runtime is timed in a process of its own (``latency.measure_in_subprocess``:
interleaved runs, median and interquartile range) — onnxruntime and OpenVINO each model in its
own, as a plain session runs it. ``Bench.fastest`` names the fastest artefact
whose check passed — a faster one that missed its check is shown, never chosen. The CPU's name
and instruction-set flags say which machine the numbers belong to.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from tfsurgery.export import artefacts
from tfsurgery.int8 import target as int8_target
from tfsurgery.bench import latency
from tfsurgery.export import onnx as onnx_export
from tfsurgery.export import openvino as openvino_export
from tfsurgery.export import tflite as tflite_export
from tfsurgery.verify import check as verify
from tfsurgery.errors import ExportError, VerificationError
from tfsurgery.ops import first_line

RUNTIMES = ("tensorflow", "onnxruntime", "tflite", "openvino")
# Instruction sets that decide which kernels the runtimes pick (int8 dot products, bf16, fp16).
CPU_FLAGS = int8_target.CPU_FLAGS


@dataclasses.dataclass
class Check:
    """How an artefact was checked: passed, its max error and tolerance, and by what."""
    passed: bool
    max_error: float
    tolerance: float
    by: str

    def line(self) -> str:
        verdict = "passed" if self.passed else "MISSED"
        return f"{verdict} {self.max_error:.2g} ≤ {self.tolerance:g}" if self.passed else \
            f"{verdict} {self.max_error:.2g} > {self.tolerance:g}"

    def as_dict(self) -> dict:
        return {"passed": self.passed, "max_error": float(self.max_error),
                "tolerance": float(self.tolerance), "by": self.by}


@dataclasses.dataclass
class Entry:
    """One model in one runtime: what it is, its check (None: the original in TensorFlow, the
    reference itself), its timing (None with ``skipped``: why it was not timed)."""
    runtime: str
    model: str                 # "original" or "optimized"
    precision: str             # "float32", or OpenVINO's inference precision
    check: Optional[Check] = None
    timing: Optional[latency.Timing] = None
    skipped: str = ""

    @property
    def variant(self) -> str:
        """The timing's name: "original", "optimized", or "optimized bf16" (OpenVINO)."""
        return self.model if self.precision == "float32" else \
            f"{self.model} {self.precision.split()[0]}"

    @property
    def label(self) -> str:
        return f"{self.runtime} {self.model} {self.precision}"

    @property
    def checked(self) -> bool:
        """The reference itself, or an artefact whose check passed."""
        return self.check is None or self.check.passed

    def as_dict(self) -> dict:
        return {"runtime": self.runtime, "model": self.model, "precision": self.precision,
                "check": self.check.as_dict() if self.check else None,
                "checked": self.checked, "skipped": self.skipped,
                "timing": self.timing.as_dict() if self.timing else None}


@dataclasses.dataclass
class Bench:
    entries: List[Entry]
    cpu: Dict[str, object]
    runs: int
    missing: List[str] = dataclasses.field(default_factory=list)   # runtimes not installed

    def fastest(self) -> Optional[Entry]:
        """The fastest timed entry whose check passed (or the original, the reference)."""
        timed = [e for e in self.entries if e.timing and e.timing.median_ms and e.checked]
        return min(timed, key=lambda e: e.timing.median_ms, default=None)

    def timings(self) -> List[latency.Timing]:
        return [e.timing for e in self.entries if e.timing]

    def as_dict(self) -> dict:
        fastest = self.fastest()
        return {"runs": self.runs, "cpu": self.cpu, "missing": self.missing,
                "entries": [e.as_dict() for e in self.entries],
                "fastest": fastest.as_dict() if fastest else None}


def installed(runtime: str) -> bool:
    """TensorFlow, onnxruntime and TFLite come with tfsurgery (TFLite: LiteRT, else TensorFlow's
    own interpreter); OpenVINO is an optional extra."""
    return runtime != "openvino" or openvino_export.installed()


def cpu() -> Dict[str, object]:
    """The CPU's name and the instruction-set flags that matter to the runtimes' kernels."""
    name, flags = int8_target.cpu_features()
    return {"name": name, "flags": flags}


def bench(original, optimized, inputs: Sequence[str], outputs: Sequence[str],
          signature, *, feeds: Mapping[str, np.ndarray], verification: Check,
          tolerance: float, settings: Optional[Mapping[str, object]] = None,
          original_feeds: Optional[Mapping[str, np.ndarray]] = None, runs: int = 50,
          runtimes: Sequence[str] = RUNTIMES, work: Path,
          timeout: float = verify.DEFAULT_TIMEOUT) -> Bench:
    """Every installed runtime in ``runtimes``: the artefacts written under ``work``, checked,
    and timed. ``verification``: the optimized graph's own check; ``tolerance``: the run's (the
    ONNX and TFLite checks'; OpenVINO's are its precisions' own, or this if looser).
    ``settings`` (training flags) are fed to the original only; ``original_feeds`` replace
    ``feeds`` for it (preprocessing in the optimized graph). An optimized graph onnxruntime
    cannot take raises ``ExportError``; another runtime's failure is a row saying why."""
    missing = [r for r in runtimes if not installed(r)]
    wanted = [r for r in runtimes if r not in missing]
    extra = {k: np.asarray(v) for k, v in (settings or {}).items()}
    given = {"original": {**(feeds if original_feeds is None else original_feeds), **extra},
             "optimized": dict(feeds)}
    for model, values in given.items():
        np.savez(work / f"{model}.npz", **{k: np.asarray(v) for k, v in values.items()})
    entries: List[Entry] = []
    for runtime in wanted:
        models = WRITERS[runtime](original, optimized, inputs, outputs, signature, given,
                                  verification, tolerance, work, timeout)
        entries += _timed(runtime, models, outputs, runs, work, timeout)
    return Bench(entries, cpu(), runs, missing)


# Each writer: [(Entry, model path or None, feeds .npz)] for one runtime.
def _tensorflow(original, optimized, inputs, outputs, signature, given, verification,
                tolerance, work, timeout):
    for name, graph_def in (("original", original), ("optimized", optimized)):
        (work / f"{name}.pb").write_bytes(graph_def.SerializeToString())
    return [(Entry("tensorflow", "original", "float32"), work / "original.pb",
             work / "original.npz"),
            (Entry("tensorflow", "optimized", "float32", verification), work / "optimized.pb",
             work / "optimized.npz")]


def _onnxruntime(original, optimized, inputs, outputs, signature, given, verification,
                 tolerance, work, timeout):
    """Both graphs through tf2onnx, each checked against itself in TensorFlow: the original
    (tf2onnx alone, the peer) only if it converts — a TF1 training cond may not —, the
    optimized one (an optimized graph onnxruntime cannot take raises ``ExportError``)."""
    models = []
    for name, graph_def in (("original", original), ("optimized", optimized)):
        path = work / f"{name}.onnx"
        try:
            exported = onnx_export.export(graph_def, inputs, outputs, path, feeds=given[name],
                                          tolerance=tolerance, timeout=timeout)
        except ExportError as error:
            if name == "optimized":
                raise
            models.append((Entry("onnxruntime", name, "float32", skipped=str(error)), None,
                           None))
            continue
        check = Check(exported.passed, exported.max_error, exported.tolerance, "onnxruntime")
        models.append((Entry("onnxruntime", name, "float32", check),
                       path if exported.passed else None, work / f"{name}.npz"))
    return models


def _tflite(original, optimized, inputs, outputs, signature, given, verification, tolerance,
            work, timeout):
    path = work / "optimized.tflite"
    try:
        done = tflite_export.export(optimized, signature, path, feeds=given["optimized"],
                                    tolerance=tolerance, timeout=timeout)
    except ExportError as error:
        return [(Entry("tflite", "optimized", "float32", skipped=str(error)), None, None)]
    npz = work / "optimized_signature.npz"
    np.savez(npz, **artefacts.feeds_by_key(given["optimized"], signature.inputs))
    return [(Entry("tflite", "optimized", "float32",
                   Check(done.passed, done.max_error, done.tolerance, done.checked_by)),
             path if done.passed else None, npz)]


def _openvino(original, optimized, inputs, outputs, signature, given, verification, tolerance,
              work, timeout):
    """The IR checked at f32, and at OpenVINO's default precision where that differs (the same
    IR: precision is chosen when it is compiled) at that precision's tolerance."""
    directory = work / "optimized_openvino"
    try:
        done = openvino_export.export(optimized, inputs, outputs, directory,
                                      feeds=given["optimized"], precision="f32",
                                      tolerance=openvino_export.tolerance_for("f32", tolerance),
                                      timeout=timeout)
    except ExportError as error:
        return [(Entry("openvino", "optimized", "f32", skipped=str(error)), None, None)]
    models = [(Entry("openvino", "optimized", "f32",
                     Check(done.passed, done.max_error, done.tolerance, done.checked_by)),
               directory if done.passed else None, work / "optimized.npz")]
    default = openvino_export.default_precision()
    if default != "f32" and done.passed:
        expected = openvino_export.reference(optimized, outputs, given["optimized"], timeout)
        at_default = openvino_export.check(directory, outputs, given["optimized"], expected,
                                           precision=default, timeout=timeout,
                                           tolerance=openvino_export.tolerance_for(default,
                                                                                   tolerance))
        models.append((Entry("openvino", "optimized", f"{default} (OpenVINO's default)",
                             Check(at_default.passed, at_default.max_error,
                                   at_default.tolerance, at_default.checked_by)),
                       directory, work / "optimized.npz"))
    return models


WRITERS = {"tensorflow": _tensorflow, "onnxruntime": _onnxruntime, "tflite": _tflite,
           "openvino": _openvino}


def _timed(runtime: str, models, outputs, runs: int, work: Path, timeout: float) -> List[Entry]:
    """Every model of one runtime that could be written, timed in one process of its own —
    onnxruntime's and OpenVINO's, one process per model: each session (compiled model) keeps
    its own CPU threads, and two in one process disturb each other (the demo in OpenVINO: 0.08
    → 0.22 ms per call; a BERT-style model in onnxruntime: 2.4-4x a plain session)."""
    variants = {entry.variant: (path, npz) for entry, path, npz in models if path is not None}
    groups = [{name: spec} for name, spec in variants.items()] \
        if runtime in latency.ONE_PROCESS_PER_MODEL else [variants] if variants else []
    precisions = {entry.variant: entry.precision.split(" ")[0] for entry, _, _ in models} \
        if runtime == "openvino" else None
    timings = {}
    for group in groups:
        try:
            rows = latency.measure_in_subprocess(runtime, group, list(outputs), runs=runs,
                                                 work=work, timeout=max(timeout, 600),
                                                 precisions=precisions)
            timings.update({row.variant: row for row in rows})
        except VerificationError as error:     # the worker failed: say so on its rows
            for entry, _, _ in models:
                if entry.variant in group:
                    entry.skipped = entry.skipped or first_line(error)
    entries = []
    for entry, path, _ in models:
        entry.timing = timings.get(entry.variant)
        if entry.timing is None and not entry.skipped:
            entry.skipped = f"its check missed ({entry.check.line()})" if entry.check else \
                "not written"
        entries.append(entry)
    return entries


# ---------------------------------------------------------------- the picture
def svg(result: Bench) -> str:
    """A horizontal bar chart of the timed entries (median, with the interquartile range as a
    whisker), the fastest checked one marked, a missed check greyed. Hand-written SVG: matplotlib
    is not a dependency (docs/openvino.md says why), and a bar chart is a few rectangles."""
    timed = [e for e in result.entries if e.timing and e.timing.median_ms]
    fastest = result.fastest()
    width, left, bar, gap, top = 760, 300, 18, 8, 48
    scale = (width - left - 90) / max((e.timing.median_ms + e.timing.spread_ms / 2
                                       for e in timed), default=1.0)
    height = top + len(timed) * (bar + gap) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<text x="10" y="18" font-size="14">{_escape(_title(result))}</text>',
             '<text x="10" y="36" fill="#555">median ms per call (bar), interquartile range '
             '(whisker); grey: its check missed</text>']
    for i, entry in enumerate(timed):
        y = top + i * (bar + gap)
        t = entry.timing
        colour = "#2e7d32" if entry is fastest else "#5b8fd6" if entry.checked else "#bbbbbb"
        low = left + scale * max(t.median_ms - t.spread_ms / 2, 0.0)
        high = left + scale * (t.median_ms + t.spread_ms / 2)
        parts += [f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">'
                  f'{_escape(entry.label)}</text>',
                  f'<rect x="{left}" y="{y}" width="{scale * t.median_ms:.1f}" height="{bar}" '
                  f'fill="{colour}"/>',
                  f'<line x1="{low:.1f}" x2="{high:.1f}" y1="{y + bar / 2}" y2="{y + bar / 2}" '
                  f'stroke="#222"/>',
                  f'<text x="{high + 6:.1f}" y="{y + 13}">{t.median_ms:.3g} ms'
                  f'{" fastest checked" if entry is fastest else ""}</text>']
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _title(result: Bench) -> str:
    flags = " ".join(result.cpu["flags"]) or "no listed flags"
    return (f"{result.cpu['name']} ({flags}), {result.runs} runs each, each runtime in its "
            "own process")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
