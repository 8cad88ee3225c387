"""Checked TensorFlow Lite export: TensorFlow's own converter, then the LiteRT interpreter.

The optimized graph is converted from its SavedModel (``savedmodel_export.build``) with
``tf.lite.TFLiteConverter.from_saved_model`` — builtin TFLite ops only, so the result runs in the
plain interpreter. With ``float16=True`` the converter's float16 post-training quantization stores
the weights as float16 (they are dequantized to float32 when the model loads). With ``int8=True``
(the graph's weights already int8, ``int8-weights``: the converter folds each ``Dequantize`` into
the float weight it feeds) the converter's dynamic-range quantization (``Optimize.DEFAULT``, no
representative dataset) stores weights of 1024+ values as int8 again — per channel, so it gets
the same int8 values back — and TFLite's hybrid kernels quantize activations on the fly. The
model is then run through its signature in the LiteRT interpreter (``ai_edge_litert``, the
maintained successor of ``tf.lite.Interpreter``; the latter is the fallback when LiteRT is not installed) on the
verification inputs and compared with TensorFlow (with preprocessing in the graph: with the original
fed the verifier's NumPy preprocessing). The file is written only if it matched.

A graph the converter refuses (an op with no TFLite builtin) raises ``ExportError`` with the
converter's reason in one line; the CLI exits 1, as for a failed ONNX conversion.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Mapping, Optional

import numpy as np

from tfsurgery import io
from tfsurgery.export import artefacts
from tfsurgery.trust import outside
from tfsurgery.export import savedmodel as savedmodel_export
from tfsurgery.verify import check as verify
from tfsurgery.export.artefacts import Artefact
from tfsurgery.errors import ExportError
from tfsurgery.ops import first_line


def interpreter_class():
    """LiteRT's interpreter, or TensorFlow's deprecated one when LiteRT is not installed."""
    try:
        from ai_edge_litert.interpreter import Interpreter
        return Interpreter, "LiteRT interpreter"
    except ImportError:
        import tensorflow as tf
        return tf.lite.Interpreter, "tf.lite.Interpreter (ai-edge-litert not installed)"


def export(graph_def, signature: savedmodel_export.Signature, path, *,
           feeds: Mapping[str, np.ndarray], tolerance: float, float16: bool = False,
           int8: bool = False,
           timeout: float = verify.DEFAULT_TIMEOUT, input_path=None,
           expected: Optional[Mapping[str, np.ndarray]] = None,
           batch: Optional[artefacts.Batch] = None) -> Artefact:
    """Convert ``graph_def`` to TFLite at ``path``; written (with a ``batch``: when the whole run
    has passed) only if the interpreter's outputs match the reference on ``feeds``: ``expected``
    (graph output → values) where given, else the GraphDef in TensorFlow."""
    path = Path(path)
    io.check_writable(path)
    io.refuse_input(path, input_path)
    outside.refuse_conversion(graph_def, "TFLite export")
    reference_note = artefacts.OPTIMIZED_REFERENCE if expected is None else \
        artefacts.ORIGINAL_REFERENCE
    expected = savedmodel_export.reference(graph_def, signature, feeds, timeout, expected)
    with artefacts.staging(path) as stage:
        saved_model = stage / "saved_model"
        savedmodel_export.build(graph_def, signature, saved_model)
        model = convert(saved_model, signature.key, float16=float16, int8=int8)
    artefact = check(model, signature, feeds, expected, tolerance=tolerance, timeout=timeout)
    artefact.path = path
    artefact.weights = "float16" if float16 else "int8" if int8 else "float32"
    artefact.reference = reference_note
    if artefact.passed:
        artefacts.publish(lambda: io.write_atomically(path, model), batch)
    return artefact


def convert(saved_model: Path, key: str, *, float16: bool = False, int8: bool = False) -> bytes:
    """The TFLite flatbuffer of one SavedModel signature (builtin ops only)."""
    import tensorflow as tf
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=[key])
    if float16:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    if int8:                        # dynamic range: int8 weights, no representative dataset
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    try:
        return converter.convert()
    except Exception as error:  # noqa: BLE001 - ConverterError, ValueError, RuntimeError, ...
        raise ExportError(f"the TFLite converter refuses the graph: {converter_reason(error)}") \
            from None


def converter_reason(error) -> str:
    """The converter's reason in one line: its first ``error:`` and the ops it names."""
    text = str(error)
    reason = re.search(r"error: (?:loc\(.*?\): )?(.+)", text)
    ops = re.search(r"^((?:Custom|Flex|TF Select) ops: .+)$", text, re.MULTILINE)
    parts = [reason.group(1).strip() if reason else first_line(text)]
    if ops:
        parts.append(ops.group(1).strip())
    return first_line("; ".join(parts))


def check(model: bytes, signature: savedmodel_export.Signature, feeds: Mapping[str, np.ndarray],
          expected: Mapping[str, np.ndarray], *, tolerance: float,
          timeout: float = verify.DEFAULT_TIMEOUT) -> Artefact:
    """Run ``model`` through its signature in the interpreter on ``feeds`` and compare."""
    interpreter, runtime = interpreter_class()
    actual = artefacts.with_deadline(lambda: run(interpreter, model, signature, feeds), timeout,
                                     f"the TFLite model in the {runtime}")
    errors, max_error, compared = artefacts.compare(expected, actual)
    return Artefact("tflite", Path(), len(model), max_error, tolerance,
                    compared and max_error <= tolerance, runtime, outputs=errors)


def run(interpreter_type, model: bytes, signature: savedmodel_export.Signature,
        feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    try:
        runner = interpreter_type(model_content=model).get_signature_runner(signature.key)
        return dict(runner(**artefacts.feeds_by_key(feeds, signature.inputs)))
    except Exception as error:  # noqa: BLE001 - the interpreter raises ValueError/RuntimeError
        raise ExportError(f"the TFLite interpreter cannot run the model: "
                          f"{first_line(error)}") from None
