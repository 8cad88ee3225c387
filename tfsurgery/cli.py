"""Command line: ``tfsurgery optimize|inspect|export ...`` and ``python scripts/optimize.py ...``.

Exit status: 0 success, 1 verification failed (TF graphs or ONNX vs TF, or ONNX conversion failed),
2 bad input (one line on stderr, no traceback).
"""
from __future__ import annotations

import argparse
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
  tfsurgery optimize frozen.pb --bn-fold --onnx lean.onnx   # also export to ONNX, checked
  tfsurgery export frozen.pb --bn-fold       # -> frozen.onnx next to the input (no .pb written)
  tfsurgery optimize frozen.pb --bn-fold --picture diff.svg --picture-scope backend/bn_1
  tfsurgery bench frozen.pb --bn-fold        # latency before/after in TF and onnxruntime
  tfsurgery bench frozen.pb --int8           # float vs int8 weights: size, latency, agreement
  tfsurgery optimize saved_model_dir -o lean_saved_model/   # a SavedModel back out, checked
  tfsurgery optimize frozen.pb --tflite lean.tflite --weights float16   # TFLite, float16 weights
"""


def _split(text: Optional[str]) -> List[str]:
    return [part.strip() for part in text.split(",") if part.strip()] if text else []


def _common(parser: argparse.ArgumentParser, checks: bool = True) -> None:
    parser.add_argument("input", nargs="?", help="frozen graph (.pb/.pbtxt), SavedModel directory "
                        "or Keras .keras/.h5 file; omitted: the demo model")
    parser.add_argument("--signature", default="serving_default",
                        help="SavedModel signature to optimize (default: serving_default)")
    parser.add_argument("--bn-fold", action="store_true",
                        help="fold batch norm into the preceding conv/matmul")
    parser.add_argument("--inputs", help="comma-separated input node names (default: detected)")
    parser.add_argument("--outputs", help="comma-separated output node names (default: detected)")
    parser.add_argument("--transforms", help="comma-separated transform names to run, in order; "
                        "'default' stands for the default pipeline (default,my-fix)")
    parser.add_argument("--enable", action="append", default=[], metavar="NAME",
                        help="add a transform to the default pipeline (repeatable)")
    parser.add_argument("--disable", action="append", default=[], metavar="NAME",
                        help="leave a transform out (repeatable)")
    parser.add_argument("--plugin", action="append", default=[], metavar="PATH.py|MODULE",
                        help="load users' transforms (@tfsurgery.transform) from a file or "
                             "module; name them in --transforms (repeatable)")
    parser.add_argument("--param", action="append", default=[], type=_param,
                        metavar="TRANSFORM.NAME=VALUE",
                        help="a transform's own parameter, e.g. fold-constants.max_bytes=1048576 "
                             "(repeatable; --list-transforms lists them)")
    parser.add_argument("--layout", choices=("NHWC",), default=None,
                        help="NHWC: compute NCHW convs, pools, batch norms and the ops between "
                             "them channels-last, runnable without oneDNN (layout-nhwc)")
    parser.add_argument("--exact", action="store_true",
                        help="only rewrites that are bit-exact in IEEE arithmetic (no "
                             "reassociation: simplify-algebra.exact=true)")
    parser.add_argument("--list-transforms", action="store_true",
                        help="list every transform (ours, --plugin's, installed) and exit")
    parser.add_argument("--training-flag", action="append", default=[], type=_setting,
                        metavar="NAME[=VALUE]",
                        help="a placeholder to freeze for inference: a bool training switch "
                             "(False), or NAME=VALUE, e.g. keep_prob=1.0 (repeatable)")
    parser.add_argument("--input-shape", action="append", default=[], type=_shape,
                        metavar="NAME=D0,D1,...",
                        help="an input's shape (-1 or ? for a free dimension); NAME may be any "
                             "tensor named in --inputs (repeatable)")
    parser.add_argument("--keep-asserts", action="store_true",
                        help="keep Assert, CheckNumerics and Print ops (strip-debug off)")
    if checks:            # inspect runs no graph: options about checking are not offered there
        parser.add_argument("--feed", action="append", default=[], type=_feed,
                            metavar="NAME=VALUE",
                            help="the value verification feeds an input: a number, true/false, "
                                 "a vector (0.6,0.7,0.7), or a .npy file (repeatable)")
        parser.add_argument("--samples", metavar="PATH",
                            help="your own input values: an .npz named by input (or a directory "
                                 "of .npy), rows stacked on the first axis; every row is checked")
        parser.add_argument("--check-n", type=int, default=1, metavar="N",
                            help="compare N batches of seeded random inputs (default 1: each "
                                 "batch is a full run of both graphs; with --samples, N-1 more)")
        parser.add_argument("--verify-timeout", type=_positive, default=None,
                            metavar="SECONDS",
                            help="deadline for each run of a graph during checks (default 120)")
    parser.add_argument("-v", "--verbose", action="store_true", help="more detail")
    parser.add_argument("-q", "--quiet", action="store_true", help="errors only")
    _preprocessing_options(parser)
    parser.add_argument("--weights", choices=("float32", "float16", "int8"), default="float32",
                        help="float16: store float32 weights of 64+ values as float16 with a Cast "
                             "back (about half the file; verified with tolerance 1e-2); int8: "
                             "conv/matmul weights of 1024+ values as int8 with per-channel "
                             "scales, float compute (about a quarter; tolerance 5e-2)")


def _deploy_options(parser: argparse.ArgumentParser) -> None:
    """SavedModel and TensorFlow Lite outputs, each loaded back, run and compared with TF."""
    group = parser.add_argument_group("deployment formats (each checked against TensorFlow)")
    group.add_argument("--saved-model", metavar="DIR",
                       help="also write the optimized graph as a SavedModel directory")
    group.add_argument("--tflite", metavar="OUT.tflite",
                       help="also convert to TensorFlow Lite, checked in the LiteRT interpreter")
    group.add_argument("--force", action="store_true",
                       help="replace an existing non-empty SavedModel directory")


def _preprocessing_options(parser: argparse.ArgumentParser) -> None:
    """--input-dtype etc.: the model then sees m = (reverse(x) - mean) / scale (add-preprocessing)."""
    group = parser.add_argument_group("preprocessing in the graph: the model sees "
                                      "(reverse(x) - mean) / scale")
    group.add_argument("--input-dtype", metavar="[NAME=]DTYPE",
                       help="the input takes this dtype (e.g. uint8), cast to the model's")
    group.add_argument("--reverse-input-channels", nargs="?", const=(None, True), default=None,
                       type=lambda text: (text or None, True), metavar="NAME",
                       help="reverse the input's channel order (BGR<->RGB)")
    group.add_argument("--mean-values", metavar="[NAME=]V[,V...]",
                       help="subtract these (one, or one per channel in the model's order)")
    group.add_argument("--scale-values", metavar="[NAME=]V[,V...]",
                       help="then divide by these (one, or one per channel)")


def _preprocess(args):
    """The preprocessing options, parsed after logging is set up (parsing imports TensorFlow,
    whose start-up chatter would otherwise reach stderr); bad text: InputError, exit 2."""
    from tfsurgery import api
    return api.requested_preprocessing(args.input_dtype, args.reverse_input_channels,
                                       args.mean_values, args.scale_values)


class UsageError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes get one line and exit status 2, like every other bad input."""

    def error(self, message):
        command = self.prog.split()[1:]          # "tfsurgery optimize" → the subcommand
        where = f"{command[0]}: " if command else ""
        raise UsageError(f"{where}{message} (see {self.prog} --help)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):      # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}")
    return value


def _named(text: str, what: str):
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME={what}, not {text!r}")
    return name.strip(), value.strip()


def _shape(text: str):
    name, dims = _named(text, "D0,D1,...")
    try:
        shape = [None if d.strip() in ("-1", "?", "") else int(d) for d in dims.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"dimensions must be integers, -1 or ?, not {dims!r}")
    if any(d is not None and d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"negative dimension in {dims!r}")
    return name, shape


def _scalar(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, true/false or .npy file")


def _feed(text: str):
    """NAME=VALUE: a number, true/false, a comma-separated vector (``0.6,0.7,0.7``, a 1-D
    array) or an .npy file; cast to the input's dtype and checked against its shape later."""
    import numpy as np
    name, value = _named(text, "VALUE")
    if value.endswith(".npy"):
        try:
            return name, np.load(value, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise argparse.ArgumentTypeError(f"cannot read {value}: {error}")
    if "," in value:
        items = [item.strip() for item in value.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"an empty value in the vector {value!r}")
        try:
            return name, np.asarray([_scalar(item) for item in items])
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{value!r}: a vector takes numbers or true/false "
                                             "separated by commas") from None
    return name, _scalar(value)


def _param(text: str):
    """TRANSFORM.NAME=VALUE → (transform, name, value text)."""
    target, value = _named(text, "VALUE")
    transform, dot, name = target.rpartition(".")
    if not dot or not transform or not name:
        raise argparse.ArgumentTypeError(f"expected TRANSFORM.NAME=VALUE, not {text!r}")
    return transform, name, value


def _params(given) -> dict:
    params: dict = {}
    for transform, name, value in given:
        params.setdefault(transform, {})[name] = value
    return params


def _setting(text: str):
    if "=" not in text:
        return text.strip(), None
    name, value = _named(text, "VALUE")
    return name, _scalar(value)


def _verify_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the numeric check of the optimized graph against the original")
    parser.add_argument("--tolerance", type=_positive, default=None,
                        help="max allowed output error relative to the output's magnitude "
                             "(default 1e-4; also used for ONNX vs TensorFlow)")
    parser.add_argument("--report-json", metavar="PATH", help="write the report as JSON")


def _onnx_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset for tf2onnx (default 18, the newest it tests)")
    parser.add_argument("--inputs-as-nchw", metavar="A,B",
                        help="make these rank-4 NHWC inputs NCHW in the ONNX model (tf2onnx)")
    parser.add_argument("--raw-onnx", action="store_true",
                        help="keep tf2onnx's output as is (skip the removal of identity "
                             "Reshapes and onnxruntime's basic graph "
                             "optimizations, e.g. MatMul+Add -> Gemm)")


def _int8_options(parser: argparse.ArgumentParser) -> None:
    """--quantize int8: static int8 ONNX, calibrated on --samples, checked on held-back rows."""
    group = parser.add_argument_group("int8 (ONNX; calibrated on --samples, checked on "
                                      "held-back rows against the float original)")
    group.add_argument("--quantize", choices=("int8",), default=None,
                       help="write the ONNX model as static QDQ int8 (per-channel weights)")
    group.add_argument("--check-fraction", type=float, default=0.25, metavar="F",
                       help="share of the --samples rows held back to check int8 (default "
                            "0.25, at least 8 rows)")
    group.add_argument("--check-samples", metavar="PATH",
                       help="check int8 on these rows instead (all of --samples calibrate)")
    group.add_argument("--tflite-io", choices=("float32", "int8"), default="float32",
                       help="with --tflite: the full-integer model's inputs and outputs "
                            "(default float32; int8: scale and zero point in the report)")
    group.add_argument("--int8-min-agreement", type=float, default=None, metavar="A",
                       help="min top-1 agreement with the float original for class-score "
                            "outputs (default 0.99)")
    group.add_argument("--int8-min-sqnr", type=float, default=None, metavar="DB",
                       help="min SQNR in dB for other outputs (default 20)")
    group.add_argument("--int8-max-float-layers", type=int, default=None, metavar="N",
                       help="most layers kept float when a threshold fails (default 10%% of "
                            "the layers, at least 1)")
    group.add_argument("--int8-calibration", default="auto",
                       choices=("auto", "minmax", "percentile", "entropy"),
                       help="ONNX calibration method (default auto: minmax and percentile "
                            "tried on the check rows, the best kept, both reported; entropy is "
                            "~20x slower and only when asked)")
    group.add_argument("--int8-equalize", default="auto", choices=("auto", "on", "off"),
                       help="cross-layer equalization before int8, ONNX or TFLite (default "
                            "auto: kept only if it quantizes better on the check rows; plain "
                            "and equalized are reported)")
    group.add_argument("--int8-bias-correction", default="auto", choices=("auto", "on", "off"),
                       help="correct each layer's bias for the mean shift its int8 weights "
                            "cause on the calibration rows (default auto: every attempt tried "
                            "with and without, the best on the check rows kept)")


def _picture_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--picture", metavar="OUT.svg|OUT.png",
                        help="draw the graph before and after side by side (Graphviz)")
    parser.add_argument("--picture-scope", metavar="PREFIX",
                        help="draw only nodes whose name starts with PREFIX (for big graphs)")


def build_parser() -> argparse.ArgumentParser:
    from tfsurgery import __version__
    parser = OneLineParser(
        prog="tfsurgery", description="Make trained TensorFlow graphs lean for inference, "
        "and prove the numbers did not change.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tfsurgery {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser)

    optimize = sub.add_parser("optimize", help="optimize a graph and verify it (default)",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(optimize)
    optimize.add_argument("-o", "--output", help="output file (default: <input>_optimized.pb); "
                          "DIR/ (with the trailing slash): a SavedModel")
    _verify_options(optimize)
    optimize.add_argument("--onnx", metavar="PATH",
                          help="also export the optimized graph to ONNX, checked against TF")
    _onnx_options(optimize)
    _int8_options(optimize)
    _deploy_options(optimize)
    _picture_options(optimize)

    inspect = sub.add_parser("inspect", help="show the graph's interface and what each transform "
                             "would change (dry run)")
    _common(inspect, checks=False)
    inspect.add_argument("--report-json", metavar="PATH", help="write the report as JSON")
    _picture_options(inspect)

    export = sub.add_parser("export", help="optimize, verify and export to ONNX, checked with "
                            "onnx.checker and onnxruntime against TensorFlow",
                            epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(export)
    export.add_argument("-o", "--output", help="ONNX file (default: <input stem>.onnx)")
    _verify_options(export)
    _onnx_options(export)
    _int8_options(export)
    _deploy_options(export)
    _picture_options(export)

    compare = sub.add_parser("compare", help="two graphs or artefacts on the same inputs: "
                             "every common tensor, the first and the worst divergence")
    compare.add_argument("a", help="the reference: a TensorFlow graph (.pb/.pbtxt, SavedModel "
                         "directory, .keras/.h5)")
    compare.add_argument("b", help="another TensorFlow graph, an .onnx or a .tflite model")
    compare.add_argument("--inputs", help="comma-separated input names (default: A's)")
    compare.add_argument("--outputs", help="comma-separated output names (default: A's)")
    compare.add_argument("--input-shape", action="append", default=[], type=_shape,
                         metavar="NAME=D0,D1,...")
    compare.add_argument("--feed", action="append", default=[], type=_feed, metavar="NAME=VALUE")
    compare.add_argument("--samples", metavar="PATH", help="feed the first row of your samples")
    compare.add_argument("--tolerance", type=_positive, default=None,
                         help="relative to each tensor's magnitude (default 1e-4)")
    compare.add_argument("--verify-timeout", type=_positive, default=None, metavar="SECONDS")
    compare.add_argument("--report-json", metavar="PATH", help="every tensor's error as JSON")
    compare.add_argument("-v", "--verbose", action="store_true", help="more detail")
    compare.add_argument("-q", "--quiet", action="store_true", help="errors only")

    bench = sub.add_parser("bench", help="latency before and after, in TensorFlow and "
                           "onnxruntime (interleaved runs, median and spread)")
    _common(bench)
    bench.add_argument("--runs", type=int, default=50, help="timed runs per variant (default 50)")
    bench.add_argument("--no-onnx", action="store_true", help="TensorFlow only")
    bench.add_argument("--int8", action="store_true",
                       help="the optimized float model against its --weights int8 twin in "
                            "TensorFlow, onnxruntime and TFLite: size, latency, agreement")
    bench.add_argument("--report-json", metavar="PATH", help="write the timings as JSON")
    return parser


SUBCOMMANDS = ("optimize", "inspect", "export", "bench", "compare")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--version" in argv[:argv.index("--")] if "--" in argv else "--version" in argv:
        argv = ["--version"]                      # anywhere: before or after the subcommand
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["optimize"] + argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        print(f"tfsurgery: error: {error}", file=sys.stderr)
        return 2
    _setup_logging(args)
    from tfsurgery import api
    from tfsurgery.api import InputError, StructureError
    api.progress.start()
    try:
        return _run(args)
    except InputError as error:
        print(f"tfsurgery: error: {error}", file=sys.stderr)
        return 2
    except StructureError as error:
        print(f"tfsurgery: FAILED: {error}; nothing written", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tfsurgery: interrupted", file=sys.stderr)
        return 130


def _setup_logging(args) -> None:
    if not args.verbose:
        _silence_native_stderr()
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    logging.getLogger("tfsurgery").setLevel(level)     # also where logging was set up before
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")      # before TensorFlow is imported
    import tensorflow as tf
    tf.get_logger().setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    # tf2onnx logs its progress at INFO and unsupported ops at ERROR; we report those ourselves.
    logging.getLogger("tf2onnx").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    # absl logs at INFO through Python logging (the SavedModel builder's "Writing fingerprint").
    logging.getLogger("absl").setLevel(logging.DEBUG if args.verbose else logging.WARNING)


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
    if args.command == "compare":
        return _compare(args)
    api.load_plugins(args.plugin)
    if args.list_transforms:
        _say(args, api.format_table(api.list_transforms(),
                                    headers=("transform", "runs", "from", "what it does",
                                             "parameters (--param)")))
        return 0
    transforms = api.choose_transforms(_split(args.transforms), bn_fold=args.bn_fold,
                                       enable=args.enable + (["layout-nhwc"] if args.layout
                                                             else []), disable=args.disable)
    args.preprocess = _preprocess(args)       # bad values: exit 2 before loading the model
    saved_model = _saved_model_path(args)
    api.check_output_paths([getattr(args, option, None)         # before minutes of work
                            for option in ("output", "report_json", "onnx", "picture", "tflite")
                            if not (option == "output" and _saved_model_from_output(args))],
                           opset=getattr(args, "opset", None),
                           picture_path=getattr(args, "picture", None))
    if getattr(args, "quantize", None):
        api.check_int8_request(args.samples, args.quantize, args.command == "export" or
                               bool(args.onnx) or bool(args.tflite),
                               _split(args.inputs_as_nchw), weights=args.weights)
    if saved_model is not None:
        api.check_saved_model_target(saved_model, force=args.force, input_path=args.input)
    source = api.load(args.input, args.signature) if args.input else api.demo()
    if getattr(args, "picture", None):
        api.check_drawable(source, args.picture_scope)
    if args.command == "inspect":
        return _inspect(args, source, transforms)
    if args.command == "bench":
        return _bench(args, source, transforms)
    return _optimize(args, source, transforms)


def _interface(args):
    """The options that describe the graph's interface, as api.optimize takes them."""
    from tfsurgery import api
    return api.Interface(
        inputs=_split(args.inputs), outputs=_split(args.outputs),
        training_flags=[name for name, value in args.training_flag if value is None],
        inference_values={name: value for name, value in args.training_flag
                          if value is not None},
        input_shapes=dict(args.input_shape), feeds=dict(getattr(args, "feed", [])))


def _checks(args, verify: bool = True, tolerance=None):
    from tfsurgery import api
    return api.Checks(verify=verify, tolerance=tolerance,
                      timeout=getattr(args, "verify_timeout", None))


def _options(args) -> dict:
    """api.optimize's other options: what the transforms do and what the checks run on."""
    return {"keep_asserts": args.keep_asserts, "preprocess": args.preprocess,
            "weights": args.weights, "samples": getattr(args, "samples", None),
            "check_n": getattr(args, "check_n", 1),
            "transform_params": _params(args.param), "exact": args.exact}


def _say(args, text: str = "") -> None:
    if not args.quiet:
        print(text)


def _optimize(args, source, transforms) -> int:
    """``optimize`` (writes the .pb, and the ONNX model with --onnx) and ``export`` (ONNX only):
    the API writes every target, all or nothing; here it is printed. Any failed check exits 1
    with nothing written."""
    from tfsurgery import api
    targets = _targets(args, source)
    result = _optimized(api, source, transforms, args, verify=not args.no_verify,
                        tolerance=args.tolerance)
    _say(args, f"{source.label}: {len(source.graph_def.node)} → "
               f"{len(result.graph_def.node)} nodes")
    _say(args, api.comparison_table(source.graph_def, result.graph_def))
    for line in api.transform_lines(result.reports, verbose=args.verbose):
        _say(args, line)
    _interface_notes(args, result)
    data = result.as_report()
    data["artefacts"] = []
    code = _check_verification(args, result)
    if code == 0:
        failed = None
        try:
            written = api.write(source, result, targets)
        except api.WriteFailed as error:
            failed, written, code = error, error.written, 1
        _say_checks(args, result, written)
        if failed is not None:
            print(f"tfsurgery: {failed.stage} FAILED: {failed}; nothing written",
                  file=sys.stderr)
        else:
            _say_written(args, written.artefacts)
        data.update(written.report())
    if args.report_json:           # last: it describes outputs that now exist (or a failed check)
        api.write_json(args.report_json, data, input_path=source.path)
    if code == 0 and args.picture:
        _say(args, f"wrote {args.picture}")
    return code


def _targets(args, source):
    """What to write, from the options (the API decides how)."""
    from tfsurgery import api
    exporting = args.command == "export"
    int8 = None
    if getattr(args, "quantize", None):
        int8 = api.Int8Targets(
            samples=args.samples, check_samples=args.check_samples,
            check_fraction=args.check_fraction,
            thresholds=api.Int8Thresholds(args.int8_min_agreement, args.int8_min_sqnr,
                                          args.int8_max_float_layers),
            calibration=args.int8_calibration, equalize=args.int8_equalize,
            bias_correction=args.int8_bias_correction, tflite_io=args.tflite_io)
    return api.Targets(
        pb=None if exporting or _saved_model_from_output(args) else (
            Path(args.output) if args.output else api.default_output_path(source)),
        saved_model=_saved_model_path(args), force=getattr(args, "force", False),
        tflite=getattr(args, "tflite", None) or None, onnx=_onnx_path(args, source),
        opset=getattr(args, "opset", None), inputs_as_nchw=_split(getattr(args, "inputs_as_nchw",
                                                                           None)),
        ort_optimize=not getattr(args, "raw_onnx", False), int8=int8,
        picture=getattr(args, "picture", None) or None,
        picture_scope=getattr(args, "picture_scope", None), allow_unverified=args.no_verify)


def _say_checks(args, result, written) -> None:
    """What each export's conversion and check found, in the order they ran."""
    from tfsurgery import api
    exported = written.onnx
    if exported is not None:
        path = Path(written.onnx_record["path"])
        _say(args, f"ONNX (opset {exported.opset}): {exported.node_count} nodes "
                   f"({exported.converted_node_count} from tf2onnx"
                   f"{''.join(f'; {n} {what}' for what, n in exported.tidied.items())})"
                   f"{', weights in ' + path.name + '.data' if exported.external_data else ''}")
        _say(args, api.format_table(
            _side_by_side(api.summary(result.graph_def), exported),
            headers=("TF after", "count", "ONNX", "count")))
        _say(args, f"ONNX check: max error {exported.max_error:.3g} vs {exported.reference} "
                   f"(tolerance {exported.tolerance:g}; onnx.checker passed)")
    if written.int8 is not None:
        _say_int8(args, written.int8)
    for artefact in written.checks:
        _say(args, f"{CHECK_NAMES[artefact.format]} check: {api.check_line(artefact)}")
    report = written.tflite_int8
    if report is not None and report.passed:
        measures = ", ".join(f"{o.name}: {o.measure} {o.value:.4g} (threshold {o.threshold:g})"
                             for o in report.outputs)
        equalized = " of the cross-layer-equalized graph" if report.model == "equalized" else ""
        _say(args, f"TFLite full-integer{equalized} ({report.io_type} I/O), checked on "
                   f"{report.check_rows} held-back rows against the float original: {measures}")
        if len(report.tried) > 1:
            _say(args, "  tried: " + "; ".join(
                f"{a.model}: " + ", ".join(f"{o.measure} {o.value:.4g}" for o in a.outputs)
                for a in report.tried))
        for name, q in report.io_quantization.items():
            _say(args, f"  int8 {name}: scale {q['scale']:.6g}, zero point {q['zero_point']}")


CHECK_NAMES = {"saved_model": "SavedModel", "tflite": "TFLite"}


def _say_written(args, artefacts: list) -> None:
    """One line per artefact written: its path, size and check result."""
    import math
    for artefact in artefacts:
        check = artefact.checked_by
        if math.isfinite(artefact.max_error):
            check += (f" against {artefact.reference}: max error {artefact.max_error:.3g} "
                      f"(tolerance {artefact.tolerance:g})")
        _say(args, f"wrote {artefact.path} ({FORMAT_NAMES[artefact.format]}, "
                   f"{artefact.weights} weights, {_size(artefact.bytes)}); {check}")


FORMAT_NAMES = {"pb": "frozen graph", "onnx": "ONNX", "saved_model": "SavedModel",
                "tflite": "TFLite"}


def _interface_notes(args, result) -> None:
    """How the source was frozen, and the inputs that no longer matter."""
    if result.frozen_form:
        _say(args, f"frozen form: {result.frozen_form}")
    for name in result.unused_inputs:
        _say(args, f"input '{name}' no longer matters: no output reads it after optimization; "
                   "dropped from the optimized interface (verification fed the original a "
                   "stand-in value there)")


def _saved_model_from_output(args) -> bool:
    """``optimize -o DIR/``: the output itself is a SavedModel (no .pb written)."""
    from tfsurgery import api
    return args.command == "optimize" and api.wants_directory(args.output)


def _saved_model_path(args) -> Optional[Path]:
    if getattr(args, "saved_model", None):
        return Path(args.saved_model)
    return Path(args.output) if _saved_model_from_output(args) else None


def _size(nbytes: int) -> str:
    return f"{nbytes / 1024:.1f} KiB" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):.1f} MiB"


def _optimized(api, source, transforms, args, *, verify: bool = True, tolerance=None,
               **options):
    """The optimized result — also when its check failed (``VerificationFailed`` carries it):
    the CLI still prints what changed and why the check failed, then writes nothing."""
    try:
        return api.optimize(source, transforms, interface=_interface(args),
                            checks=_checks(args, verify, tolerance),
                            **{**_options(args), **options})
    except api.VerificationFailed as failed:
        if failed.result is None:
            raise
        return failed.result


def _check_verification(args, result) -> int:
    if result.verification is not None:
        v = result.verification
        _say(args, f"verification: {v.summary()}")
        if not v.passed:
            where = f"; {result.divergence.line()}" if result.divergence else ""
            print(f"tfsurgery: verification FAILED: {v.failure()}{where}; nothing written",
                  file=sys.stderr)
            return 1
    elif result.verification_error:
        print(f"tfsurgery: verification FAILED: {result.verification_error}; nothing written",
              file=sys.stderr)
        return 1
    return 0


def _onnx_path(args, source) -> Optional[Path]:
    from tfsurgery import api
    if args.command != "export":
        return Path(args.onnx) if args.onnx else None
    return Path(args.output) if args.output else api.default_onnx_path(source)


def _say_int8(args, report) -> None:
    equalized = " of the cross-layer-equalized graph" if report.model == "equalized" else ""
    corrected = ", biases corrected" if report.bias_corrected else ""
    _say(args, f"int8{equalized} ({report.calibration_method} calibration{corrected} on "
               f"{report.calibration_rows} rows, checked on {report.check_rows} held-back rows "
               "against the float original):")
    eq = report.equalization
    if eq.get("asked", "off") != "off":
        how = (f"{eq.get('pairs', 0)} layer pair(s) equalized, {eq.get('refused', 0)} refused"
               + (f"; not used: {eq['why']}" if eq.get("why") else ""))
        _say(args, f"  cross-layer equalization ({eq['asked']}): {how}")
        for skipped in eq.get("transform", {}).get("skipped", [])[:5]:
            _say(args, f"    refused {skipped['node']}: {skipped['reason']}")
    if len(report.tried) > 1:
        _say(args, "  tried (error score, lower is better): " + "; ".join(
            f"{a.label}: " + ", ".join(f"{o.measure} {o.value:.4g}"
                                                  for o in a.outputs) + f" ({a.score:.4g})"
            for a in report.tried))
    for plain, final in zip(report.plain_outputs, report.outputs):
        changed = (f" (plain int8: {plain.value:.4g})" if report.kept_float else "")
        _say(args, f"  {final.name}: {final.measure} {final.value:.4g}{changed}, threshold "
                   f"{final.threshold:g}: {'ok' if final.passed else 'MISSED'}")
    if report.sensitivities:
        ranked = sorted(report.sensitivities.items(), key=lambda kv: -kv[1])
        _say(args, "  layer sensitivity (error drop with only that layer float): " +
             ", ".join(f"{name} {value:.3g}" for name, value in ranked[:10]))
    for name in report.kept_float:
        why = "to meet the thresholds" if report.passed else "tried: thresholds still missed"
        _say(args, f"  kept float: {name} (sensitivity {report.sensitivities[name]:.3g}; {why})")


def _side_by_side(tf_summary: dict, exported) -> List[tuple]:
    """Rows (TF op, count, ONNX op, count), each side by count, node totals first."""
    def ranked(hist):
        return sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))
    left = [("nodes", tf_summary["nodes"])] + ranked(tf_summary["ops"])
    right = [("nodes", exported.node_count)] + ranked(exported.op_histogram)
    right += [("", "")] * (len(left) - len(right))
    left += [("", "")] * (len(right) - len(left))
    return [l + r for l, r in zip(left, right)]


def _inspect(args, source, transforms) -> int:
    from tfsurgery import api
    result = api.optimize(source, transforms, interface=_interface(args),
                          checks=_checks(args, verify=False), **_options(args))
    hist = api.op_histogram(source.graph_def)
    _say(args, f"{source.label}: {len(source.graph_def.node)} nodes, "
               f"{source.graph_def.ByteSize()} bytes")
    _say(args, f"inputs:  {', '.join(result.inputs) or '(none)'}")
    _say(args, f"outputs: {', '.join(result.outputs)}")
    _say(args, f"training flags: {', '.join(result.training_flags) or '(none)'}")
    _say(args, api.format_table(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])),
                                headers=("op", "count")))
    _say(args, "dry run — what each transform would change:")
    for line in api.transform_lines(result.reports, verbose=args.verbose):
        _say(args, line)
    _interface_notes(args, result)
    if args.report_json:
        api.write_json(args.report_json, result.as_report(), input_path=source.path)
    if args.picture:
        api.draw(source, result, args.picture, scope=args.picture_scope)
        _say(args, f"wrote {args.picture}")
    return 0


def _bench(args, source, transforms) -> int:
    from tfsurgery import api
    api.check_runs(args.runs)                   # before the optimization runs
    if args.int8:
        return _bench_int8(args, source, transforms)
    result = _optimized(api, source, transforms, args)
    code = _check_verification(args, result)
    if code:
        return code
    from tfsurgery.api import ExportError, VerificationError
    try:
        timings = api.bench(source, result, runs=args.runs, onnx=not args.no_onnx)
    except (ExportError, VerificationError) as error:   # e.g. an op tf2onnx cannot convert
        print(f"tfsurgery: bench FAILED: {error}", file=sys.stderr)
        return 1
    by_runtime = {}
    for t in timings:
        by_runtime.setdefault(t.runtime, {})[t.variant] = t
    rows = [(runtime, _timing_cell(v["original"]), _timing_cell(v["optimized"]),
             _speedup(v["original"], v["optimized"])) for runtime, v in by_runtime.items()]
    _say(args, f"{source.label}: {len(source.graph_def.node)} → {len(result.graph_def.node)} "
               f"nodes; median ± interquartile range over {args.runs} interleaved runs, ms; "
               f"each runtime in its own process, {timings[0].threads} intra-op threads")
    _say(args, api.format_table(rows, headers=("runtime", "original", "optimized",
                                               "speed-up")))
    for t in timings:
        if t.skipped:
            _say(args, f"{t.runtime}, {t.variant} graph not timed: {t.skipped}")
    if args.report_json:
        api.write_json(args.report_json, {"runs": args.runs,
                                          "timings": [t.as_dict() for t in timings]},
                       input_path=source.path)
    return 0


def _bench_int8(args, source, transforms) -> int:
    """``bench --int8``: per runtime, the float and the int8-weight model's size, latency and
    the int8 model's error against the float one (top-1 agreement for class scores)."""
    from tfsurgery import api
    if args.weights != "float32":
        raise api.InputError("bench --int8 compares float32 with int8 weights: drop --weights")
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
               f"{args.runs} interleaved runs, ms; each runtime in its own process"
               f"{f', {timed[0].threads} intra-op threads' if timed else ''}; int8 vs float: "
               "max error relative to each output's magnitude (worst batch) and top-1 "
               "agreement, on " + ("every --samples row" if args.samples else
                                   "the random bench inputs (no accuracy claim)"))
    _say(args, api.format_table(rows, headers=("runtime", "float size", "int8 size", "float",
                                               "int8", "speed-up", "int8 vs float")))
    for side in sides:
        if side.skipped:
            _say(args, f"{side.runtime} not timed: {side.skipped}")
    if args.report_json:
        api.write_json(args.report_json, {"runs": args.runs,
                                          "int8": [side.as_dict() for side in sides]},
                       input_path=source.path)
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


def _compare(args) -> int:
    """``compare A B``: 0 when every compared tensor is within the tolerance, else 1."""
    from tfsurgery import api
    compared = api.compare(args.a, args.b, inputs=_split(args.inputs),
                           outputs=_split(args.outputs), feeds=dict(args.feed),
                           input_shapes=dict(args.input_shape), samples=args.samples,
                           tolerance=args.tolerance, timeout=args.verify_timeout)
    for line in compared.lines():
        _say(args, line)
    if args.report_json:
        api.write_json(args.report_json, compared.as_dict(), input_path=args.a)
    if not compared.passed:
        first = compared.first or compared.worst
        where = f": first divergence {first.name}" if first else ""
        print(f"tfsurgery: {args.b} differs from {args.a}{where}", file=sys.stderr)
        return 1
    return 0


def _timing_cell(timing) -> str:
    return "not convertible" if timing.skipped else \
        f"{timing.median_ms:.3f} ± {timing.spread_ms:.3f}"


if __name__ == "__main__":
    sys.exit(main())
