"""The CPU this test run is on, in one line — the suite's summary prints it (conftest), so a log
says which kind of machine its results belong to (issue 47: AVX2-only, AVX-512 VNNI, AMX). The
detection is tfsurgery's own (``tfsurgery.int8.target.cpu_features``, what ``bench`` reports);
with the environment variables that change which kernels TensorFlow's oneDNN picks."""
import os

from tfsurgery.int8.target import cpu_features

# TensorFlow's oneDNN switch and ceiling (ONEDNN_MAX_CPU_ISA=AVX2 simulates an AVX2-only CPU)
ONEDNN_VARIABLES = ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA")


def kind(flags) -> str:
    """The CPU kind docs/performance.md has a row for."""
    if {"amx_int8", "amx_bf16"} & set(flags):
        return "AMX"
    if {"avx512_vnni", "avx_vnni"} & set(flags):
        return "AVX-512 VNNI" if "avx512f" in flags else "AVX-VNNI"
    if "avx512f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2-only"
    return "ARM" if {"asimd", "sve"} & set(flags) else "other"


def describe(cpuinfo=None, environ=None) -> str:
    """E.g. "CPU: AMD EPYC (AVX-512 VNNI: avx2 fma avx512f ...); TF_ENABLE_ONEDNN_OPTS=unset,
    ONEDNN_MAX_CPU_ISA=AVX2"."""
    environ = os.environ if environ is None else environ
    name, flags = cpu_features(cpuinfo)
    settings = ", ".join(f"{key}={environ.get(key, 'unset')}" for key in ONEDNN_VARIABLES)
    return f"CPU: {name} ({kind(flags)}: {' '.join(flags) or 'none of the flags we look for'}); " \
           f"{settings}"
