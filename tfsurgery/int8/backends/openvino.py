"""OpenVINO int8: NNCF post-training quantization as a backend of the int8 loop
(:mod:`tfsurgery.int8.loop`).

Each float candidate (the plain optimized graph and, given one, its cross-layer-equalized twin)
is converted once with ``openvino.convert_model``; every model the loop asks for is
``nncf.quantize`` of that ov.Model over an ``nncf.Dataset`` of the calibration rows (and only
those), with the layers to keep float in NNCF's ``IgnoredScope`` (OpenVINO's node names of the
convolutions and matrix products). NNCF's two presets are the choices tried: ``performance``
(symmetric int8 activations and weights) and ``mixed`` (asymmetric activations, for ranges that
are not centred on zero); both apply NNCF's fast bias correction. The loop measures each on the
selection rows and judges the one chosen on the gate rows against the float ORIGINAL in
TensorFlow, as it does for ONNX and TFLite.

Every int8 model is run compiled for the CPU at an explicit inference precision (f32 unless
asked): what is not int8 runs at that precision, not at OpenVINO's bf16 default. The published
IR records that precision in its rt_info, as the float IR does.
"""
from __future__ import annotations

import contextlib
import io as std_io
import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.export import artefacts
from tfsurgery.export import openvino as openvino_export
from tfsurgery.verify import check as verify
from tfsurgery.errors import ExportError
from tfsurgery.int8.loop import (Backend, Choice, Int8Refused, Int8Report, Rows,  # noqa: F401
                                 Thresholds, run_loop)
from tfsurgery.ops import first_line
from tfsurgery.verify.samples import Samples

# OpenVINO operations with weights that NNCF quantizes: the layers that can be kept float.
LAYER_OPS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData",
             "GroupConvolutionBackpropData", "MatMul")
PRESETS = ("performance", "mixed")
RUN_BATCH = 64                      # check rows per inference call

OpenvinoInt8Refused = Int8Refused


def require_nncf() -> None:
    """NNCF importable, or one line saying how to get it (``InputError``: exit 2)."""
    from tfsurgery.errors import InputError
    try:
        import nncf  # noqa: F401
    except ImportError:
        raise InputError("OpenVINO int8 needs NNCF: pip install 'tfsurgery[openvino]' "
                         "(or pip install nncf)") from None


class OpenvinoBackend(Backend):
    """``candidates``: float GraphDefs by name, each converted once; quantized by NNCF on
    ``calibration``; run compiled at ``precision``; staged and published under ``stage``."""

    name = "openvino"

    def __init__(self, candidates: Dict[str, object], inputs: Sequence[str],
                 outputs: Sequence[str], calibration: Samples, stage: Path, *,
                 precision: str = "f32", batch: Optional[artefacts.Batch] = None,
                 timeout: float = verify.DEFAULT_TIMEOUT):
        self.candidates, self.inputs, self.outputs = candidates, list(inputs), list(outputs)
        self.calibration, self.stage, self.precision = calibration, stage, precision
        self.batch, self.timeout = batch, timeout
        self._float: Dict[str, object] = {}
        self._sizes: Dict[int, int] = {}

    def float_model(self, name: str):
        if name not in self._float:
            self._float[name] = openvino_export.convert(self.candidates[name], self.inputs,
                                                        self.outputs)
        return self._float[name]

    def choices(self) -> List[Choice]:
        return [Choice(name, f"NNCF {preset}", bias_corrected=True)
                for name in self.candidates for preset in PRESETS]

    def layers(self, choice: Choice) -> List[str]:
        return [op.get_friendly_name() for op in self.float_model(choice.model).get_ordered_ops()
                if op.get_type_name() in LAYER_OPS and _has_weights(op)]

    def build(self, choice: Choice, kept_float: Sequence[str]):
        return quantize(self.float_model(choice.model), self.calibration,
                        preset=choice.method.split()[-1], kept_float=kept_float)

    def run(self, model, rows: Samples) -> List[List[np.ndarray]]:
        return artefacts.with_deadline(lambda: run(model, rows, self.outputs, self.precision),
                                       self.timeout, f"the OpenVINO int8 model on {rows.rows} rows")

    def size(self, model) -> int:
        if id(model) not in self._sizes:
            directory = self.stage / f"size-{len(self._sizes)}"
            openvino_export.save(model, directory, self.precision)
            self._sizes[id(model)] = artefacts.size_of(directory)
        return self._sizes[id(model)]

    def float_size(self, choice: Choice) -> int:
        return self.size(self.float_model(choice.model))

    def publish(self, model, path) -> None:
        staged = self.stage / "openvino-int8"
        openvino_export.save(model, staged, self.precision)
        artefacts.publish(lambda: artefacts.publish_directory(staged, Path(path), self.stage),
                          self.batch, self.stage)

    def details(self, model) -> dict:
        return {}


def _has_weights(op) -> bool:
    """A convolution or matrix product with a constant operand (through NNCF-visible converts):
    a layer NNCF quantizes, not an activation × activation product."""
    for value in op.inputs():
        producer = value.get_source_output().get_node()
        while producer.get_type_name() in ("Convert", "Reshape", "Transpose") and \
                producer.inputs():
            producer = producer.input_value(0).get_node()
        if producer.get_type_name() == "Constant":
            return True
    return False


def quantize(model, calibration: Samples, *, preset: str = "performance",
             kept_float: Sequence[str] = ()):
    """``nncf.quantize`` of the float ov.Model over every calibration row, ``kept_float`` in its
    ignored scope. NNCF's progress bars and INFO lines are kept out of the user's output."""
    import nncf
    ports = [port.get_any_name() for port in model.inputs]
    items = [_by_port(model, feeds) for feeds in calibration.feeds()]
    dataset = nncf.Dataset(items)
    options = dict(preset=getattr(nncf.QuantizationPreset, preset.upper()),
                   subset_size=len(items), fast_bias_correction=True)
    if kept_float:
        options["ignored_scope"] = nncf.IgnoredScope(names=list(kept_float))
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(std_io.StringIO()), \
                contextlib.redirect_stderr(std_io.StringIO()):
            return nncf.quantize(model, dataset, **options)
    except Exception as error:  # noqa: BLE001 - NNCF raises many types
        raise ExportError(f"NNCF cannot quantize the OpenVINO model ({', '.join(ports)}): "
                          f"{first_line(error)}") from None
    finally:
        logger.setLevel(level)


def _by_port(model, feeds) -> Dict[str, np.ndarray]:
    """One row's feeds keyed by the ov.Model's input names (TensorFlow tensor names)."""
    return {port.get_any_name(): value for port, value in openvino_export.fed_ports(
        model.inputs, feeds, "the samples do not feed the OpenVINO input {}")}


def run(model, rows: Samples, outputs: Sequence[str], precision: str
        ) -> List[List[np.ndarray]]:
    """The model compiled for the CPU at ``precision``, run on ``rows`` a batch at a time:
    [batch][output] in ``outputs`` order."""
    import openvino as ov
    try:
        compiled = ov.Core().compile_model(model, openvino_export.DEVICE,
                                           {"INFERENCE_PRECISION_HINT": precision})
        return [openvino_export.runner(compiled, feeds, outputs)()
                for _, feeds in rows.batches(RUN_BATCH)]
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001 - OpenVINO raises RuntimeError and kin
        raise ExportError(f"OpenVINO cannot run the int8 model: {first_line(error)}") from None


def export(graph_def, inputs: Sequence[str], outputs: Sequence[str], path, *, rows: Rows,
           expected: Dict[str, list], thresholds: Thresholds, precision: str = "f32",
           force: bool = False, input_path=None, batch: Optional[artefacts.Batch] = None,
           timeout: float = verify.DEFAULT_TIMEOUT, say=lambda _: None) -> Int8Report:
    """NNCF int8 OpenVINO IR of ``graph_def`` (one graph, or candidates by name: {"plain": g,
    "equalized": h}) through the int8 loop, in the directory ``path``; raises ``Int8Refused``
    (its report attached) when the gate rows refuse it."""
    require_nncf()
    openvino_export.check_precision(precision)
    path = Path(path)
    artefacts.check_new_directory(path, force, input_path)
    candidates = graph_def if isinstance(graph_def, dict) else {"plain": graph_def}
    with artefacts.staging(path, batch) as stage:
        backend = OpenvinoBackend(candidates, inputs, outputs, rows.calibration, stage,
                                  precision=precision, batch=batch, timeout=timeout)
        return run_loop(backend, outputs, rows, expected, thresholds, path, say)
