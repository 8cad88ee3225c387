"""Transformer fusions in the converted ONNX model: onnxruntime's fused kernels.

Where the fusion happens: each pattern is proven on the TensorFlow graph (``transforms/fuse_*``:
LayerNorm, GELU, attention) and spliced into tf2onnx's output after onnxruntime's basic
rewrites (``onnx_splice``), because there the pattern is still the one the author wrote, while
tf2onnx's lowering of Einsum with dynamic shapes buries attention under Shape/Gather/Concat/
Reshape chains. The TensorFlow graph itself is not changed — nothing stands between Grappler's
remapper (oneDNN fuses LayerNorm and MatMul+GELU on its own) and the ops it knows. Then
onnxruntime's own transformer fusions take the next step on our nodes: a residual ``Add`` before
``LayerNormalization`` → ``SkipLayerNormalization``, a bias ``Add`` before ``Gelu``/``FastGelu``
→ ``BiasGelu``/``FastGelu`` with bias (``onnxruntime.transformers``; no torch needed).
The export's check (onnxruntime against TensorFlow) judges the result like any other.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Dict, List, Optional, Sequence, Tuple

from tfsurgery.export import onnx_splice
from tfsurgery.graph import Graph
from tfsurgery.transforms import CANONICAL_RULES, ONNX_FUSIONS, canonical_forms

NAMES = tuple(fusion.NAME for fusion in ONNX_FUSIONS)
SKIP_LAYER_NORM = "residual Add + LayerNormalization → SkipLayerNormalization"
BIAS_GELU = "bias Add + Gelu/FastGelu → BiasGelu/FastGelu(bias)"


# the report's word for what each fusion looks for (its candidates: each Softmax, Rsqrt, ...)
KINDS = {"fuse-embed-layer-norm": "embedding LayerNorm", "fuse-layer-norm": "LayerNorm",
         "fuse-gelu": "GELU", "fuse-attention": "attention"}


@dataclasses.dataclass
class FusionReport:
    fused: Dict[str, int] = dataclasses.field(default_factory=dict)      # what → how many
    skipped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)   # (node, why)
    kinds: List[str] = dataclasses.field(default_factory=list)   # skipped[i]'s fusion name
    # spellings rewritten to canonical form before matching: "from → to" → how many
    canonical: Dict[str, int] = dataclasses.field(default_factory=dict)

    def skip(self, fusion: str, node: str, why: str) -> None:
        self.skipped.append((node, why))
        self.kinds.append(fusion)

    def not_fused(self) -> List[str]:
        return [f"{node}: {why}" for node, why in self.skipped]

    def grouped(self) -> List[dict]:
        """The candidates left alone, one entry per fusion and reason: {fusion, kind, count,
        why, nodes}, in the order first met."""
        groups: Dict[Tuple[str, str], dict] = {}
        for fusion, (node, why) in zip(self.kinds, self.skipped):
            group = groups.setdefault((fusion, why), dict(
                fusion=fusion, kind=KINDS.get(fusion, fusion), count=0, why=why, nodes=[]))
            group["count"] += 1
            group["nodes"].append(node)
        return list(groups.values())


def not_fused_lines(groups: Sequence[dict]) -> List[str]:
    """The report's lines: "attention ×12 not fused: <why>"."""
    return [f"onnx fusions: {g['kind']} ×{g['count']} not fused: {g['why']}" for g in groups]


@dataclasses.dataclass
class Matches:
    """What each fusion found on the TensorFlow graph (matched once per export, spliced into
    as many copies of the ONNX model as ``auto`` times): fusion name → the ``Fused``
    replacements, and → (node, why not) of its other candidates."""
    found: Dict[str, List[onnx_splice.Fused]]
    skipped: Dict[str, List[Tuple[str, str]]]
    graph: Graph
    canonical: Dict[str, int] = dataclasses.field(default_factory=dict)   # rewrites made

    @property
    def names(self) -> List[str]:
        """The fusions that found at least one pattern."""
        return [name for name, found in self.found.items() if found]


def match(graph_def, shapes=None) -> Matches:
    """Every fusion of ``ONNX_FUSIONS`` matched on ``graph_def`` in canonical form
    (``canonical_forms``); the ONNX stays tf2onnx's conversion of ``graph_def`` itself."""
    shapes = shapes or static_shapes(graph_def)
    graph, rewrites = canonical_forms.canonical(graph_def, shapes, CANONICAL_RULES)
    found, skipped = {}, {}
    for fusion in ONNX_FUSIONS:
        found[fusion.NAME], skipped[fusion.NAME] = fusion.find(graph, shapes)
    return Matches(found, skipped, graph, canonical_forms.summary(rewrites))


def fuse(model, graph_def, *, only: Optional[Sequence[str]] = None,
         skip_layer_norm: bool = True, bias_gelu: bool = True, shapes=None) -> FusionReport:
    """Splice every fusion ``ONNX_FUSIONS`` proves on ``graph_def`` into ``model`` (in place);
    ``only``: the fusions by name (``fuse-embed-layer-norm``, ``fuse-layer-norm``,
    ``fuse-gelu``, ``fuse-attention``)."""
    return splice(model, match(graph_def, shapes), only=only, skip_layer_norm=skip_layer_norm,
                  bias_gelu=bias_gelu)


def splice(model, matches: Matches, *, only: Optional[Sequence[str]] = None,
           skip_layer_norm: bool = True, bias_gelu: bool = True,
           left_out: str = "not among the fusions asked for (--onnx-fusions)") -> FusionReport:
    """The fusions ``matches`` found (``only`` those named) spliced into ``model`` in place.
    The report keeps every candidate left alone with its reason — those of the fusions not
    asked for too, ``left_out`` being theirs."""
    report, claimed = FusionReport(canonical=dict(matches.canonical)), set()
    for name, found in matches.found.items():
        for node, why in matches.skipped[name]:
            report.skip(name, node, why)
        if only is not None and name not in only:
            for fused in found:
                report.skip(name, fused.output, left_out)
            continue
        for fused in found:
            if fused.output in claimed:     # the embedding's LayerNorm: already fused with it
                continue
            # the matches serve every variant ``auto`` times: the nodes renamed are copies
            fused = dataclasses.replace(fused, nodes=[copy.deepcopy(n) for n in fused.nodes])
            output = fused.output
            why = onnx_splice.splice(model, _named_as_converted(fused, matches.graph, model))
            if why is None:
                claimed.add(output)
                report.fused[fused.what] = report.fused.get(fused.what, 0) + 1
            else:
                report.skip(name, fused.output, why)
    if report.fused:
        onnx_splice.finish(model)
        ort_fused = _onnxruntime_fusions(model, skip_layer_norm and "LayerNormalization" in
                                         _histogram(model), bias_gelu)
        report.fused.update({what: n for what, n in ort_fused.items() if n})
    return report


def found(graph_def, shapes=None) -> List[str]:
    """The names of the fusions that find at least one pattern in ``graph_def``."""
    return match(graph_def, shapes).names


def _named_as_converted(fused: onnx_splice.Fused, graph: Graph, model) -> onnx_splice.Fused:
    """tf2onnx drops Identities (a graph output's, a SavedModel's ``StatefulPartitionedCall/
    Identity`` before it, say) and gives the last one's name to the tensor they forwarded: then
    the fused op writes that name."""
    produced = {out for node in model.graph.node for out in node.output}
    node, seen = fused.output.rsplit(":", 1)[0], set()
    while f"{node}:0" not in produced and node not in seen:
        seen.add(node)
        readers = sorted(r for r in graph.consumer_nodes(node, 0) if graph.op(r) == "Identity")
        if not readers:
            return fused
        node = next((r for r in readers if f"{r}:0" in produced), readers[0])
    if f"{node}:0" in produced:
        fused.nodes[-1].output[0] = fused.output = f"{node}:0"
    return fused


def static_shapes(graph_def):
    """A tensor's static shape by TensorFlow's shape inference: ``shapes(ref)`` → a list of
    ints (None where unknown), or None for unknown rank or a missing tensor. The graph is
    imported on the first question only (most graphs have no attention to ask about)."""
    imported = []

    def shapes(ref) -> Optional[list]:
        if not imported:
            import tensorflow as tf
            with tf.Graph().as_default() as graph:
                tf.graph_util.import_graph_def(graph_def, name="")
            imported.append(graph)
        try:
            shape = imported[0].get_tensor_by_name(onnx_splice.tensor_name(ref)).shape
        except (KeyError, ValueError):
            return None
        return None if shape.rank is None else shape.as_list()
    return shapes


def _onnxruntime_fusions(model, skip_layer_norm: bool, bias_gelu: bool) -> Dict[str, int]:
    """onnxruntime.transformers' fusions that start from the ops we emitted."""
    from onnxruntime.transformers.fusion_biasgelu import FusionBiasGelu
    from onnxruntime.transformers.fusion_skiplayernorm import FusionSkipLayerNormalization
    from onnxruntime.transformers.onnx_model import OnnxModel
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    wrapped, counts = OnnxModel(model), {}
    biased_before = _biased_gelus(model)
    if skip_layer_norm:
        FusionSkipLayerNormalization(wrapped).apply()
    if bias_gelu:
        FusionBiasGelu(wrapped, is_fastgelu=True).apply()
        FusionBiasGelu(wrapped, is_fastgelu=False).apply()
    wrapped.prune_graph()
    wrapped.topological_sort()
    after = _histogram(wrapped.model)
    counts[SKIP_LAYER_NORM] = after.get("SkipLayerNormalization", 0)
    counts[BIAS_GELU] = _biased_gelus(wrapped.model) - biased_before
    if wrapped.model is not model:
        model.CopyFrom(wrapped.model)
    onnx_splice.declare_microsoft_opset(model)
    return counts


def _histogram(model) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _biased_gelus(model) -> int:
    return sum(1 for n in model.graph.node if n.op_type == "BiasGelu" or
               (n.op_type == "FastGelu" and len(n.input) > 1))
