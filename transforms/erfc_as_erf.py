"""erfc-as-erf: ``Erfc(z)`` → ``1 - Erf(z)``, the form ONNX runtimes know.

TensorFlow 2.21 lowers exact GELU (DistilBERT, ViT: ``0.5·x·erfc(-x/√2)``) to ``Erfc``. ONNX has
``Erf`` (opset 9) but no ``Erfc``, and tf2onnx 1.17 has no handler for it: it leaves the TF op in
and writes a file onnxruntime refuses to load. ``erfc(z) = 1 − erf(z)`` exactly; in float32 the
right side loses the tail where ``erfc(z)`` < 6e-8 (z > 3.9), an absolute error under 6e-8 —
GELU multiplies it by ``0.5·x``, so the output moves by less than ``1e-7·|x|``.

Not in the default pipeline (TensorFlow runs ``Erfc`` itself): the ONNX exporter applies it to
the graph it hands tf2onnx (``tfsurgery.export.onnx.convert``); ask for it by name to have the
form in the ``.pb`` too. The Sub keeps the Erfc's name, so its readers and the outputs stay.
Function bodies get the same rewrite: tf2onnx converts a While's body (an RNN cell with exact
GELU) into its ONNX Loop, where an Erfc stops the conversion as at the top level.
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
    for name in sorted(graph.function_names()):      # While/If bodies tf2onnx converts too
        _rewrite_function(graph.edit_function(name), report)
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


def _rewrite_function(function, report: TransformReport) -> None:
    """The same rewrite inside a FunctionDef body (a While loop's: an RNN cell with exact GELU),
    where a node's output is named by its output argument: Erfc's ``y``, Sub's ``z``."""
    from tensorflow.core.framework import node_def_pb2
    names = {node.name for node in function.node_def}
    for erfc in [node for node in function.node_def if node.op == "Erfc"]:
        where = f"{function.signature.name}/{erfc.name}"
        report.matched += 1
        dtype = _float_type(erfc.attr["T"].type)
        if dtype is None or {f"{erfc.name}/erf", f"{erfc.name}/one"} & names:
            report.skip(where, "its type T is not a float type" if dtype is None else
                        "the names for its Erf and constant are taken")
            continue
        data = [ref for ref in erfc.input if not ref.startswith("^")]
        controls = [ref for ref in erfc.input if ref.startswith("^")]
        erf = node_def_pb2.NodeDef(name=f"{erfc.name}/erf", op="Erf", input=data,
                                   device=erfc.device)
        erf.attr["T"].type = dtype.as_datatype_enum
        one = node_def_pb2.NodeDef(name=f"{erfc.name}/one", op="Const", device=erfc.device)
        one.attr["dtype"].type = dtype.as_datatype_enum
        one.attr["value"].tensor.CopyFrom(_tensor_proto(np.ones((), dtype.as_numpy_dtype)))
        erfc.op = "Sub"
        del erfc.input[:]
        erfc.input.extend([f"{one.name}:output:0", f"{erf.name}:y:0", *controls])
        function.node_def.extend([erf, one])
        _rename_output(function, f"{erfc.name}:y:", f"{erfc.name}:z:")
        report.rewritten.append(where)


def _rename_output(function, old: str, new: str) -> None:
    """Readers of ``old`` (``node:arg:``) read ``new`` instead, the function's results too."""
    for node in function.node_def:
        for i, ref in enumerate(node.input):
            if ref.startswith(old):
                node.input[i] = new + ref[len(old):]
    for key, ref in function.ret.items():
        if ref.startswith(old):
            function.ret[key] = new + ref[len(old):]


def _tensor_proto(value):
    import tensorflow as tf
    return tf.make_tensor_proto(value)


def _float_type(value):
    import tensorflow as tf
    dtype = tf.dtypes.as_dtype(value) if value else None
    return dtype if dtype is not None and dtype.name in FLOAT_TYPES else None


def _dtype(graph: Graph, name: str):
    return _float_type(graph.node(name).attr["T"].type)
