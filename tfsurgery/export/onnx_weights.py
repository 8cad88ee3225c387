"""ONNX weight storage: float16 or int8 initializers decoded back to float32 by a node in front
of the graph (``Cast`` / ``DequantizeLinear``), so onnxruntime computes with its float kernels
and the file is half or a quarter of the size. Runs after onnxruntime's rewrite, whose constant
folding would undo it; on a ModelProto in memory or a model file (external data stays external).
"""
from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Dict, Optional

import numpy as np

EXTERNAL_MIN_BYTES = 1024       # smaller tensors stay inside the .onnx file


def weights_to_float16(model, min_elements: int) -> int:
    """float32 initializers with at least ``min_elements`` values → float16 initializers and a
    Cast to float32 under the original name (consumers unchanged). After onnxruntime's rewrite,
    whose constant folding would undo it. ``model``: a ModelProto (edited in place) or the path
    of a model file (rewritten). Returns how many were converted."""
    import onnx
    from onnx import helper, numpy_helper
    model, path = _loaded(model)
    graph, casts, kept = model.graph, [], []
    for tensor in graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT or np.prod(tensor.dims) < min_elements:
            kept.append(tensor)
            continue
        value = numpy_helper.to_array(tensor)
        if not np.all(np.isfinite(value)) or np.abs(value).max() > np.finfo(np.float16).max:
            kept.append(tensor)
            continue
        kept.append(numpy_helper.from_array(value.astype(np.float16), tensor.name + "_float16"))
        casts.append(helper.make_node("Cast", [tensor.name + "_float16"], [tensor.name],
                                      name=tensor.name + "_to_float32", to=onnx.TensorProto.FLOAT))
    if casts:
        _store_weights(model, path, kept, casts)
    return len(casts)


# ONNX op → (weight input, output-channel axis of that weight); MatMul's B is [in, out], Gemm's
# [out, in] with transB; Conv's W [out, in/group, k...]; ConvTranspose's W [in, out/group, k...].
ONNX_WEIGHT_INPUTS = {"Conv": (1, 0), "ConvTranspose": (1, 1), "MatMul": (1, 1), "Gemm": (1, None)}


def weights_to_int8(model, min_elements: int) -> int:
    """Float32 weight initializers of Conv/ConvTranspose/MatMul/Gemm with at least
    ``min_elements`` values → int8 initializers + ``DequantizeLinear`` (per output channel,
    symmetric: zero point 0) under the original name, so onnxruntime computes in float with its
    float kernels. The TensorFlow side stored these weights as int8 already (int8-weights;
    ``dequantized_weights`` folded them for tf2onnx): requantizing q·s per output channel gives
    back q (a depthwise Conv's multiplier channels share their input channel's scale, as there).
    After onnxruntime's rewrite, whose constant folding would undo it; through a
    Transpose of the initializer too (--raw-onnx). ``model``: a ModelProto (edited in place) or
    the path of a model file (rewritten). Returns how many were converted."""
    import onnx
    from onnx import helper, numpy_helper
    from tfsurgery.transforms.int8_weights import quantize
    model, path = _loaded(model)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    axes: Dict[str, set] = collections.defaultdict(set)
    producers = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name not in initializers:
                continue
            spec = ONNX_WEIGHT_INPUTS.get(node.op_type)
            weight = spec and index == spec[0] and not (node.op_type == "MatMul" and
                                                        len(initializers[name].dims) != 2)
            axes[name].add((_onnx_axis(node), _shared(node, initializers[name]))
                           if weight else None)
        if node.op_type in ONNX_WEIGHT_INPUTS and len(node.input) > 1:
            transpose = producers.get(node.input[1])
            if transpose is not None and transpose.op_type == "Transpose" and \
                    transpose.input[0] in initializers:
                perm = [a for attr in transpose.attribute if attr.name == "perm"
                        for a in attr.ints]
                axis = _onnx_axis(node)
                axes[transpose.input[0]].add((perm[axis], 1) if perm and axis is not None
                                             else None)
    dequantize, kept = [], []
    for tensor in graph.initializer:
        chosen = axes.get(tensor.name, {None})
        if tensor.data_type != onnx.TensorProto.FLOAT or np.prod(tensor.dims) < min_elements \
                or len(chosen) != 1 or None in chosen or len(tensor.dims) < 2:
            kept.append(tensor)
            continue
        value = numpy_helper.to_array(tensor)
        if not np.all(np.isfinite(value)):
            kept.append(tensor)
            continue
        axis, group = chosen.pop()
        q, scale = quantize(value, axis, group)
        base = tensor.name
        kept += [numpy_helper.from_array(q, base + "_int8"),
                 numpy_helper.from_array(scale, base + "_scale"),
                 numpy_helper.from_array(np.zeros_like(scale, dtype=np.int8), base + "_zero")]
        dequantize.append(helper.make_node(
            "DequantizeLinear", [base + "_int8", base + "_scale", base + "_zero"], [base],
            name=base + "_dequantize", axis=axis))
    if dequantize:
        _store_weights(model, path, kept, dequantize)
    return len(dequantize)


def _loaded(model):
    """(ModelProto, None) for a model in memory; (the file's model, its path) for a path."""
    import onnx
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(str(model)), Path(model)
    return model, None


def _store_weights(model, path: Optional[Path], initializers: list, decoders: list) -> None:
    """Gives ``model`` ``initializers`` as its weights and ``decoders`` (the nodes turning
    stored weights back into float32) in front of its nodes; with a ``path``, saves it there
    (external data stays external)."""
    import onnx
    graph = model.graph
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    nodes = decoders + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    if path is None:
        return
    data = path.with_name(path.name + ".data")
    external = data.exists()
    data.unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=external,
                    location=data.name if external else None,
                    size_threshold=EXTERNAL_MIN_BYTES)


def _shared(node, weight) -> int:
    """Output channels sharing one scale: a depthwise Conv's (group > 1, one input channel per
    group) multiplier channels, as int8-weights scaled them per input channel; else 1."""
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    if node.op_type != "Conv" or group <= 1:
        return 1
    if len(weight.dims) < 2 or weight.dims[1] != 1:
        return 1
    return int(weight.dims[0]) // group


def _onnx_axis(node) -> Optional[int]:
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return ONNX_WEIGHT_INPUTS[node.op_type][1]
