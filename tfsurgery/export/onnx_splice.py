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
import functools
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
    opsets = {o.domain or "": o.version for o in model.opset_import}
    for node in fused.nodes:
        why = undefined(node, opsets)
        if why is not None:
            return why
    graph.node.remove(producers[fused.output])
    graph.node.extend(fused.nodes)
    graph.initializer.extend(numpy_helper.from_array(value, name)
                             for name, value in fused.weights.items())
    return None


def undefined(node, opsets: Dict[str, int]) -> Optional[str]:
    """Why ``node`` is not an op of the model's opsets (``opsets``: domain → version; the
    com.microsoft opset we declare is 1), or None when it is: standard ops by onnx's schemas
    (LayerNormalization exists from opset 17, Squeeze takes its axes as an input from 13),
    com.microsoft's by onnxruntime's."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = opsets.get(domain, opsets.get("ai.onnx") if domain == "" else MICROSOFT_OPSET)
    if domain == MICROSOFT:
        if not any(since <= version for since in _onnxruntime_ops().get(node.op_type, ())):
            return (f"onnxruntime {_onnxruntime_version()} has no {MICROSOFT} {node.op_type} "
                    f"at version {version}")
        return None
    import onnx.defs
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        first = next((v for v in range(version + 1, onnx.defs.onnx_opset_version() + 1)
                      if onnx.defs.has(node.op_type, v, domain)), None)
        since = f" from opset {first}" if first else " at no opset onnx knows"
        return f"{node.op_type} is an ONNX op{since}; the model's opset is {version}"
    unknown = [a.name for a in node.attribute if a.name not in schema.attributes]
    if not schema.min_input <= len(node.input) <= schema.max_input or unknown:
        return (f"{node.op_type} at opset {version} (version {schema.since_version}) takes "
                f"{schema.min_input}-{schema.max_input} inputs and attributes "
                f"{sorted(schema.attributes)}; the fusion writes {len(node.input)} inputs"
                f"{' and ' + ', '.join(unknown) if unknown else ''}")
    return None


MICROSOFT_OPSET = 1         # the com.microsoft version ``declare_microsoft_opset`` declares


@functools.lru_cache(maxsize=1)
def _onnxruntime_ops() -> Dict[str, tuple]:
    """onnxruntime's com.microsoft ops: name → the versions it defines."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema
    ops: Dict[str, tuple] = {}
    for schema in get_all_operator_schema():
        if schema.domain == MICROSOFT:
            ops[schema.name] = ops.get(schema.name, ()) + (schema.since_version,)
    return ops


def _onnxruntime_version() -> str:
    import onnxruntime
    return onnxruntime.__version__


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
        model.opset_import.append(helper.make_opsetid(MICROSOFT, MICROSOFT_OPSET))
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
