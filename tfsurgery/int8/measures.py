"""What the int8 gate measures and how much its rows can show.

Per output, on a set of rows, against the float original: top-1 agreement for class scores,
SQNR in dB for every other output; with labels, the float and int8 accuracy. On the gate rows an
agreement carries its one-sided 95% Clopper–Pearson lower bound, which is what must reach
``--int8-min-agreement`` — 12 of 12 rows agreeing shows 0.78, not 0.99 — and :func:`rows_needed`
says how many rows could show a threshold at all.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.errors import InputError

MIN_AGREEMENT = 0.99
MIN_SQNR_DB = 20.0                 # signal 100× the quantization noise in power
MAX_ACCURACY_DROP = 0.01           # NNCF's accuracy control default: one point
CONFIDENCE = 0.95                  # the gate's one-sided lower bound


@dataclasses.dataclass
class Thresholds:
    """None: the default, and not asked for (a threshold asked for must apply to some output).
    ``given_agreement`` 0: no agreement gate (measured and reported, never refusing)."""
    given_agreement: Optional[float] = None
    given_sqnr_db: Optional[float] = None
    max_float_layers: Optional[int] = None     # None: 10% of the layers, at least 1
    given_accuracy_drop: Optional[float] = None
    # each output's kind read from the graph (int8.kinds: "classes", "values", or None: the
    # shape decides); None for all: the shape decides (rank 2, last dimension ≥ 2 = classes)
    kinds: Optional[Dict[str, Optional[str]]] = None

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

    def is_classes(self, name: str, values: np.ndarray) -> bool:
        """Is output ``name`` (``values`` of one row) judged as class scores?"""
        kind = (self.kinds or {}).get(name)
        if kind is not None:
            return kind == "classes"
        return is_class_scores(values)

    def check_applies(self, outputs: Sequence[str], expected: List[List[np.ndarray]],
                      labels: Optional[np.ndarray] = None) -> None:
        """A threshold asked for that no output is measured by: one line (exit 2)."""
        classes = [self.is_classes(name, np.asarray(expected[0][i]))
                   for i, name in enumerate(outputs)]
        if self.given_agreement and not any(classes):
            raise InputError("--int8-min-agreement: no output is class scores (a Softmax or "
                             "ArgMax head, or rank 2 with labels or an agreement threshold); "
                             f"{', '.join(outputs)} are checked by SQNR (--int8-min-sqnr)")
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
    cosine: Optional[float] = None   # values: cosine similarity of int8 and float, all rows

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


def rows_needed(threshold: float, share: float = 1.0, confidence: float = CONFIDENCE
                ) -> Optional[int]:
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
        if thresholds.is_classes(name, np.asarray(expected[0][index])):
            scores = ref.ndim >= 2 and ref.shape[-1] >= 2       # else class ids (an ArgMax)
            same = (ref.argmax(-1) == got.argmax(-1)) if scores else ref == got
            measure = OutputMeasure(name, "top1_agreement", float(np.mean(same)),
                                    thresholds.min_agreement, relative, int(same.size))
            if bounded:
                measure.lower_bound = lower_bound(int(same.sum()), int(same.size))
                measure.rows_needed = rows_needed(thresholds.min_agreement)
            result.append(measure)
        else:
            sqnr = 20 * math.log10(1 / relative) if relative > 0 else math.inf
            cosine = float(np.dot(ref.ravel(), got.ravel()) /
                           max(np.linalg.norm(ref) * np.linalg.norm(got), 1e-30))
            result.append(OutputMeasure(name, "sqnr_db", sqnr, thresholds.min_sqnr_db, relative,
                                        len(expected), cosine=cosine))
    return result


def accuracy(outputs: Sequence[str], expected, actual, labels: Optional[np.ndarray],
             thresholds: Thresholds) -> Optional[Accuracy]:
    """Accuracy of the first class-score output against ``labels`` (one per compared row)."""
    if labels is None:
        return None
    index = next(i for i, name in enumerate(outputs)
                 if thresholds.is_classes(name, np.asarray(expected[0][i])))
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


def score(measures: List[OutputMeasure]) -> float:
    """A continuous error over outputs (lower is better): disagreement plus relative error, so
    attempts and layers can be ranked even when top-1 barely moves."""
    return sum(o.relative_error + (1 - o.value if o.measure == "top1_agreement" else 0)
               for o in measures)

