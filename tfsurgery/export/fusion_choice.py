"""Which transformer fusions pay on this machine: measured, never assumed (issue 40).

A fused kernel is not always faster. On a 2-core AVX-512 Xeon (onnxruntime 1.32) a BERT-style
encoder ran 26% faster with attention fused but 3% *slower* with LayerNorm fused as well; the
answer moves with the CPU, the model's size and the batch. So ``--onnx-fusions auto`` (the
default) times the model in onnxruntime with every fusion found, with each one left out in
turn, and with none. The patterns are matched once (``onnx_fusion.match``) and spliced into
each variant. The timing runs in a process of its own (``tfsurgery.bench.latency``; sessions
interleaved round by round, every other round in reverse order — A B, B A, ... — their idle
threads not spinning, so the variants share whatever else the machine does), at batch 1 and 4
where the batch is free. Each variant is judged against all fused round by round: the median
of its per-round time ratios, and the spread of that median (its distribution-free ~95%
interval, from the order statistics). The most fused variant is kept unless a less fused one is
faster beyond that spread (the whole interval below 1); on a machine whose noise is ~20% a
fixed margin on medians is not evidence. The report names each fusion dropped with its
numbers; the choice is this CPU's (the report names it).

``all`` applies every fusion found and ``none`` none (a standard-ops model plus onnxruntime's
basic rewrites); a comma-separated list of fusion names applies those.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from tfsurgery.bench import latency
from tfsurgery.errors import InputError, VerificationError
from tfsurgery.export import onnx_fusion
from tfsurgery.int8.target import cpu_name

AUTO, ALL, NONE = "auto", "all", "none"
Z95 = 1.96                  # the median's interval: ~95% (normal approximation of the sign test)
BATCHES = (1, 4)            # timed where the inputs' batch dimension is free
RUNS = (5, 30)              # fewest and most interleaved runs per variant
BUDGET_SECONDS = 30.0       # the timing's target duration (the runs shrink to fit)
TIMEOUT_SECONDS = 600.0     # the timing process's deadline


def requested(value) -> Union[str, bool, List[str]]:
    """``--onnx-fusions``' text (auto, all, none or fusion names A,B) as ``Targets.onnx_fusions``;
    a name that is no fusion: ``InputError``."""
    return parse(value, onnx_fusion.NAMES)


def parse(value: Union[str, bool, Sequence[str], None], names: Sequence[str]):
    """``--onnx-fusions``' value as :func:`tfsurgery.export.onnx.export`'s ``fuse``: "auto",
    True (all), False (none) or a list of fusion names."""
    if value is None or value == AUTO:
        return AUTO
    if value is True or value == ALL:
        return True
    if value is False or value == NONE:
        return False
    chosen = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    unknown = [v for v in chosen if v not in names]
    if unknown or not chosen:
        raise InputError(f"--onnx-fusions {value}: choose auto, all, none or a list of "
                         f"{', '.join(names)}")
    return chosen


def apply(model, graph_def, fuse, feeds: Dict[str, np.ndarray], outputs: Sequence[str]):
    """The fusions ``fuse`` asks for (True: all, a list: those, AUTO: those that pay, measured
    by :func:`choose` first) spliced into ``model`` in place; the patterns matched once.
    Returns the ``onnx_fusion.FusionReport`` (every candidate left alone, with why) and the
    ``FusionChoice`` (None unless AUTO)."""
    choice, left_out = None, "not among the fusions asked for (--onnx-fusions)"
    matches = onnx_fusion.match(graph_def)
    if fuse == AUTO:
        def fused(copy, names):
            onnx_fusion.splice(copy, matches, only=names)
            return copy
        choice = choose(model, matches.names, fused, feeds, outputs)
        fuse, left_out = choice.kept, "left out by --onnx-fusions auto: measured slower"
    report = onnx_fusion.splice(model, matches, only=None if fuse is True else fuse,
                                left_out=left_out)
    return report, choice


def lines(choice: Optional["FusionChoice"], not_fused: Sequence[dict]) -> List[str]:
    """The report's lines: what ``auto`` kept and why (``choice``; None in the other modes),
    then every candidate left alone, grouped (``FusionReport.grouped()``)."""
    return (choice.lines() if choice else []) + onnx_fusion.not_fused_lines(not_fused)


@dataclasses.dataclass
class FusionChoice:
    """What ``auto`` measured and kept. ``timings``: variant → batch → median ms;
    ``versus_all``: variant → (median, low, high) of its per-round ratio to all fused."""
    found: List[str]
    kept: List[str]
    timings: Dict[str, Dict[int, float]] = dataclasses.field(default_factory=dict)
    versus_all: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    runs: int = 0
    cpu: str = ""
    why_not_timed: str = ""

    @property
    def dropped(self) -> List[str]:
        return [name for name in self.found if name not in self.kept]

    def lines(self) -> List[str]:
        """The report's lines: what was kept, each fusion dropped with the numbers that
        dropped it."""
        if self.why_not_timed:
            return [f"onnx fusions: {self.why_not_timed}; all {len(self.found)} applied"]
        if not self.found:
            return []
        chosen = _label(self.kept, self.found)
        if chosen == ALL:
            return [f"onnx fusions: all applied ({', '.join(self.found)}): fastest measured "
                    f"({self._versus(ALL, NONE)})"]
        if chosen == NONE:
            return [f"onnx fusions: none applied ({', '.join(self.found)} found): the model "
                    f"ran fastest unfused ({self._versus(NONE, ALL)})"]
        return [f"onnx fusions: {name} not applied: the model ran faster without it "
                f"({self._versus(chosen, ALL)}); applied: {', '.join(self.kept)}"
                for name in self.dropped]

    def _versus(self, chosen: str, other: str) -> str:
        def named(label):
            return {ALL: "all fused", NONE: "unfused"}.get(label, "without it")
        times = [f"batch {b}: {self.timings[chosen][b]:.3g} ms {named(chosen)} vs "
                 f"{self.timings[other][b]:.3g} ms {named(other)}"
                 for b in sorted(self.timings.get(chosen, {})) if b in self.timings.get(other, {})]
        ratio = self.versus_all.get(chosen if chosen != ALL else other)
        spread = "" if ratio is None else (
            f"; {named(chosen if chosen != ALL else other)} / all fused: {ratio[0]:.3f}× "
            f"(~95% interval {ratio[1]:.3f}–{ratio[2]:.3f})")
        return (f"{'; '.join(times)}{spread}; onnxruntime, medians of {self.runs} "
                f"interleaved rounds (alternating order), {self.cpu}")

    def as_dict(self) -> dict:
        return dict(found=self.found, kept=self.kept, dropped=self.dropped, runs=self.runs,
                    cpu=self.cpu, why_not_timed=self.why_not_timed,
                    versus_all={v: list(r) for v, r in self.versus_all.items()},
                    timings={v: {str(b): ms for b, ms in t.items()}
                             for v, t in self.timings.items()})


def choose(model, found: Sequence[str], fused: Callable[[object, Sequence[str]], object],
           feeds: Dict[str, np.ndarray], outputs: Sequence[str], *,
           budget: float = BUDGET_SECONDS, timer=None) -> FusionChoice:
    """The fusions of ``found`` to apply to ``model`` (an ONNX ModelProto before fusion):
    ``fused(copy, names)`` splices those fusions into a copy. ``feeds``: the check's inputs
    (ONNX names), ``timer``: :func:`time_variants` (tests replace it)."""
    found = list(found)
    choice = FusionChoice(found, list(found), cpu=cpu_name())
    if not found:
        return choice
    variants = {ALL: found, NONE: []}
    if len(found) > 1:
        variants.update({_without(name): [n for n in found if n != name] for name in found})
    models = {label: fused(copy.deepcopy(model), names) for label, names in variants.items()}
    batches = {b: at_batch(feeds, b) for b in BATCHES} if batch_is_free(model) else {}
    batches = {b: fed for b, fed in batches.items() if fed is not None} or \
        {latency.rows_of(feeds): feeds}
    try:
        rounds, choice.runs = (timer or time_variants)(models, batches, outputs, budget)
    except VerificationError as error:
        choice.why_not_timed = f"not timed ({error})"
        return choice
    choice.timings = {label: {b: statistics.median(ms) for b, ms in by_batch.items()}
                      for label, by_batch in rounds.items()}
    choice.versus_all = {label: versus_all(rounds, label) for label in rounds if label != ALL}
    best = fastest(choice.versus_all, {label: len(names) for label, names in variants.items()})
    choice.kept = list(variants[best])
    return choice


def versus_all(rounds: Dict[str, Dict[int, List[float]]], label: str) -> tuple:
    """``label``'s time over all fused's, round by round (the two ran in the same round, in the
    same process): the median ratio over the rounds of every batch, and the ~95% interval of
    that median from the order statistics (the sign test's; no distribution assumed)."""
    logs = sorted(math.log(mine / fused) for batch, times in rounds[ALL].items()
                  for mine, fused in zip(rounds[label][batch], times))
    n, half = len(logs), Z95 * math.sqrt(len(logs)) / 2
    low = logs[max(0, math.floor(n / 2 - half) - 1)]
    high = logs[min(n - 1, math.ceil(n / 2 + half))]
    return math.exp(statistics.median(logs)), math.exp(low), math.exp(high)


def fastest(versus: Dict[str, tuple], fused_count: Dict[str, int]) -> str:
    """The variant to keep: the most fused (``ALL``) unless another is faster beyond the
    spread (its whole interval below 1, see :func:`versus_all`); of those, the fastest
    (median), the more fused on a tie."""
    faster = [label for label, (_, _, high) in versus.items() if label != ALL and high < 1]
    if not faster:
        return ALL
    return min(faster, key=lambda label: (versus[label][0], -fused_count[label]))


def time_variants(models: Dict[str, object], batches: Dict[int, Dict[str, np.ndarray]],
                  outputs: Sequence[str], budget: float) -> tuple:
    """Each model's ms per round (run order) at each batch: all sessions in one onnxruntime
    process (idle threads not spinning), taking turns round by round in alternating order;
    the rounds sized to ``budget`` seconds in all. Returns (variant → batch → [ms], rounds)."""
    timings: Dict[str, Dict[int, List[float]]] = {label: {} for label in models}
    with tempfile.TemporaryDirectory(prefix="tfsurgery-fusions-") as tmp:
        work = Path(tmp)
        paths = {}
        for index, (label, model) in enumerate(models.items()):
            paths[label] = work / f"{index}.onnx"
            paths[label].write_bytes(model.SerializeToString())
        runs = None
        for batch, feeds in batches.items():
            npz = work / f"feeds{batch}.npz"
            np.savez(npz, **feeds)
            variants = {label: (path, npz) for label, path in paths.items()}
            if runs is None:
                runs = _runs_for(variants, outputs, work, budget / len(batches))
            for row in latency.measure_in_subprocess(
                    "onnxruntime", variants, outputs, runs=runs, work=work,
                    timeout=TIMEOUT_SECONDS, ort_spinning=False, alternate=True,
                    keep_runs=True):
                timings[row.variant][batch] = row.runs_ms
    return timings, runs


def _runs_for(variants: Dict[str, tuple], outputs, work: Path, seconds: float) -> int:
    """As many runs as fit in ``seconds`` (one probe run of every variant says how long one
    round takes), within ``RUNS``."""
    started = time.perf_counter()
    latency.measure_in_subprocess("onnxruntime", variants, outputs, runs=1, work=work,
                                  timeout=TIMEOUT_SECONDS, ort_spinning=False)
    round_seconds = max(1e-3, (time.perf_counter() - started) / 5)   # warmup 3 + 1 + start-up
    return int(min(RUNS[1], max(RUNS[0], seconds / round_seconds)))


def batch_is_free(model) -> bool:
    """Whether every input of the ONNX ``model`` leaves its leading dimension open."""
    initializers = {init.name for init in model.graph.initializer}
    dims = [i.type.tensor_type.shape.dim for i in model.graph.input if i.name not in initializers]
    return bool(dims) and all(len(d) > 0 and not d[0].HasField("dim_value") for d in dims)


def at_batch(feeds: Dict[str, np.ndarray], batch: int) -> Optional[Dict[str, np.ndarray]]:
    """``feeds`` with ``batch`` rows (their rows repeated or cut), or None when the inputs do
    not share one leading dimension (a model whose batch is fixed is timed as fed)."""
    leading = {np.shape(v)[0] for v in feeds.values() if np.ndim(v) > 0}
    if len(leading) != 1 or 0 in leading:
        return None
    rows = leading.pop()
    picked = np.arange(batch) % rows
    return {k: (np.asarray(v)[picked] if np.ndim(v) > 0 else v) for k, v in feeds.items()}


def _without(name: str) -> str:
    return f"all but {name}"


def _label(kept: Sequence[str], found: Sequence[str]) -> str:
    if list(kept) == list(found):
        return ALL
    if not kept:
        return NONE
    return _without(next(n for n in found if n not in kept))
