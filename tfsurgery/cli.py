"""Command line: ``tfsurgery optimize|inspect ...`` and ``python scripts/optimize.py ...``.

Exit status: 0 success, 1 verification failed, 2 bad input (one line on stderr, no traceback).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

log = logging.getLogger("tfsurgery")

EXAMPLES = """examples:
  tfsurgery optimize                         # the embedded demo model (the article's CNN)
  tfsurgery optimize frozen.pb --bn-fold     # -> frozen_optimized.pb next to the input
  tfsurgery optimize model.pbtxt -o lean.pb --outputs logits --training-flag is_train
  tfsurgery inspect frozen.pb --bn-fold      # what would change, without writing anything
"""


def _split(text: Optional[str]) -> List[str]:
    return [part.strip() for part in text.split(",") if part.strip()] if text else []


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", nargs="?", help="frozen graph (.pb or .pbtxt); omitted: the demo")
    parser.add_argument("--bn-fold", action="store_true",
                        help="fold batch norm into the preceding conv/matmul")
    parser.add_argument("--inputs", help="comma-separated input node names (default: detected)")
    parser.add_argument("--outputs", help="comma-separated output node names (default: detected)")
    parser.add_argument("--transforms", help="comma-separated transform names to run, in order")
    parser.add_argument("--training-flag", action="append", default=[], metavar="NAME",
                        help="a bool placeholder to treat as a training switch (repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true", help="more detail")
    parser.add_argument("-q", "--quiet", action="store_true", help="errors only")


def build_parser() -> argparse.ArgumentParser:
    from tfsurgery import __version__
    parser = argparse.ArgumentParser(
        prog="tfsurgery", description="Make trained TensorFlow graphs lean for inference, "
        "and prove the numbers did not change.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tfsurgery {__version__}")
    sub = parser.add_subparsers(dest="command")

    optimize = sub.add_parser("optimize", help="optimize a graph and verify it (default)",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(optimize)
    optimize.add_argument("-o", "--output", help="output file (default: <input>_optimized.pb)")
    optimize.add_argument("--no-verify", action="store_true", help="skip the numeric check")
    optimize.add_argument("--tolerance", type=float, default=None,
                          help="max allowed output error relative to the output's magnitude "
                               "(default 1e-4)")
    optimize.add_argument("--report-json", metavar="PATH", help="write the report as JSON")

    inspect = sub.add_parser("inspect", help="show the graph's interface and what each transform "
                             "would change (dry run)")
    _common(inspect)
    inspect.add_argument("--report-json", metavar="PATH", help="write the report as JSON")
    return parser


SUBCOMMANDS = ("optimize", "inspect")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["optimize"] + argv
    args = build_parser().parse_args(argv)
    _setup_logging(args)
    from tfsurgery.io import InputError
    try:
        return _run(args)
    except InputError as error:
        print(f"tfsurgery: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tfsurgery: interrupted", file=sys.stderr)
        return 130


def _setup_logging(args) -> None:
    if not args.verbose:
        _silence_native_stderr()
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")      # before TensorFlow is imported
    import tensorflow as tf
    tf.get_logger().setLevel(logging.DEBUG if args.verbose else logging.ERROR)


def _silence_native_stderr() -> None:
    """TensorFlow's C++ runtime writes start-up chatter (oneDNN, CUDA probing) straight to file
    descriptor 2, ignoring TF_CPP_MIN_LOG_LEVEL. Point fd 2 at /dev/null and give Python's
    sys.stderr a private copy of the real one, so our own messages still get through."""
    if getattr(_silence_native_stderr, "done", False) or sys.stderr is not sys.__stderr__:
        return                # already done, or stderr is captured (tests, notebooks)
    try:
        sys.stderr.flush()
        real = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        sys.stderr = os.fdopen(real, "w", buffering=1)
        _silence_native_stderr.done = True
    except (OSError, ValueError, AttributeError):
        pass                  # no real fd 2 (embedded interpreters, captured streams): keep it


def _run(args) -> int:
    from tfsurgery import api
    from tfsurgery.io import InputError
    from tfsurgery.pipeline import UnknownTransform
    try:
        transforms = api.choose_transforms(_split(args.transforms), bn_fold=args.bn_fold)
    except UnknownTransform as error:
        raise InputError(str(error)) from None
    source = api.load(args.input) if args.input else api.demo()
    if args.command == "inspect":
        return _inspect(args, source, transforms)
    return _optimize(args, source, transforms)


def _say(args, text: str = "") -> None:
    if not args.quiet:
        print(text)


def _optimize(args, source, transforms) -> int:
    from tfsurgery import api, report
    from tfsurgery.io import InputError
    output = Path(args.output) if args.output else api.default_output_path(source)
    result = api.optimize(source, transforms, inputs=_split(args.inputs),
                          outputs=_split(args.outputs), training_flags=args.training_flag,
                          verify=not args.no_verify, tolerance=args.tolerance)
    _say(args, f"{source.label}: {len(source.graph_def.node)} → "
               f"{len(result.graph_def.node)} nodes")
    _say(args, report.format_table(report.comparison_rows(
        report.summary(source.graph_def), report.summary(result.graph_def))))
    for line in report.transform_lines(result.reports, verbose=args.verbose):
        _say(args, line)
    data = result.as_report()
    if args.report_json:
        api.write_json(args.report_json, data, input_path=source.path)
    if result.verification is not None:
        v = result.verification
        _say(args, f"verification: max error {v.max_error:.3g} (tolerance {v.tolerance:g}; "
                   f"reference: {v.reference})")
        if not v.passed:
            print(f"tfsurgery: verification FAILED: max error {v.max_error:.3g} exceeds "
                  f"{v.tolerance:g}; nothing written", file=sys.stderr)
            return 1
    elif result.verification_error:
        print(f"tfsurgery: verification FAILED: {result.verification_error}; nothing written",
              file=sys.stderr)
        return 1
    api.save(result.graph_def, output, input_path=source.path)
    _say(args, f"wrote {output}")
    return 0


def _inspect(args, source, transforms) -> int:
    from tfsurgery import api, report
    result = api.optimize(source, transforms, inputs=_split(args.inputs),
                          outputs=_split(args.outputs), training_flags=args.training_flag,
                          verify=False)
    hist = report.op_histogram(source.graph_def)
    _say(args, f"{source.label}: {len(source.graph_def.node)} nodes, "
               f"{source.graph_def.ByteSize()} bytes")
    _say(args, f"inputs:  {', '.join(result.inputs) or '(none)'}")
    _say(args, f"outputs: {', '.join(result.outputs)}")
    _say(args, f"training flags: {', '.join(result.training_flags) or '(none)'}")
    _say(args, report.format_table(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])),
                                   headers=("op", "count")))
    _say(args, "dry run — what each transform would change:")
    for line in report.transform_lines(result.reports, verbose=args.verbose):
        _say(args, line)
    if args.report_json:
        api.write_json(args.report_json, result.as_report(), input_path=source.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
