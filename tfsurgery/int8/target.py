"""Which int8 settings suit the CPU the model will run on (``--int8-target``).

onnxruntime's x86 integer kernels are built for uint8 activations × int8 weights (U8S8): with
int8 activations (S8S8) its QDQ fusion leaves many convolutions float, keeps the Quantize/
Dequantize pairs as real nodes, adds layout Transposes and fuses no Add — on a 2-core AMD EPYC
(AVX-512 VNNI) a MobileNetV2 ran 1.1–1.4× float with S8S8 and 2.0× with U8S8 (docs/int8.md).
Without VNNI, x86 multiplies u8×s8 pairs with VPMADDUBSW, whose 16-bit sums can saturate:
onnxruntime's answer is ``reduce_range`` (7-bit weights). ARM's dot-product kernels take int8
activations, onnxruntime's default there. Weights are int8 per output channel everywhere (QDQ).

``auto`` reads this machine (``platform.machine()``, the CPU flags of ``/proc/cpuinfo``); a model
that will run elsewhere names its target. Every choice carries why it was made, for the report.
"""
from __future__ import annotations

import dataclasses
import platform
from typing import List, Optional, Tuple

from tfsurgery.errors import InputError

TARGETS = ("auto", "x86", "x86-vnni", "arm")
# /proc/cpuinfo flags of an x86 CPU whose u8×s8 dot product does not saturate
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")
ARM_MACHINES = ("aarch64", "arm64")
CPUINFO = "/proc/cpuinfo"
# Instruction sets that decide which kernels the runtimes pick (int8 dot products, bf16, fp16):
# x86's, then ARM's (its /proc/cpuinfo "Features")
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
             "amx_bf16", "amx_int8", "amx_fp16", "asimd", "asimddp", "sve", "bf16", "i8mm")


@dataclasses.dataclass(frozen=True)
class Int8Settings:
    """How ``quantize_static`` is asked to quantize, for one target CPU, and why."""
    target: str                 # "x86", "x86-vnni" or "arm"
    activations: str            # "uint8" or "int8"
    weights: str = "int8"
    per_channel: bool = True
    reduce_range: bool = False  # 7-bit weights: no u8×s8 saturation without VNNI
    why: str = ""

    def quantize_static_options(self) -> dict:
        """The keyword arguments of ``onnxruntime.quantization.quantize_static`` that say how
        to quantize (QDQ: onnxruntime fuses it into QLinearConv/QLinearAdd/QGemm on CPU)."""
        from onnxruntime import quantization as q
        types = {"uint8": q.QuantType.QUInt8, "int8": q.QuantType.QInt8}
        return dict(quant_format=q.QuantFormat.QDQ, activation_type=types[self.activations],
                    weight_type=types[self.weights], per_channel=self.per_channel,
                    reduce_range=self.reduce_range)

    def quantize_dynamic_options(self) -> dict:
        """``quantize_dynamic``'s: its activations are always uint8 (DynamicQuantizeLinear);
        weights int8 per output channel as static's (on a BERT 4×256, seq 128: max relative
        error 0.094 per channel against 0.122 per tensor, speed the same; docs/int8.md)."""
        from onnxruntime import quantization as q
        return dict(weight_type=q.QuantType.QInt8, per_channel=self.per_channel,
                    reduce_range=self.reduce_range)

    @property
    def weights_label(self) -> str:
        """How the weights are stored: "7-bit per-channel", "8-bit per-tensor"."""
        return self.weights_label_of(self.reduce_range, self.per_channel)

    def weight_alternatives(self) -> List["Int8Settings"]:
        """These settings with each of onnxruntime's default weight settings that the target's
        guidance differs from — 8 bits where it says 7 (reduce_range), per tensor where it
        says per channel, and both (what ``quantize_dynamic`` and ``quantize_static`` do
        unasked) — the activations kept: they choose the kernels, i.e. the speed; the weights'
        bits and granularity do not. The int8 loop measures each on the selection rows and
        keeps the most accurate: guidance from documentation is a candidate, not a verdict
        (issue 47: on an AVX2-only EPYC the x86 target's 7-bit per-channel weights gave an
        encoder max error 0.094, onnxruntime's default 0.068)."""
        found = []
        for reduce_range in sorted({self.reduce_range, False}, reverse=True):
            for per_channel in sorted({self.per_channel, False}, reverse=True):
                if (reduce_range, per_channel) != (self.reduce_range, self.per_channel):
                    found.append(dataclasses.replace(
                        self, reduce_range=reduce_range, per_channel=per_channel,
                        why=f"{self.why}; weights {self.weights_label_of(reduce_range, per_channel)}"
                        f" measured more accurate on the selection rows than the target's "
                        f"{self.weights_label}"))
        return found

    @staticmethod
    def weights_label_of(reduce_range: bool, per_channel: bool) -> str:
        return f"{7 if reduce_range else 8}-bit " + ("per-channel" if per_channel else
                                                      "per-tensor")

    @property
    def summary(self) -> str:
        """One line: "x86-vnni: activations uint8, weights int8 per-channel (why)"."""
        weights = f"weights {self.weights}" + (" per-channel" if self.per_channel else "") + \
            (" in 7 bits (reduce_range)" if self.reduce_range else "")
        return f"{self.target}: activations {self.activations}, {weights} ({self.why})"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def settings(target: str = "auto", *, machine: Optional[str] = None,
             cpuinfo: Optional[str] = None) -> Int8Settings:
    """The settings for ``target`` (one of TARGETS). ``auto`` detects this machine;
    ``machine`` and ``cpuinfo`` stand in for ``platform.machine()`` and /proc/cpuinfo's text."""
    if target not in TARGETS:
        raise InputError(f"--int8-target {target}: choose from {', '.join(TARGETS)}")
    if target == "auto":
        target, why = detect(machine, cpuinfo)
    else:
        why = "asked for (--int8-target)"
    return for_target(target, why)


def for_target(target: str, why: str) -> Int8Settings:
    if target == "x86-vnni":
        return Int8Settings(target, "uint8", why=why + "; onnxruntime's x86 kernels are fast "
                            "for uint8 activations × int8 weights, and VNNI does not saturate")
    if target == "x86":
        return Int8Settings(target, "uint8", reduce_range=True,
                            why=why + "; uint8 activations × int8 weights for onnxruntime's x86 "
                            "kernels, weights in 7 bits since without VNNI their 16-bit sums "
                            "can saturate")
    return Int8Settings(target, "int8", why=why + "; int8 activations and weights, onnxruntime's "
                        "default, for ARM's dot-product kernels")


def detect(machine: Optional[str] = None, cpuinfo: Optional[str] = None) -> Tuple[str, str]:
    """(target, why) for this machine. Unknown x86 flags fall back to ``x86`` (reduce_range is
    correct on every x86, at one bit of weight precision); a machine neither x86 nor ARM to
    onnxruntime's default (the ``arm`` settings)."""
    machine = (platform.machine() if machine is None else machine) or "unknown"
    name = machine.lower()
    if name in ARM_MACHINES or name.startswith("arm"):
        return "arm", f"this machine is {machine}"
    if name not in X86_MACHINES:
        return "arm", (f"this machine is {machine}, neither x86 nor ARM: onnxruntime's default "
                       "settings")
    if cpuinfo is None:
        cpuinfo = _read_cpuinfo()
    if cpuinfo is None:
        return "x86", (f"this machine is {machine} and {CPUINFO} cannot be read, so no VNNI is "
                       "assumed")
    flags = cpu_flags(cpuinfo)
    found = [flag for flag in VNNI_FLAGS if flag in flags]
    if found:
        return "x86-vnni", f"this {machine} CPU has {', '.join(found)}"
    return "x86", f"this {machine} CPU has no VNNI ({'/'.join(VNNI_FLAGS)} not in its flags)"


def cpuinfo_value(cpuinfo: str, *keys: str) -> str:
    """The first CPU's value in /proc/cpuinfo's text for the first line keyed by one of
    ``keys`` ("" where none is)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return ""


def cpu_flags(cpuinfo: str, *, arm: bool = False) -> set:
    """The flags of the first CPU in /proc/cpuinfo's text ("flags" on x86; ``arm``: also
    "Features", ARM's)."""
    return set(cpuinfo_value(cpuinfo, "flags", *(("Features",) if arm else ())).split())


def cpu_name(cpuinfo: Optional[str] = None) -> str:
    """This CPU's model name with its int8-relevant flags, e.g. "AMD EPYC (avx512_vnni)"."""
    text = _read_cpuinfo() if cpuinfo is None else cpuinfo
    model = cpuinfo_value(text or "", "model name") or platform_name()
    flags = cpu_flags(text or "")
    shown = [f for f in ("avx2", "avx512f") + VNNI_FLAGS + ("amx_tile",) if f in flags]
    return f"{model} ({', '.join(shown)})" if shown else model


def cpu_features(cpuinfo: Optional[str] = None) -> Tuple[str, List[str]]:
    """This CPU's model name and which of CPU_FLAGS it has (``bench`` reports them; the test
    suite's summary line names them)."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    flags = cpu_flags(text, arm=True)
    return (cpuinfo_value(text, "model name") or platform_name(),
            [flag for flag in CPU_FLAGS if flag in flags])


def platform_name() -> str:
    """The CPU's name where /proc/cpuinfo has none."""
    return platform.processor() or platform.machine() or "unknown CPU"


def read_cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where it cannot be read)."""
    return _read_cpuinfo() or ""


def _read_cpuinfo() -> Optional[str]:
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None
