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
import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfsurgery.cpu_layout import runnable
from tfsurgery.errors import ExportError, InputError, VerificationError
from tfsurgery.ops import first_line, node_name, tensor_name
from tfsurgery.trust.outside import refuse
from tfsurgery.verify.reference import comparable_reference
from tfsurgery.verify.samples import Samples
from tfsurgery.tfsession import plain_session_config

MIN_AGREEMENT = 0.99
MIN_SQNR_DB = 20.0                 # signal 100× the quantization noise in power
MAX_ACCURACY_DROP = 0.01           # NNCF's accuracy control default: one point
CONFIDENCE = 0.95                  # the gate's one-sided lower bound
MAX_FLOAT_FRACTION = 0.10          # default cap on layers kept float: 10% of them (at least 1)
SELECTION_FRACTION = 0.2           # of --samples: rows that choose (the rest calibrate/gate)
GATE_FRACTION = 0.4                # of --samples: rows that judge the chosen model
MIN_ROWS = 8                       # at least this many selection and gate rows


# ---------------------------------------------------------------- thresholds and measures
@dataclasses.dataclass
class Thresholds:
    """None: the default, and not asked for (a threshold asked for must apply to some output).
    ``given_agreement`` 0: no agreement gate (measured and reported, never refusing)."""
    given_agreement: Optional[float] = None
    given_sqnr_db: Optional[float] = None
    max_float_layers: Optional[int] = None     # None: 10% of the layers, at least 1
    given_accuracy_drop: Optional[float] = None

    def __post_init__(self):
        if self.given_agreement is not None and not 0 <= self.given_agreement <= 1:
            raise InputError(f"--int8-min-agreement {self.given_agreement:g}: give a share "
                             "between 0 and 1 (0: no agreement gate)")
        if self.max_float_layers is not None and self.max_float_layers < 0:
            raise InputError(f"--int8-max-float-layers {self.max_float_layers}: give 0 or more")
        if self.given_accuracy_drop is not None and not 0 <= self.given_accuracy_drop <= 1:
            raise InputError(f"--int8-max-accuracy-drop {self.given_accuracy_drop:g}: give a "
                             "share between 0 and 1")

    @property
    def min_agreement(self) -> float:
        return MIN_AGREEMENT if self.given_agreement is None else self.given_agreement

    @property
    def min_sqnr_db(self) -> float:
        return MIN_SQNR_DB if self.given_sqnr_db is None else self.given_sqnr_db

    @property
    def max_accuracy_drop(self) -> float:
        return MAX_ACCURACY_DROP if self.given_accuracy_drop is None else self.given_accuracy_drop

    def check_applies(self, outputs: Sequence[str], expected: List[List[np.ndarray]],
                      labels: Optional[np.ndarray] = None) -> None:
        """A threshold asked for that no output is measured by: one line (exit 2)."""
        classes = [is_class_scores(np.asarray(expected[0][i])) for i in range(len(outputs))]
        if self.given_agreement and not any(classes):
            raise InputError("--int8-min-agreement: no output is class scores (rank 2, last "
                             f"dimension ≥ 2); {', '.join(outputs)} are checked by SQNR "
                             "(--int8-min-sqnr)")
        if self.given_sqnr_db is not None and all(classes):
            raise InputError("--int8-min-sqnr: every output is class scores, checked by top-1 "
                             "agreement (--int8-min-agreement)")
        if self.given_accuracy_drop is not None and labels is None:
            raise InputError("--int8-max-accuracy-drop needs labels: a 'labels' array in "
                             "--samples (or --labels PATH)")
        if labels is not None and not any(classes):
            raise InputError("the samples carry labels but no output is class scores (rank 2, "
                             "last dimension ≥ 2) to take the accuracy of")


@dataclasses.dataclass
class OutputMeasure:
    """One output on a set of rows: top-1 agreement (class scores) or SQNR in dB (the rest).
    On gate rows an agreement also carries its one-sided 95% lower bound, which is what must
    reach the threshold, and the fewest rows that could show the threshold at all."""
    name: str
    measure: str             # "top1_agreement" or "sqnr_db"
    value: float
    threshold: float
    relative_error: float    # ||int8 - float|| / ||float||, for ranking layers
    compared: int = 0        # class-score rows (batch elements) compared
    lower_bound: Optional[float] = None
    rows_needed: Optional[int] = None

    @property
    def judged(self) -> float:
        return self.value if self.lower_bound is None else self.lower_bound

    @property
    def passed(self) -> bool:
        return self.judged >= self.threshold

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), passed=self.passed)


@dataclasses.dataclass
class Accuracy:
    """Float and int8 top-1 accuracy against the user's labels on one set of rows."""
    output: str
    rows: int
    float_accuracy: float
    int8_accuracy: float
    max_drop: float

    @property
    def drop(self) -> float:
        return self.float_accuracy - self.int8_accuracy

    @property
    def passed(self) -> bool:
        return self.drop <= self.max_drop + 1e-12

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), drop=self.drop, passed=self.passed)


def lower_bound(agreeing: int, compared: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper–Pearson lower bound of a share seen as ``agreeing`` of ``compared``."""
    if compared <= 0 or agreeing <= 0:
        return 0.0
    if agreeing >= compared:
        return (1 - confidence) ** (1 / compared)       # the closed form at k = n
    from scipy.stats import beta
    return float(beta.ppf(1 - confidence, agreeing, compared - agreeing + 1))


def rows_needed(threshold: float, share: float = 1.0, confidence: float = CONFIDENCE) -> Optional[int]:
    """The fewest rows whose lower bound reaches ``threshold`` when ``share`` of them agree
    (1.0: every row); None when ``share`` is not above the threshold (no count suffices)."""
    if threshold <= 0:
        return 0
    if share <= threshold:
        return None
    if share >= 1:
        return math.ceil(math.log(1 - confidence) / math.log(threshold))
    count = 1
    while lower_bound(math.floor(share * count), count, confidence) < threshold:
        count *= 2
        if count > 10_000_000:
            return None
    low, high = count // 2, count
    while high - low > 1:
        middle = (low + high) // 2
        if lower_bound(math.floor(share * middle), middle, confidence) >= threshold:
            high = middle
        else:
            low = middle
    return high


def compare(outputs: Sequence[str], expected: List[List[np.ndarray]],
            actual: List[List[np.ndarray]], thresholds: Thresholds, *,
            bounded: bool = False) -> List[OutputMeasure]:
    """Per output over all rows ([row][output] on both sides): agreement or SQNR; ``bounded``
    (the gate): agreements carry their lower bound and the rows needed."""
    result = []
    for index, name in enumerate(outputs):
        ref = _stacked(expected, index)
        got = _stacked(actual, index)
        relative = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
        if is_class_scores(ref):
            same = ref.argmax(-1) == got.argmax(-1)
            measure = OutputMeasure(name, "top1_agreement", float(np.mean(same)),
                                    thresholds.min_agreement, relative, int(same.size))
            if bounded:
                measure.lower_bound = lower_bound(int(same.sum()), int(same.size))
                measure.rows_needed = rows_needed(thresholds.min_agreement)
            result.append(measure)
        else:
            sqnr = 20 * math.log10(1 / relative) if relative > 0 else math.inf
            result.append(OutputMeasure(name, "sqnr_db", sqnr, thresholds.min_sqnr_db, relative,
                                        len(expected)))
    return result


def accuracy(outputs: Sequence[str], expected, actual, labels: Optional[np.ndarray],
             thresholds: Thresholds) -> Optional[Accuracy]:
    """Accuracy of the first class-score output against ``labels`` (one per compared row)."""
    if labels is None:
        return None
    index = next(i for i in range(len(outputs))
                 if is_class_scores(np.asarray(expected[0][i])))
    ref, got = _stacked(expected, index), _stacked(actual, index)
    truth = np.asarray(labels).reshape(-1)
    if truth.size != len(ref):
        raise InputError(f"the labels hold {truth.size} values for {len(ref)} rows of "
                         f"'{outputs[index]}'")
    return Accuracy(outputs[index], int(truth.size), float(np.mean(ref.argmax(-1) == truth)),
                    float(np.mean(got.argmax(-1) == truth)), thresholds.max_accuracy_drop)


def _stacked(rows: List[List[np.ndarray]], index: int) -> np.ndarray:
    return np.concatenate([np.atleast_1d(row[index]) for row in rows]).astype(np.float64)


def is_class_scores(values: np.ndarray) -> bool:
    return values.ndim == 2 and values.shape[-1] >= 2


# ---------------------------------------------------------------- choices and attempts
@dataclasses.dataclass(frozen=True)
class Choice:
    """One way to quantize: the float candidate ("plain"/"equalized"), the calibration method,
    and whether the biases are corrected for the weights' rounding."""
    model: str = "plain"
    method: str = "MinMax"
    bias_corrected: bool = False

    @property
    def label(self) -> str:
        return f"{self.model} {self.method}" + (" + bias correction" if self.bias_corrected
                                                else "")


@dataclasses.dataclass
class Attempt:
    """One choice measured on the selection rows before any layer is kept float."""
    model: str
    method: str
    outputs: List[OutputMeasure]
    seconds: float = 0.0
    bias_corrected: bool = False
    accuracy: Optional[Accuracy] = None

    @property
    def choice(self) -> Choice:
        return Choice(self.model, self.method, self.bias_corrected)

    @property
    def score(self) -> float:
        return score(self.outputs)

    @property
    def label(self) -> str:
        return self.choice.label

    def as_dict(self) -> dict:
        return dict(model=self.model, method=self.method, bias_corrected=self.bias_corrected,
                    score=self.score, seconds=round(self.seconds, 3),
                    outputs=[o.as_dict() for o in self.outputs],
                    accuracy=self.accuracy.as_dict() if self.accuracy else None)


def rank(attempt: Attempt) -> tuple:
    """How attempts are ordered (smallest first): passing the thresholds, then each output's
    own measure (disagreement for class scores; relative error — i.e. SQNR — for the rest),
    then the continuous :func:`score` to break ties."""
    primary = sum(1 - o.value if o.measure == "top1_agreement" else o.relative_error
                  for o in attempt.outputs)
    failed = not all(o.passed for o in attempt.outputs) or \
        (attempt.accuracy is not None and not attempt.accuracy.passed)
    return (failed, primary, attempt.score)


def score(measures: List[OutputMeasure]) -> float:
    """A continuous error over outputs (lower is better): disagreement plus relative error, so
    attempts and layers can be ranked even when top-1 barely moves."""
    return sum(o.relative_error + (1 - o.value if o.measure == "top1_agreement" else 0)
               for o in measures)


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
    speed: dict = dataclasses.field(default_factory=dict)            # set by the caller
    target: dict = dataclasses.field(default_factory=dict)           # int8_target (ONNX)

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
        super().__init__(f"{report.format} int8 misses its thresholds on {report.gate_rows} "
                         f"gate rows{kept}: {'; '.join(report.failures())}{sensitive}{few}")
        self.report = report


# ---------------------------------------------------------------- rows
@dataclasses.dataclass
class Rows:
    """The three disjoint sets of rows."""
    calibration: Samples
    selection: Samples
    gate: Samples

    def sizes(self) -> Dict[str, int]:
        return {"calibration": self.calibration.rows, "selection": self.selection.rows,
                "gate": self.gate.rows}


def split_rows(samples: Samples, gate: Optional[Samples] = None, *,
               gate_fraction: float = GATE_FRACTION,
               selection_fraction: float = SELECTION_FRACTION, seed: int = 0) -> Rows:
    """``samples`` cut by a seeded shuffle into calibration, selection and gate rows (or, with
    ``gate`` given, into calibration and selection rows, ``gate`` judging)."""
    if gate is not None:
        if gate.rows < MIN_ROWS:
            raise InputError(f"{gate.source}: {gate.rows} rows are too few to gate int8 on; "
                             f"give at least {MIN_ROWS}")
        gate_fraction = 0.0
    if not 0 <= gate_fraction < 1 or not 0 < selection_fraction < 1 or \
            gate_fraction + selection_fraction >= 1:
        raise InputError(f"the gate share {gate_fraction:g} and selection share "
                         f"{selection_fraction:g} must leave rows to calibrate on")
    count = samples.rows
    chosen = max(MIN_ROWS, int(round(count * selection_fraction)))
    judged = 0 if gate is not None else max(MIN_ROWS, int(round(count * gate_fraction)))
    if count - chosen - judged < 1:
        raise InputError(f"{samples.source}: {count} rows are too few for {judged} gate rows, "
                         f"{chosen} selection rows and at least one calibration row; give at "
                         f"least {chosen + judged + 1} rows")
    order = np.random.default_rng(seed).permutation(count)
    selection = samples.take(order[:chosen])
    calibration = samples.take(order[chosen + judged:])
    judging = gate if gate is not None else samples.take(order[chosen:chosen + judged])
    return Rows(calibration, selection, judging)


# ---------------------------------------------------------------- the backend and the loop
class Backend:
    """What a format provides (subclass it or duck-type it). ``build`` must calibrate on the
    calibration rows only (given to the backend when it is made); ``run`` is the one way the
    loop sees a model's numbers.

    - ``name``: "onnx", "tflite", ...
    - ``choices()``: the :class:`Choice` objects worth trying (the loop tries each one).
    - ``layers(choice)``: names of the layers that may be kept float, in graph order.
    - ``build(choice, kept_float)``: a quantized model (any handle) with ``kept_float`` float.
    - ``run(model, rows)``: each row's outputs, [row][output], in the loop's output order.
    - ``size(model)``: bytes the written model takes; ``float_size(choice)``: the float's.
    - ``accept(model, report)``: the format's last word on the model the gate passed, before
      it is published (ONNX: its speed on this machine); raising there writes nothing.
    - ``publish(model, path)``: write it (atomically; the caller's batch may hold it).
    - ``details(model)``: extra report fields (e.g. TFLite's int8 I/O), a dict.
    - ``labels(layers)``: what the user's graph calls layers whose names the converter made
      up (ONNX ``Conv__348``), by layer name.
    """

    name = "int8"

    def choices(self) -> List[Choice]:
        raise NotImplementedError

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


def choose(backend, outputs: Sequence[str], selection: Samples,
           expected: List[List[np.ndarray]], thresholds: Thresholds,
           say: Callable[[str], None] = lambda _: None) -> Chosen:
    """Every choice of ``backend`` measured on the ``selection`` rows (``expected``: the float
    reference there), the best kept; when it misses, each layer's sensitivity (the error with
    only that layer float) and the most sensitive kept float, one more at a time, up to the cap,
    until the selection rows pass — else the best of those steps (none kept float when no step
    beats the plain attempt). Gate rows are not an argument: nothing here can see them."""

    def measured(choice: Choice, kept_float: Sequence[str]) -> Tuple[object, Attempt]:
        started = time.perf_counter()
        model = backend.build(choice, kept_float)
        actual = backend.run(model, selection)
        attempt = Attempt(choice.model, choice.method,
                          compare(outputs, expected, actual, thresholds),
                          time.perf_counter() - started, choice.bias_corrected,
                          accuracy(outputs, expected, actual, selection.labels, thresholds))
        return model, attempt

    tried, models = [], {}
    for choice in backend.choices():
        say(f"int8 attempt: {choice.label}")
        models[choice], attempt = measured(choice, [])
        tried.append(attempt)
    best = min(tried, key=rank)
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
    return Chosen(choice, list(kept), model, len(layers), tried, best, final, sensitivities, cap)


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
        bias_corrected=chosen.choice.bias_corrected, kept_float=chosen.kept_float,
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
             thresholds: Thresholds, path, say: Callable[[str], None] = lambda _: None
             ) -> Int8Report:
    """:func:`choose` on the selection rows, then :func:`gate` on the gate rows; publishes
    through the backend when the gate passes, else raises :class:`Int8Refused` (nothing
    written). ``expected``: the float reference by set ("selection", "gate")."""
    if (rows.selection.labels is None) != (rows.gate.labels is None):
        raise InputError("labels for some rows only: give them for the selection and the gate "
                         "rows alike")
    thresholds.check_applies(outputs, expected["selection"], rows.selection.labels)
    chosen = choose(backend, outputs, rows.selection, expected["selection"], thresholds, say)
    report = gate(backend, chosen, outputs, rows, expected["gate"], thresholds, path)
    if not report.passed:
        raise Int8Refused(report)
    backend.accept(chosen.model, report)
    backend.publish(chosen.model, path)
    return report


# ---------------------------------------------------------------- the float reference
def float_reference(original, optimized, settings: Dict[str, object], outputs: Sequence[str],
                    rows: Samples, timeout: float) -> List[List[np.ndarray]]:
    """The float ORIGINAL in TensorFlow on every row, [row][output]: the graph as the user gave
    it, fed besides each row what verification feeds it (``settings``: a ``keep_prob`` at 1,
    a training flag False — ``Result.original_extra_feeds``), its random ops made comparable
    with ``optimized`` as verification makes them. One session for all rows, within
    ``timeout`` seconds per row."""
    import tensorflow as tf
    extra = {node_name(k): np.asarray(v) for k, v in settings.items()}
    try:
        reference, _, _ = comparable_reference(original, optimized, extra)
        reference = runnable(reference, label="the original graph")
    except VerificationError as error:
        raise ExportError(f"no float reference for int8: {error}") from None
    present = {n.name for n in reference.node}
    fixed = {tensor_name(k): v for k, v in extra.items() if k in present}
    options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(timeout * 1000)))
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(reference, name="")
        with tf.compat.v1.Session(graph=graph, config=plain_session_config()) as session:
            fetches = [tensor_name(o) for o in outputs]
            result = []
            for feeds in rows.feeds():
                feed = dict(fixed)
                feed.update({tensor_name(k): v for k, v in feeds.items()
                             if node_name(k) in present})
                if not result:
                    refuse(reference, outputs, list(feed), where="the original graph")
                try:
                    result.append(session.run(fetches, feed, options=options))
                except (tf.errors.OpError, ValueError, KeyError, TypeError) as error:
                    raise ExportError("no float reference for int8: the original graph does "
                                      f"not run on the samples: "
                                      f"{first_line(getattr(error, 'message', str(error)))}"
                                      ) from None
            return result
