"""Everything ``--quantize int8`` takes besides its rows, in one object checked when it is made
(a bad value is one line, exit 2, before any work)."""
from __future__ import annotations

import dataclasses
from typing import Optional

from tfsurgery.errors import InputError
from tfsurgery.int8 import target as int8_target
from tfsurgery.int8.measures import Thresholds

SWITCHES = ("auto", "on", "off")                  # --int8-equalize, --int8-bias-correction
CALIBRATIONS = ("auto", "minmax", "percentile", "entropy")
# static: QDQ with calibrated activations (+ layers kept float when it misses: "mixed");
# dynamic: int8 weights, activations quantized at run time; auto: static, and dynamic too when
# static misses on the selection rows.
MODES = ("auto", "static", "dynamic")
TFLITE_IO = ("float32", "int8")
MIN_SPEEDUP = 1.0        # int8 not faster than float is refused unless the user says 0
SPEED_RUNS = 20          # interleaved runs per model when timing


@dataclasses.dataclass
class Int8Config:
    """``thresholds``: the gate's; ``calibration``/``equalize``/``bias_correction``: the static
    choices tried (docs/int8.md); ``modes``: see MODES; ``target``: the CPU the ONNX model is
    for ("auto": this machine); ``min_speedup``: the int8 model must run at least this many
    times as fast as its float ONNX here (None: 1.0; 0: speed reported only — int8 for size);
    ``tflite_io``: the full-integer TFLite model's inputs and outputs."""
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    calibration: str = "auto"
    equalize: str = "auto"
    bias_correction: str = "auto"
    modes: str = "auto"
    target: str = "auto"
    min_speedup: Optional[float] = None
    tflite_io: str = "float32"
    speed_runs: int = SPEED_RUNS

    def __post_init__(self):
        for flag, value, allowed in (("--int8-calibration", self.calibration, CALIBRATIONS),
                                     ("--int8-equalize", self.equalize, SWITCHES),
                                     ("--int8-bias-correction", self.bias_correction, SWITCHES),
                                     ("--int8-mode", self.modes, MODES),
                                     ("--tflite-io", self.tflite_io, TFLITE_IO)):
            if value not in allowed:
                raise InputError(f"{flag} {value}: choose from {', '.join(allowed)}")
        check_min_speedup(self.min_speedup)
        int8_target.settings(self.target)                 # an unknown target: exit 2

    @property
    def required_speedup(self) -> float:
        return MIN_SPEEDUP if self.min_speedup is None else self.min_speedup

    @property
    def settings(self) -> int8_target.Int8Settings:
        return int8_target.settings(self.target)


def check_min_speedup(min_speedup: Optional[float]) -> None:
    """A bad ``--int8-min-speedup``, before any work (exit 2)."""
    if min_speedup is not None and not min_speedup >= 0:
        raise InputError(f"--int8-min-speedup {min_speedup:g}: give a ratio of 0 or more (1, "
                         "the default: int8 must not be slower than float; 0: int8 for its "
                         "size, speed reported only)")
