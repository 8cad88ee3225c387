"""``bench --int8``: the float model and its int8-weight twin side by side in each runtime.

For each runtime — TensorFlow (the two ``.pb``), onnxruntime (the float ONNX and the one with
int8 initializers + ``DequantizeLinear``), TFLite (float and dynamic-range int8) — both models
are written (each export checked as usual against its own graph in TensorFlow), sized, timed
in one process of their own through ``latency.measure_in_subprocess`` (interleaved runs, median
and interquartile range), and compared with each other on the same inputs: the int8 model's
max error relative to each float output's magnitude, and top-1 agreement where an output is
class scores. On random inputs and random weights that agreement says nothing about accuracy
on real data; with ``--samples`` it is measured on the user's rows.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Mapping, Sequence

import numpy as np

from tfsurgery import artefacts, latency, onnx_export, savedmodel_export, tflite_export, verify
from tfsurgery.errors import ExportError
from tfsurgery.ops import tensor_name

RUNTIMES = ("tensorflow", "onnxruntime", "tflite")
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
          timeout: float = verify.DEFAULT_TIMEOUT) -> List[Side]:
    """``graphs``: {"float": GraphDef, "int8": GraphDef}, both verified against the original
    (``tolerances``: each one's). A runtime whose export fails is reported as skipped (why)."""
    sides = []
    for runtime in runtimes:
        side = Side(runtime)
        try:
            paths, values, npz = _write(runtime, graphs, inputs, outputs, signature, feeds,
                                        tolerances, int8_min_elements, work, timeout)
        except ExportError as error:
            side.skipped = str(error)
            sides.append(side)
            continue
        side.bytes = {v: artefacts.size_of(p) + _data_size(p) for v, p in paths.items()}
        side.max_error, side.agreement = _agreement(values["float"], values["int8"])
        rows = latency.measure_in_subprocess(runtime, {v: (paths[v], npz) for v in VARIANTS},
                                             list(outputs), runs=runs, work=work,
                                             timeout=max(timeout, 600))
        side.timings = {row.variant: row for row in rows}
        sides.append(side)
    return sides


def _write(runtime, graphs, inputs, outputs, signature, feeds, tolerances, min_elements,
           work: Path, timeout: float):
    """({variant: model path}, {variant: {output: values}}, feeds .npz) for one runtime."""
    paths, values = {}, {}
    npz = work / f"feeds_{runtime}.npz"
    np.savez(npz, **(artefacts.feeds_by_key(feeds, signature.inputs) if runtime == "tflite"
                     else {k: np.asarray(v) for k, v in feeds.items()}))
    for variant in VARIANTS:
        graph_def, int8 = graphs[variant], variant == "int8"
        if runtime == "tensorflow":
            path = work / f"{variant}.pb"
            path.write_bytes(graph_def.SerializeToString())
            got = verify.run_graph(graph_def, dict(feeds), outputs, timeout=timeout,
                                   label=f"the {variant} graph")
            values[variant] = dict(zip(outputs, got))
        elif runtime == "onnxruntime":
            path = work / f"{variant}.onnx"
            exported = onnx_export.export(graph_def, inputs, outputs, path, feeds=dict(feeds),
                                          tolerance=tolerances[variant], timeout=timeout,
                                          int8_min_elements=min_elements if int8 else None)
            if not exported.passed:
                raise ExportError(f"the {variant} ONNX model differs from its graph in "
                                  f"TensorFlow by {exported.max_error:.3g}")
            got = onnx_export.run_onnx(path, {tensor_name(k): v for k, v in feeds.items()},
                                       outputs, timeout=timeout)
            values[variant] = dict(zip(outputs, got))
        else:
            path = work / f"{variant}.tflite"
            exported = tflite_export.export(graph_def, signature, path, feeds=feeds,
                                            tolerance=tolerances[variant], int8=int8,
                                            timeout=timeout)
            if not exported.passed:
                raise ExportError(f"the {variant} TFLite model differs from its graph in "
                                  f"TensorFlow by {exported.max_error:.3g}")
            interpreter = tflite_export.interpreter_class()[0]
            got = tflite_export.run(interpreter, path.read_bytes(), signature, feeds)
            values[variant] = {tensor: got[key] for key, tensor in signature.outputs.items()}
        paths[variant] = path
    return paths, values, npz


def _data_size(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return data.stat().st_size if data.exists() else 0


def _agreement(reference: Mapping[str, np.ndarray], int8: Mapping[str, np.ndarray]):
    """(max relative error of int8 against float, {class output: {"agree", "rows"}})."""
    errors = [verify.output_error(name, reference[name], np.asarray(int8[name]))
              for name in reference]
    agreement = {}
    for name in reference:
        if verify.is_class_scores(reference[name]):
            same = np.argmax(reference[name], -1) == np.argmax(np.asarray(int8[name]), -1)
            agreement[name] = {"agree": int(np.count_nonzero(same)), "rows": int(same.size)}
    return verify.worst_error(errors), agreement

