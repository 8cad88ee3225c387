"""The command line's grammar: the subcommands, their options and the option value types.
Usage mistakes raise ``UsageError`` (one line, exit status 2); nothing here runs a graph."""
from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  tfsurgery optimize                         # the embedded demo model (the article's CNN)
  tfsurgery optimize frozen.pb --bn-fold     # -> frozen_optimized.pb next to the input
  tfsurgery optimize model.pbtxt -o lean.pb --outputs logits --training-flag is_train
  tfsurgery inspect frozen.pb --bn-fold      # what would change, without writing anything
  tfsurgery optimize frozen.pb --bn-fold --onnx lean.onnx   # also export to ONNX, checked
  tfsurgery export frozen.pb --bn-fold       # -> frozen.onnx next to the input (no .pb written)
  tfsurgery optimize frozen.pb --bn-fold --picture diff.svg --picture-scope backend/bn_1
  tfsurgery bench frozen.pb --bn-fold        # every installed runtime; the fastest checked one
  tfsurgery bench frozen.pb --int8           # float vs int8 weights and static int8
  tfsurgery optimize saved_model_dir -o lean_saved_model/   # a SavedModel back out, checked
  tfsurgery optimize frozen.pb --tflite lean.tflite --store-weights float16   # TFLite, float16 weights
  tfsurgery optimize frozen.pb --openvino lean_ir/   # OpenVINO IR, checked at f32
  tfsurgery batch models/ -o lean/ --jobs 2 --bn-fold --onnx   # every model in a folder
"""
BATCH_USAGE = ("tfsurgery batch IN_DIR -o OUT_DIR [--jobs N] [--model-timeout SECONDS] "
               "[--engine local|ray [--ray-address ADDR [--ray-shared-output]]] [--onnx] "
               "[--tflite] [--saved-model] [--openvino] [--picture] [optimize options ...]")


def _common(parser: argparse.ArgumentParser, checks: bool = True) -> None:
    parser.add_argument("input", nargs="?", help="frozen graph (.pb/.pbtxt), SavedModel directory "
                        "or Keras .keras/.h5 file; omitted: the demo model")
    parser.add_argument("--signature", default="serving_default",
                        help="SavedModel signature to optimize (default: serving_default)")
    parser.add_argument("--bn-fold", action="store_true",
                        help="fold batch norm into the preceding conv/matmul")
    _model_code_options(parser)
    parser.add_argument("--inputs", help="comma-separated input node names (default: detected)")
    parser.add_argument("--outputs", help="comma-separated output node names (default: detected)")
    parser.add_argument("--transforms", help="comma-separated transform names to run, in order; "
                        "'default' stands for the default pipeline (default,my-fix)")
    _allow_op(parser)
    _repeatable(parser, "--enable", "NAME", "add a transform to the default pipeline")
    _repeatable(parser, "--disable", "NAME", "leave a transform out")
    _repeatable(parser, "--plugin", "PATH.py|MODULE", "load users' transforms "
                "(@tfsurgery.transform) from a file or module; name them in --transforms")
    _repeatable(parser, "--param", "TRANSFORM.NAME=VALUE", "a transform's own parameter, e.g. "
                "fold-constants.max_bytes=1048576 (--list-transforms lists them)", _param)
    parser.add_argument("--layout", choices=("NHWC",), default=None,
                        help="NHWC: compute NCHW convs, pools, batch norms and the ops between "
                             "them channels-last, runnable without oneDNN (layout-nhwc)")
    parser.add_argument("--exact", action="store_true",
                        help="only rewrites that are bit-exact in IEEE arithmetic (no "
                             "reassociation: simplify-algebra.exact=true)")
    parser.add_argument("--list-transforms", action="store_true",
                        help="list every transform (ours, --plugin's, installed) and exit")
    _repeatable(parser, "--training-flag", "NAME[=VALUE]", "a placeholder to freeze for "
                "inference: a bool training switch (False), or NAME=VALUE, e.g. keep_prob=1.0",
                _setting)
    _repeatable(parser, "--input-shape", "NAME=D0,D1,...", "an input's shape (-1 or ? for a "
                "free dimension); NAME may be any tensor named in --inputs", _shape)
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
    parser.add_argument("--store-weights", dest="weights", default="float32",
                        choices=WEIGHT_STORAGE,
                        help="how weights are stored, compute stays float: float16 stores "
                             "float32 weights of 64+ values as float16 with a Cast back (about "
                             "half the file; verified with tolerance 1e-2); int8 stores "
                             "conv/matmul weights of 1024+ values as int8 with per-channel "
                             "scales (about a quarter; tolerance 5e-2). To compute in int8: "
                             "--quantize int8")
    parser.add_argument("--weights", dest="weights", choices=WEIGHT_STORAGE,
                        action=_RenamedOption, new_name="--store-weights",
                        help=argparse.SUPPRESS)


WEIGHT_STORAGE = ("float32", "float16", "int8")


class _RenamedOption(argparse.Action):
    """An option's old spelling: still works for one release, with a warning naming the new."""

    def __init__(self, option_strings, dest, new_name, **kwargs):
        self.new_name = new_name
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"warning: {option_string} is now {self.new_name} (it says what it does); "
              f"{option_string} goes in the next release", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _allow_op(parser: argparse.ArgumentParser) -> None:
    _repeatable(parser, "--allow-op", "OP", "let the model run this op although it acts outside "
                "the graph (ReadFile, WriteFile, PyFunc, ...: refused by default, nothing run); "
                "transforms still never evaluate it")


def _model_code_options(parser: argparse.ArgumentParser) -> None:
    """The code loading a Keras model may run: only what the user trusts or names."""
    parser.add_argument("--trust-model", action="store_true",
                        help="load a Keras file holding Python code (a Lambda layer's, which "
                             "loading runs); refused otherwise")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="MODULE|PATH.py",
                        help="import the module defining a Keras model's custom layers first "
                             "(registered classes resolve; its classes are the loaders' "
                             "custom_objects) (repeatable)")


def _repeatable(parser: argparse.ArgumentParser, flag: str, metavar: str, text: str,
                kind=str) -> None:
    """An option given any number of times, each value parsed by ``kind``."""
    parser.add_argument(flag, action="append", default=[], type=kind, metavar=metavar,
                        help=f"{text} (repeatable)")


def _deploy_options(parser: argparse.ArgumentParser) -> None:
    """SavedModel and TensorFlow Lite outputs, each loaded back, run and compared with TF."""
    group = parser.add_argument_group("deployment formats (each checked against TensorFlow)")
    group.add_argument("--saved-model", metavar="DIR",
                       help="also write the optimized graph as a SavedModel directory")
    group.add_argument("--tflite", metavar="OUT.tflite",
                       help="also convert to TensorFlow Lite, checked in the LiteRT interpreter")
    group.add_argument("--openvino", metavar="DIR",
                       help="also write OpenVINO IR (DIR/model.xml + .bin; needs the openvino "
                            "extra), checked in OpenVINO's CPU runtime")
    group.add_argument("--openvino-precision", default="f32", metavar="f32|bf16|f16",
                       help="OpenVINO inference precision the IR is checked at (default f32; "
                            "bf16/f16 only where the CPU has them, each at its own tolerance)")
    group.add_argument("--openvino-tolerance", type=_positive, default=None, metavar="T",
                       help="the OpenVINO check's tolerance (default: the precision's own, "
                            "f32 1e-3, bf16 5e-2, f16 2e-2, or --tolerance if looser)")
    group.add_argument("--force", action="store_true",
                       help="replace an existing non-empty SavedModel or OpenVINO directory")


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
    parser.add_argument("--accept-blind-spots", action="store_true",
                        help="pass a check although a 1%% change in some layer's weights shows "
                             "in nothing it compares on random inputs (else: 'cannot verify', "
                             "exit 1; --samples gives real inputs instead)")


def _onnx_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset for tf2onnx (default 18, the newest it tests)")
    parser.add_argument("--inputs-as-nchw", metavar="A,B",
                        help="make these rank-4 NHWC inputs NCHW in the ONNX model (tf2onnx)")
    parser.add_argument("--raw-onnx", action="store_true",
                        help="keep tf2onnx's output as is (skip the removal of identity "
                             "Reshapes and onnxruntime's basic graph "
                             "optimizations, e.g. MatMul+Add -> Gemm)")
    parser.add_argument("--onnx-fusions", default="auto", metavar="auto|all|none|A,B",
                        help="transformer patterns made onnxruntime's fused kernels "
                             "(fuse-layer-norm, fuse-gelu, fuse-attention): auto (default) "
                             "keeps those that make this model faster in onnxruntime on this "
                             "CPU, timed at export; all; none; or a list")


# the int8 gate's thresholds (None: quantize.Thresholds' defaults): flag, type, metavar, help
INT8_THRESHOLDS = (
    ("--int8-min-agreement", float, "A", "min top-1 agreement with the float original for "
     "class-score outputs, judged by its 95%% lower confidence bound on the gate rows (default "
     "0.99: at least 299 gate rows; 0: no agreement gate)"),
    ("--int8-min-sqnr", float, "DB", "min SQNR in dB for value outputs (embeddings, "
     "regressions: no Softmax/ArgMax head; default 20, i.e. relative error 0.1)"),
    ("--int8-max-accuracy-drop", float, "D", "with labels: most the int8 accuracy may fall "
     "below float's on the gate rows (default 0.01)"),
    ("--int8-max-float-layers", int, "N", "most layers kept float when a threshold fails "
     "(default 10%% of the layers, at least 1)"),
)


def _int8_options(parser: argparse.ArgumentParser) -> None:
    """--quantize int8: static int8 ONNX/TFLite; --samples cut into calibration, selection and
    gate rows (docs/int8.md)."""
    group = parser.add_argument_group("int8 (ONNX/TFLite/OpenVINO; --samples calibrate, choose "
                                      "and, on rows no choice saw, gate against the float "
                                      "original)")
    group.add_argument("--quantize", choices=("int8",), default=None,
                       help="write the ONNX model as int8 (static QDQ, per-channel weights; "
                            "dynamic when static misses), the TFLite model full-integer (or "
                            "dynamic range), the OpenVINO IR through NNCF")
    group.add_argument("--int8-mode", dest="int8_mode", default="auto",
                       choices=("auto", "static", "dynamic"),
                       help="static: activations calibrated (layers kept float when it misses: "
                            "mixed); dynamic: int8 weights, activations quantized at run time "
                            "(ONNX quantize_dynamic, TFLite dynamic range); default auto: "
                            "static, and dynamic too when static misses on the selection rows")
    group.add_argument("--check-fraction", type=float, default=0.4, metavar="F",
                       help="share of the --samples rows kept as gate rows, seen by no choice "
                            "(default 0.4, at least 8; 0.2 more choose, the rest calibrate)")
    group.add_argument("--check-samples", metavar="PATH",
                       help="gate int8 on these rows instead (--samples calibrate and choose)")
    group.add_argument("--labels", metavar="PATH",
                       help="each --samples row's class (.npy), when --samples has no 'labels' "
                            "array: float and int8 accuracy reported and gated")
    group.add_argument("--tflite-io", choices=("float32", "int8"), default="float32",
                       help="with --tflite: the full-integer model's inputs and outputs "
                            "(default float32; int8: scale and zero point in the report)")
    for flag, kind, metavar, text in INT8_THRESHOLDS:
        group.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)
    group.add_argument("--int8-calibration", default="auto",
                       choices=("auto", "minmax", "percentile", "entropy"),
                       help="ONNX calibration method (default auto: minmax and percentile "
                            "tried on the selection rows, the best kept, both reported; entropy is "
                            "~20x slower and only when asked)")
    group.add_argument("--int8-equalize", default="auto", choices=("auto", "on", "off"),
                       help="cross-layer equalization before int8, ONNX or TFLite (default "
                            "auto: kept only if it quantizes better on the selection rows; plain "
                            "and equalized are reported)")
    group.add_argument("--int8-bias-correction", default="auto", choices=("auto", "on", "off"),
                       help="correct each layer's bias for the mean shift its int8 weights "
                            "cause on the calibration rows (default auto: every attempt tried "
                            "with and without, the best on the selection rows kept)")
    group.add_argument("--int8-target", default="auto",
                       choices=("auto", "x86", "x86-vnni", "arm"),
                       help="the CPU the int8 ONNX will run on (default auto: this machine): "
                            "x86 and x86-vnni take uint8 activations × int8 weights, x86 (no "
                            "VNNI) in 7-bit weights (reduce_range), arm int8 × int8")
    group.add_argument("--int8-min-speedup", type=float, default=None, metavar="X",
                       help="refuse an int8 ONNX that runs less than X times as fast as the "
                            "float ONNX on this machine (each mode timed before writing; "
                            "default 1: int8 not faster is not written; 0: int8 for its size, "
                            "speed reported only)")


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
    # every subcommand reports as JSON the same way: the option is declared once, here
    reporting = argparse.ArgumentParser(add_help=False)
    reporting.add_argument("--report-json", metavar="PATH",
                           help="write the report as JSON (bench: the timings; compare: every "
                                "tensor's error)")

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[reporting], **kwargs)

    optimize = command("optimize", help="optimize a graph and verify it (default)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(optimize)
    optimize.add_argument("-o", "--output", help="output file (default: <input>_optimized.pb); "
                          "DIR/ (with the trailing slash): a SavedModel")
    optimize.add_argument("--output-format", choices=("pb", "saved-model"), default=None,
                          help="what -o writes: a frozen graph (pb) or a SavedModel directory "
                               "(saved-model); default: a SavedModel when -o ends with /, else pb")
    _verify_options(optimize)
    optimize.add_argument("--onnx", metavar="PATH",
                          help="also export the optimized graph to ONNX, checked against TF")
    _onnx_options(optimize)
    _int8_options(optimize)
    _deploy_options(optimize)
    _picture_options(optimize)

    inspect = command("inspect", help="show the graph's interface and what each transform "
                      "would change (dry run)")
    _common(inspect, checks=False)
    inspect.add_argument("--load", action="store_true",
                         help="load a SavedModel or Keras file (runs its initializers, restores "
                              "its variables) and dry-run the transforms; without it, inspect "
                              "reads its protos only")
    _picture_options(inspect)

    export = command("export", help="optimize, verify and export to ONNX, checked with "
                     "onnx.checker and onnxruntime against TensorFlow",
                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(export)
    export.add_argument("-o", "--output", help="ONNX file (default: <input stem>.onnx)")
    _verify_options(export)
    _onnx_options(export)
    _int8_options(export)
    _deploy_options(export)
    _picture_options(export)

    compare = command("compare", help="two graphs or artefacts on the same inputs: "
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
    _allow_op(compare)
    _model_code_options(compare)
    compare.add_argument("-v", "--verbose", action="store_true", help="more detail")
    compare.add_argument("-q", "--quiet", action="store_true", help="errors only")

    _batch_command(sub)

    bench = command("bench", help="latency in every installed runtime (TensorFlow, "
                    "onnxruntime, TFLite, OpenVINO), each artefact checked; names the fastest "
                    "checked one (interleaved runs, median and spread)")
    _common(bench)
    bench.add_argument("--runs", type=int, default=50, help="timed runs per variant (default 50)")
    bench.add_argument("--runtimes", metavar="A,B",
                       help="time only these: tensorflow, onnxruntime, tflite, openvino "
                            "(default: every one installed)")
    bench.add_argument("--no-onnx", action="store_true", help="leave onnxruntime out")
    bench.add_argument("--plot", metavar="OUT.svg",
                       help="also draw the timings as a bar chart (SVG)")
    bench.add_argument("--int8", action="store_true",
                       help="the optimized float model against its --store-weights int8 twin in "
                            "TensorFlow, onnxruntime and TFLite, and against static int8 "
                            "(--quantize int8's QDQ for this CPU) in onnxruntime and NNCF's "
                            "in OpenVINO (when installed): size, latency, agreement")
    return parser


SUBCOMMANDS = ("optimize", "inspect", "export", "bench", "compare", "batch")


def _batch_command(sub) -> None:
    """``batch``: its own options here; every other option is an ``optimize`` option, checked
    by optimize's grammar and handed to each model's run (see parse_args)."""
    batch = sub.add_parser(
        "batch", usage=BATCH_USAGE, allow_abbrev=False,
        help="optimize every model in a folder, N at once, each in its own process: "
             "OUT_DIR/<model>/ and OUT_DIR/summary.json (docs/batch.md)",
        description="Every .pb/.pbtxt/.keras/.h5 file and SavedModel folder in IN_DIR, "
                    "optimized with the same optimize options (tfsurgery optimize --help); "
                    "exit status 0 when all are ok, 1 when any is not.")
    batch.add_argument("-o", "--output", required=True, metavar="OUT_DIR",
                       help="where each model's outputs and summary.json go")
    batch.add_argument("--jobs", type=_whole, default=1, metavar="N",
                       help="models at once (default 1; each TensorFlow uses every core)")
    batch.add_argument("--model-timeout", type=_positive, default=None, metavar="SECONDS",
                       help="deadline per model, then it is killed and reported (default 1800)")
    batch.add_argument("--engine", choices=("local", "ray"), default="local",
                       help="local processes (default) or a Ray cluster (pip install ray)")
    batch.add_argument("--ray-address", metavar="ADDRESS",
                       help="the Ray cluster to use (default: a local instance for this run); "
                            "each node's outputs travel back to OUT_DIR here")
    batch.add_argument("--ray-shared-output", action="store_true",
                       help="with --ray-address: OUT_DIR is on a filesystem the nodes share; "
                            "they write there, and each output is checked visible here")
    group = batch.add_argument_group("also per model, each checked (OUT_DIR/<model>/...)")
    group.add_argument("--onnx", action="store_true", help="<model>.onnx")
    group.add_argument("--tflite", action="store_true", help="<model>.tflite")
    group.add_argument("--saved-model", action="store_true", help="<model>_saved_model/")
    group.add_argument("--openvino", action="store_true",
                       help="<model>_openvino/ (OpenVINO IR; --openvino-precision applies)")
    group.add_argument("--picture", action="store_true", help="<model>.svg")


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def parse_args(argv):
    """The command line as a namespace. ``batch`` takes its own options and passes the rest
    on: those must parse as ``optimize`` options (which also finds IN_DIR, optimize's input);
    ``args.optimize`` is what they mean, ``args.optimize_argv`` the words each model gets."""
    parser = build_parser()
    if argv[:1] != ["batch"] or "-h" in argv or "--help" in argv:
        return parser.parse_args(argv)
    args, rest = parser.parse_known_args(argv)
    options = _optimize_options(rest)
    if options.input is None:
        raise UsageError("batch: the folder of models (IN_DIR) is missing "
                         "(see tfsurgery batch --help)")
    args.optimize, args.optimize_argv = options, _without_input(rest, options)
    args.verbose, args.quiet = options.verbose, options.quiet
    return args


def _optimize_options(words):
    try:
        return build_parser().parse_args(["optimize", *words])
    except UsageError as error:
        raise UsageError(str(error).replace("optimize: ", "batch: ", 1).replace(
            "tfsurgery optimize --help", "tfsurgery batch --help")) from None


def _without_input(words, options):
    """``words`` less the one word optimize took as its input: the removal that leaves the
    same options and no input."""
    same = repr(sorted({**vars(options), "input": None}.items()))
    for i, word in enumerate(words):
        if word == options.input:
            rest = words[:i] + words[i + 1:]
            try:
                again = _optimize_options(rest)
            except UsageError:
                continue
            if repr(sorted(vars(again).items())) == same:
                return rest
    raise UsageError(f"batch: cannot tell the folder {options.input!r} from an option's value "
                     "(see tfsurgery batch --help)")
