"""``bench --int8``: the float model and its int8-weight twin side by side in each runtime.

For each runtime — TensorFlow (the two ``.pb``), onnxruntime (the float ONNX and the one with
int8 initializers + ``DequantizeLinear``), TFLite (float and dynamic-range int8) — both models
are written (each export checked as usual against its own graph in TensorFlow), sized, timed
in one process of their own through ``latency.measure_in_subprocess`` (interleaved runs, median
and interquartile range), and compared with each other on the same inputs: the int8 model's
max error relative to each float output's magnitude, and top-1 agreement where an output is
class scores. On random inputs and random weights that agreement says nothing about accuracy
on real data; with ``--samples`` it is measured on the user's rows.

In onnxruntime a third model joins them, reported as a row of its own against float: **static
int8** (the quantization ``--quantize int8`` makes: QDQ with this machine's ``int8_target``
settings, calibrated on the same rows; no accuracy search). Each onnxruntime session is timed
in a process of its own with onnxruntime's defaults but the thread count, as a plain session
runs it (``latency.measure_each``; two spinning sessions in one process slow each other).

In OpenVINO (when installed) the float IR (checked at f32 against its graph in TensorFlow) is
set against its **NNCF int8** twin (``nncf.quantize`` calibrated on the same rows, no accuracy
search), both compiled at f32 — what is not int8 runs at f32, not at OpenVINO's bf16 default.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Mapping, Sequence

import numpy as np

from tfsurgery.export import artefacts
from tfsurgery.int8 import target as int8_target
from tfsurgery.bench import latency
from tfsurgery.export import onnx as onnx_export
from tfsurgery.export import openvino as openvino_export
from tfsurgery.int8.backends import onnx as quantize
from tfsurgery.int8.backends import openvino as quantize_openvino
from tfsurgery.export import savedmodel as savedmodel_export
from tfsurgery.export import tflite as tflite_export
from tfsurgery.verify import check as verify
from tfsurgery.errors import InputError
from tfsurgery.errors import ExportError
from tfsurgery.ops import tensor_name
from tfsurgery.verify.samples import Samples

RUNTIMES = ("tensorflow", "onnxruntime", "tflite", "openvino")
OPENVINO_SIDE = "openvino (int8: NNCF static)"
VARIANTS = ("float", "int8")


@dataclasses.dataclass
class Side:
    """One runtime: both models' sizes and timings, and how far int8 is from float there."""
    runtime: str
    bytes: Dict[str, int] = dataclasses.field(default_factory=dict)        # variant → size
    timings: Dict[str, latency.Timing] = dataclasses.field(default_factory=dict)
    max_error: float = float("nan")      # int8 vs float, relative to each output's magnitude
    agreement: Dict[str, dict] = dataclasses.field(default_factory=dict)   # class outputs
    skipped: str = ""                    # why this runtime has no row

    def as_dict(self) -> dict:
        return {"runtime": self.runtime, "bytes": self.bytes, "max_error": self.max_error,
                "timings": {v: t.as_dict() for v, t in self.timings.items()},
                "agreement": self.agreement, "skipped": self.skipped}


def bench(graphs: Mapping[str, object], inputs: Sequence[str], outputs: Sequence[str],
          signature: savedmodel_export.Signature, *, feeds: Mapping[str, np.ndarray],
          tolerances: Mapping[str, float], int8_min_elements: int, work: Path,
          runs: int = 50, runtimes: Sequence[str] = RUNTIMES,
          compare_on: Sequence[Mapping[str, np.ndarray]] = (),
          timeout: float = verify.DEFAULT_TIMEOUT) -> List[Side]:
    """``graphs``: {"float": GraphDef, "int8": GraphDef}, both checked against the original
    (``tolerances``: each one's). Timed on ``feeds``; int8 compared with float on
    ``compare_on`` (e.g. every row of the user's samples; default: ``feeds``). A runtime whose
    export fails is reported as skipped, with why."""
    sides = []
    for runtime in runtimes:
        if runtime == "openvino":
            sides.append(_openvino_side(graphs["float"], inputs, outputs, feeds,
                                        list(compare_on) or [feeds], tolerances["float"], work,
                                        runs, timeout))
            continue
        side = Side(runtime)
        try:
            paths = _write(runtime, graphs, inputs, outputs, signature, feeds, tolerances,
                           int8_min_elements, work, timeout)
            values = {variant: _run(runtime, paths[variant], graphs[variant], outputs,
                                    signature, list(compare_on) or [feeds], timeout)
                      for variant in VARIANTS}
        except ExportError as error:
            side.skipped = str(error)
            sides.append(side)
            continue
        side.bytes = {v: artefacts.size_of(p) + _data_size(p) for v, p in paths.items()}
        side.max_error, side.agreement = _agreement(values["float"], values["int8"])
        static = None
        if runtime == "onnxruntime":
            static, paths["static"] = _static_int8(paths["float"], work,
                                                   list(compare_on) or [feeds], outputs,
                                                   values["float"], timeout)
        npz = work / f"feeds_{runtime}.npz"
        np.savez(npz, **(artefacts.feeds_by_key(feeds, signature.inputs) if runtime == "tflite"
                         else {k: np.asarray(v) for k, v in feeds.items()}))
        rows = latency.measure_each(runtime, {v: (paths[v], npz) for v in paths},
                                    list(outputs), runs=runs, work=work,
                                    timeout=max(timeout, 600))
        side.timings = {row.variant: row for row in rows if row.variant in VARIANTS}
        sides.append(side)
        if static is not None:
            static.bytes = {"float": side.bytes["float"],
                            "int8": artefacts.size_of(paths["static"])}
            static.timings = {"float": side.timings["float"],
                              "int8": next(r for r in rows if r.variant == "static")}
            sides.append(static)
    return sides


def _static_int8(float_model: Path, work: Path, batches, outputs, reference,
                 timeout: float):
    """(its side, its path): the float ONNX as static QDQ int8 for this machine, calibrated on
    ``batches`` (the user's samples, else the bench inputs), and its agreement with float
    there; the caller fills in sizes and timings."""
    settings = int8_target.settings()
    side = Side(f"onnxruntime static int8 ({settings.target})")
    rows = _samples(batches)
    path = work / "static.onnx"
    quantize._quantize_static(float_model, path, rows, [], cache=work / "static.json",
                              settings=settings)
    values = _run("onnxruntime", path, None, outputs, None, batches, timeout)
    side.max_error, side.agreement = _agreement(reference, values)
    return side, path


def _samples(batches) -> Samples:
    """The batches' rows as one set of samples (what static int8 calibrates on)."""
    names = list(batches[0])
    return Samples({name: np.concatenate([np.asarray(b[name]) for b in batches])
                    for name in names}, {name: False for name in names}, "bench rows")


def _openvino_side(graph_def, inputs, outputs, feeds, batches, tolerance: float, work: Path,
                   runs: int, timeout: float) -> Side:
    """The float IR and its NNCF int8 twin (calibrated on ``batches``), both compiled at f32:
    sizes, agreement on ``batches``, and timings, each in an OpenVINO process of its own (two
    compiled models in one process disturb each other's threads)."""
    side = Side(OPENVINO_SIDE)
    paths = {"float": work / "float_openvino", "int8": work / "int8_openvino"}
    try:
        done = openvino_export.export(graph_def, inputs, outputs, paths["float"],
                                      feeds=dict(feeds), precision="f32", timeout=timeout,
                                      tolerance=openvino_export.tolerance_for("f32", tolerance))
        if not done.passed:
            raise ExportError(f"the float OpenVINO IR differs from its graph in TensorFlow by "
                              f"{done.max_error:.3g}")
        quantize_openvino.require_nncf()
        int8 = quantize_openvino.quantize(openvino_export.convert(graph_def, inputs, outputs),
                                          _samples(batches))
        openvino_export.save(int8, paths["int8"], "f32")
        values = {variant: [openvino_export.run(path / openvino_export.XML, batch, outputs,
                                                "f32") for batch in batches]
                  for variant, path in paths.items()}
    except (ExportError, InputError) as error:
        side.skipped = str(error)
        return side
    side.bytes = {variant: artefacts.size_of(path) for variant, path in paths.items()}
    side.max_error, side.agreement = _agreement(values["float"], values["int8"])
    npz = work / "feeds_openvino.npz"
    np.savez(npz, **{k: np.asarray(v) for k, v in feeds.items()})
    for variant, path in paths.items():     # one process each: compiled models share no CPU
        (side.timings[variant],) = latency.measure_in_subprocess(
            "openvino", {variant: (path, npz)}, list(outputs), runs=runs, work=work,
            timeout=max(timeout, 600), precisions={variant: "f32"})
    return side


def _write(runtime, graphs, inputs, outputs, signature, feeds, tolerances, min_elements,
           work: Path, timeout: float) -> Dict[str, Path]:
    """Each variant's model for one runtime, written (ONNX and TFLite: checked against their
    own graph in TensorFlow on ``feeds``, as every export is)."""
    paths = {}
    for variant in VARIANTS:
        graph_def, int8 = graphs[variant], variant == "int8"
        if runtime == "tensorflow":
            path = work / f"{variant}.pb"
            path.write_bytes(graph_def.SerializeToString())
        elif runtime == "onnxruntime":
            path = work / f"{variant}.onnx"
            exported = onnx_export.export(graph_def, inputs, outputs, path, feeds=dict(feeds),
                                          tolerance=tolerances[variant], timeout=timeout,
                                          int8_min_elements=min_elements if int8 else None)
            if not exported.passed:
                raise ExportError(f"the {variant} ONNX model differs from its graph in "
                                  f"TensorFlow by {exported.max_error:.3g}")
        else:
            path = work / f"{variant}.tflite"
            exported = tflite_export.export(graph_def, signature, path, feeds=feeds,
                                            tolerance=tolerances[variant], int8=int8,
                                            timeout=timeout)
            if not exported.passed:
                raise ExportError(f"the {variant} TFLite model differs from its graph in "
                                  f"TensorFlow by {exported.max_error:.3g}")
        paths[variant] = path
    return paths


def _run(runtime: str, path: Path, graph_def, outputs: Sequence[str], signature,
         batches: Sequence[Mapping[str, np.ndarray]], timeout: float) -> List[Dict]:
    """The model's outputs ({output: values}) on each batch."""
    got = []
    model = path.read_bytes() if runtime == "tflite" else None
    for feeds in batches:
        if runtime == "tensorflow":
            values = verify.run_graph(graph_def, dict(feeds), outputs, timeout=timeout)
        elif runtime == "onnxruntime":
            values = onnx_export.run_onnx(path, {tensor_name(k): v for k, v in feeds.items()},
                                          outputs, timeout=timeout)
        else:
            by_key = tflite_export.run(tflite_export.interpreter_class()[0], model, signature,
                                       feeds)
            key_of = {tensor: key for key, tensor in signature.outputs.items()}
            values = [by_key[key_of[tensor_name(name)]] for name in outputs]
        got.append({name: np.asarray(value) for name, value in zip(outputs, values)})
    return got


def _data_size(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return data.stat().st_size if data.exists() else 0


def _agreement(reference: Sequence[Mapping[str, np.ndarray]],
               int8: Sequence[Mapping[str, np.ndarray]]):
    """(the worst batch's max error of int8 against float, relative to each output's magnitude
    as verification measures it; {class output: {"agree", "rows"}} over every batch's rows)."""
    errors = [verify.output_error(name, expected[name], actual[name])
              for expected, actual in zip(reference, int8) for name in expected]
    agreement = {}
    for name in reference[0]:
        if all(verify.is_class_scores(batch[name]) for batch in reference):
            same = np.concatenate([np.argmax(e[name], -1) == np.argmax(a[name], -1)
                                   for e, a in zip(reference, int8)])
            agreement[name] = {"agree": int(np.count_nonzero(same)), "rows": int(same.size)}
    return verify.worst_error(errors), agreement
