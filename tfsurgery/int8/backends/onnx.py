"""Static int8 for onnxruntime: the ONNX backend of the int8 loop (:mod:`tfsurgery.int8.loop`).

The float ONNX model is quantized with ``onnxruntime.quantization.quantize_static`` (QDQ,
per-channel weights) over the calibration rows. The loop measures every choice on the selection
rows — each calibration method asked for (``auto``: MinMax and Percentile; Entropy when asked),
each float candidate (the plain model and, when the caller gives one, its cross-layer-equalized
twin), with and without bias correction — keeps the best, keeps the most sensitive layers float
when it misses, and judges the one model chosen on gate rows that chose nothing.
Each method's ranges are computed once and read back from its own cache file afterwards.
A Softmax/LogSoftmax/Sigmoid making a graph output stays float (:func:`output_heads`).

A layer kept float must really run float: onnxruntime's ``WeightBiasQuantization`` rewrite
(session load, basic level) quantizes the float weights of any Conv/Gemm whose input comes from
a per-tensor DequantizeLinear — per TENSOR, which wrecks a batch-norm-folded depthwise layer
(measured: a MobileNet's agreement 0.84 → 0.46 with one depthwise layer "kept float"). So such a
layer reads its input through its own per-axis DequantizeLinear carrying the same scale and zero
point for every channel (:func:`keep_float`): the same numbers, and no match.
"""
import contextlib
import dataclasses
import io
import logging
import os
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.export import artefacts
from tfsurgery.int8 import target as int8_target
from tfsurgery.errors import ExportError, InputError
from tfsurgery.int8 import speed as int8_speed
from tfsurgery.int8.backends.onnx_coverage import (dynamic_op_types, left_float_note,
                                                   untyped_as_float)
from tfsurgery.int8.backends.onnx_ranges import entropy_ranges, percentile_ranges
from tfsurgery.int8.loop import (DYNAMIC, MAX_FLOAT_FRACTION, MIN_AGREEMENT,  # noqa: F401
                                 MIN_SQNR_DB, Attempt, Backend, Choice, Int8Refused, Int8Report,
                                 OutputMeasure, Rows, Thresholds, compare, is_class_scores,
                                 rank, run_loop, score)
from tfsurgery.verify.samples import Samples

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
DEFAULT_TIMEOUT = 120.0            # seconds for all rows of one run of an int8 model


class OnnxBackend(Backend):
    """The ONNX QDQ backend: ``candidates`` float ONNX files by name ("plain", "equalized"),
    calibrated on ``calibration``; every model built lives in ``stage``."""

    name = "onnx"

    def __init__(self, candidates: Dict[str, Path], calibration: Samples, stage: Path, *,
                 methods: Sequence[str], corrections: Sequence[bool],
                 timeout: float = DEFAULT_TIMEOUT, batch: Optional[artefacts.Batch] = None,
                 settings: Optional[int8_target.Int8Settings] = None, accept=None,
                 speed_runs: Optional[int] = int8_speed.RUNS):
        self.settings = settings or int8_target.settings()
        self._accept = accept
        self.speed_runs = speed_runs             # None: not timed
        self.candidates = {name: Path(p) for name, p in candidates.items()}
        self.calibration = calibration
        self.stage = stage
        self.methods, self.corrections = list(methods), list(corrections)
        self.timeout, self.batch = timeout, batch
        self._built = 0
        self._means: Dict[tuple, List[np.ndarray]] = {}     # bias correction's E[x], once
        self._settings_of: Dict[Path, int8_target.Int8Settings] = {}   # each model built

    def choices(self) -> List[Choice]:
        return [Choice(model, method, corrected) for model in self.candidates
                for method in self.methods for corrected in self.corrections]

    def dynamic_choices(self) -> List[Choice]:
        return [Choice(model, DYNAMIC) for model in self.candidates]

    def alternatives(self, choice: Choice) -> List[Choice]:
        """``choice`` with each of onnxruntime's default weight settings (8 bits, per tensor)
        that the target's guidance differs from (:meth:`Int8Settings.weight_alternatives`)."""
        if choice.weights:
            return []
        return [dataclasses.replace(choice, weights=other.weights_label)
                for other in self.settings.weight_alternatives()]

    def settings_for(self, choice: Choice) -> int8_target.Int8Settings:
        """The settings ``choice`` quantizes with: the target's, or the alternative its
        ``weights`` names."""
        for other in self.settings.weight_alternatives() if choice.weights else ():
            if other.weights_label == choice.weights:
                return other
        return self.settings

    def weights_label(self, choice: Choice) -> str:
        settings = self.settings_for(choice)
        if settings is self.settings:
            return f"{settings.weights_label} (the {settings.target} target's guidance)"
        default = not settings.reduce_range and not settings.per_channel
        return settings.weights_label + (" (onnxruntime's default)" if default else "")

    def layers(self, choice: Choice) -> List[str]:
        return quantizable_layers(self.candidates[choice.model])

    def build(self, choice: Choice, kept_float: Sequence[str]) -> Path:
        self._built += 1
        out = self.stage / f"int8-{self._built}.onnx"
        float_model = self.candidates[choice.model]
        settings = self._settings_of[out] = self.settings_for(choice)
        if choice.mode == DYNAMIC:
            _quantize_dynamic(float_model, out, kept_float, settings)
            return out
        _quantize_static(float_model, out, self.calibration,
                         list(kept_float) + output_heads(float_model), method=choice.method,
                         cache=self.stage / f"calibration-{choice.model}-{choice.method}.json",
                         settings=settings)
        if choice.bias_corrected:
            try:
                correct_biases(float_model, out, self.calibration, self._means)
            except Exception as error:   # onnx/onnxruntime errors are not one hierarchy
                raise ExportError(f"bias correction failed on {choice.label}: "
                                  f"{str(error).splitlines()[0] if str(error) else error!r}"
                                  "; --int8-bias-correction off skips it") from None
        if kept_float:
            keep_float(out, kept_float)
        return out

    def run(self, model: Path, rows: Samples) -> List[List[np.ndarray]]:
        return run_rows(model, rows, self.timeout)

    def size(self, model: Path) -> int:
        return model.stat().st_size

    def float_size(self, choice: Choice) -> int:
        return self.candidates[choice.model].stat().st_size

    def details(self, model: Path) -> dict:
        """The settings ``model`` was quantized with (the target's, or its activations with
        onnxruntime's default weights when those measured more accurate)."""
        return {"target": self._settings_of.get(Path(model), self.settings).as_dict()}

    def mode_notes(self, choice: Choice) -> List[str]:
        """What onnxruntime's quantizer for ``choice``'s mode leaves float in its model (a
        fused transformer's com.microsoft ``Attention`` has no static int8 form)."""
        return left_float_note(self.candidates[choice.model], choice.mode)

    def time(self, models: Dict[str, Path]) -> Optional[Dict[str, int8_speed.Speed]]:
        """Each model against the plain float ONNX on the first calibration row (batch 1),
        all in one onnxruntime process, interleaved."""
        if self.speed_runs is None:
            return None
        float_model = self.candidates.get("plain", next(iter(self.candidates.values())))
        return int8_speed.against_float(float_model, models, self.calibration.row(0),
                                        runs=self.speed_runs)

    def accept(self, model: Path, report: Int8Report) -> None:
        """The caller's check (``accept(model, report)``: its speed) on the model chosen."""
        if self._accept is not None:
            self._accept(model, report)

    def publish(self, model: Path, path) -> None:
        artefacts.publish(lambda: os.replace(model, path), self.batch, self.stage)

    def labels(self, layers: Sequence[str]) -> Dict[str, str]:
        return made_up_names(next(iter(self.candidates.values())), layers)


def quantize(float_model, path: Path, *, outputs: Sequence[str], rows: Rows,
             expected: Dict[str, list], thresholds: Thresholds,
             batch: Optional[artefacts.Batch] = None, timeout: float = DEFAULT_TIMEOUT,
             calibration_method: str = "auto", bias_correction: str = "off",
             say=lambda _: None, settings: Optional[int8_target.Int8Settings] = None,
             accept=None, modes: str = "auto", min_speedup: float = 0.0,
             speed_runs: Optional[int] = int8_speed.RUNS) -> Int8Report:
    """Quantize ``float_model`` to ``path`` through the int8 loop (with ``batch``: written when
    the whole run passed). ``float_model``: a path, or candidates by name ({"plain": p,
    "equalized": q}) of which the one quantizing best is kept. ``rows``: calibration, selection
    and gate rows; ``expected``: the float reference on the selection and gate rows.
    ``calibration_method``: "auto" (each method tried, the best kept) or one of
    CALIBRATION_METHODS. ``bias_correction``: "auto" tries every attempt with and without its
    biases corrected (:func:`correct_biases`: cheap, the ranges are cached); "on" only with,
    "off" only without. Raises ``Int8Refused`` carrying the report when the gate misses.
    ``settings``: the target CPU's (``int8_target``; default this machine's); ``accept(model,
    report)``: called on the model the gate passed before it is published. ``modes``: "auto"
    (static; dynamic too when static misses on the selection rows), "static" or "dynamic";
    every mode is timed against the float model (``speed_runs`` interleaved runs; None: not
    timed) and one slower than ``min_speedup`` × float is not written (0: any speed)."""
    candidates = {"plain": Path(float_model)} if isinstance(float_model, (str, Path)) else \
        {name: Path(p) for name, p in float_model.items()}
    methods = calibration_methods(calibration_method)
    with artefacts.staging(Path(path), batch) as stage:
        backend = OnnxBackend(candidates, rows.calibration, stage, methods=methods,
                              corrections=CORRECTIONS[bias_correction], timeout=timeout,
                              batch=batch, settings=settings, accept=accept,
                              speed_runs=speed_runs)
        return run_loop(backend, outputs, rows, expected, thresholds, path, say, modes=modes,
                        min_speedup=min_speedup)


def calibration_methods(choice: str) -> List[str]:
    """onnxruntime's method names for a choice ("auto": AUTO_METHODS)."""
    if choice == "auto":
        return list(AUTO_METHODS)
    if choice not in CALIBRATION_METHODS:
        raise InputError(f"--int8-calibration {choice}: choose from "
                         f"{', '.join(CALIBRATION_CHOICES)}")
    return [CALIBRATION_METHODS[choice]]


def quantizable_layers(float_model: Path) -> List[str]:
    import onnx
    model = onnx.load(str(float_model))
    weights = {init.name for init in model.graph.initializer}
    return [node.name for node in model.graph.node
            if node.op_type in LAYER_OPS and any(name in weights for name in node.input)]


# Ops that make a graph output from scores: left float (they cost nothing next to the layers,
# and 8-bit probabilities tie: a step of 1/256 hides the top class whenever two are that close).
OUTPUT_HEADS = ("Softmax", "LogSoftmax", "Sigmoid")


def output_heads(float_model: Path) -> List[str]:
    """The Softmax/LogSoftmax/Sigmoid nodes whose output is a graph output."""
    import onnx
    model = onnx.load(str(float_model), load_external_data=False)
    outputs = {o.name for o in model.graph.output}
    return [node.name for node in model.graph.node
            if node.op_type in OUTPUT_HEADS and any(o in outputs for o in node.output)]


def made_up_names(float_model: Path, layers: Sequence[str]) -> Dict[str, str]:
    """For layers tf2onnx named itself (``Conv__348``: a depthwise conv it rewrote), what they
    feed in the user's graph: "before <first reader>"."""
    import re
    import onnx
    model = onnx.load(str(float_model), load_external_data=False)
    wanted = {name for name in layers if re.search(r"__\d+$", name)}
    readers: Dict[str, List[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    return {node.name: f"before {readers[node.output[0]][0]}" for node in model.graph.node
            if node.name in wanted and readers.get(node.output[0])}


def keep_float(model_path: Path, kept_float: Sequence[str]) -> int:
    """Each kept-float Conv/ConvTranspose/Gemm whose input comes from a per-tensor
    DequantizeLinear reads it through its own per-axis one instead (the same scale and zero
    point for every channel): onnxruntime's WeightBiasQuantization then leaves its float
    weights alone (see the module doc). Rewrites the model; returns how many layers."""
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(model_path))
    initializers = {init.name: init for init in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    kept, rewired = set(kept_float), {}
    for node in model.graph.node:
        dequantize = producer.get(node.input[0]) if node.input else None
        weight = initializers.get(node.input[1]) if len(node.input) > 1 else None
        if node.name not in kept or node.op_type not in ("Conv", "ConvTranspose", "Gemm") or \
                dequantize is None or dequantize.op_type != "DequantizeLinear" or weight is None \
                or _attr(node, "transA", 0):
            continue
        params = [initializers.get(name) for name in dequantize.input[1:3]]
        if any(p is None for p in params) or numpy_helper.to_array(params[0]).size != 1:
            continue
        channels = _input_channels(node, list(weight.dims))
        name = f"{node.name}/float_input"
        per_axis = []
        for suffix, param in zip(("scale", "zero_point"), params):
            value = numpy_helper.to_array(param).reshape(())
            model.graph.initializer.append(numpy_helper.from_array(
                np.full(channels, value, value.dtype), f"{name}_{suffix}"))
            per_axis.append(f"{name}_{suffix}")
        rewired[node.name] = helper.make_node("DequantizeLinear",
                                              [dequantize.input[0]] + per_axis, [name],
                                              name=name, axis=1)
        node.input[0] = name
    if rewired:
        ordered = []
        for node in model.graph.node:       # each new DequantizeLinear just before its reader
            if node.name in rewired:
                ordered.append(rewired[node.name])
            ordered.append(node)
        del model.graph.node[:]
        model.graph.node.extend(ordered)
        onnx.save(model, str(model_path))
    return len(rewired)


def _input_channels(node, weight_shape: List[int]) -> int:
    if node.op_type == "Conv":
        return weight_shape[1] * _attr(node, "group", 1)
    if node.op_type == "ConvTranspose":
        return weight_shape[0]
    return weight_shape[1] if _attr(node, "transB", 0) else weight_shape[0]    # Gemm


def run_rows(model: Path, rows: Samples, timeout: float = DEFAULT_TIMEOUT
             ) -> List[List[np.ndarray]]:
    """Each row's outputs of ``model`` in onnxruntime, [row][output], within ``timeout``."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    run_options = ort.RunOptions()
    deadline = threading.Timer(timeout, setattr, (run_options, "terminate", True))
    deadline.start()
    try:
        return [session.run(names, _onnx_feeds(feeds, wanted), run_options)
                for feeds in rows.feeds()]
    except Exception as error:   # onnxruntime's error types are not a public hierarchy
        if run_options.terminate:
            raise ExportError(f"the int8 model did not finish {rows.rows} rows within "
                              f"{timeout:g} s in onnxruntime") from None
        raise ExportError(f"onnxruntime cannot run the int8 model: {error}") from None
    finally:
        deadline.cancel()


def _onnx_feeds(feeds: Dict[str, np.ndarray], wanted) -> Dict[str, np.ndarray]:
    named = {_tensor(k): v for k, v in feeds.items()}
    return {k: v for k, v in named.items() if k in wanted}


def _tensor(name: str) -> str:
    return name if ":" in name else name + ":0"


def _quantize_static(float_model: Path, out: Path, calibration: Samples,
                     kept_float: Sequence[str], cache: Path, method: str = "MinMax",
                     settings: Optional[int8_target.Int8Settings] = None) -> None:
    """QDQ int8 with ``kept_float`` left float; the calibration ranges are computed once and
    read back from ``cache`` on every later attempt (the sensitivity scan makes many).
    ``settings``: the target CPU's types and options (default: this machine's)."""
    options = (settings or int8_target.settings()).quantize_static_options()
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
    with _onnxruntime_quantizing("onnxruntime cannot quantize the model"):
        if method == "Entropy" and not cache.exists():
            entropy_ranges(float_model, Rows, cache)
        if method == "Percentile" and not cache.exists():
            percentile_ranges(float_model, Rows, cache)
        with contextlib.redirect_stdout(io.StringIO()):    # the histogram methods print()
            q.quantize_static(str(float_model), str(out), Rows(), **options,
                              calibrate_method=getattr(q.CalibrationMethod, method),
                              nodes_to_exclude=list(kept_float),
                              calibration_cache_path=str(cache),
                              extra_options=untyped_as_float())


@contextlib.contextmanager
def _onnxruntime_quantizing(failure: str):
    """onnxruntime's quantizer quiet on the root logger (it logs "consider pre-processing"
    there), and its errors — not a public hierarchy — one ExportError line after ``failure``."""
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR
    try:
        yield
    except Exception as error:
        raise ExportError(f"{failure}: "
                          f"{str(error).splitlines()[0] if str(error) else error!r}") from None
    finally:
        root.level = level


def _quantize_dynamic(float_model: Path, out: Path, kept_float: Sequence[str],
                      settings: int8_target.Int8Settings) -> None:
    """Dynamic int8 by onnxruntime's ``quantize_dynamic`` (each activation's range measured
    as the model runs), int8 weights as the target wants them (per channel; 7 bits without
    VNNI), table lookups and ``kept_float`` left float (``onnx_coverage``). On a fused
    transformer ONNX it makes ``QAttention``."""
    from onnxruntime import quantization as q
    with _onnxruntime_quantizing("onnxruntime cannot quantize the model dynamically"):
        q.quantize_dynamic(str(float_model), str(out), **settings.quantize_dynamic_options(),
                           op_types_to_quantize=dynamic_op_types(),
                           nodes_to_exclude=list(kept_float), extra_options=untyped_as_float())


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


def check_request(samples_path: Optional[str], quantize: Optional[str], onnx: bool,
                  nchw_inputs: Sequence[str] = ()) -> None:
    """Bad requests, before any work: one line each (exit 2)."""
    if quantize is None:
        return
    if not samples_path:
        raise InputError("int8 needs --samples: real inputs to calibrate on and to check with")
    if not onnx:
        raise InputError("--quantize int8 needs an ONNX, TFLite or OpenVINO output (--onnx "
                         "PATH, `export`, --tflite PATH or --openvino DIR)")
    if nchw_inputs:     # the samples are NHWC rows of the graph's inputs
        raise InputError("--quantize int8 does not take --inputs-as-nchw yet")

