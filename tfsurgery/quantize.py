"""Static int8 for onnxruntime, calibrated on the user's samples and checked on held-back ones.

The float ONNX model is quantized with ``onnxruntime.quantization.quantize_static`` (QDQ,
per-channel weights) over the calibration rows, then every output is compared, on the check rows,
with the float ORIGINAL graph run in TensorFlow: top-1 agreement for class-score outputs (rank 2,
last dimension ≥ 2), SQNR in dB for the rest. When a threshold fails, each quantized layer's
sensitivity is measured (the error with only that layer kept float) and the most sensitive layers
stay float, most sensitive first, until the thresholds hold or the cap is reached — then refuse.

Before that, the model is made as quantizable as it can be: each calibration method asked for
(``auto``: MinMax and Percentile; Entropy when asked) and each float candidate (the plain model and, when the
caller gives one, its cross-layer-equalized twin), with and without bias correction, is quantized
and measured on the check rows; the best attempt (:func:`rank`: agreement, or SQNR, first) is
kept, and every attempt is reported.
Each method's ranges are computed once and read back from its own cache file afterwards.
"""
import contextlib
import dataclasses
import io
import logging
import math
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery import artefacts, verify
from tfsurgery.errors import ExportError, InputError
from tfsurgery.samples import Samples

# Layers with weights that quantize_static turns into QDQ int8 (what a user calls a layer).
LAYER_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# onnxruntime's calibration methods, by the name the CLI takes: MinMax (exact ranges of the
# calibration rows), Percentile (the 99.999th percentile of |x|: outliers clipped), Entropy
# (the range minimizing the KL divergence of the quantized histogram, TensorRT's method).
CALIBRATION_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
CALIBRATION_CHOICES = ("auto",) + tuple(CALIBRATION_METHODS)
# what "auto" tries: Entropy costs 20× MinMax's time (a KL search over 2048 histogram bins per
# tensor: 60 s against 3 s on a MobileNet 0.25 with 200 rows) and did not win there; ask for it.
AUTO_METHODS = ("MinMax", "Percentile")
CORRECTIONS = {"auto": (False, True), "on": (True,), "off": (False,)}   # bias correction tried
MIN_AGREEMENT = 0.99
MIN_SQNR_DB = 20.0                 # signal 100× the quantization noise in power
DEFAULT_TIMEOUT = 120.0            # seconds for all check rows of one int8 model
MAX_FLOAT_FRACTION = 0.10          # default cap on layers kept float: 10% of them (at least 1)


@dataclasses.dataclass
class Thresholds:
    """None: the default, and not asked for (a threshold asked for must apply to some output)."""
    given_agreement: Optional[float] = None
    given_sqnr_db: Optional[float] = None
    max_float_layers: Optional[int] = None     # None: 10% of the layers, at least 1

    def __post_init__(self):
        if self.given_agreement is not None and not 0 < self.given_agreement <= 1:
            raise InputError(f"--int8-min-agreement {self.given_agreement:g}: give a share "
                             "between 0 and 1")
        if self.max_float_layers is not None and self.max_float_layers < 0:
            raise InputError(f"--int8-max-float-layers {self.max_float_layers}: give 0 or more")

    @property
    def min_agreement(self) -> float:
        return MIN_AGREEMENT if self.given_agreement is None else self.given_agreement

    @property
    def min_sqnr_db(self) -> float:
        return MIN_SQNR_DB if self.given_sqnr_db is None else self.given_sqnr_db

    def check_applies(self, outputs: Sequence[str], expected: List[List[np.ndarray]]) -> None:
        """A threshold asked for that no output is measured by: one line (exit 2)."""
        classes = [is_class_scores(np.asarray(expected[0][i])) for i in range(len(outputs))]
        if self.given_agreement is not None and not any(classes):
            raise InputError("--int8-min-agreement: no output is class scores (rank 2, last "
                             f"dimension ≥ 2); {', '.join(outputs)} are checked by SQNR "
                             "(--int8-min-sqnr)")
        if self.given_sqnr_db is not None and all(classes):
            raise InputError("--int8-min-sqnr: every output is class scores, checked by top-1 "
                             "agreement (--int8-min-agreement)")


@dataclasses.dataclass
class OutputMeasure:
    """One output on the check rows: top-1 agreement (class scores) or SQNR in dB (the rest)."""
    name: str
    measure: str             # "top1_agreement" or "sqnr_db"
    value: float
    threshold: float
    relative_error: float    # ||int8 - float|| / ||float||, for ranking layers

    @property
    def passed(self) -> bool:
        return self.value >= self.threshold

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), passed=self.passed)


@dataclasses.dataclass
class Attempt:
    """One calibration method on one float candidate ("plain" or "equalized"), measured on the
    check rows before any layer is kept float."""
    model: str
    method: str
    outputs: List[OutputMeasure]
    seconds: float = 0.0
    bias_corrected: bool = False

    @property
    def score(self) -> float:
        return score(self.outputs)

    @property
    def label(self) -> str:
        return f"{self.model} {self.method}" + (" + bias correction" if self.bias_corrected
                                                else "")

    def as_dict(self) -> dict:
        return dict(model=self.model, method=self.method, bias_corrected=self.bias_corrected,
                    score=self.score, seconds=round(self.seconds, 3),
                    outputs=[o.as_dict() for o in self.outputs])


@dataclasses.dataclass
class Int8Report:
    path: str
    calibration_method: str
    calibration_rows: int
    check_rows: int
    layers: int
    outputs: List[OutputMeasure]
    plain_outputs: List[OutputMeasure]             # before any layer was kept float
    kept_float: List[str] = dataclasses.field(default_factory=list)
    sensitivities: Dict[str, float] = dataclasses.field(default_factory=dict)
    max_float_layers: int = 0
    float_bytes: int = 0
    int8_bytes: int = 0
    tried: List[Attempt] = dataclasses.field(default_factory=list)   # every method × candidate
    model: str = "plain"                           # the float candidate kept: plain or equalized
    bias_corrected: bool = False                   # the kept attempt's biases were corrected
    equalization: dict = dataclasses.field(default_factory=dict)    # set by the caller

    @property
    def passed(self) -> bool:       # nothing measured is never a pass (review H5)
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(passed=self.passed, outputs=[o.as_dict() for o in self.outputs],
                    plain_outputs=[o.as_dict() for o in self.plain_outputs],
                    tried=[a.as_dict() for a in self.tried])
        return data


def reference_outputs(graph_def, outputs: Sequence[str], check: Samples,
                      timeout: float = DEFAULT_TIMEOUT) -> List[List[np.ndarray]]:
    """The float ORIGINAL in TensorFlow on every check row: [row][output]."""
    try:
        return [verify.run_graph(graph_def, feeds, outputs, timeout=timeout,
                                 label="the original graph") for feeds in check.feeds()]
    except verify.VerificationError as error:
        raise ExportError(f"no float reference on the check samples: {error}") from None


def quantize(float_model, path: Path, *, outputs: Sequence[str], calibration: Samples,
             check: Samples, expected: List[List[np.ndarray]], thresholds: Thresholds,
             batch: Optional[artefacts.Batch] = None, timeout: float = DEFAULT_TIMEOUT,
             calibration_method: str = "auto", bias_correction: str = "off") -> Int8Report:
    """Quantize ``float_model`` to ``path`` (with ``batch``: written when the whole run passed).
    ``float_model``: a path, or candidates by name ({"plain": p, "equalized": q}) of which the
    one quantizing best is kept. ``calibration_method``: "auto" (each method tried, the best
    kept) or one of CALIBRATION_METHODS. ``bias_correction``: "auto" tries every attempt with
    and without its biases corrected (:func:`correct_biases`: cheap, the ranges are cached);
    "on" only with, "off" only without. Raises ``ExportError`` carrying the report when the
    thresholds cannot be met."""
    thresholds.check_applies(outputs, expected)
    candidates = {"plain": Path(float_model)} if isinstance(float_model, (str, Path)) else \
        {name: Path(p) for name, p in float_model.items()}
    methods = calibration_methods(calibration_method)
    first = next(iter(candidates.values()))
    layers = quantizable_layers(first)
    cap = thresholds.max_float_layers
    if cap is None:
        cap = max(1, int(len(layers) * MAX_FLOAT_FRACTION))
    with artefacts.staging(path, batch) as stage:
        staged = stage / path.name

        def attempt(model: str, method: str, kept_float: Sequence[str],
                    corrected: bool = False) -> List[OutputMeasure]:
            _quantize_static(candidates[model], staged, calibration, kept_float, method=method,
                             cache=stage / f"calibration-{model}-{method}.json")
            if corrected:
                try:
                    correct_biases(candidates[model], staged, calibration, input_means)
                except Exception as error:   # onnx/onnxruntime errors are not one hierarchy
                    raise ExportError(f"bias correction failed on {model} {method}: "
                                      f"{str(error).splitlines()[0] if str(error) else error!r}"
                                      "; --int8-bias-correction off skips it") from None
            return measure(staged, outputs, check, expected, thresholds, timeout)

        input_means: Dict[tuple, List[np.ndarray]] = {}     # bias correction's E[x], once
        tried = []
        for model in candidates:
            for method in methods:
                for corrected in CORRECTIONS[bias_correction]:
                    started = time.perf_counter()
                    measures = attempt(model, method, [], corrected)
                    tried.append(Attempt(model, method, measures, time.perf_counter() - started,
                                         bias_corrected=corrected))
        best = min(tried, key=rank)
        report = Int8Report(str(path), best.method, calibration.rows, check.rows,
                            len(layers), best.outputs, best.outputs, max_float_layers=cap,
                            float_bytes=candidates[best.model].stat().st_size, tried=tried,
                            model=best.model, bias_corrected=best.bias_corrected)

        def chosen(kept_float: Sequence[str]) -> List[OutputMeasure]:
            return attempt(best.model, best.method, kept_float, best.bias_corrected)

        if not report.passed and cap > 0:
            report.sensitivities = sensitivities(layers, best.outputs, chosen)
            ranked = sorted(report.sensitivities, key=report.sensitivities.get, reverse=True)
            for count in range(1, min(cap, len(ranked)) + 1):
                report.kept_float = ranked[:count]
                report.outputs = chosen(report.kept_float)
                if report.passed:
                    break
        if not report.passed:
            raise Int8Refused(report)
        if not report.kept_float and best is not tried[-1]:
            chosen([])                 # the staged file was the last attempt's: make it the best
        report.int8_bytes = staged.stat().st_size
        artefacts.publish(lambda: _publish(staged, path), batch, stage)
    return report


def calibration_methods(choice: str) -> List[str]:
    """onnxruntime's method names for a choice ("auto": AUTO_METHODS)."""
    if choice == "auto":
        return list(AUTO_METHODS)
    if choice not in CALIBRATION_METHODS:
        raise InputError(f"--int8-calibration {choice}: choose from "
                         f"{', '.join(CALIBRATION_CHOICES)}")
    return [CALIBRATION_METHODS[choice]]


class Int8Refused(ExportError):
    """The int8 model misses its thresholds even with the cap of layers kept float."""

    def __init__(self, report: Int8Report):
        failed = "; ".join(f"{o.name}: {o.measure} {o.value:.4g} < {o.threshold:g}"
                           for o in report.outputs if not o.passed)
        kept = (f" with {len(report.kept_float)} layer(s) kept float "
                f"(cap {report.max_float_layers})" if report.kept_float else "")
        super().__init__(f"int8 misses its thresholds on {report.check_rows} held-back rows"
                         f"{kept}: {failed}")
        self.report = report


def quantizable_layers(float_model: Path) -> List[str]:
    import onnx
    model = onnx.load(str(float_model))
    weights = {init.name for init in model.graph.initializer}
    return [node.name for node in model.graph.node
            if node.op_type in LAYER_OPS and any(name in weights for name in node.input)]


def sensitivities(layers: Sequence[str], plain: List[OutputMeasure], attempt) -> Dict[str, float]:
    """How much each layer's quantization costs: the drop in summed relative output error when
    only that layer stays float (larger = more sensitive)."""
    base = score(plain)
    return {layer: base - score(attempt([layer])) for layer in layers}


def rank(attempt: "Attempt") -> tuple:
    """How attempts are ordered (smallest first): passing the thresholds, then each output's
    own measure (disagreement for class scores; relative error — i.e. SQNR — for the rest),
    then the continuous :func:`score` to break ties."""
    primary = sum(1 - o.value if o.measure == "top1_agreement" else o.relative_error
                  for o in attempt.outputs)
    return (not all(o.passed for o in attempt.outputs), primary, attempt.score)


def score(measures: List[OutputMeasure]) -> float:
    """A continuous error over outputs (lower is better): disagreement plus relative error, so
    attempts and layers can be ranked even when top-1 barely moves."""
    return sum(o.relative_error + (1 - o.value if o.measure == "top1_agreement" else 0)
               for o in measures)


def measure(model: Path, outputs: Sequence[str], check: Samples,
            expected: List[List[np.ndarray]], thresholds: Thresholds,
            timeout: float = DEFAULT_TIMEOUT) -> List[OutputMeasure]:
    """Each output of ``model`` in onnxruntime against ``expected`` over the check rows."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    run_options = ort.RunOptions()
    deadline = threading.Timer(timeout, setattr, (run_options, "terminate", True))
    deadline.start()
    try:
        actual = [session.run(names, _onnx_feeds(feeds, wanted), run_options)
                  for feeds in check.feeds()]
    except Exception as error:   # onnxruntime's error types are not a public hierarchy
        if run_options.terminate:
            raise ExportError(f"the int8 model did not finish the {check.rows} check rows "
                              f"within {timeout:g} s in onnxruntime") from None
        raise ExportError(f"onnxruntime cannot run the int8 model: {error}") from None
    finally:
        deadline.cancel()
    return compare(outputs, expected, actual, thresholds)


def compare(outputs: Sequence[str], expected: List[List[np.ndarray]],
            actual: List[List[np.ndarray]], thresholds: Thresholds) -> List[OutputMeasure]:
    """Per output over all rows ([row][output] on both sides): agreement or SQNR."""
    result = []
    for index, name in enumerate(outputs):
        ref = np.concatenate([np.atleast_1d(row[index]) for row in expected]).astype(np.float64)
        got = np.concatenate([np.atleast_1d(row[index]) for row in actual]).astype(np.float64)
        relative = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
        if is_class_scores(ref):
            agreement = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
            result.append(OutputMeasure(name, "top1_agreement", agreement,
                                        thresholds.min_agreement, relative))
        else:
            sqnr = 20 * math.log10(1 / relative) if relative > 0 else math.inf
            result.append(OutputMeasure(name, "sqnr_db", sqnr, thresholds.min_sqnr_db, relative))
    return result


def is_class_scores(values: np.ndarray) -> bool:
    return values.ndim == 2 and values.shape[-1] >= 2


def _onnx_feeds(feeds: Dict[str, np.ndarray], wanted) -> Dict[str, np.ndarray]:
    named = {_tensor(k): v for k, v in feeds.items()}
    return {k: v for k, v in named.items() if k in wanted}


def _tensor(name: str) -> str:
    return name if ":" in name else name + ":0"


def _quantize_static(float_model: Path, out: Path, calibration: Samples,
                     kept_float: Sequence[str], cache: Path, method: str = "MinMax") -> None:
    """QDQ int8 with ``kept_float`` left float; the calibration ranges are computed once and
    read back from ``cache`` on every later attempt (the sensitivity scan makes many)."""
    from onnxruntime import quantization as q

    class Rows(q.CalibrationDataReader):
        def __init__(self):
            self._rows = iter(calibration.feeds())

        def get_next(self):
            feeds = next(self._rows, None)
            return None if feeds is None else _onnx_feeds(feeds, wanted)

    import onnxruntime as ort
    wanted = {i.name for i in ort.InferenceSession(
        str(float_model), providers=["CPUExecutionProvider"]).get_inputs()}
    root = logging.getLogger()       # onnxruntime logs "consider pre-processing" on the root
    level, root.level = root.level, logging.ERROR
    try:
        if method == "Entropy" and not cache.exists():
            _entropy_ranges(float_model, Rows(), cache)
        with contextlib.redirect_stdout(io.StringIO()):    # the histogram methods print()
            q.quantize_static(str(float_model), str(out), Rows(), quant_format=q.QuantFormat.QDQ,
                              per_channel=True, weight_type=q.QuantType.QInt8,
                              calibrate_method=getattr(q.CalibrationMethod, method),
                              nodes_to_exclude=list(kept_float),
                              calibration_cache_path=str(cache))
    except Exception as error:     # onnxruntime's errors are not a public hierarchy
        raise ExportError(f"onnxruntime cannot quantize the model: "
                          f"{str(error).splitlines()[0] if str(error) else error!r}") from None
    finally:
        root.level = level


def correct_biases(float_model: Path, quantized: Path, calibration: Samples,
                   means: Optional[Dict[tuple, List[np.ndarray]]] = None) -> int:
    """Bias correction (Nagel et al. 2019, §4.2): rounding a layer's weights to int8 shifts its
    output by an expected error E[(W_int8 − W) x] = (W_int8 − W) E[x] per output channel,
    with E[x] the mean of each input channel over the calibration rows in the FLOAT model. That
    shift is subtracted from the layer's bias, in the bias's own int32 steps (scale = input scale
    × weight scale), for every Conv (grouped and depthwise too) and Gemm whose weights and
    bias are quantized (E[x] is over real positions: the zeros of padding at the borders are
    not counted, a small overestimate there). Rewrites ``quantized``; returns how many layers
    were corrected.
    ``means``: a cache of E[x] by (float model, tensors), kept by the caller across attempts."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(quantized))
    reference = onnx.load(str(float_model))
    producer = {out: node for node in model.graph.node for out in node.output}
    initializers = {init.name: init for init in model.graph.initializer}
    float_weights = {init.name: init for init in reference.graph.initializer}
    float_nodes = {node.name: node for node in reference.graph.node}
    layers = []
    for node in model.graph.node:
        twin = float_nodes.get(node.name)
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or twin is None or \
                twin.op_type != node.op_type or len(twin.input) < 2 or \
                twin.input[1] not in float_weights or _attr(node, "transA", 0):
            continue
        weight = _dequantized(producer.get(node.input[1]), initializers)
        bias = producer.get(node.input[2])
        if weight is None or bias is None or bias.op_type != "DequantizeLinear":
            continue
        values, scale = (initializers.get(name) for name in bias.input[:2])
        if values is None or scale is None or values.data_type != onnx.TensorProto.INT32:
            continue
        exact = numpy_helper.to_array(float_weights[twin.input[1]]).astype(np.float64)
        if exact.shape != weight.shape:
            continue
        layers.append((node, twin, weight - exact, values,
                       numpy_helper.to_array(scale).astype(np.float64)))
    if not layers:
        return 0
    cache = {} if means is None else means
    tensors = tuple(twin.input[0] for _, twin, *_ in layers)
    key = (str(float_model), tensors)
    if key not in cache:
        cache[key] = _channel_means(reference, list(tensors), calibration)
    corrected = 0
    for (node, _, error, values, scale), mean in zip(layers, cache[key]):
        shift = _output_shift(node, error, mean)
        old = numpy_helper.to_array(values).astype(np.int64)
        if shift is None or shift.shape != old.shape:
            continue
        new = old - np.round(shift / scale).astype(np.int64)
        info = np.iinfo(np.int32)
        values.CopyFrom(numpy_helper.from_array(np.clip(new, info.min, info.max)
                                                .astype(np.int32), values.name))
        corrected += 1
    onnx.save(model, str(quantized))
    return corrected


def _attr(node, name: str, default):
    import onnx
    found = [a for a in node.attribute if a.name == name]
    return onnx.helper.get_attribute_value(found[0]) if found else default


def _dequantized(node, initializers) -> Optional[np.ndarray]:
    """The float values a DequantizeLinear of int8 initializers yields (per-axis or not)."""
    from onnx import numpy_helper
    if node is None or node.op_type != "DequantizeLinear" or \
            any(name not in initializers for name in node.input[:3]) or len(node.input) < 3:
        return None
    q, scale, zero = (numpy_helper.to_array(initializers[name]).astype(np.float64)
                      for name in node.input[:3])
    if scale.ndim == 1 and scale.size > 1:
        view = [1] * q.ndim
        view[_attr(node, "axis", 1) % q.ndim] = -1
        scale, zero = scale.reshape(view), zero.reshape(view)
    return (q - zero) * scale


def _output_shift(node, error: np.ndarray, mean: np.ndarray) -> Optional[np.ndarray]:
    """(W_int8 − W) E[x] per output channel: Conv weights [O, I/g, k…] with ``group`` g,
    Gemm [K, N] (or [N, K] with transB)."""
    if node.op_type == "Gemm":
        matrix = error.T if _attr(node, "transB", 0) else error
        return mean @ matrix if matrix.shape[0] == mean.shape[0] else None
    groups = _attr(node, "group", 1)
    out_channels, per_group = error.shape[0], error.shape[1]
    if per_group * groups != mean.shape[0] or out_channels % groups:
        return None
    summed = error.reshape(out_channels, per_group, -1).sum(axis=2)     # over the kernel
    inputs = mean.reshape(groups, per_group)[np.arange(out_channels) // (out_channels // groups)]
    return np.sum(summed * inputs, axis=1)


def _channel_means(model, tensors: Sequence[str], rows: Samples) -> List[np.ndarray]:
    """Each tensor's mean per channel (axis 1: NCHW conv outputs, [N, C] Gemm outputs) over
    ``rows``, run in onnxruntime with the tensors added as outputs (``model`` keeps them)."""
    import onnx
    import onnxruntime as ort
    present = {out.name for out in model.graph.output}
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                 None)
                              for name in tensors if name not in present)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    sums: List[np.ndarray] = [np.zeros(0)] * len(tensors)
    counts = [0] * len(tensors)
    for feeds in rows.feeds():
        for index, value in enumerate(session.run(list(tensors), _onnx_feeds(feeds, wanted))):
            value = np.asarray(value, dtype=np.float64)
            per_channel = np.moveaxis(value, 1, 0).reshape(value.shape[1], -1)
            sums[index] = per_channel.sum(axis=1) + (sums[index] if counts[index] else 0)
            counts[index] += per_channel.shape[1]
    return [total / max(count, 1) for total, count in zip(sums, counts)]


ENTROPY_BINS = (2048, 128)          # histogram bins, quantized bins: TensorRT's entropy method


def _entropy_ranges(float_model: Path, rows, cache: Path) -> None:
    """Entropy ranges into ``cache`` (read back by quantize_static). quantize_static's own
    Entropy calibrator keeps onnxruntime's defaults of 128 histogram bins for 128 quantized
    bins, which leaves one candidate threshold — the full range, i.e. MinMax; KL-divergence
    calibration needs a finer histogram than the grid it chooses a range for."""
    import tempfile
    from onnxruntime.quantization import calibrate, registry
    ops = sorted(set(registry.QLinearOpsRegistry) | set(registry.QDQRegistry))
    with tempfile.TemporaryDirectory(prefix="entropy.", dir=cache.parent) as scratch, \
            contextlib.redirect_stdout(io.StringIO()):
        calibrator = calibrate.create_calibrator(
            Path(float_model), ops, augmented_model_path=str(Path(scratch) / "augmented.onnx"),
            calibrate_method=calibrate.CalibrationMethod.Entropy,
            providers=["CPUExecutionProvider"],
            extra_options={"num_bins": ENTROPY_BINS[0], "num_quantized_bins": ENTROPY_BINS[1]})
        calibrator.collect_data(rows)
        calibrate.save_tensors_data(calibrator.compute_data(), cache)


def _publish(staged: Path, path: Path) -> None:
    import os
    os.replace(staged, path)


def check_request(samples_path: Optional[str], quantize: Optional[str], onnx: bool,
                  nchw_inputs: Sequence[str] = ()) -> None:
    """Bad requests, before any work: one line each (exit 2)."""
    if quantize is None:
        return
    if not samples_path:
        raise InputError("int8 needs --samples: real inputs to calibrate on and to check with")
    if not onnx:
        raise InputError("--quantize int8 needs an ONNX or TFLite output (--onnx PATH, "
                         "`export`, or --tflite PATH)")
    if nchw_inputs:     # the samples are NHWC rows of the graph's inputs
        raise InputError("--quantize int8 does not take --inputs-as-nchw yet")

