"""One accuracy-aware int8 loop for every format (ONNX QDQ, TFLite full-integer, ...).

The user's rows are cut into three disjoint sets:

- **calibration** rows: the backend computes activation ranges from these, nothing else;
- **selection** rows: every choice is measured here and only here — the calibration method,
  bias correction, the plain or cross-layer-equalized float graph, and which layers stay float
  (each layer's sensitivity, then the most sensitive kept float until the thresholds hold);
- **gate** rows: the one model chosen is measured here once, after every choice is made.
  :func:`choose` never receives them, so no choice can have seen them.

The gate's top-1 agreement carries its one-sided 95% Clopper–Pearson lower bound, and that bound
must reach ``--int8-min-agreement``: 12 of 12 rows agreeing shows 0.78, not 0.99. When the gate
rows are too few to show the threshold even if all agreed, the report says so and how many would
be. With labels (``Samples.labels``) the float and int8 accuracies are measured too and the drop
must stay within ``--int8-max-accuracy-drop``.

A format is a small **backend** (duck-typed; see :class:`Backend`): it lists the choices it
supports and the layers it can keep float, builds a quantized model for a choice and a set of
float layers (calibrated on the calibration rows it was given), runs a model on rows, and
publishes the chosen model. The loop does the rest: ranking, fallback, the gate, one report.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfsurgery.errors import ExportError, InputError
from tfsurgery.int8.measures import (CONFIDENCE, MAX_ACCURACY_DROP, MIN_AGREEMENT,  # noqa: F401
                                     MIN_SQNR_DB, Accuracy, OutputMeasure, Thresholds, accuracy,
                                     compare, is_class_scores, lower_bound, rows_needed, score)
from tfsurgery.int8.speed import Int8TooSlow
from tfsurgery.int8.rows import (GATE_FRACTION, MIN_ROWS, SELECTION_FRACTION,  # noqa: F401
                                 Rows, float_reference, split_rows)
from tfsurgery.verify.samples import Samples

MAX_FLOAT_FRACTION = 0.10          # default cap on layers kept float: 10% of them (at least 1)
DYNAMIC = "dynamic"                # the Choice.method of dynamic int8
# speed ratios closer than this are one speed (a shared machine's timing noise, ~20%):
# between two such modes the more accurate is written
SPEED_NOISE = 1.2


# ---------------------------------------------------------------- choices and attempts
@dataclasses.dataclass(frozen=True)
class Choice:
    """One way to quantize: the float candidate ("plain"/"equalized"), the calibration method,
    whether the biases are corrected for the weights' rounding, and ``weights``: "" for the
    target's weight settings, else the name of the backend's alternative
    (:meth:`Backend.alternatives`, e.g. the runtime's default)."""
    model: str = "plain"
    method: str = "MinMax"
    bias_corrected: bool = False
    weights: str = ""

    @property
    def mode(self) -> str:
        """"dynamic" (int8 weights, activations quantized at run time) or "static"."""
        return DYNAMIC if self.method == DYNAMIC else "static"

    @property
    def label(self) -> str:
        return f"{self.model} {self.method}" + (" + bias correction" if self.bias_corrected
                                                else "") + \
            (f", {self.weights} weights" if self.weights else "")


@dataclasses.dataclass
class Attempt:
    """One choice measured on the selection rows before any layer is kept float."""
    model: str
    method: str
    outputs: List[OutputMeasure]
    seconds: float = 0.0
    bias_corrected: bool = False
    accuracy: Optional[Accuracy] = None
    weights: str = ""

    @property
    def choice(self) -> Choice:
        return Choice(self.model, self.method, self.bias_corrected, self.weights)

    @property
    def score(self) -> float:
        return score(self.outputs)

    @property
    def label(self) -> str:
        return self.choice.label

    def as_dict(self) -> dict:
        return dict(model=self.model, method=self.method, bias_corrected=self.bias_corrected,
                    weights=self.weights, mode=self.choice.mode, score=self.score, seconds=round(self.seconds, 3),
                    outputs=[o.as_dict() for o in self.outputs],
                    accuracy=self.accuracy.as_dict() if self.accuracy else None)


def rank(attempt: Attempt) -> tuple:
    """How attempts are ordered (smallest first): passing the thresholds, then each output's
    own measure (:func:`error`), then the continuous :func:`score` to break ties."""
    failed = not all(o.passed for o in attempt.outputs) or \
        (attempt.accuracy is not None and not attempt.accuracy.passed)
    return (failed, error(attempt), attempt.score)


def error(attempt: Attempt) -> float:
    """An attempt's error, summed over its outputs: disagreement for class scores, relative
    error (||int8 − float|| / ||float||, i.e. SQNR) for the rest."""
    return sum(1 - o.value if o.measure == "top1_agreement" else o.relative_error
               for o in attempt.outputs)


# ---------------------------------------------------------------- the report
@dataclasses.dataclass
class Int8Report:
    """What the loop chose, on which rows, and what the gate saw: one type for every format."""
    format: str                                    # the backend: "onnx", "tflite", ...
    path: str
    calibration_rows: int
    selection_rows: int
    gate_rows: int
    layers: int
    outputs: List[OutputMeasure]                   # on the gate rows: what passes or refuses
    selection_outputs: List[OutputMeasure]         # on the selection rows, as chosen
    plain_outputs: List[OutputMeasure]             # selection rows, before any layer kept float
    calibration_method: str = ""
    model: str = "plain"                           # the float candidate kept: plain/equalized
    bias_corrected: bool = False
    weights: str = ""                              # Choice.weights kept ("": the target's)
    kept_float: List[str] = dataclasses.field(default_factory=list)
    sensitivities: Dict[str, float] = dataclasses.field(default_factory=dict)
    max_float_layers: int = 0
    tried: List[Attempt] = dataclasses.field(default_factory=list)   # every choice
    accuracy: Optional[Accuracy] = None            # on the gate rows, with labels
    selection_accuracy: Optional[Accuracy] = None
    float_bytes: int = 0
    int8_bytes: int = 0
    io_type: str = "float32"                       # TFLite: its inputs' and outputs' type
    io_quantization: Dict[str, dict] = dataclasses.field(default_factory=dict)
    equalization: dict = dataclasses.field(default_factory=dict)     # set by the caller
    notes: List[str] = dataclasses.field(default_factory=list)
    layer_labels: Dict[str, str] = dataclasses.field(default_factory=dict)  # made-up names
    speed: dict = dataclasses.field(default_factory=dict)            # the mode written's
    target: dict = dataclasses.field(default_factory=dict)           # int8_target (ONNX)
    mode: str = "static"                           # static, mixed, dynamic, dynamic mixed
    modes: List[dict] = dataclasses.field(default_factory=list)      # every mode tried

    def modes_line(self) -> str:
        """Each mode tried: its selection-row measures, size and speed, in one line."""
        return "; ".join(
            f"{m['mode']} ({m['label']}): " + ", ".join(
                f"{o['measure']} {o['value']:.4g}" + (f" rel. error {o['relative_error']:.3g}"
                                                      if o["measure"] == "sqnr_db" else "")
                for o in m["outputs"]) +
            (f", {m['int8_bytes'] / m['float_bytes']:.2f} of the float size"
             if m["float_bytes"] else f", {m['int8_bytes']} bytes") +
            (f", {m['speedup']:.2f}× float" if m.get("speedup") else ", speed not measured") +
            "".join(f", {note}" for note in m.get("notes", ())) +
            ("" if m["selection_passed"] else ", misses on the selection rows")
            for m in self.modes)

    @property
    def passed(self) -> bool:       # nothing measured is never a pass (review H5)
        return bool(self.outputs) and all(o.passed for o in self.outputs) and \
            (self.accuracy is None or self.accuracy.passed)

    @property
    def check_rows(self) -> int:    # the older name: the rows that judge
        return self.gate_rows

    @property
    def bytes(self) -> int:         # the older name (TFLite)
        return self.int8_bytes

    def named(self, layer: str) -> str:
        """A layer as the user can find it: its name, and what it feeds when made up."""
        label = self.layer_labels.get(layer)
        return f"{layer} ({label})" if label else layer

    def failures(self) -> List[str]:
        """What missed on the gate rows, one phrase each."""
        missed = [f"{o.name}: {_shown(o)} < {o.threshold:g}" for o in self.outputs
                  if not o.passed]
        if self.accuracy is not None and not self.accuracy.passed:
            a = self.accuracy
            missed.append(f"accuracy drop {a.drop:.4g} ({a.float_accuracy:.4g} float → "
                          f"{a.int8_accuracy:.4g} int8) > {a.max_drop:g}")
        return missed

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(passed=self.passed, check_rows=self.check_rows,
                    outputs=[o.as_dict() for o in self.outputs],
                    selection_outputs=[o.as_dict() for o in self.selection_outputs],
                    plain_outputs=[o.as_dict() for o in self.plain_outputs],
                    tried=[a.as_dict() for a in self.tried],
                    accuracy=self.accuracy.as_dict() if self.accuracy else None,
                    selection_accuracy=(self.selection_accuracy.as_dict()
                                        if self.selection_accuracy else None))
        return data


def _shown(measure: OutputMeasure) -> str:
    if measure.lower_bound is None:
        return f"{measure.measure} {measure.value:.4g}"
    return (f"{measure.measure} {measure.value:.4g} (95% lower bound "
            f"{measure.lower_bound:.4g} on {measure.compared} rows)")


class Int8Refused(ExportError):
    """The int8 model misses its thresholds on the gate rows even with the cap of layers kept
    float; names the layers kept float and the most sensitive ones."""

    def __init__(self, report: Int8Report):
        kept = (f" with {len(report.kept_float)} layer(s) kept float "
                f"({', '.join(map(report.named, report.kept_float))}; cap "
                f"{report.max_float_layers})" if report.kept_float else "")
        ranked = sorted(report.sensitivities, key=report.sensitivities.get, reverse=True)
        sensitive = (f"; most sensitive layers: {', '.join(map(report.named, ranked[:5]))}"
                     if ranked and not report.kept_float else "")
        few = "".join(f"; {note}" for note in report.notes if "too few" in note)
        modes = (f"; modes tried on the selection rows: {report.modes_line()}"
                 if len(report.modes) > 1 else "")
        super().__init__(f"{report.format} {report.mode} int8 misses its thresholds on "
                         f"{report.gate_rows} gate rows{kept}: {'; '.join(report.failures())}"
                         f"{sensitive}{few}{modes}")
        self.report = report


# ---------------------------------------------------------------- the backend and the loop
class Backend:
    """What a format provides (subclass it or duck-type it). ``build`` must calibrate on the
    calibration rows only (given to the backend when it is made); ``run`` is the one way the
    loop sees a model's numbers.

    - ``name``: "onnx", "tflite", ...
    - ``choices()``: the static :class:`Choice` objects worth trying (the loop tries each).
    - ``dynamic_choices()``: the dynamic int8 ones (method DYNAMIC), tried when static misses
      on the selection rows (or when asked for alone); none by default.
    - ``alternatives(choice)``: ``choice`` with other weight settings (``Choice.weights``)
      where the target's guidance and the runtime's default disagree — the same kernels, so
      the same speed; the best choice of each mode is measured with each and the more
      accurate kept (:func:`choose`); none by default. ``weights_label(choice)``: what the
      weights of a choice are, for the report.
    - ``layers(choice)``: names of the layers that may be kept float, in graph order.
    - ``build(choice, kept_float)``: a quantized model (any handle) with ``kept_float`` float.
    - ``run(model, rows)``: each row's outputs, [row][output], in the loop's output order.
    - ``size(model)``: bytes the written model takes; ``float_size(choice)``: the float's.
    - ``time(models)``: each model's speed against the float model on this machine, by name
      (``speed.Speed``), all timed together; None when the format is not timed.
    - ``accept(model, report)``: the format's last word on the model the gate passed, before
      it is published; raising there writes nothing.
    - ``publish(model, path)``: write it (atomically; the caller's batch may hold it).
    - ``details(model)``: extra report fields (e.g. TFLite's int8 I/O), a dict.
    - ``labels(layers)``: what the user's graph calls layers whose names the converter made
      up (ONNX ``Conv__348``), by layer name.
    """

    name = "int8"

    def choices(self) -> List[Choice]:
        raise NotImplementedError

    def dynamic_choices(self) -> List[Choice]:
        return []

    def alternatives(self, choice: Choice) -> List[Choice]:
        return []

    def weights_label(self, choice: Choice) -> str:
        return choice.weights or "the target's"

    def time(self, models: Dict[str, object]) -> Optional[dict]:
        return None

    def layers(self, choice: Choice) -> List[str]:
        raise NotImplementedError

    def build(self, choice: Choice, kept_float: Sequence[str]):
        raise NotImplementedError

    def run(self, model, rows: Samples) -> List[List[np.ndarray]]:
        raise NotImplementedError

    def size(self, model) -> int:
        raise NotImplementedError

    def float_size(self, choice: Choice) -> int:
        return 0

    def accept(self, model, report: "Int8Report") -> None:
        pass

    def publish(self, model, path) -> None:
        raise NotImplementedError

    def details(self, model) -> dict:
        return {}

    def labels(self, layers: Sequence[str]) -> Dict[str, str]:
        return {}


@dataclasses.dataclass
class Chosen:
    """What :func:`choose` settled on, from calibration and selection rows only."""
    choice: Choice
    kept_float: List[str]
    model: object
    layers: int
    tried: List[Attempt]
    plain: Attempt
    final: Attempt
    sensitivities: Dict[str, float]
    max_float_layers: int
    plain_model: object = None          # the model of ``plain`` (no layer kept float)
    notes: List[str] = dataclasses.field(default_factory=list)   # e.g. the weights compared


def choose(backend, outputs: Sequence[str], selection: Samples,
           expected: List[List[np.ndarray]], thresholds: Thresholds,
           say: Callable[[str], None] = lambda _: None,
           choices: Optional[Sequence[Choice]] = None) -> Chosen:
    """Every choice of ``backend`` measured on the ``selection`` rows (``expected``: the float
    reference there), the best kept; when it misses, each layer's sensitivity (the error with
    only that layer float) and the most sensitive kept float, one more at a time, up to the cap,
    until the selection rows pass — else the best of those steps (none kept float when no step
    beats the plain attempt). ``choices``: these instead of ``backend.choices()``. The best
    choice is measured again with each of the backend's alternative weight settings
    (:meth:`Backend.alternatives`) and the more accurate kept, the two errors in ``notes``.
    Gate rows are not an argument: nothing here can see them."""

    def measured(choice: Choice, kept_float: Sequence[str]) -> Tuple[object, Attempt]:
        started = time.perf_counter()
        model = backend.build(choice, kept_float)
        actual = backend.run(model, selection)
        attempt = Attempt(choice.model, choice.method,
                          compare(outputs, expected, actual, thresholds),
                          time.perf_counter() - started, choice.bias_corrected,
                          accuracy(outputs, expected, actual, selection.labels, thresholds),
                          choice.weights)
        return model, attempt

    tried, models = [], {}
    for choice in (backend.choices() if choices is None else choices):
        say(f"int8 attempt: {choice.label}")
        models[choice], attempt = measured(choice, [])
        tried.append(attempt)
    best = min(tried, key=rank)
    compared = []
    for alternative in getattr(backend, "alternatives", lambda _: [])(best.choice):
        say(f"int8 attempt: {alternative.label}")
        models[alternative], attempt = measured(alternative, [])
        tried.append(attempt)
        compared.append(attempt)
    said = [weights_note(backend, best, compared)] if compared else []
    best = min([best] + compared, key=rank)
    choice = best.choice
    layers = backend.layers(choice)
    cap = thresholds.max_float_layers
    if cap is None:
        cap = max(1, int(len(layers) * MAX_FLOAT_FRACTION))
    model, final, kept, sensitivities = models[choice], best, [], {}
    if not selection_passes(best) and cap > 0 and layers:
        say(f"int8 misses on the selection rows: measuring {len(layers)} layers' sensitivity")
        base = best.score
        for layer in layers:
            sensitivities[layer] = base - measured(choice, [layer])[1].score
        ranked = sorted(sensitivities, key=sensitivities.get, reverse=True)
        for count in range(1, min(cap, len(ranked)) + 1):
            step_model, step = measured(choice, ranked[:count])
            if selection_passes(step) or rank(step) < rank(final):
                model, final, kept = step_model, step, ranked[:count]   # the best step so far
            if selection_passes(step):
                break
    return Chosen(choice, list(kept), model, len(layers), tried, best, final, sensitivities, cap,
                  models[choice], said)


def weights_note(backend, guided: Attempt, others: Sequence[Attempt]) -> str:
    """Which weights were kept and by how much, on the selection rows: "weights: 8-bit
    per-tensor (onnxruntime's default) kept over 7-bit per-channel (the x86 target's): error
    0.031 against 0.045 on the selection rows"."""
    label = getattr(backend, "weights_label", lambda c: c.weights or "the target's")
    kept = min([guided] + list(others), key=rank)
    lost = [a for a in [guided] + list(others) if a is not kept]
    return (f"{kept.choice.mode} weights: {label(kept.choice)} kept over " +
            ", ".join(label(a.choice) for a in lost) +
            f" ({dataclasses.replace(kept.choice, weights='').label}): error {error(kept):.3g} against " +
            ", ".join(f"{error(a):.3g}" for a in lost) + " on the selection rows (relative "
            "L2 error, or disagreement for class scores, summed over the outputs)")


def selection_passes(attempt: Attempt) -> bool:
    """The selection rows' verdict: every measure at its threshold — for an agreement, as the
    gate will judge it (the lower bound) where the selection rows are enough to show the
    threshold, else every row agreeing — and the accuracy drop within its limit."""
    for o in attempt.outputs:
        if not o.passed:
            return False
        if o.measure == "top1_agreement" and o.threshold > 0:
            agreeing = int(round(o.value * o.compared))
            if lower_bound(agreeing, o.compared) < o.threshold and agreeing < o.compared:
                return False
    return attempt.accuracy is None or attempt.accuracy.passed


def gate(backend, chosen: Chosen, outputs: Sequence[str], rows: Rows,
         expected_gate: List[List[np.ndarray]], thresholds: Thresholds, path) -> Int8Report:
    """The chosen model measured once on the gate rows: the report (``passed`` or not)."""
    actual = backend.run(chosen.model, rows.gate)
    measures = compare(outputs, expected_gate, actual, thresholds, bounded=True)
    report = Int8Report(
        backend.name, str(path), rows.calibration.rows, rows.selection.rows, rows.gate.rows,
        chosen.layers, measures, chosen.final.outputs, chosen.plain.outputs,
        calibration_method=chosen.choice.method, model=chosen.choice.model,
        bias_corrected=chosen.choice.bias_corrected, weights=chosen.choice.weights,
        kept_float=chosen.kept_float,
        sensitivities=chosen.sensitivities, max_float_layers=chosen.max_float_layers,
        tried=chosen.tried, accuracy=accuracy(outputs, expected_gate, actual, rows.gate.labels,
                                              thresholds),
        selection_accuracy=chosen.final.accuracy,
        float_bytes=backend.float_size(chosen.choice), int8_bytes=backend.size(chosen.model),
        **backend.details(chosen.model))
    report.notes = notes(report)
    report.layer_labels = backend.labels(list(chosen.sensitivities) or chosen.kept_float)
    return report


def notes(report: Int8Report) -> List[str]:
    """Plain statements about what the gate can and cannot show."""
    said = []
    for o in report.outputs:
        if o.lower_bound is None or o.threshold <= 0 or o.passed:
            continue
        if o.rows_needed is not None and o.compared < o.rows_needed:
            said.append(f"{o.name}: {o.compared} gate rows are too few to show agreement "
                        f"≥ {o.threshold:g} at 95% confidence — even all agreeing would show "
                        f"only {lower_bound(o.compared, o.compared):.4g}; give at least "
                        f"{o.rows_needed} gate rows (--samples or --check-samples), or lower "
                        "--int8-min-agreement (0: no agreement gate)")
        else:
            more = rows_needed(o.threshold, o.value)
            said.append(f"{o.name}: at the agreement seen ({o.value:.4g}) "
                        + (f"about {more} gate rows would show ≥ {o.threshold:g}"
                           if more else f"no number of rows shows ≥ {o.threshold:g}"))
    return said


def run_loop(backend, outputs: Sequence[str], rows: Rows, expected: Dict[str, list],
             thresholds: Thresholds, path, say: Callable[[str], None] = lambda _: None, *,
             modes: str = "auto", min_speedup: float = 0.0) -> Int8Report:
    """:func:`choose` on the selection rows — static (and mixed: static with layers kept float
    when it misses); with ``modes`` "auto" dynamic too, on the same rows (its layers kept float
    only when static missed as well); "static" or "dynamic" alone — every
    mode timed against float (:meth:`Backend.time`), the one to write picked by
    :func:`pick_mode`, then :func:`gate` on the gate rows. Publishes through the backend when
    the gate passes and the mode runs at least ``min_speedup`` × float (0: any speed, int8 for
    its size); else raises :class:`Int8Refused` or ``speed.Int8TooSlow`` (nothing written),
    the report showing every mode tried. ``expected``: the float reference by set."""
    if (rows.selection.labels is None) != (rows.gate.labels is None):
        raise InputError("labels for some rows only: give them for the selection and the gate "
                         "rows alike")
    thresholds.check_applies(outputs, expected["selection"], rows.selection.labels)
    picks = []
    if modes != DYNAMIC:
        picks.append(choose(backend, outputs, rows.selection, expected["selection"],
                            thresholds, say))
    dynamic = getattr(backend, "dynamic_choices", lambda: [])() if modes != "static" else []
    if dynamic:         # cheap (nothing to calibrate); its layers kept float only if needed
        say("dynamic int8")
        static_passed = bool(picks) and selection_passes(picks[0].final)
        picks.append(choose(backend, outputs, rows.selection, expected["selection"],
                            dataclasses.replace(thresholds, max_float_layers=0)
                            if static_passed else thresholds, say, choices=dynamic))
    entries = timed(backend, mode_entries(picks), min_speedup)     # all in one process
    if not picks:
        raise InputError(f"{backend.name} has no dynamic int8: --int8-mode static or auto")
    picked = pick_mode(entries, min_speedup)
    report = gate(backend, picked.chosen, outputs, rows, expected["gate"], thresholds, path)
    report.mode = picked.name
    report.tried = [a for chosen in picks for a in chosen.tried]
    report.modes = [entry.as_dict(backend, picked) for entry in entries]
    report.notes += mode_notes(backend, picked.chosen.choice) + picked.chosen.notes
    if picked.speed is not None:
        report.speed = dict(picked.speed.as_dict(), line=picked.speed.line())
    if not report.passed:
        raise Int8Refused(report)
    if picked.speed is not None and not picked.speed.passed:
        slow = Int8TooSlow(picked.speed, report.modes_line() if len(entries) > 1 else "")
        slow.report = report
        raise slow
    backend.accept(picked.chosen.model, report)
    backend.publish(picked.chosen.model, path)
    return report


@dataclasses.dataclass
class Mode:
    """One mode's model as measured on the selection rows (static, mixed, dynamic, ...)."""
    name: str
    chosen: Chosen               # its model, choice and kept-float layers
    speed: object = None         # speed.Speed against float, when the format is timed

    @property
    def passed(self) -> bool:
        return selection_passes(self.chosen.final)

    def as_dict(self, backend, picked: "Mode") -> dict:
        return dict(mode=self.name, label=self.chosen.choice.label, written=self is picked,
                    kept_float=list(self.chosen.kept_float), selection_passed=self.passed,
                    outputs=[o.as_dict() for o in self.chosen.final.outputs],
                    int8_bytes=backend.size(self.chosen.model),
                    float_bytes=backend.float_size(self.chosen.choice),
                    notes=mode_notes(backend, self.chosen.choice) + self.chosen.notes,
                    **({"speedup": self.speed.speedup, "int8_ms": self.speed.int8_ms,
                        "float_ms": self.speed.float_ms} if self.speed is not None else {}))


def mode_notes(backend, choice: Choice) -> List[str]:
    """What the format says of a mode's model (``backend.mode_notes``: e.g. the layers its
    quantizer leaves float)."""
    return list(getattr(backend, "mode_notes", lambda _: [])(choice))


def timed(backend, entries: List[Mode], min_speedup: float) -> List[Mode]:
    """``entries`` with their speed against float (:meth:`Backend.time`), all in one run."""
    speeds = getattr(backend, "time", lambda _: None)({m.name: m.chosen.model
                                                        for m in entries}) if entries else None
    for entry in entries:
        entry.speed = speeds.get(entry.name) if speeds else None
        if entry.speed is not None:
            entry.speed.min_speedup = min_speedup
    return entries


def mode_entries(picks: Sequence[Chosen]) -> List[Mode]:
    """Each chosen model as a mode, and the model before its layers were kept float: static
    and "mixed" (static with layers float), dynamic and "dynamic mixed"."""
    entries = []
    for chosen in picks:
        name = chosen.choice.mode
        if chosen.kept_float:
            entries.append(Mode(name, dataclasses.replace(
                chosen, kept_float=[], model=chosen.plain_model, final=chosen.plain)))
            entries.append(Mode("mixed" if name == "static" else f"{name} mixed", chosen))
        else:
            entries.append(Mode(name, chosen))
    return entries


def pick_mode(entries: Sequence[Mode], min_speedup: float) -> Mode:
    """The mode to gate and write: of those passing on the selection rows and running
    ``min_speedup`` × float (else of all passing), the most accurate — unless another is
    faster than it by more than SPEED_NOISE, then the fastest (untimed: the first, static
    before dynamic); when none passes, the best ranked (the gate will say why). Speeds
    within SPEED_NOISE of each other are one speed on a shared machine: accuracy decides."""
    passing = [m for m in entries if m.passed]
    if not passing:
        return min(entries, key=lambda m: rank(m.chosen.final))
    timed = [m for m in passing if m.speed is not None]
    if not timed:
        return passing[0]
    candidates = [m for m in timed if m.speed.speedup >= min_speedup] or timed
    accurate = min(candidates, key=lambda m: rank(m.chosen.final))
    fastest = max(candidates, key=lambda m: m.speed.speedup)
    clearly = fastest.speed.speedup > accurate.speed.speedup * SPEED_NOISE
    return fastest if clearly else accurate
