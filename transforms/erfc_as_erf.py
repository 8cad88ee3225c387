"""erfc-as-erf: ``Erfc(z)`` → ``1 - Erf(z)``, the form ONNX runtimes know.

TensorFlow 2.21 lowers exact GELU (DistilBERT, ViT: ``0.5·x·erfc(-x/√2)``) to ``Erfc``. ONNX has
``Erf`` (opset 9) but no ``Erfc``, and tf2onnx 1.17 has no handler for it: it leaves the TF op in
and writes a file onnxruntime refuses to load. ``erfc(z) = 1 − erf(z)`` exactly; in float32 the
right side loses the tail where ``erfc(z)`` < 6e-8 (z > 3.9), an absolute error under 6e-8 —
GELU multiplies it by ``0.5·x``, so the output moves by less than ``1e-7·|x|``.

Not in the default pipeline (TensorFlow runs ``Erfc`` itself): the ONNX exporter applies it to
the graph it hands tf2onnx (``tfsurgery.export.onnx.convert``); ask for it by name to have the
form in the ``.pb`` too. The Sub keeps the Erfc's name, so its readers and the outputs stay.
"""
from __future__ import annotations

import numpy as np

from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.graph import Graph

FLOAT_TYPES = {"float16", "bfloat16", "float32", "float64"}


@transform("erfc-as-erf", default=False)
def erfc_as_erf(graph: Graph, options: Options) -> TransformReport:
    report = TransformReport("erfc-as-erf")
    for node in graph.nodes_with_ops({"Erfc"}):
        report.matched += 1
        dtype = _dtype(graph, node.name)
        if dtype is None:
            report.skip(node.name, "its type T is not a float type")
            continue
        _rewrite(graph, node.name, dtype)
        report.rewritten.append(node.name)
    return report


def _rewrite(graph: Graph, name: str, dtype) -> None:
    """``name = Erfc(z)`` becomes ``name = Sub(1, Erf(z))`` on the same device, after the same
    control inputs."""
    node = graph.node(name)
    z, device, controls = graph.inputs(name)[0], node.device, graph.control_inputs(name)
    graph.remove([name])
    erf = graph.new_node("Erf", f"{name}/erf", [z], {"T": dtype}, device=device)
    one = graph.add_const(f"{name}/one", np.ones((), dtype.as_numpy_dtype), device=device)
    graph.new_node("Sub", name, [one, erf.name, *(f"^{c}" for c in controls)], {"T": dtype},
                   device=device)


def _dtype(graph: Graph, name: str):
    import tensorflow as tf
    value = graph.node(name).attr["T"].type
    dtype = tf.dtypes.as_dtype(value) if value else None
    return dtype if dtype is not None and dtype.name in FLOAT_TYPES else None
