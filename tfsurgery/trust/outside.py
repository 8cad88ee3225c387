"""What a model may run: an allowlist decided from TensorFlow's own registry, before anything runs.

People optimize models they downloaded, and tfsurgery runs every model it is given (to verify it,
fold its constants, check every artefact, calibrate int8, time it). Before anything runs, what
would run is scanned — the nodes the fetched tensors need once the fed ones cut the graph, and
every library function they call, at any depth. A node may run when TensorFlow's OpDef says it
is stateless (``is_stateful`` false) or when it is a stateful op reviewed to stay in memory
(``stateful_ops.REVIEWED``) — and it is not one of the ops below that reach files, servers or
Python (some of those, ``ReadFile`` among them, are stateless by TF's contract). Everything else
is refused (``UnsafeModel``: one line naming the ops, their nodes and the ``--allow-op`` that
allows each): unreviewed stateful ops, ops TensorFlow does not register, and a graph held in a
tensor (``DatasetFromGraph``) unless it is a constant whose decoded graph passes the same scan.

The named list follows TensorFlow's op definitions: every registered op whose inputs or
attributes name a file, a directory, a checkpoint prefix, a log directory, a summary writer, a
reader, a debug URL, a proto descriptor file, a database or a server address, plus the Python
callbacks and ``MatchingFiles`` (tests/test_outside_ops.py derives that set from the registry).
It gives the refusal its reason ("reads files") and keeps stateless file ops out.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections import deque
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

from tfsurgery.errors import UnsafeModel
from tfsurgery.ops import node_name
from tfsurgery.trust.provenance import (CHECKPOINT_PATH_INPUTS, TABLE_FROM_FILE_OPS, Provenance,
                                        data_inputs, is_inside, name_in, nested_functions)
from tfsurgery.trust.stateful_ops import REVIEWED

READS_FILES = "reads files"
WRITES_FILES = "writes files"
CALLS_PYTHON = "calls Python code"
NETWORK = "reaches the network"


def _ops(text: str, reach: str) -> Dict[str, str]:
    return {op: reach for op in text.split()}


# op → what it reaches. Each entry is an op TensorFlow registers (checked by the tests).
OUTSIDE_OPS: Dict[str, str] = {
    # file I/O and file listing (saved_model_cli's denylist: ReadFile, WriteFile, PrintV2)
    **_ops("ReadFile MatchingFiles ImmutableConst FileSystemSetConfiguration", READS_FILES),
    **_ops("WriteFile", WRITES_FILES),
    # checkpoints
    **_ops("Restore RestoreSlice RestoreV2 LoadAndRemapMatrix GenerateVocabRemapping",
           READS_FILES),
    **_ops("Save SaveSlices SaveV2 MergeV2Checkpoints", WRITES_FILES),
    # summary writers (summaries themselves are plain protos: harmless)
    **_ops("SummaryWriter CreateSummaryFileWriter CreateSummaryDbWriter FlushSummaryWriter "
           "CloseSummaryWriter WriteSummary WriteScalarSummary WriteHistogramSummary "
           "WriteImageSummary WriteAudioSummary WriteGraphSummary WriteRawProtoSummary "
           "ImportEvent StatsAggregatorSetSummaryWriter", WRITES_FILES),
    # TF1 readers (the reader ops themselves open the files a queue names)
    **_ops("WholeFileReader WholeFileReaderV2 TextLineReader TextLineReaderV2 TFRecordReader "
           "TFRecordReaderV2 FixedLengthRecordReader FixedLengthRecordReaderV2 LMDBReader "
           "IdentityReader IdentityReaderV2 ReaderRead ReaderReadV2 ReaderReadUpTo "
           "ReaderReadUpToV2 ReaderReset ReaderResetV2 ReaderRestoreState ReaderRestoreStateV2 "
           "ReaderSerializeState ReaderSerializeStateV2 ReaderNumRecordsProduced "
           "ReaderNumRecordsProducedV2 ReaderNumWorkUnitsCompleted "
           "ReaderNumWorkUnitsCompletedV2 RecordInput", READS_FILES),
    # file datasets (tf.data)
    **_ops("TFRecordDataset TFRecordDatasetV2 TextLineDataset FixedLengthRecordDataset "
           "FixedLengthRecordDatasetV2 CSVDataset CSVDatasetV2 ExperimentalCSVDataset "
           "LMDBDataset ExperimentalLMDBDataset SqlDataset ExperimentalSqlDataset "
           "MatchingFilesDataset ExperimentalMatchingFilesDataset LoadDataset "
           "SnapshotDatasetReader SnapshotNestedDatasetReader SnapshotChunkDataset "
           "ListSnapshotChunksDataset", READS_FILES),
    **_ops("CacheDataset CacheDatasetV2 SnapshotDataset SnapshotDatasetV2 SaveDataset "
           "SaveDatasetV2 DatasetToTFRecord ExperimentalDatasetToTFRecord", WRITES_FILES),
    # lookup tables and samplers filled from text files
    **_ops("InitializeTableFromTextFile InitializeTableFromTextFileV2", READS_FILES),
    # tf.data service (a server address) and distributed snapshots
    **_ops("DataServiceDataset DataServiceDatasetV2 DataServiceDatasetV3 DataServiceDatasetV4 "
           "RegisterDataset RegisterDatasetV2 DistributedSave", NETWORK),
    # Python callbacks (tf.py_function / tf.numpy_function)
    **_ops("PyFunc PyFuncStateless EagerPyFunc", CALLS_PYTHON),
}

def _prints_to_file(attr) -> bool:
    return attr.s.decode(errors="replace").startswith("file://")


def _reads_descriptor_file(attr) -> bool:
    return attr.s.decode(errors="replace") not in ("", "local://")


def _has_urls(attr) -> bool:
    return len(attr.list.s) > 0


def _names_a_file(attr) -> bool:
    return bool(attr.s)


# Ops that reach outside only with some attribute values: op → (attribute, what it reaches,
# the test on the attribute's value).
CONDITIONAL_OPS = {
    "PrintV2": ("output_stream", WRITES_FILES, _prints_to_file),
    "DecodeProtoV2": ("descriptor_source", READS_FILES, _reads_descriptor_file),
    "EncodeProto": ("descriptor_source", READS_FILES, _reads_descriptor_file),
    "DebugIdentity": ("debug_urls", WRITES_FILES, _has_urls),
    "DebugIdentityV2": ("debug_urls", WRITES_FILES, _has_urls),
    "DebugIdentityV3": ("debug_urls", WRITES_FILES, _has_urls),
    "DebugNanCount": ("debug_urls", WRITES_FILES, _has_urls),
    "DebugNumericSummary": ("debug_urls", WRITES_FILES, _has_urls),
    "FixedUnigramCandidateSampler": ("vocab_file", READS_FILES, _names_a_file),
}

# Stateless ops that run a graph they are given as a tensor: its graph is decoded and scanned.
EMBEDDED_GRAPH_OPS = frozenset({"DatasetFromGraph"})
NOT_REVIEWED = "a stateful op not reviewed to stay in memory (tfsurgery/trust/stateful_ops.py)"
UNKNOWN_OP = "an op this TensorFlow does not register (a custom op: --import its library)"
UNSCANNABLE = "runs a graph held in a tensor that cannot be decoded and scanned"
MOST_NESTED = 8                        # embedded graphs inside embedded graphs: deeper is refused


def reaches_outside(node, functions=()) -> Optional[str]:
    """Why ``node`` (a NodeDef) may not run, or None: TensorFlow's registry decides (a stateless
    op runs, a stateful one only when reviewed), after the ops known to reach files, servers or
    Python. ``functions``: the library's names (a node calling one is scanned through it)."""
    reach = OUTSIDE_OPS.get(node.op)
    if reach is not None:
        return reach
    conditional = CONDITIONAL_OPS.get(node.op)
    if conditional is not None:
        attr, reach, applies = conditional
        if attr in node.attr and applies(node.attr[attr]):
            return reach
    if node.op in functions:
        return None
    definition = _op_def(node.op)
    if definition is None:
        return UNKNOWN_OP
    if definition.is_stateful and node.op not in REVIEWED:
        return NOT_REVIEWED
    return None


def _op_def(op: str):
    from tensorflow.python.framework import op_def_registry
    return op_def_registry.get(op)


def runs_unreviewed(op: str) -> bool:
    """``op`` is one a model may not run by default (what ``--allow-op`` may name)."""
    definition = _op_def(op)
    return op in OUTSIDE_OPS or op in CONDITIONAL_OPS or op in EMBEDDED_GRAPH_OPS or (
        definition is not None and definition.is_stateful and op not in REVIEWED)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One node that may not run: ``node`` (``function/node`` inside a library function), its
    ``op`` and what it ``reaches`` (or why it is refused)."""

    node: str
    op: str
    reaches: str

    def line(self) -> str:
        return f"{self.op} '{self.node}' ({self.reaches})"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _called_functions(node) -> Iterator[str]:
    """Library functions a node calls: as its op (a direct call) or through its function
    attributes (If/While bodies, PartitionedCall, tf.data functions), nested ones included."""
    yield node.op
    for value in node.attr.values():
        for func in ([value.func] if value.HasField("func") else list(value.list.func)):
            yield func.name
            yield from nested_functions(func)


def find(graph_def, outputs: Optional[Sequence[str]] = None, cut: Iterable[str] = (), *,
         own_assets: Optional[Path] = None, provenance: Optional[Provenance] = None,
         all_functions: bool = False, depth: int = 0) -> List[Finding]:
    """Every node that may not run when ``outputs`` are fetched with the ``cut`` tensors fed
    (their producers do not run), and every such node in the library functions those nodes
    call, at any depth. ``outputs`` None: every node; ``all_functions``: every library function
    too, called or not (a SavedModel's loader calls some by name). Checkpoint
    ops and tables filled from a file pass only where ``provenance`` (a SavedModel's; with
    ``own_assets``, a frozen graph's constant paths into that directory) proves the file the
    model's own. Embedded graphs (``DatasetFromGraph``) are decoded and scanned the same way."""
    if provenance is None and own_assets is not None:
        provenance = Provenance(graph_def, assets=own_assets)
    nodes = {node.name: node for node in graph_def.node}
    functions = {f.signature.name: f for f in graph_def.library.function}
    reached = list(nodes) if outputs is None else _needed(nodes, outputs, cut)
    scan = _Scan(functions, provenance, depth)
    called: deque = deque(sorted(functions) if all_functions else ())
    for name in reached:
        scan.check(nodes[name], name, nodes, None)
        called.extend(_called_functions(nodes[name]))
    seen = set()
    while called:
        function = called.popleft()
        if function in seen or function not in functions:
            continue
        seen.add(function)
        body = {node.name: node for node in functions[function].node_def}
        for node in functions[function].node_def:
            scan.check(node, f"{function}/{node.name}", body, function)
            called.extend(_called_functions(node))
    return scan.findings


@dataclasses.dataclass
class _Scan:
    functions: dict
    provenance: Optional[Provenance]
    depth: int
    findings: List[Finding] = dataclasses.field(default_factory=list)

    def check(self, node, where: str, scope: dict, function: Optional[str]) -> None:
        if node.op in EMBEDDED_GRAPH_OPS:
            self.findings += self._embedded(node, where, scope, function)
            return
        reach = reaches_outside(node, self.functions)
        if reach is None:
            return
        if self.provenance is not None and (node.op in TABLE_FROM_FILE_OPS or
                                            node.op in CHECKPOINT_PATH_INPUTS) and \
                self.provenance.proven(node, function):
            return
        self.findings.append(Finding(where, node.op, reach))

    def _embedded(self, node, where: str, scope: dict, function: Optional[str]):
        """The graph a ``DatasetFromGraph`` runs, decoded from its constant input and scanned
        whole (its functions too), or a finding when it cannot be."""
        embedded = _constant_graph(node, scope, function)
        if embedded is None or self.depth >= MOST_NESTED:
            return [Finding(where, node.op, UNSCANNABLE)]
        inner = find(embedded, all_functions=True, depth=self.depth + 1)
        return [Finding(f"{where}/{f.node}", f.op, f.reaches) for f in inner]


def _constant_graph(node, scope: dict, function: Optional[str]):
    """The GraphDef a node's first input holds as a constant (through Identity), or None."""
    from tensorflow.core.framework import graph_pb2
    from google.protobuf.message import DecodeError
    inputs = data_inputs(node)
    source = scope.get(name_in(inputs[0], function)) if inputs else None
    while source is not None and source.op == "Identity" and source.input:
        source = scope.get(name_in(source.input[0], function))
    if source is None or source.op != "Const":
        return None
    values = source.attr["value"].tensor.string_val
    if len(values) != 1:
        return None
    embedded = graph_pb2.GraphDef()
    try:
        embedded.ParseFromString(values[0])
    except DecodeError:
        return None
    return embedded


def find_in_saved_model(saved_model, directory: Path) -> List[Finding]:
    """What loading and calling a SavedModel (a ``SavedModel`` proto) could run: every node and
    every function of its graphs — restore and initializer functions, the saver's own graph —
    checkpoint ops passing only when fed by the saver's own filename tensor and tables only
    when filled from the model's own assets (tfsurgery.trust.provenance). An asset whose path
    leaves the model's assets directory is itself a finding."""
    findings: List[Finding] = []
    assets = directory / "assets"
    for meta_graph in saved_model.meta_graphs:
        for asset in meta_graph.asset_file_def:
            if not is_inside(assets / asset.filename, assets):
                findings.append(Finding(asset.tensor_info.name or asset.filename,
                                        "asset file", f"reads {asset.filename!r}, outside "
                                        "the model's assets directory"))
        provenance = Provenance(
            meta_graph.graph_def, assets=assets,
            asset_nodes=[a.tensor_info.name for a in meta_graph.asset_file_def],
            saver_filename=meta_graph.saver_def.filename_tensor_name,
            object_graph=meta_graph.object_graph_def
            if meta_graph.HasField("object_graph_def") else None)
        findings += find(meta_graph.graph_def, None, provenance=provenance, all_functions=True)
    return findings


def _needed(nodes: dict, outputs: Sequence[str], cut: Iterable[str]) -> List[str]:
    """The nodes fetching ``outputs`` runs: ancestors over data and control edges, not through
    the fed ``cut`` tensors' producers."""
    stop = {node_name(name) for name in cut}
    stack, seen = [node_name(name) for name in outputs], set()
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        if name in stop:
            continue
        stack.extend(node_name(text) for text in nodes[name].input)
    return sorted(seen)


# ---------------------------------------------------------------- allowing
_ALLOWED: contextvars.ContextVar = contextvars.ContextVar("tfsurgery_allowed_ops",
                                                          default=frozenset())


def allowed() -> frozenset:
    """The op names allowed to act outside the graph here (``allowing``)."""
    return _ALLOWED.get()


@contextlib.contextmanager
def allowing(ops: Iterable[str]):
    """Within the block, graphs holding these ops (by op name) may run, besides those already
    allowed. Unknown names are refused: a typo must not pass silently."""
    ops = frozenset(ops or ())
    check_op_names(ops)
    token = _ALLOWED.set(_ALLOWED.get() | ops)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def check_op_names(ops: Iterable[str]) -> None:
    unknown = sorted(op for op in set(ops) if not runs_unreviewed(op))
    if unknown:
        examples = ", ".join(sorted(OUTSIDE_OPS)[:4])
        raise UnsafeModel(f"--allow-op {unknown[0]}: not an op a model is refused to run "
                          f"(those act outside the graph, like {examples}, or are stateful and "
                          "not reviewed; see docs/untrusted_models.md)")


def refuse(graph_def, outputs: Optional[Sequence[str]] = None, cut: Iterable[str] = (), *,
           where: str = "the graph", allow: Iterable[str] = (),
           own_assets: Optional[Path] = None, strict: bool = False) -> List[Finding]:
    """``UnsafeModel`` when what would run holds ops acting outside the graph that are not
    allowed (``allow`` plus ``allowing``'s; ``strict``: none at all); otherwise the allowed
    findings (for the report)."""
    findings = find(graph_def, outputs, cut, own_assets=own_assets)
    return refuse_findings(findings, where, frozenset() if strict else
                           allowed() | frozenset(allow or ()))


def refuse_findings(findings: Sequence[Finding], where: str,
                    permitted: Optional[frozenset] = None) -> List[Finding]:
    """``UnsafeModel`` for the findings not ``permitted`` (default: ``allowed()``); else them."""
    permitted = allowed() if permitted is None else permitted
    refused = [f for f in findings if f.op not in permitted]
    if refused:
        raise UnsafeModel(refusal(where, refused), findings=refused)
    return list(findings)


MOST_LISTED = 4


def refusal(where: str, findings: Sequence[Finding]) -> str:
    """One line: the ops, their nodes, and how to allow them."""
    listed = ", ".join(f.line() for f in findings[:MOST_LISTED])
    more = f" and {len(findings) - MOST_LISTED} more" if len(findings) > MOST_LISTED else ""
    flags = " ".join(f"--allow-op {op}" for op in sorted({f.op for f in findings})
                     if runs_unreviewed(op))
    return (f"{where}: refused, it holds ops that may not run (they act outside the graph or "
            f"are not reviewed): {listed}{more}; nothing was run or written" +
            (f" (if you trust the model: {flags})" if flags else ""))


def with_allowed_ops(function):
    """``function(..., result, ...)`` runs allowing what the optimize run that made ``result``
    was allowed (its ``allowed_ops``): a later export or check of that result runs the same
    graphs."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        ops = set()
        for value in (*args, *kwargs.values()):
            ops.update(getattr(value, "allowed_ops", None) or ())
        with allowing(ops):
            return function(*args, **kwargs)
    return run


def refuse_conversion(graph_def, converter: str) -> None:
    """Converters (tf2onnx, the TFLite converter, OpenVINO) fold constant subgraphs with
    TensorFlow or drop what they cannot express: a graph still holding ops that act outside it
    (the user allowed them to run) is not handed to one — a file's bytes could end up in the
    artefact. ``UnsafeModel`` naming them."""
    findings = find(graph_def)
    if findings:
        listed = ", ".join(f.line() for f in findings[:MOST_LISTED])
        raise UnsafeModel(f"{converter}: the graph still holds {listed}, which act outside it; "
                          "converters evaluate constant subgraphs, so it is not converted "
                          "(the frozen graph or a SavedModel keeps them as they are)",
                          findings=findings)
