"""Full-integer TensorFlow Lite: the TFLite backend of the int8 loop (:mod:`tfsurgery.int8.loop`).

Each float candidate (the plain graph and, given one, its cross-layer-equalized twin) goes
through a SavedModel to the TFLiteConverter (int8 builtin ops only), which calibrates it on the
calibration rows ONCE; every model the loop asks for is then quantized from that calibrated
model with the layers to keep float denylisted — what ``tf.lite.experimental.
QuantizationDebugger`` does for its ``QuantizationDebugOptions(denylisted_nodes=...)`` and
``get_nondebug_quantized_model()``: the converter's calibrate-only mode, then the MLIR quantizer
(``mlir_quantize``) with the denylist. The debugger itself is not used: it builds a debug model
with a NumericVerify op per layer on every option change, and its quantized model has no int8
inputs/outputs. A TFLite layer is named by its op's output tensor (what the denylist takes).
Float inputs and outputs by default; ``int8_io`` makes them int8 (scale and zero point reported).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery import io
from tfsurgery.export import artefacts
from tfsurgery.trust import outside
from tfsurgery.export import savedmodel as savedmodel_export
from tfsurgery.export import tflite as tflite_export
from tfsurgery.errors import ExportError
from tfsurgery.int8.loop import (DYNAMIC, Backend, Choice, Int8Refused,  # noqa: F401
                                 Int8Report, Rows, Thresholds, run_loop)
from tfsurgery.ops import tensor_name
from tfsurgery.verify.samples import Samples
from tfsurgery.transforms.simplify_algebra import adds_of_add_n

# TFLite ops with weights: what can be kept float (denylisted) when int8 misses.
LAYER_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "CONV_3D",
             "BATCH_MATMUL")
METHOD = "TFLiteConverter"          # the converter's own calibration (min/max of each tensor)

TfliteInt8Report = Int8Report       # one report type for every format
TfliteInt8Refused = Int8Refused


class TfliteBackend(Backend):
    """The TFLite full-integer backend: ``candidates`` float GraphDefs by name, converted
    through a SavedModel with ``signature`` in ``stage``, calibrated on ``calibration``."""

    name = "tflite"

    def __init__(self, candidates: Dict[str, object], signature, outputs: Sequence[str],
                 calibration: Samples, stage: Path, *, int8_io: bool = False,
                 batch: Optional[artefacts.Batch] = None):
        self.candidates = {name: adds_of_add_n(g)  # TFLite's ADD_N has no int8 kernel; ADD has
                           for name, g in candidates.items()}
        self.signature, self.outputs = signature, list(outputs)
        self.calibration, self.stage = calibration, stage
        self.int8_io, self.batch = int8_io, batch
        self._calibrated: Dict[str, bytes] = {}
        self._layers: Dict[str, List[str]] = {}

    def choices(self) -> List[Choice]:
        return [Choice(name, METHOD) for name in self.candidates]

    def dynamic_choices(self) -> List[Choice]:
        """Dynamic range (float I/O): none when int8 inputs and outputs are asked for."""
        return [] if self.int8_io else [Choice(name, DYNAMIC) for name in self.candidates]

    def saved_model(self, model: str) -> Path:
        """The candidate as a SavedModel (what the converter reads), built once."""
        saved_model = self.stage / f"saved_model-{model}"
        if not saved_model.exists():
            savedmodel_export.build(self.candidates[model], self.signature, saved_model)
        return saved_model

    def calibrated(self, model: str) -> bytes:
        """The candidate converted and calibrated (float ops carrying each tensor's range)."""
        if model not in self._calibrated:
            self._calibrated[model] = calibrate(self.saved_model(model), self.signature,
                                                self.calibration)
        return self._calibrated[model]

    def layers(self, choice: Choice) -> List[str]:
        if choice.mode == DYNAMIC:          # the converter's dynamic range has no denylist
            return []
        if choice.model not in self._layers:
            self._layers[choice.model] = weighted_ops(self.calibrated(choice.model))
        return self._layers[choice.model]

    def build(self, choice: Choice, kept_float: Sequence[str]) -> bytes:
        if choice.mode == DYNAMIC:
            return dynamic_range(self.saved_model(choice.model), self.signature)
        return quantize(self.calibrated(choice.model), self.int8_io, kept_float)

    def run(self, model: bytes, rows: Samples) -> List[List[np.ndarray]]:
        return run(model, self.signature, self.outputs, rows)[0]

    def size(self, model: bytes) -> int:
        return len(model)

    def publish(self, model: bytes, path) -> None:
        artefacts.publish(lambda: io.write_atomically(Path(path), model), self.batch)

    def details(self, model: bytes) -> dict:
        return {"io_type": "int8" if self.int8_io else "float32",
                "io_quantization": io_quantization(model, self.signature)}


def export(graph_def, signature: savedmodel_export.Signature, path, *, outputs: Sequence[str],
           rows: Rows, expected: Dict[str, list], thresholds: Thresholds,
           int8_io: bool = False, input_path=None, batch: Optional[artefacts.Batch] = None,
           say=lambda _: None, modes: str = "auto") -> Int8Report:
    """Full-integer TFLite of ``graph_def`` (one graph, or candidates by name: {"plain": g,
    "equalized": h}) through the int8 loop — dynamic-range int8 too as ``modes`` says (see
    ``loop.run_loop``); raises ``Int8Refused`` (its report attached)."""
    path = Path(path)
    io.check_writable(path)
    io.refuse_input(path, input_path)
    candidates = graph_def if isinstance(graph_def, dict) else {"plain": graph_def}
    for candidate in candidates.values():
        outside.refuse_conversion(candidate, "TFLite int8 export")
    with artefacts.staging(path) as stage:
        backend = TfliteBackend(candidates, signature, outputs, rows.calibration, stage,
                                int8_io=int8_io, batch=batch)
        return run_loop(backend, outputs, rows, expected, thresholds, path, say, modes=modes)


def calibrate(saved_model: Path, signature, calibration: Samples) -> bytes:
    """The TFLiteConverter's calibrate-only conversion (int8 builtin ops only): float ops with
    every tensor's range from the calibration rows, ready for :func:`quantize`."""
    import tensorflow as tf
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model),
                                                         signature_keys=[signature.key])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        artefacts.feeds_by_key(feeds, signature.inputs) for feeds in calibration.feeds())
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter._experimental_calibrate_only = True      # as QuantizationDebugger sets it
    try:
        return converter.convert()
    except Exception as error:  # noqa: BLE001 - ConverterError, ValueError, RuntimeError, ...
        raise ExportError("the TFLite converter cannot make the graph full-integer: "
                          f"{tflite_export.converter_reason(error)}") from None


def dynamic_range(saved_model: Path, signature) -> bytes:
    """The converter's dynamic-range int8: weights int8, activations quantized at run time by
    the kernels that take them (no representative dataset)."""
    import tensorflow as tf
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model),
                                                         signature_keys=[signature.key])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    try:
        return converter.convert()
    except Exception as error:  # noqa: BLE001 - ConverterError, ValueError, RuntimeError, ...
        raise ExportError("the TFLite converter cannot make dynamic-range int8: "
                          f"{tflite_export.converter_reason(error)}") from None


def quantize(calibrated: bytes, int8_io: bool, kept_float: Sequence[str] = ()) -> bytes:
    """The calibrated model quantized by the MLIR quantizer (what ``converter.convert()`` runs
    after calibrating), ``kept_float`` (op output tensor names) left float."""
    import tensorflow as tf
    from tensorflow.lite.python import convert as lite_convert
    io_type = tf.int8 if int8_io else tf.float32
    try:
        return lite_convert.mlir_quantize(calibrated, input_data_type=io_type,
                                          output_data_type=io_type,
                                          denylisted_nodes=list(kept_float) or None)
    except Exception as error:  # noqa: BLE001 - the quantizer's errors are not one hierarchy
        raise ExportError(f"the TFLite quantizer failed: {tflite_export.converter_reason(error)}"
                          ) from None


def weighted_ops(model: bytes) -> List[str]:
    """The output tensor names of the ops with weights (LAYER_OPS), in the model's order."""
    interpreter_type, _ = tflite_export.interpreter_class()
    interpreter = interpreter_type(model_content=model)
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    return [names[op["outputs"][0]] for op in interpreter._get_ops_details()  # noqa: SLF001
            if op["op_name"] in LAYER_OPS and len(op["outputs"]) > 0]


def float_ops(model: bytes) -> List[str]:
    """Op types of a quantized model that compute in float32 (kept-float layers and the
    quantize/dequantize at float I/O aside, a full-integer model has none)."""
    interpreter_type, _ = tflite_export.interpreter_class()
    interpreter = interpreter_type(model_content=model)
    types = {t["index"]: t["dtype"] for t in interpreter.get_tensor_details()}
    return [op["op_name"] for op in interpreter._get_ops_details()  # noqa: SLF001
            if op["op_name"] not in ("QUANTIZE", "DEQUANTIZE") and op["outputs"].size and
            types.get(op["outputs"][0]) == np.float32]


def io_quantization(model: bytes, signature) -> Dict[str, dict]:
    """The int8 inputs' and outputs' scale and zero point by signature key."""
    runner = _runner(model, signature)
    details = {**runner.get_input_details(), **runner.get_output_details()}
    return {key: {"scale": float(d["quantization"][0]), "zero_point": int(d["quantization"][1])}
            for key, d in details.items() if d["dtype"] == np.int8}


def _runner(model: bytes, signature):
    interpreter_type, _ = tflite_export.interpreter_class()
    return interpreter_type(model_content=model).get_signature_runner(signature.key)


def run(model: bytes, signature, outputs: Sequence[str], rows: Samples):
    """([row][output] in graph output order, the int8 I/O scale and zero point by name)."""
    runner = _runner(model, signature)
    quantization = io_quantization(model, signature)
    key_of = {tensor_name(t): key for key, t in signature.outputs.items()}
    result = []
    for feeds in rows.feeds():
        given = {key: _to_int8(value, quantization.get(key))
                 for key, value in artefacts.feeds_by_key(feeds, signature.inputs).items()}
        got = runner(**given)
        result.append([_from_int8(got[key_of[tensor_name(name)]],
                                  quantization.get(key_of[tensor_name(name)]))
                       for name in outputs])
    return result, quantization


def _to_int8(value: np.ndarray, q: Optional[dict]) -> np.ndarray:
    if q is None:
        return value
    return np.clip(np.round(value / q["scale"] + q["zero_point"]), -128, 127).astype(np.int8)


def _from_int8(value: np.ndarray, q: Optional[dict]) -> np.ndarray:
    if q is None:
        return value
    return (value.astype(np.float32) - q["zero_point"]) * q["scale"]

