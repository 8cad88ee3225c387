"""Full-integer TensorFlow Lite: TFLiteConverter with the calibration rows as representative
dataset (int8 builtin ops only), checked in the LiteRT interpreter on the held-back rows against
the float original with int8's own measures (``quantize.compare``); given the cross-layer-
equalized graph too, both are converted and the better kept. Float inputs and outputs by
default; ``int8_io`` makes them int8 too (their scale and zero point are reported). No per-layer
fallback here: a model that misses its thresholds is refused."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery import artefacts, io, quantize, savedmodel_export, tflite_export
from tfsurgery.errors import ExportError
from tfsurgery.ops import tensor_name
from tfsurgery.samples import Samples
from tfsurgery.transforms.simplify_algebra import adds_of_add_n


@dataclasses.dataclass
class TfliteInt8Report:
    path: str
    calibration_rows: int
    check_rows: int
    outputs: List[quantize.OutputMeasure]
    io_type: str                                   # "float32" or "int8"
    io_quantization: Dict[str, dict] = dataclasses.field(default_factory=dict)
    bytes: int = 0
    model: str = "plain"                   # the float graph converted: plain or equalized
    tried: List[quantize.Attempt] = dataclasses.field(default_factory=list)
    equalization: dict = dataclasses.field(default_factory=dict)     # set by the caller

    @property
    def passed(self) -> bool:       # nothing measured is never a pass (review H5)
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(passed=self.passed, outputs=[o.as_dict() for o in self.outputs],
                    tried=[a.as_dict() for a in self.tried])
        return data


class TfliteInt8Refused(ExportError):
    def __init__(self, report: TfliteInt8Report):
        failed = "; ".join(f"{o.name}: {o.measure} {o.value:.4g} < {o.threshold:g}"
                           for o in report.outputs if not o.passed)
        super().__init__(f"TFLite int8 misses its thresholds on {report.check_rows} held-back "
                         f"rows: {failed}")
        self.report = report


def export(graph_def, signature: savedmodel_export.Signature, path, *, outputs: Sequence[str],
           calibration: Samples, check: Samples, expected: List[List[np.ndarray]],
           thresholds: quantize.Thresholds, int8_io: bool = False, input_path=None,
           batch: Optional[artefacts.Batch] = None) -> TfliteInt8Report:
    """``graph_def``: one graph, or candidates by name ({"plain": g, "equalized": h}), each
    converted and measured on ``check``; the best (``quantize.rank``) is kept."""
    thresholds.check_applies(outputs, expected)
    path = Path(path)
    io.check_writable(path)
    io.refuse_input(path, input_path)
    candidates = {name: adds_of_add_n(g)     # TFLite's ADD_N has no int8 kernel; ADD has
                  for name, g in (graph_def if isinstance(graph_def, dict)
                                  else {"plain": graph_def}).items()}
    tried, built = [], {}
    for name, candidate in candidates.items():
        started = time.perf_counter()
        with artefacts.staging(path) as stage:
            saved_model = stage / "saved_model"
            savedmodel_export.build(candidate, signature, saved_model)
            model = convert(saved_model, signature, calibration, int8_io)
        actual, io_quantization = run(model, signature, outputs, check)
        measures = quantize.compare(outputs, expected, actual, thresholds)
        tried.append(quantize.Attempt(name, "TFLiteConverter", measures,
                                      time.perf_counter() - started))
        built[name] = (model, io_quantization)
    best = min(tried, key=quantize.rank)
    model, io_quantization = built[best.model]
    report = TfliteInt8Report(str(path), calibration.rows, check.rows, best.outputs,
                              "int8" if int8_io else "float32", io_quantization, len(model),
                              model=best.model, tried=tried)
    if not report.passed:
        raise TfliteInt8Refused(report)
    artefacts.publish(lambda: io.write_atomically(path, model), batch)
    return report


def convert(saved_model: Path, signature, calibration: Samples, int8_io: bool) -> bytes:
    import tensorflow as tf
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model),
                                                         signature_keys=[signature.key])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        artefacts.feeds_by_key(feeds, signature.inputs) for feeds in calibration.feeds())
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if int8_io:
        converter.inference_input_type = converter.inference_output_type = tf.int8
    try:
        return converter.convert()
    except Exception as error:  # noqa: BLE001 - ConverterError, ValueError, RuntimeError, ...
        raise ExportError("the TFLite converter cannot make the graph full-integer: "
                          f"{tflite_export.converter_reason(error)}") from None


def run(model: bytes, signature, outputs: Sequence[str], check: Samples):
    """([row][output] in graph output order, the int8 I/O scale and zero point by name)."""
    interpreter_type, _ = tflite_export.interpreter_class()
    interpreter = interpreter_type(model_content=model)
    runner = interpreter.get_signature_runner(signature.key)
    details = {**runner.get_input_details(), **runner.get_output_details()}
    io_quantization = {key: {"scale": float(d["quantization"][0]),
                             "zero_point": int(d["quantization"][1])}
                       for key, d in details.items() if d["dtype"] == np.int8}
    key_of = {tensor_name(t): key for key, t in signature.outputs.items()}
    rows = []
    for feeds in check.feeds():
        given = {key: _to_int8(value, io_quantization.get(key))
                 for key, value in artefacts.feeds_by_key(feeds, signature.inputs).items()}
        got = runner(**given)
        rows.append([_from_int8(got[key_of[tensor_name(name)]],
                                io_quantization.get(key_of[tensor_name(name)]))
                     for name in outputs])
    return rows, io_quantization


def _to_int8(value: np.ndarray, q: Optional[dict]) -> np.ndarray:
    if q is None:
        return value
    return np.clip(np.round(value / q["scale"] + q["zero_point"]), -128, 127).astype(np.int8)


def _from_int8(value: np.ndarray, q: Optional[dict]) -> np.ndarray:
    if q is None:
        return value
    return (value.astype(np.float32) - q["zero_point"]) * q["scale"]
