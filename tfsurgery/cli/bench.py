"""``bench`` and ``bench --int8``: each runtime's artefacts checked then timed in a process of
its own, printed as a table with speed-ups against TensorFlow's original."""
from __future__ import annotations

import sys
from typing import List

from tfsurgery.cli.common import _check_verification, _optimized, _say, _size, _split


def _bench(args, source, transforms) -> int:
    """``bench``: every installed runtime (or --runtimes), each artefact checked then timed in
    a process of its own; the fastest checked one named, with the CPU."""
    from tfsurgery import api
    api.check_runs(args.runs)                   # before the optimization runs
    api.check_plot(args.plot)
    if args.int8:
        if args.plot:
            raise api.InputError("--plot draws the runtimes' bench; bench --int8 has no plot")
        return _bench_int8(args, source, transforms)
    runtimes = api.check_runtimes(_split(args.runtimes))
    if args.no_onnx:
        runtimes = [r for r in runtimes if r != "onnxruntime"]
    result = _optimized(api, source, transforms, args)
    code = _check_verification(args, result)
    if code:
        return code
    try:
        bench = api.bench_runtimes(source, result, runs=args.runs, runtimes=runtimes)
    except (api.ExportError, api.VerificationError) as error:   # e.g. an op tf2onnx cannot convert
        print(f"tfsurgery: bench FAILED: {error}", file=sys.stderr)
        return 1
    if args.plot:
        api.write_bench_plot(bench, args.plot, input_path=source.path)
    return _say_bench(args, source, result, bench)


def _say_bench(args, source, result, bench) -> int:
    """The bench's header, CPU, table, what it could not time, the fastest checked artefact,
    and its JSON (``--report-json``)."""
    from tfsurgery import api
    timed = [e.timing for e in bench.entries if e.timing]
    threads = f", {timed[0].threads} intra-op threads" if timed else ""
    _say(args, f"{source.label}: {len(source.graph_def.node)} → {len(result.graph_def.node)} "
               f"nodes; median ± interquartile range over {args.runs} interleaved runs, ms; "
               f"each runtime in its own process (onnxruntime and OpenVINO: each model, as "
               f"a plain session runs it){threads}")
    _say(args, f"CPU: {bench.cpu['name']} ({' '.join(bench.cpu['flags']) or 'no listed flags'})")
    baseline = next((e.timing for e in bench.entries
                     if (e.runtime, e.model) == ("tensorflow", "original") and e.timing), None)
    rows = [(e.runtime, e.model, e.precision, e.check.line() if e.check else "the reference",
             _timing_cell(e.timing) if e.timing else
             ("check missed" if e.check and not e.check.passed else "not convertible"),
             _speedup(baseline, e.timing) if baseline and e.timing else "-")
            for e in bench.entries]
    table = api.format_table(rows, headers=("runtime", "model", "precision",
                                            "check (max error vs tolerance)", "ms", "speed-up"))
    notes = [f"{e.runtime}, {e.model} graph not timed: {e.skipped}"
             for e in bench.entries if e.skipped]
    notes += [f"{runtime}: not installed" + (" (pip install 'tfsurgery[openvino]')"
                                             if runtime == "openvino" else "")
              for runtime in bench.missing]
    fastest = bench.fastest()
    if fastest is not None:
        ratio = f", {baseline.median_ms / fastest.timing.median_ms:.2f}x TensorFlow's " \
                "original" if baseline else ""
        notes.append(f"fastest checked on this machine: {fastest.runtime} {fastest.model} "
                     f"{fastest.precision} ({fastest.timing.median_ms:.3g} ms{ratio})")
    if args.plot:
        notes.append(f"wrote {args.plot}")
    report = {**bench.as_dict(), "timings": [e.timing.as_dict() if e.timing else
                                             _skipped_timing(e) for e in bench.entries]}
    return _bench_table(args, source, table, notes, report)


def _skipped_timing(entry) -> dict:
    return {"runtime": entry.runtime, "variant": entry.variant, "median_ms": None,
            "spread_ms": None, "threads": 0, "skipped": entry.skipped}


def _bench_int8(args, source, transforms) -> int:
    """``bench --int8``: per runtime, the float and the int8-weight model's size, latency and
    the int8 model's error against the float one (top-1 agreement for class scores)."""
    from tfsurgery import api
    if args.weights != "float32":
        raise api.InputError("bench --int8 compares float32 with int8 weights: drop --store-weights")
    result = _optimized(api, source, transforms, args)
    code = _check_verification(args, result)
    if code:
        return code
    int8 = _optimized(api, source, transforms, args, weights="int8")
    if int8.verification is None:
        return _check_verification(args, int8)         # could not compare: exit 1
    _say(args, f"int8 weights: {int8.verification.summary()}")
    if not int8.verification.passed:
        _say(args, f"int8 weights MISS their check ({int8.verification.failure()}): timed "
                   "anyway; bench writes nothing, and optimize would refuse to")
    try:
        sides = api.bench_int8(source, result, int8, runs=args.runs, onnx=not args.no_onnx)
    except (api.ExportError, api.VerificationError) as error:
        print(f"tfsurgery: bench FAILED: {error}", file=sys.stderr)
        return 1
    rows = []
    for side in sides:
        if side.skipped:
            rows.append((side.runtime, "-", "-", "not converted", "-", "-", "-"))
            continue
        float_t, int8_t = side.timings["float"], side.timings["int8"]
        agree = "".join(f"; top-1 {a['agree']}/{a['rows']}" for a in side.agreement.values())
        rows.append((side.runtime, _size(side.bytes["float"]), _size(side.bytes["int8"]),
                     _timing_cell(float_t), _timing_cell(int8_t), _speedup(float_t, int8_t),
                     f"{side.max_error:.3g}{agree}"))
    timed = [t for side in sides for t in side.timings.values()]
    _say(args, f"{source.label}: float32 against int8 weights; median ± interquartile range over "
               f"{args.runs} interleaved runs, ms; each runtime in its own process "
               f"(onnxruntime and OpenVINO: each model)"
               f"{f', {timed[0].threads} intra-op threads' if timed else ''}; int8 vs float: "
               "max error relative to each output's magnitude (worst batch) and top-1 "
               "agreement, on " + ("every --samples row" if args.samples else
                                   "the random bench inputs (no accuracy claim)"))
    return _bench_table(args, source, api.format_table(
        rows, headers=("runtime", "float size", "int8 size", "float", "int8", "speed-up",
                       "int8 vs float")),
        [f"{side.runtime} not timed: {side.skipped}" for side in sides if side.skipped],
        {"int8": [side.as_dict() for side in sides]})


def _bench_table(args, source, table: str, not_timed: List[str], report: dict) -> int:
    """A bench's table, what it could not time, and its JSON (``--report-json``)."""
    from tfsurgery import api
    _say(args, table)
    for line in not_timed:
        _say(args, line)
    if args.report_json:
        api.write_json(args.report_json, {"runs": args.runs, **report}, input_path=source.path)
    return 0


def _speedup(original, optimized) -> str:
    """The ratio of medians — or "≈ (n.s.)" when the interquartile ranges overlap: then the
    spread says more than the ratio."""
    if original.skipped or optimized.skipped:
        return "-"
    ratio = original.median_ms / optimized.median_ms
    low_a, high_a = original.median_ms - original.spread_ms / 2, \
        original.median_ms + original.spread_ms / 2
    low_b, high_b = optimized.median_ms - optimized.spread_ms / 2, \
        optimized.median_ms + optimized.spread_ms / 2
    overlap = low_a <= high_b and low_b <= high_a
    return f"≈ {ratio:.2f}x (n.s.)" if overlap else f"{ratio:.2f}x"


def _timing_cell(timing) -> str:
    return "not convertible" if timing.skipped else \
        f"{timing.median_ms:.3f} ± {timing.spread_ms:.3f}"

