"""One format at a time: the single exports the API offers (``export_saved_model``,
``export_tflite``, ``export_openvino``, ``draw``), the checks made before minutes of work
(``check_*_target``, ``check_drawable``), and the .pb's own artefact record. Each export is
converted, run on the verification inputs and written only when it matches the reference —
with a ``Batch``, only when the whole run has passed (:func:`tfsurgery.export.writer.write`)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from tfsurgery import io, picture, progress
from tfsurgery.export import artefacts
from tfsurgery.export import openvino as openvino_export
from tfsurgery.export import savedmodel as savedmodel_export
from tfsurgery.export import tflite as tflite_export
from tfsurgery.export.artefacts import Artefact, Batch
from tfsurgery.result import Result, export_reference, feeds_for_checks, require_verified
from tfsurgery.source import Source, signature_for
from tfsurgery.trust.outside import with_allowed_ops


def draw(source: Source, result: Result, path, *, scope: Optional[str] = None,
         batch: Optional[Batch] = None) -> Path:
    """The graph before and after, side by side (needs the ``picture`` extra). Rendered now —
    a graph too big to draw is refused before anything is written — and written now, or with a
    ``batch`` when the whole run has passed."""
    path = Path(path)
    data = picture.drawing(source.graph_def, result.graph_def, path, scope=scope)
    artefacts.publish(lambda: io.write_atomically(path, data), batch)
    return path


def check_drawable(source: Source, scope: Optional[str] = None) -> None:
    """Right after loading: an original too big to draw (in ``scope``) is refused at once."""
    picture.check_drawable(source.graph_def, "the input graph", scope)


def wants_directory(output) -> bool:
    """``-o DIR/`` (a trailing slash) asks for a SavedModel."""
    return output is not None and str(output).endswith(("/", os.sep))


def check_saved_model_target(path, *, force: bool = False, input_path=None) -> None:
    """Before minutes of work: a file there, or a non-empty directory without --force: exit 2."""
    savedmodel_export.check_target(Path(path), force, input_path)


def pb_artefact(result: Result, path) -> Artefact:
    """The written .pb as an artefact: its check is the verification against the original."""
    v = result.verification
    return Artefact("pb", Path(path), artefacts.size_of(Path(path)),
                    v.max_error if v else float("nan"), v.allowed if v else result.tolerance,
                    bool(v and v.passed), "verification" if v
                    else "not verified (--no-verify)", weights=result.weights,
                    outputs=list(v.outputs) if v else [],
                    reference=(artefacts.ORIGINAL_REFERENCE if result.preprocess
                               else "the original graph"))


@with_allowed_ops
def export_saved_model(source: Source, result: Result, path, *, force: bool = False,
                       batch: Optional[Batch] = None, allow_unverified: bool = False) -> Artefact:
    """Write the optimized graph as a SavedModel; loaded back and its signature called on the
    verification inputs; written only if it matches the reference (``export_reference``)
    within the run's tolerance (with a ``batch``: when the whole run has passed)."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"writing the SavedModel {path}")
    return savedmodel_export.export(result.graph_def, signature_for(source, result), path,
                                    feeds=feeds_for_checks(result), tolerance=result.tolerance,
                                    timeout=result.timeout, force=force, input_path=source.path,
                                    weights=result.weights, expected=export_reference(result),
                                    batch=batch)


@with_allowed_ops
def export_tflite(source: Source, result: Result, path, batch: Optional[Batch] = None, *,
                  allow_unverified: bool = False) -> Artefact:
    """Convert with tf.lite.TFLiteConverter (float16 weights with --store-weights float16, dynamic-range
    int8 weights with --store-weights int8), run in the
    LiteRT interpreter on the verification inputs; written only if it matches the reference
    (``export_reference``; with a ``batch``: when the whole run has passed)."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"converting to TensorFlow Lite: {path}")
    return tflite_export.export(result.graph_def, signature_for(source, result), path,
                                feeds=feeds_for_checks(result), tolerance=result.tolerance,
                                float16=result.weights == "float16",
                                int8=result.weights == "int8", timeout=result.timeout,
                                input_path=source.path, expected=export_reference(result),
                                batch=batch)


OPENVINO_PRECISIONS = openvino_export.PRECISIONS


def check_openvino_target(path, *, precision: str = "f32", force: bool = False,
                          input_path=None) -> None:
    """Before minutes of work: OpenVINO installed (else one line saying how to get it), the
    precision one this CPU runs natively, the IR directory writable: exit 2 otherwise."""
    openvino_export.check_precision(precision)
    openvino_export.check_target(Path(path), force, input_path)


@with_allowed_ops
def export_openvino(source: Source, result: Result, path, *, precision: str = "f32",
                    tolerance: Optional[float] = None, force: bool = False,
                    batch: Optional[Batch] = None, allow_unverified: bool = False) -> Artefact:
    """Convert with openvino.convert_model and save as IR (``path``/model.xml + model.bin);
    compiled for the CPU at ``precision`` ("f32" unless asked: OpenVINO's own default is bf16
    on CPUs with bf16) and run on the verification inputs; written only if it matches the
    reference (``export_reference``) within ``tolerance`` — default the precision's own
    (``openvino_export.TOLERANCES``) or the run's, whichever is looser."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"converting to OpenVINO IR ({precision}): {path}")
    if tolerance is None:
        tolerance = openvino_export.tolerance_for(precision, result.tolerance)
    return openvino_export.export(result.graph_def, result.inputs, result.outputs, path,
                                  feeds=feeds_for_checks(result), precision=precision,
                                  tolerance=tolerance, timeout=result.timeout, force=force,
                                  input_path=source.path, weights=result.weights,
                                  expected=export_reference(result), batch=batch)


def check_line(artefact: Artefact) -> str:
    """How an export was checked, in one line."""
    return (f"{artefact.checked_by}: max error {artefact.max_error:.3g} vs "
            f"{artefact.reference} (tolerance {artefact.tolerance:g})")
