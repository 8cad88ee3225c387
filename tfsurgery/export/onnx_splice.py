"""Put a fused ONNX op in place of the nodes that computed one tensor (ground floor).

A fusion (``transforms/fuse_*.py``) proves a pattern on the TensorFlow graph, where the ops are
the ones the model's author wrote, and describes its replacement as a ``Fused``: ONNX nodes that
read tensors tf2onnx named after TensorFlow's (``"node:0"``) and produce the matched pattern's
output under that same name, so every reader of it — and the verifier comparing by name — stays
valid. ``splice`` puts it into the converted model; the nodes that only fed the old output are
then dead and go (``remove_dead_nodes``).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import numpy as np

MICROSOFT = "com.microsoft"
INT_OUTPUTS = {("EmbedLayerNormalization", 1): 6}     # its mask_index: int32 (TensorProto.INT32)


@dataclasses.dataclass
class Fused:
    """The replacement of one TF tensor ``output`` (``"node:0"``): ``nodes`` (NodeProtos) read
    ``reads`` (existing tensors) and ``weights`` (new initializers, by name), and the last of
    them writes ``output``. ``what`` is the report's word for it ("LayerNorm")."""

    what: str
    output: str
    reads: List[str]
    nodes: list
    weights: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    # what to splice instead when this one's tensors are not in the ONNX model
    fallback: Optional["Fused"] = None


def tensor_name(ref) -> str:
    """The ONNX name tf2onnx gives a TF tensor: ``node:port``."""
    return f"{ref.node}:{ref.port}"


def splice(model, fused: Fused) -> Optional[str]:
    """Replace the producer of ``fused.output`` in ``model`` by ``fused.nodes``; None when done,
    else why not (the model is then unchanged)."""
    from onnx import numpy_helper
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    known = set(producers) | {t.name for t in graph.initializer} | {i.name for i in graph.input}
    missing = [name for name in [fused.output] + fused.reads if name not in known]
    if missing:
        if fused.fallback is not None:
            return splice(model, fused.fallback)
        return f"tensor {missing[0]} is not in the ONNX model (renamed by the conversion)"
    if fused.output not in producers:
        return f"{fused.output} is a graph input"
    graph.node.remove(producers[fused.output])
    graph.node.extend(fused.nodes)
    graph.initializer.extend(numpy_helper.from_array(value, name)
                             for name, value in fused.weights.items())
    return None


def finish(model) -> None:
    """After the splices: dead nodes and unread initializers out, nodes in topological order,
    com.microsoft's opset declared where its ops are used."""
    remove_dead_nodes(model.graph)
    _sort_topologically(model.graph)
    declare_microsoft_opset(model)


def declare_microsoft_opset(model) -> None:
    """The com.microsoft opset where its ops are used, and the element type (float) of their
    outputs: onnx's shape inference knows neither, and tools after us (onnxruntime's
    quantizers) stop at an untyped tensor."""
    from onnx import TensorProto, helper
    ours = [node for node in model.graph.node if node.domain == MICROSOFT]
    if ours and not any(o.domain == MICROSOFT for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))
    typed = {v.name for v in model.graph.value_info} | {o.name for o in model.graph.output}
    model.graph.value_info.extend(
        helper.make_tensor_value_info(name, INT_OUTPUTS.get((node.op_type, port),
                                                            TensorProto.FLOAT), None)
        for node in ours for port, name in enumerate(node.output) if name and name not in typed)


def remove_dead_nodes(graph) -> int:
    """Nodes whose outputs nothing reads (nor the graph gives), repeatedly; then initializers
    nothing reads. Returns how many nodes went."""
    removed = 0
    outputs = {o.name for o in graph.output}
    while True:
        read = {name for node in graph.node for name in _reads(node)} | outputs
        live = [n for n in graph.node if any(out in read for out in n.output if out)]
        if len(live) == len(graph.node):
            break
        removed += len(graph.node) - len(live)
        del graph.node[:]
        graph.node.extend(live)
    read = {name for node in graph.node for name in _reads(node)} | outputs
    kept = [t for t in graph.initializer if t.name in read]
    if len(kept) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return removed


def _reads(node) -> Sequence[str]:
    """The names a node reads, in its subgraphs too (If/Loop bodies read outer names)."""
    names = list(node.input)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            own = {out for inner in sub.node for out in inner.output}
            own |= {t.name for t in sub.initializer} | {i.name for i in sub.input}
            names.extend(name for inner in sub.node for name in _reads(inner)
                         if name not in own)
    return names


def _sort_topologically(graph) -> None:
    """Kahn's order: spliced nodes were appended after their readers."""
    available = {t.name for t in graph.initializer} | {i.name for i in graph.input} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(name in available for name in _reads(n))]
        if not ready:       # a name read from nowhere (a subgraph's own): keep the rest as is
            ordered.extend(pending)
            break
        ready_ids = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in ready_ids]
        ordered.extend(ready)
        available.update(out for n in ready for out in n.output)
    del graph.node[:]
    graph.node.extend(ordered)
