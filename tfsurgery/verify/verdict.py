"""The verdict of a check: ``Verification`` — what was compared, the errors, and whether it
passed — and the rules every check shares (something real was compared; the worst error; top-1
agreement of class scores)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfsurgery.verify import sensitivity as sensitivity_mod
from tfsurgery.verify.runs import OutputError
from tfsurgery.verify.scales import part_errors

DEFAULT_TOLERANCE = 1e-4
NOISE_FACTOR = 4
NOISE_CAP = 1e-3                        # the noise floor never excuses a larger relative error


@dataclasses.dataclass
class Watching:
    """What the first batch of a check decided, kept for the others: the random inputs' scale,
    the sensitivity measured, whether the comparison was widened (tfsurgery.verify.sensitivity)."""
    scale: Optional[float] = None
    saturated: List[str] = dataclasses.field(default_factory=list)
    sensitivity: Optional[sensitivity_mod.Sensitivity] = None
    notes: List[str] = dataclasses.field(default_factory=list)
    wide_rows: Optional[int] = None     # the widened comparison's first rows (None: all)
    # sampled layers whose probed change showed in nothing compared, at any input scale tried
    blind: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Verification:
    outputs: List[OutputError]
    tolerance: float
    reference: str = "the original graph"   # verify() says what it was fed
    noise_floor: float = 0.0        # the original's own output change for a 1-ulp change of
    noise_source: str = ""          # ... its float "inputs" or its float "weights", the larger
    #                                 (the largest of any output's: reported, never lent)
    # each output's own noise floor, one per part it is judged by (scales.part_errors): what
    # excuses that output's error, and no other's
    noise_floors: Dict[str, Tuple[float, ...]] = dataclasses.field(default_factory=dict)
    # output → the parts the original's structure makes of it (tfsurgery.verify.scales): how
    # it was judged, and how the exports' checks judge it
    parts: Dict[str, object] = dataclasses.field(default_factory=dict, repr=False)
    deterministic: bool = True      # two runs of the reference agree bit for bit
    feeds: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    # further feeds compared, by the suffix their outputs carry ("@32": free dims at 32)
    more_feeds: Dict[str, Dict[str, np.ndarray]] = dataclasses.field(default_factory=dict,
                                                                     repr=False)
    # the reference's outputs on ``feeds`` (output → values): what exports are checked against
    expected: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    actual: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    batches: int = 1                # input batches compared (--check-n, --samples rows)
    worst_batch: str = ""           # the batch of the largest error
    # class-score outputs: name → {"rows", "agree", "flips": rows whose top-1 changed although
    # the original's top-2 margin exceeded the tolerance}
    agreement: Dict[str, dict] = dataclasses.field(default_factory=dict)
    # the worst batch as it was made (given values, seed) and fed: what localizing re-runs
    worst: tuple = dataclasses.field(default=(None, 0), repr=False)
    worst_feeds: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    # where the outputs alone are blind (tfsurgery.verify.sensitivity): the first batch's decisions,
    # and the intermediate tensors compared when the comparison was widened (nearest the
    # inputs first), each with its own noise-floor allowance; those a rewrite changed inside
    # (their affine readers match) are excused
    watching: Optional["Watching"] = dataclasses.field(default=None, repr=False)
    intermediate: List[OutputError] = dataclasses.field(default_factory=list)
    intermediate_allowed: Dict[str, float] = dataclasses.field(default_factory=dict)
    excused: List[str] = dataclasses.field(default_factory=list)
    # layers the check could not see a change of (Watching.blind): "cannot verify" unless the
    # user accepted it (--accept-blind-spots) or gave the data the model is meant for (--samples)
    blind: List[str] = dataclasses.field(default_factory=list)
    blind_accepted: bool = False

    @property
    def max_error(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    @property
    def allowed(self) -> float:
        """The largest error any output is allowed (each is judged by its own ``bounds``)."""
        return max([self.tolerance] + [b for o in self.outputs for b in self.bounds(o)])

    def bounds(self, error: OutputError) -> List[float]:
        """The largest error allowed each part of an output (scales.part_errors): the tolerance,
        or up to NOISE_FACTOR × that part's own noise floor (capped at NOISE_CAP) where the
        reference is deterministic — a floor measured on that output, never another's."""
        count = len(part_errors(error))
        floors = self.noise_floors.get(error.name, ()) if self.deterministic else ()
        floors = floors if len(floors) == count else (0.0,) * count
        return [max(self.tolerance, min(NOISE_FACTOR * f, NOISE_CAP)) for f in floors]

    @property
    def exceeding(self) -> List[OutputError]:
        """The outputs one of whose parts differs beyond its own bound, worst first."""
        over = [o for o in self.outputs
                if any(e > b for e, b in zip(part_errors(o), self.bounds(o)))]
        return sorted(over, key=self._excess, reverse=True)

    def _excess(self, error: OutputError) -> float:
        return max(e / b for e, b in zip(part_errors(error), self.bounds(error)))

    @property
    def uncomparable(self) -> List[str]:
        """Outputs whose every value is NaN/Inf in the original: nothing there was compared."""
        return [o.name for o in self.outputs if not o.reason and
                o.nonfinite == int(np.prod(o.shape))]        # a scalar NaN too

    @property
    def flips(self) -> int:
        return sum(a["flips"] for a in self.agreement.values())

    @property
    def passed(self) -> bool:
        return compared_real_numbers(self.outputs) and not self.exceeding and \
            not self.flips and not self.hidden and not self.cannot_verify

    @property
    def cannot_verify(self) -> bool:
        """The check could not see a change in some layer's weights, and nobody accepted that."""
        return bool(self.blind) and not self.blind_accepted

    @property
    def hidden(self) -> List[OutputError]:
        """Intermediate tensors that differ beyond their allowance although nothing excuses
        them: a change the outputs hide on these inputs."""
        return [e for e in self.intermediate
                if e.max_rel > self.bound(e.name) and e.name not in self.excused]

    def bound(self, name: str) -> float:
        """The largest error allowed an intermediate tensor: the tolerance, or its own noise
        floor's (never an output's)."""
        if not self.deterministic:
            return self.tolerance
        return max(self.tolerance, self.intermediate_allowed.get(name, 0.0))

    def notes(self) -> List[str]:
        """What the check did besides comparing the outputs, and why (saturated heads, the
        inputs' scale, its sensitivity, a widened comparison)."""
        return list(self.watching.notes) if self.watching else []

    def failure(self) -> str:
        """Why it did not pass, in one line."""
        if not self.outputs:
            return "no outputs were compared"
        if self.uncomparable:
            return (f"cannot compare: every value of output '{self.uncomparable[0]}' is NaN/Inf "
                    "(not finite) in the original on the test inputs; give real inputs with "
                    "--feed NAME=file.npy")
        nonfinite = f" ({self.nonfinite} NaN/Inf output values)" if self.nonfinite else ""
        changed = next((o for o in self.outputs if o.reason), None)
        if changed is not None:
            return (f"output '{changed.name}' no longer matches the original's: its "
                    f"{changed.reason}, the values are not compared")
        within = not self.exceeding
        if within and self.flips:
            name, worst = max(self.agreement.items(), key=lambda kv: kv[1]["flips"])
            return (f"the top-1 class changed on {worst['flips']} of {worst['rows']} rows of "
                    f"'{name}' where the original's margin exceeded the tolerance")
        where = f" (on {self.worst_batch})" if self.batches > 1 and self.worst_batch else ""
        if within and self.hidden:
            first = self.hidden[0]
            return (f"intermediate tensor '{first.name}' differs by {first.max_rel:.3g} (beyond "
                    f"{self.bound(first.name):.3g}) although the outputs match on these random "
                    f"inputs (max error {self.max_error:.3g}): a change the outputs hide; "
                    f"{len(self.hidden)} of {len(self.intermediate)} compared intermediate "
                    "tensors differ")
        found = self.watching.sensitivity if self.watching else None
        if within and self.cannot_verify and found and found.error and not found.unnoticed:
            return (f"cannot verify: {found.error}: the check has not seen whether it would "
                    "notice a change there; give real inputs with --samples, or accept a check "
                    "that cannot see it with --accept-blind-spots")
        if within and self.cannot_verify:
            change = self.watching.sensitivity.change if self.watching and \
                self.watching.sensitivity else 0.01
            return (f"cannot verify: a {change:.0%} change in the weights of '{self.blind[0]}' "
                    f"shows in none of the compared values (the outputs, their logits and "
                    f"{len(self.intermediate)} intermediate tensors) on random inputs at any "
                    "scale tried; give real inputs with --samples, or accept a check that "
                    "cannot see it with --accept-blind-spots")
        if within:
            return f"max error {self.max_error:.3g} exceeds {self.allowed:.3g}{where}{nonfinite}"
        worst = self.exceeding[0]
        return (f"max error {worst.max_rel:.3g} exceeds {max(self.bounds(worst)):.3g} on "
                f"'{worst.name}'{_part_text(worst, self.bounds(worst))}{where}{nonfinite}")

    @property
    def nonfinite(self) -> int:
        return sum(o.nonfinite for o in self.outputs)

    def summary(self) -> str:
        """The numbers in plain words, for the report line."""
        floor = (f", float32 noise floor {self.noise_floor:.3g} from its {self.noise_source}"
                 if self.noise_floor else "")
        batches = (f" over {self.batches} batches, worst on {self.worst_batch}"
                   if self.batches > 1 else "")
        text = (f"max error {self.max_error:.3g}{batches} (tolerance {self.tolerance:g}{floor}; "
                f"reference: {self.reference})")
        for name, a in self.agreement.items():
            text += f"; top-1 agreement on '{name}': {a['agree']}/{a['rows']} rows"
        for error in self.outputs:
            if error.name.startswith("logits of "):
                text += f"\n  {error.name}: max error {error.max_rel:.3g}"
        for error in self.outputs:
            if error.parts:
                text += f"\n  {error.name}: judged at {error.judged}"
                text += _part_text(error, self.bounds(error))
        whole = [f"'{e.name}' ({e.scale:.3g})" for e in self.outputs
                 if not e.parts and not e.reason and e.scale > 0]
        if whole:
            more = f" and {len(whole) - 4} more" if len(whole) > 4 else ""
            text += (f"\n  judged as a whole, each against its own largest value: "
                     f"{', '.join(whole[:4])}{more}")
        if self.intermediate:
            worst = max(self.intermediate, key=lambda e: e.max_rel)
            text += (f"\n  {len(self.intermediate)} intermediate tensors: max error "
                     f"{worst.max_rel:.3g} ('{worst.name}')")
            if self.excused:
                text += f", {len(self.excused)} changed only inside a rewrite (readers match)"
        for note in self.notes():
            text += f"\n  {note}"
        if self.nonfinite:
            total = sum(int(np.prod(o.shape)) for o in self.outputs)
            text += (f"; {self.nonfinite} of {total} original output values are NaN/Inf: "
                     "they match by position, only the finite ones were compared")
        return text

    def as_dict(self) -> dict:
        return {"passed": self.passed, "max_error": float(self.max_error),
                "tolerance": float(self.tolerance), "noise_floor": float(self.noise_floor),
                "noise_floor_from": self.noise_source,
                "allowed": float(self.allowed), "deterministic": self.deterministic,
                "nonfinite_outputs": self.nonfinite, "reference": self.reference,
                "batches": self.batches, "worst_batch": self.worst_batch,
                "agreement": self.agreement,
                "outputs": [dict(o.as_dict(), allowed=[float(b) for b in self.bounds(o)],
                                 noise_floor=[float(f) for f in
                                              self.noise_floors.get(o.name, ())])
                            for o in self.outputs],
                "intermediate": {"compared": len(self.intermediate),
                                 "max_error": max((e.max_rel for e in self.intermediate),
                                                  default=0.0),
                                 "differ": [e.as_dict() for e in self.hidden],
                                 "excused": self.excused},
                "sensitivity": (self.watching.sensitivity.as_dict()
                                if self.watching and self.watching.sensitivity else None),
                "input_scale": self.watching.scale if self.watching else None,
                "saturated": self.watching.saturated if self.watching else [],
                "blind": self.blind, "blind_accepted": self.blind_accepted,
                "cannot_verify": self.cannot_verify,
                "notes": self.notes()}


def _part_text(error: OutputError, bounds: Sequence[float]) -> str:
    """The worst part of an output judged by parts, and its scale; "" for a whole tensor."""
    if not error.parts:
        return ""
    part, bound = max(zip(error.parts, bounds), key=lambda pb: pb[0].max_rel / pb[1])
    return (f" (worst part {part.where}: max error {part.max_rel:.3g} of its own scale "
            f"{part.scale:.3g}, allowed {bound:.3g})")


def compared_real_numbers(errors: Sequence["OutputError"]) -> bool:
    """The one rule for every check (verification, ONNX, SavedModel, TFLite): something was
    compared, and no output was NaN/Inf everywhere in the reference (nothing real there)."""
    return bool(errors) and all(e.reason or e.nonfinite < int(np.prod(e.shape)) for e in errors)


def worst_error(errors: Sequence["OutputError"]) -> float:
    """The largest relative error; infinite when nothing was compared (never a pass)."""
    return max((e.max_rel for e in errors), default=float("inf"))

def is_class_scores(value) -> bool:
    value = np.asarray(value)
    return value.ndim == 2 and value.shape[-1] >= 2 and value.dtype.kind == "f"


def top1_agreement(expected: np.ndarray, actual: np.ndarray, tolerance: float) -> dict:
    """Rows whose top-1 class is the same; a changed top-1 counts as a flip only where the
    original's top-2 margin exceeds tolerance × that row's magnitude (a near tie may go either
    way within rounding). Per row: a row of small scores can flip while the error, relative to
    the largest score of the batch, looks tiny."""
    same = np.argmax(expected, axis=-1) == np.argmax(actual, axis=-1)
    top2 = np.sort(expected, axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    scale = np.maximum(np.max(np.abs(expected), axis=-1), np.finfo(np.float32).tiny)
    flips = int(np.count_nonzero(~same & (margin > tolerance * scale)))
    return {"rows": int(same.size), "agree": int(np.count_nonzero(same)), "flips": flips}
