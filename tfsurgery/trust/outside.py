"""Ops that act outside the graph: what a model would do to the user's machine if it ran.

People optimize models they downloaded, and tfsurgery runs every model it is given (to verify it,
fold its constants, check every artefact, calibrate int8, time it). Before anything runs, what
would run is scanned — the nodes the fetched tensors need once the fed ones cut the graph, and
every library function they call — for ops that read or write files, print to files, reach the
network or call back into Python. Such a model is refused (``UnsafeModel``: one line naming the
ops and their nodes) unless the user allows the ops by name (``--allow-op``, ``allowing(...)``).

The list follows TensorFlow's own op definitions: every registered op whose inputs or attributes
name a file, a directory, a checkpoint prefix, a log directory, a summary writer, a reader, a
debug URL, a proto descriptor file, a database or a server address, plus the Python callbacks and
``MatchingFiles`` (tests/test_outside_ops.py derives that set from the registry and checks it is
covered here). ``saved_model_cli run`` refuses ``ReadFile``, ``WriteFile`` and ``PrintV2`` by
default; we refuse those three too (``PrintV2`` when it prints to a file) and the rest below.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from collections import deque
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

from tfsurgery.errors import UnsafeModel
from tfsurgery.ops import node_name

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

TABLE_FROM_FILE_OPS = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})


def reaches_outside(node) -> Optional[str]:
    """What ``node`` (a NodeDef) reaches outside the graph when it runs, or None."""
    reach = OUTSIDE_OPS.get(node.op)
    if reach is not None:
        return reach
    conditional = CONDITIONAL_OPS.get(node.op)
    if conditional is not None:
        attr, reach, applies = conditional
        if attr in node.attr and applies(node.attr[attr]):
            return reach
    return None


@dataclasses.dataclass(frozen=True)
class Finding:
    """One node that would act outside the graph: ``node`` (``function/node`` inside a library
    function), its ``op`` and what it ``reaches``."""

    node: str
    op: str
    reaches: str

    def line(self) -> str:
        return f"{self.op} '{self.node}' ({self.reaches})"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _called_functions(node) -> Iterator[str]:
    """Library functions a node calls: through its function attributes (If/While bodies,
    PartitionedCall, tf.data map functions) or as its op (a direct call)."""
    yield node.op
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        for func in value.list.func:
            yield func.name


def find(graph_def, outputs: Optional[Sequence[str]] = None, cut: Iterable[str] = (), *,
         own_assets: Optional[Path] = None, skip: Iterable[str] = (),
         functions_too: bool = False, asset_nodes: Iterable[str] = ()) -> List[Finding]:
    """Every node that would act outside the graph when ``outputs`` are fetched with the ``cut``
    tensors fed (their producers do not run), and every such node in the library functions those
    nodes call, at any depth. ``outputs`` None: the whole graph but the ``skip`` nodes (and, with
    ``functions_too``, every library function they alone call: a SavedModel's). ``own_assets``: a
    SavedModel's assets directory — a table filled from a file there (or from an argument the
    loader binds to an asset) reads the model's own asset: allowed."""
    nodes = {node.name: node for node in graph_def.node}
    skip = set(skip)
    reached = [n for n in nodes if n not in skip] if outputs is None else \
        _needed(nodes, outputs, cut)
    functions = {f.signature.name: f for f in graph_def.library.function}
    findings: List[Finding] = []
    asset_nodes = frozenset(asset_nodes)
    called: deque = deque()
    for name in reached:
        _check(nodes[name], name, nodes, own_assets, findings, asset_nodes)
        called.extend(_called_functions(nodes[name]))
    if functions_too:
        only_skipped = _calls(functions, [nodes[n] for n in skip if n in nodes]) - \
            _calls(functions, [nodes[n] for n in reached])
        called.extend(sorted(set(functions) - only_skipped))
    seen = set()
    while called:
        function = called.popleft()
        if function in seen or function not in functions:
            continue
        seen.add(function)
        body = {node.name: node for node in functions[function].node_def}
        for node in functions[function].node_def:
            _check(node, f"{function}/{node.name}", body, own_assets, findings)
            called.extend(_called_functions(node))
    return findings


def _calls(functions: dict, roots) -> set:
    """The library functions ``roots`` (NodeDefs) call, at any depth."""
    found, stack = set(), [name for node in roots for name in _called_functions(node)]
    while stack:
        name = stack.pop()
        if name in found or name not in functions:
            continue
        found.add(name)
        stack.extend(n for node in functions[name].node_def for n in _called_functions(node))
    return found


def find_in_saved_model(saved_model, directory: Path) -> List[Finding]:
    """What loading and calling a SavedModel (a ``SavedModel`` proto) could run: every node and
    function of its graphs except its own saver's (the loader restores the variables from the
    model's own directory), tables filled from its own assets allowed. An asset whose path
    leaves the model's assets directory is itself a finding."""
    findings: List[Finding] = []
    assets = directory / "assets"
    for meta_graph in saved_model.meta_graphs:
        for asset in meta_graph.asset_file_def:
            if not is_inside(assets / asset.filename, assets):
                findings.append(Finding(asset.tensor_info.name or asset.filename,
                                        "asset file", f"reads {asset.filename!r}, outside "
                                        "the model's assets directory"))
        fed_paths = {node_name(a.tensor_info.name) for a in meta_graph.asset_file_def}
        findings += find(meta_graph.graph_def, None, skip=_saver_nodes(meta_graph),
                         functions_too=True, own_assets=assets, asset_nodes=fed_paths)
    return findings


def _saver_nodes(meta_graph) -> set:
    """The nodes of the SavedModel's own saver: what its save tensor and restore op need."""
    saver = meta_graph.saver_def
    roots = [name for name in (saver.save_tensor_name, saver.restore_op_name) if name]
    if not roots:
        return set()
    nodes = {node.name: node for node in meta_graph.graph_def.node}
    return set(_needed(nodes, roots, ()))


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


def _check(node, where: str, scope: dict, own_assets: Optional[Path],
           findings: List[Finding], asset_nodes: frozenset = frozenset()) -> None:
    reach = reaches_outside(node)
    if reach is None:
        return
    if node.op in TABLE_FROM_FILE_OPS and own_assets is not None and \
            _reads_own_asset(node, scope, own_assets, asset_nodes):
        return
    findings.append(Finding(where, node.op, reach))


def _reads_own_asset(node, scope: dict, assets: Path, asset_nodes: frozenset) -> bool:
    """A table initializer whose file name is a function argument (the SavedModel loader binds
    it to an asset) or a constant path inside the model's own assets directory."""
    if len(node.input) < 2:
        return False
    source = scope.get(node_name(node.input[1]))
    if source is None:
        return True                       # a function argument: bound by the loader to an asset
    if source.op != "Const":
        return False
    if source.name in asset_nodes:
        return True                       # TF1: the loader feeds it the asset's own path
    from tensorflow.python.framework import tensor_util
    try:
        path = tensor_util.MakeNdarray(source.attr["value"].tensor).item()
        path = Path(path.decode() if isinstance(path, bytes) else str(path))
    except (ValueError, TypeError, UnicodeDecodeError):
        return False
    return is_inside(path, assets)


def is_inside(path: Path, directory: Path) -> bool:
    """``path`` (resolved, symlinks followed) lies inside ``directory``."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))
    except (OSError, ValueError):
        return False


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
    unknown = sorted(set(ops) - set(OUTSIDE_OPS) - set(CONDITIONAL_OPS))
    if unknown:
        raise UnsafeModel(f"--allow-op {unknown[0]}: not an op that acts outside the graph "
                          f"(those are: {', '.join(sorted(OUTSIDE_OPS)[:6])}, ...; see "
                          "docs/untrusted_models.md)")


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
    flags = " ".join(f"--allow-op {op}" for op in sorted({f.op for f in findings}))
    return (f"{where}: refused, running it would act outside the graph: {listed}{more}; "
            f"nothing was run or written (if you trust the model: {flags})")


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
