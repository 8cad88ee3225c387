"""What tf2onnx leaves behind that a shape fact proves unnecessary, removed in the ONNX model.

**Identity Reshape.** tf2onnx's transpose optimizer turns a layout Transpose of an
``[N, 1, 1, C]`` tensor into ``Reshape(x, [-1, C, 1, 1])``; once the layout has settled, many
of them reshape ``[N, C, 1, 1]`` to ``[N, C, 1, 1]`` (EfficientNet: two per squeeze-and-excite
block, 32 in all) and onnxruntime keeps them. A Reshape is the identity when ONNX shape
inference gives its input a shape the constant target matches dimension by dimension: equal
static sizes, a 0 that copies (``allowzero=0``), and at most one -1, which then can only stand
for the one size left. Shape inference runs in strict mode: where the shapes tf2onnx declares
contradict the ops, nothing is proven and every Reshape stays. Graph outputs keep their names: a
Reshape that produces one stays.
"""
from __future__ import annotations

from typing import Dict, Iterator, Optional, Sequence

import numpy as np


def tidy(model) -> Dict[str, int]:
    """Rewrite ``model`` in place; how many of each rewrite were made (only those made)."""
    done = {"identity Reshape removed": remove_identity_reshapes(model)}
    return {rewrite: count for rewrite, count in done.items() if count}


def remove_identity_reshapes(model) -> int:
    import onnx
    graph = model.graph
    try:
        shapes = _inferred_shapes(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    except Exception:    # declared and inferred shapes disagree, > 2 GB, unknown ops: no facts
        return 0
    constants = _int64_constants(graph)
    outputs = {o.name for o in graph.output}
    alias = {}                                  # a removed Reshape's output → its input
    for node in graph.node:
        target = constants.get(node.input[1]) if node.op_type == "Reshape" else None
        if (target is not None and node.output[0] not in outputs
                and _is_identity(shapes.get(node.input[0]), target,
                                 _attribute(node, "allowzero", 0))):
            alias[node.output[0]] = alias.get(node.input[0], node.input[0])
    targets = {n.input[1] for n in graph.node if n.op_type == "Reshape" and n.output[0] in alias}
    _remove_nodes(graph, lambda node: node.op_type == "Reshape" and node.output[0] in alias)
    _rename_inputs(graph, alias)
    _drop_unread_initializers(graph, targets)
    return len(alias)


def _is_identity(shape: Optional[Sequence], target: np.ndarray, allowzero: int) -> bool:
    """Reshape of a tensor of ``shape`` (ints, None where unknown) to ``target`` returns it as is:
    every size equal to the input's (static, or copied by a 0) but at most one -1, which then can
    only be the input's own size — unless another size is 0 and leaves it undetermined."""
    if shape is None or target.ndim != 1 or len(target) != len(shape) or (target == -1).sum() > 1:
        return False
    for size, t in zip(shape, target):
        copied = t == 0 and not allowzero
        if not (t == -1 or copied or (size is not None and t == size)):
            return False
    return -1 not in target or 0 not in [s for s, t in zip(shape, target) if t != -1]


# ---------------------------------------------------------------- helpers
def _inferred_shapes(model) -> Dict[str, list]:
    """Tensor name → dims (int, or None where symbolic/unknown) for every shaped top-level value."""
    shapes = {}
    for value in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None
                                  for d in tensor.shape.dim]
    for tensor in model.graph.initializer:
        shapes[tensor.name] = list(tensor.dims)
    return shapes


def _int64_constants(graph) -> Dict[str, np.ndarray]:
    """int64 initializers and Constant nodes whose data is in the model (not external), by name."""
    import onnx
    from onnx import numpy_helper
    tensors = {t.name: t for t in graph.initializer}
    tensors.update({n.output[0]: n.attribute[0].t for n in graph.node
                    if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return {name: numpy_helper.to_array(t) for name, t in tensors.items()
            if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type == onnx.TensorProto.INT64}


def _attribute(node, name: str, default):
    from onnx import helper
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _rename_inputs(graph, alias: Dict[str, str]) -> None:
    """Every reader (in subgraphs too) of a name in ``alias`` reads its alias instead."""
    for node in all_nodes(graph):
        for i, name in enumerate(node.input):
            if name in alias:
                node.input[i] = alias[name]


def _remove_nodes(graph, doomed) -> None:
    kept = [node for node in graph.node if not doomed(node)]
    if len(kept) < len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def _drop_unread_initializers(graph, names) -> None:
    """Those of ``names`` that are initializers nothing reads any more."""
    read = {name for node in all_nodes(graph) for name in node.input}
    read |= {o.name for o in graph.output} | {i.name for i in graph.input}
    unread = [t for t in graph.initializer if t.name in names and t.name not in read]
    for tensor in unread:
        graph.initializer.remove(tensor)


def all_nodes(graph) -> Iterator:
    """Every node, including those in If/Loop bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from all_nodes(sub)
