"""Checked ONNX export: convert with tf2onnx, tidy with onnxruntime, check, run, compare.

``export`` converts a GraphDef with tf2onnx, removes what it leaves needlessly (``onnx_tidy``:
identity Reshapes), applies onnxruntime's *basic* graph optimizations
(portable, standard-ONNX rewrites such as MatMul+Add → Gemm; both skipped with
``ort_optimize=False``),
runs ``onnx.checker``, runs the model in onnxruntime on the same feeds as ``tfsurgery.verify.check`` and
compares with TensorFlow's outputs (or the given reference: with preprocessing in the graph, the
original fed the verifier's NumPy preprocessing). The model travels as a ``ModelProto`` in memory
through all of it (onnxruntime opens bytes) and the disk is touched once, to publish it
atomically, only if everything passed: a failed export writes nothing. A GraphDef near
protobuf's 2 GB limit is the exception: its model is staged with external data in a temporary
directory next to the target (the checker and onnxruntime read it by path) and moved into place.

Failures: a graph tf2onnx cannot convert, or converts to something the checker or onnxruntime
rejects, raises ``ExportError`` (the CLI exits 1: the graph ran in TensorFlow, so the *conversion*
failed, as with a failed verification); bad options and GraphDefs over protobuf's 2 GB limit raise
``io.InputError`` (exit 2).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import shutil
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from tfsurgery import _compat, io
from tfsurgery.export import artefacts
from tfsurgery.export import fusion_choice, onnx_divergence, onnx_tidy
from tfsurgery.export.onnx_weights import (  # noqa: F401 - part of this module's API
    EXTERNAL_MIN_BYTES, weights_to_float16, weights_to_int8)
from tfsurgery.trust import outside
from tfsurgery.verify import check as verify, scales, string_inputs
from tfsurgery.constants import evaluate
from tfsurgery.errors import ExportError, InputError, OnnxCheckFailed, OnnxUnconvertible
from tfsurgery.graph import Graph
from tfsurgery.contract import Options
from tfsurgery.transforms.erfc_as_erf import erfc_as_erf
from tfsurgery.io import PROTOBUF_LIMIT, check_protobuf_size, output_directory, refuse_input
from tfsurgery.ops import first_line, tensor_name
from tfsurgery.export.tensor_list_loops import as_tensor_arrays

DEFAULT_OPSET = 18              # newest opset tf2onnx 1.17 tests (14-18); its own default is 15
# Above this GraphDef size, export with external data. Half the limit: tf2onnx may hold a weight
# twice (e.g. a conv kernel and its transposed copy), so the ONNX model can outgrow the GraphDef.
LARGE_MODEL_BYTES = PROTOBUF_LIMIT // 2
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
NHWC_TO_NCHW = (0, 3, 1, 2)     # tf2onnx's --inputs-as-nchw handles rank-4 inputs only
CPU = ["CPUExecutionProvider"]


@dataclasses.dataclass
class OnnxExport:
    path: Path
    opset: int
    node_count: int
    op_histogram: Dict[str, int]
    max_error: float
    passed: bool                 # ONNX matches TensorFlow within tolerance; only then is it written
    external_data: bool          # weights in <path>.data next to the model
    tolerance: float = verify.DEFAULT_TOLERANCE
    converted_node_count: int = 0    # straight out of tf2onnx, before onnxruntime's rewrites
    outputs: List[verify.OutputError] = dataclasses.field(default_factory=list)
    reference: str = artefacts.OPTIMIZED_REFERENCE     # what onnxruntime was compared with
    tidied: Dict[str, int] = dataclasses.field(default_factory=dict)   # onnx_tidy's rewrites
    divergence: Optional[str] = None   # a failed check: the first ONNX node that parts from TF
    # transforms left out of the graph converted here, because tf2onnx refused the graph after
    # them: [{"transform", "why", "verification"}] (the fully optimized graph is the .pb)
    left_out: List[dict] = dataclasses.field(default_factory=list)
    not_fused: List[str] = dataclasses.field(default_factory=list)   # onnx_fusion: why not
    not_fused_groups: List[dict] = dataclasses.field(default_factory=list)   # by fusion, why
    # --onnx-fusions auto: what was measured and kept (fusion_choice.FusionChoice.as_dict())
    fusion_choice: Optional[dict] = None
    fusion_lines: List[str] = dataclasses.field(default_factory=list)   # the report's lines

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(path=str(self.path), outputs=[o.as_dict() for o in self.outputs])
        return data


def export(graph_def, inputs: Sequence[str], outputs: Sequence[str], path, *,
           opset: Optional[int] = None, inputs_as_nchw: Sequence[str] = (),
           feeds: Optional[Dict[str, np.ndarray]] = None,
           tolerance: float = verify.DEFAULT_TOLERANCE, large_model: Optional[bool] = None,
           ort_optimize: bool = True, input_path=None, seed: int = 0,
           timeout: float = verify.DEFAULT_TIMEOUT,
           float16_min_elements: Optional[int] = None,
           int8_min_elements: Optional[int] = None,
           more_feeds: Optional[Dict[str, Dict[str, np.ndarray]]] = None,
           expected: Optional[Dict[str, np.ndarray]] = None, batch=None,
           fuse: Union[bool, str, Sequence[str]] = "auto", parts=None) -> OnnxExport:
    """Convert ``graph_def`` to ONNX at ``path`` and check it against TensorFlow.
    ``parts``: output → the parts it is judged by (``Verification.parts``), else as a whole.

    ``large_model=None`` chooses external data when the GraphDef exceeds ``LARGE_MODEL_BYTES``.
    ``feeds`` default to ``verify.make_feeds(graph_def, inputs, seed)`` (NHWC; transposed for
    onnxruntime where ``inputs_as_nchw`` made the ONNX input NCHW). The model is written only if
    ``passed``; ``input_path`` is never overwritten. ``float16_min_elements``: float32 initializers
    of at least that many values are stored as float16 with a Cast back (--store-weights float16).
    ``int8_min_elements``: conv/matmul weight initializers of at least that many values are
    stored as int8 with a per-channel ``DequantizeLinear`` in front (--store-weights int8).
    ``more_feeds``: further inputs to check on, by label (verification's ``{"@32": feeds}``, a
    second sequence length), their errors named ``output@32``.
    ``fuse``: LayerNorm, GELU and attention become onnxruntime's fused kernels
    (``onnx_fusion``; the model then needs onnxruntime for its com.microsoft ops); a list of
    fusion names (``onnx_fusion.NAMES``) makes only those; "auto" those that make this model
    faster in onnxruntime on this CPU, measured (``fusion_choice``). ``ort_optimize=False`` (--raw-onnx)
    leaves them out too: tf2onnx's output, standard ops only.
    ``expected`` (output → values, e.g. the original fed the verifier's preprocessing) replaces
    the optimized graph in TensorFlow as the reference on ``feeds``; with a ``batch``
    (artefacts.Batch) the model is published when the whole run has passed.
    """
    path = Path(path)
    check_protobuf_size(graph_def.ByteSize(), "the graph")
    opset = DEFAULT_OPSET if opset is None else opset
    check_opset(opset)
    _check_target(path, input_path)
    nchw = _nchw_inputs(graph_def, inputs, inputs_as_nchw)
    large_model = graph_def.ByteSize() > LARGE_MODEL_BYTES if large_model is None else large_model
    feeds = verify.make_feeds(graph_def, inputs, seed) if feeds is None else feeds
    reference = artefacts.OPTIMIZED_REFERENCE if expected is None else \
        artefacts.ORIGINAL_REFERENCE
    expected = _reference(graph_def, feeds, outputs, timeout, expected)
    # In memory from conversion to publishing; only a model near protobuf's 2 GB limit goes
    # through files (external data), staged next to the target.
    staged = artefacts.staging(path, batch) if large_model else contextlib.nullcontext(None)
    with staged as stage:
        model, storage = convert(graph_def, inputs, outputs, opset=opset, inputs_as_nchw=nchw,
                                 large_model=large_model)
        converted_nodes = len(model.graph.node)
        tidied = onnx_tidy.tidy(model) if ort_optimize else {}
        converted = model                   # what localizing a failed check compares with TF
        if stage is not None:
            save(model, storage, stage / path.name)
            model = stage / path.name       # from here on, the steps read and write the file
        if ort_optimize:
            model = _basic_rewrites(model)
        fusions, choice = fusion_choice.apply(model, graph_def, fuse,
                                               _onnx_feeds(feeds, nchw), outputs) \
            if fuse and ort_optimize and stage is None else (None, None)
        if fusions is not None:
            tidied.update(fusions.fused)
        if float16_min_elements is not None:
            weights_to_float16(model, float16_min_elements)
        if int8_min_elements is not None and not weights_to_int8(model, int8_min_elements):
            raise ExportError("--store-weights int8: no conv/matmul weight initializer of at least "
                              f"{int8_min_elements} values is left in the ONNX model to store "
                              "as int8")
        check(model)
        runnable = model if stage is not None else model.SerializeToString()
        actual = run_onnx(runnable, _onnx_feeds(feeds, nchw), outputs, timeout=timeout)
        parts = dict(parts or {})       # each part at its own scale, as the verification judged
        errors = [scales.judged_error(name, e, a, parts.get(name), same_dtype=False)
                  for name, e, a in zip(outputs, expected, actual)]
        for label, more in (more_feeds or {}).items():
            errors += _errors_at(graph_def, runnable, more, nchw, outputs, timeout, label, parts)
        hist = op_histogram(model)
        groups = fusions.grouped() if fusions else []
        max_error = verify.worst_error(errors)
        external = stage is not None and (stage / (path.name + ".data")).exists()
        compared = verify.compared_real_numbers(errors)
        result = OnnxExport(path, opset, sum(hist.values()), hist, max_error,
                            compared and max_error <= tolerance, external, tolerance,
                            converted_nodes, errors, reference, tidied,
                            not_fused=fusions.not_fused() if fusions else [],
                            not_fused_groups=groups,
                            fusion_choice=choice.as_dict() if choice else None,
                            fusion_lines=fusion_choice.lines(choice, groups))
        if result.passed and stage is not None:
            artefacts.publish(lambda: _publish(stage, path), batch, stage)
        elif result.passed:
            artefacts.publish(lambda: io.write_atomically(path, runnable), batch)
        elif compared and not large_model:
            result.divergence = onnx_divergence.first_onnx_divergence(
                graph_def, converted, feeds, _onnx_feeds(feeds, nchw), tolerance, timeout)
    return result


def require_passed(exported: OnnxExport) -> OnnxExport:
    """``exported`` if its check passed; else ``OnnxCheckFailed`` with its numbers (the one
    wording of a failed ONNX check, for the API and ``api.write`` alike)."""
    if exported.passed:
        return exported
    worst = max(exported.outputs, key=lambda e: e.max_rel, default=None)
    where = f" on '{worst.name}'" if worst is not None else ""
    found = f"; {exported.divergence}" if exported.divergence else ""
    if not verify.compared_real_numbers(exported.outputs):
        message = (f"onnxruntime's outputs could not be compared with {exported.reference} "
                   f"(no finite values to compare){found}")
    else:
        message = (f"onnxruntime differs from {exported.reference} by {exported.max_error:.3g}"
                   f"{where} (tolerance {exported.tolerance:g}){found}")
    raise OnnxCheckFailed(message, exported)


def _reference(graph_def, feeds, outputs: Sequence[str], timeout: float,
               expected: Optional[Dict[str, np.ndarray]]) -> List[np.ndarray]:
    """``expected`` in output order where given, else the optimized graph's outputs in TF."""
    if expected is not None:
        given = {tensor_name(k): v for k, v in expected.items()}
        return [given[tensor_name(name)] for name in outputs]
    try:
        return verify.run_graph(graph_def, feeds, outputs, timeout=timeout,
                                label="the optimized graph")
    except verify.VerificationError as error:
        raise ExportError(f"no TensorFlow reference to compare with: {error}") from None


def _errors_at(graph_def, model, feeds, nchw, outputs, timeout: float,
               label: str, parts=None) -> List[verify.OutputError]:
    """TensorFlow vs onnxruntime on further feeds (a second sequence length: a Loop whose trip
    count became a constant cannot pass); errors named ``output`` + ``label``."""
    expected = _reference(graph_def, feeds, outputs, timeout, None)
    actual = run_onnx(model, _onnx_feeds(feeds, nchw), outputs, timeout=timeout)
    return [scales.judged_error(name + label, e, a, (parts or {}).get(name), same_dtype=False)
            for name, e, a in zip(outputs, expected, actual)]


# ---------------------------------------------------------------- steps
def convert(graph_def, inputs: Sequence[str], outputs: Sequence[str], *, opset: int,
            inputs_as_nchw: Sequence[str] = (), large_model: bool = False):
    """tf2onnx's (ModelProto, ExternalTensorStorage or None); unsupported ops → ExportError.
    TensorList loops frozen with lowering are converted in their TensorArray form
    (``tensor_list_loops``); should that fail too, the error names the graph's own ops."""
    graph_def = erf_forms(dequantized_weights(graph_def))
    prepared = as_tensor_arrays(graph_def)
    settings = dict(opset=opset, inputs_as_nchw=inputs_as_nchw, large_model=large_model)
    if prepared is graph_def:
        return _convert(graph_def, inputs, outputs, **settings)
    try:
        return _convert(prepared, inputs, outputs, **settings)
    except ExportError:
        return _convert(graph_def, inputs, outputs, **settings)


def refusal(graph_def, inputs: Sequence[str], outputs: Sequence[str], *,
            opset: int = DEFAULT_OPSET) -> Optional[str]:
    """Why tf2onnx refuses ``graph_def`` (``OnnxUnconvertible``'s message), or None when it
    converts."""
    try:
        convert(graph_def, inputs, outputs, opset=opset)
    except OnnxUnconvertible as error:
        return str(error)
    return None


# tf2onnx's dropped graph copies are collected (``_compat.tf2onnx_collecting``) only for graphs
# this large: a full collection costs ~0.1-0.3 s with TensorFlow loaded, ~24 per conversion —
# seconds that a small graph's copies (a few MB in all) are not worth
COLLECT_ABOVE_BYTES = 32 << 20


def _convert(graph_def, inputs: Sequence[str], outputs: Sequence[str], *, opset: int,
             inputs_as_nchw: Sequence[str], large_model: bool):
    import onnx
    import tf2onnx
    outside.refuse_conversion(graph_def, "ONNX export (tf2onnx)")
    try:
        _compat.tf2onnx_on_numpy2()
        with _compat.tf2onnx_collecting() if graph_def.ByteSize() > COLLECT_ABOVE_BYTES \
                else contextlib.nullcontext():
            model, storage = tf2onnx.convert.from_graph_def(
                graph_def, input_names=[tensor_name(n) for n in inputs],
                output_names=[tensor_name(n) for n in outputs], opset=opset,
                inputs_as_nchw=[tensor_name(n) for n in inputs_as_nchw] or None,
                large_model=large_model)
    except Exception as error:   # tf2onnx raises ValueError, KeyError, AssertionError, ...
        missing = _without_conversion(graph_def)
        hint = f" (ops tf2onnx has no conversion for: {_unsupported(missing)})" if missing else ""
        raise OnnxUnconvertible(f"tf2onnx cannot convert the graph: {first_line(error)}{hint}") \
            from None
    # tf2onnx keeps going past unsupported ops and leaves them in as TF ops: name them all here.
    left = [n for n in onnx_tidy.all_nodes(model.graph) if not onnx.defs.has(n.op_type, n.domain)]
    if left:
        hint = string_inputs.onnx_hint(graph_def, outputs, left)   # the numeric model's cut
        raise OnnxUnconvertible(f"tf2onnx cannot convert op(s) {_unsupported(left)} to ONNX "
                                f"opset {opset}{hint}")
    return model, storage


# v1 loop ops and TensorArrays have no tf2onnx handler: its loop rewriter takes them (TF1
# dynamic_rnn, tensor_list_loops' output). Anything else without a handler it cannot convert.
REWRITTEN_BY_TF2ONNX = frozenset({
    "Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond", "TensorArrayV3",
    "TensorArrayReadV3", "TensorArrayWriteV3", "TensorArrayGatherV3", "TensorArrayScatterV3",
    "TensorArraySizeV3"})


def _without_conversion(graph_def) -> list:
    """Nodes (top level and function bodies) whose op tf2onnx has no handler for: what to name
    when tf2onnx dies with a message that names none (e.g. on TF1's TensorArrayConcatV3)."""
    from tf2onnx import handler
    import tf2onnx.onnx_opset  # noqa: F401 - registers the handlers
    known = {op for versions in handler.tf_op.get_opsets().values() for table in versions
             for op in table}
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return [_Named(n.op, n.name) for n in nodes
            if n.op not in known and n.op not in REWRITTEN_BY_TF2ONNX]


@dataclasses.dataclass
class _Named:
    """A TF node as ``_unsupported`` reads ONNX ones."""
    op_type: str
    name: str


def _unsupported(nodes) -> str:
    """"TensorListReserve (x2, e.g. node 'while/TensorListReserve')": each op and a node to find it by."""
    counts = collections.Counter(n.op_type for n in nodes)
    first = {}
    for n in nodes:
        first.setdefault(n.op_type, n.name)
    return ", ".join(f"{op} ({f'x{count}, ' if count > 1 else ''}node '{first[op]}')"
                     for op, count in sorted(counts.items()))


def dequantized_weights(graph_def):
    """ONNX has no quint8/qint8 tensors: ``Dequantize`` of constant weights (OpenCV's uint8
    detectors) is computed by TensorFlow into float constants for the conversion. The optimized
    ``.pb`` keeps the compact form."""
    graph = Graph(graph_def, check_inputs=False)
    weights = [n.name for n in graph if n.op == "Dequantize"
               and all(graph.is_const(ref) for ref in graph.inputs(n.name))]
    if not weights:
        return graph_def
    for name, value in zip(weights, evaluate(graph, weights)):
        graph.remove([name])
        graph.add_const(name, value)
    return graph.to_graph_def()


def erf_forms(graph_def):
    """ONNX has no ``Erfc`` (exact GELU in TF 2.21) and tf2onnx 1.17 no handler for it: the
    conversion gets ``1 - Erf`` instead (``transforms/erfc_as_erf``), in function bodies too
    (tf2onnx converts a While's body into its Loop). The ``.pb`` keeps Erfc."""
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    if not any(node.op == "Erfc" for node in nodes):
        return graph_def
    graph = Graph(graph_def, check_inputs=False)
    erfc_as_erf(graph, Options())
    return graph.to_graph_def()


def save(model, storage, path: Path) -> None:
    """Save the model; with tf2onnx's external tensor storage, as ``path`` + ``path.data``
    (ONNX's standard external-data layout, not tf2onnx's zip, so onnxruntime can open it)."""
    import onnx
    if storage is None:
        onnx.save_model(model, str(path))
        return
    for tensor in _tensors(model.graph):      # tf2onnx's bytes back in place, then ONNX writes them
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            key = {e.key: e.value for e in tensor.external_data}["location"]
            tensor.raw_data = storage.name_to_tensor_data[key]
            tensor.ClearField("external_data")
            tensor.data_location = onnx.TensorProto.DEFAULT
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=EXTERNAL_MIN_BYTES)


def _basic_rewrites(model):
    """onnxruntime's basic rewrites of ``model`` (in memory), or of the model file at a path
    (external data): the rewritten model, or the same one where it was not kept."""
    if isinstance(model, (str, os.PathLike)):
        optimize_with_onnxruntime(Path(model), external_data=True)
        return model
    return optimized_by_onnxruntime(model) or model


def optimized_by_onnxruntime(model):
    """onnxruntime's basic-level rewrite of the in-memory ``model`` (constant folding, redundant
    nodes, MatMul+Add → Gemm: standard ONNX ops, portable), handed back through memory
    (``_compat.memory_file``); None when a node is no longer a standard ONNX op."""
    import onnx
    import onnxruntime as ort
    options = _session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with _compat.memory_file("onnxruntime-basic.onnx") as optimized:
        options.optimized_model_filepath = str(optimized)
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=CPU)
        except Exception as error:   # onnxruntime raises its own Fail/InvalidGraph/... types
            raise ExportError(f"onnxruntime cannot load the model: {first_line(error)}") \
                from None
        rewritten = onnx.load_from_string(_compat.read_memory_file(optimized))
    return rewritten if _standard_only(rewritten) else None


def _standard_only(model) -> bool:
    """Every node is a standard ONNX op; then the opset imports onnxruntime declared for every
    domain it knows are cut to the ones the graph uses."""
    domains = {node.domain for node in onnx_tidy.all_nodes(model.graph)}
    if not domains <= set(STANDARD_DOMAINS):
        return False
    keep = [o for o in model.opset_import if o.domain in domains | {""}]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return True


def optimize_with_onnxruntime(path: Path, *, external_data: bool = False) -> bool:
    """Replace the model file at ``path`` with onnxruntime's basic-level rewrite of it (see
    ``optimized_by_onnxruntime``; for models with external data). Kept only if every node is
    still a standard ONNX op; returns whether it was kept."""
    import onnx
    import onnxruntime as ort
    work = path.parent / "ort"
    work.mkdir()
    optimized = work / path.name
    options = _session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(optimized)
    if external_data:
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", path.name + ".data")
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes",
            str(EXTERNAL_MIN_BYTES))
    try:
        ort.InferenceSession(str(path), options, providers=CPU)
    except Exception as error:   # onnxruntime raises its own Fail/InvalidGraph/... types
        raise ExportError(f"onnxruntime cannot load the model: {first_line(error)}") from None
    model = onnx.load(str(optimized), load_external_data=False)
    kept = _standard_only(model)
    if kept:
        onnx.save_model(model, str(optimized))
        path.with_name(path.name + ".data").unlink(missing_ok=True)
        for produced in work.iterdir():
            os.replace(produced, path.parent / produced.name)
    shutil.rmtree(work)
    return kept


def check(model) -> None:
    """onnx.checker on a ModelProto, or on a path (external data, models over 2 GB)."""
    import onnx
    try:
        onnx.checker.check_model(str(model) if isinstance(model, (str, os.PathLike)) else model)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"onnx.checker rejects the model: {first_line(error)}") from None


def run_onnx(model, feeds: Dict[str, np.ndarray], outputs: Sequence[str], *,
             timeout: float = verify.DEFAULT_TIMEOUT) -> List[np.ndarray]:
    """Run the model once in onnxruntime (CPU), within ``timeout`` seconds; feeds keyed by ONNX
    input name. ``model``: serialized bytes, a ModelProto or the path of a model file."""
    import onnxruntime as ort
    run_options = ort.RunOptions()
    deadline = threading.Timer(timeout, setattr, (run_options, "terminate", True))
    try:
        session = ort.InferenceSession(_openable(model), _session_options(), providers=CPU)
        wanted = {i.name for i in session.get_inputs()}
        deadline.start()
        return session.run([tensor_name(n) for n in outputs],
                           {k: v for k, v in feeds.items() if k in wanted}, run_options)
    except Exception as error:   # onnxruntime's error types are not a public hierarchy
        if run_options.terminate:
            raise ExportError(f"the ONNX model did not finish within {timeout:g} s in "
                              "onnxruntime; give real inputs with --feed / --input-shape, or a "
                              "longer --verify-timeout") from None
        raise ExportError(f"onnxruntime cannot run the model: {first_line(error)}") from None
    finally:
        deadline.cancel()


def op_histogram(model) -> Dict[str, int]:
    """Op type → count over the model's top-level nodes (an If counts once); ``model``: a
    ModelProto or the path of a model file."""
    import onnx
    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(str(model), load_external_data=False)
    return dict(collections.Counter(node.op_type for node in model.graph.node))


# ---------------------------------------------------------------- helpers
def check_opset(opset: int) -> None:
    from tf2onnx import __version__, constants
    supported = sorted(constants.OPSET_TO_IR_VERSION)
    if opset not in supported:
        raise InputError(f"--opset {opset}: tf2onnx {__version__} supports opsets "
                         f"{supported[0]}-{supported[-1]}")


def _check_target(path: Path, input_path) -> None:
    output_directory(path)
    for target in (path, path.with_name(path.name + ".data")):
        refuse_input(target, input_path)


def _nchw_inputs(graph_def, inputs: Sequence[str], names: Sequence[str]) -> List[str]:
    """Check that each name is a rank-4 graph input (tf2onnx silently ignores anything else)."""
    from tfsurgery.graph import Graph
    graph = Graph(graph_def, check_inputs=False)
    plain = {n.split(":")[0]: n for n in inputs}
    chosen = []
    for name in names:
        if name.split(":")[0] not in plain:
            raise InputError(f"--inputs-as-nchw: {name!r} is not one of the graph's inputs "
                             f"({', '.join(inputs) or 'none'})")
        node = graph.node(name.split(":")[0])
        if len(verify.placeholder_shape(node)) != 4:
            raise InputError(f"--inputs-as-nchw: {name!r} is not a rank-4 (NHWC) input")
        chosen.append(plain[name.split(":")[0]])
    return chosen


def _onnx_feeds(feeds: Dict[str, np.ndarray], nchw: Sequence[str]) -> Dict[str, np.ndarray]:
    transposed = {tensor_name(n) for n in nchw}
    return {tensor_name(k): np.transpose(v, NHWC_TO_NCHW) if tensor_name(k) in transposed else v
            for k, v in feeds.items()}


def _publish(stage: Path, path: Path) -> None:
    """Move the staged model into place: its data file first, then the model that points at it."""
    data = stage / (path.name + ".data")
    try:
        if data.exists():
            os.replace(data, path.with_name(data.name))
        os.replace(stage / path.name, path)
    except OSError as error:
        raise InputError(f"{path}: cannot write ({error.strerror})") from None


def _openable(model) -> Union[bytes, str]:
    """What onnxruntime's InferenceSession opens: bytes in memory, or a file's path."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    return model if isinstance(model, bytes) else model.SerializeToString()


def _session_options():
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3          # errors only: no "removing initializer" chatter
    return options


def _tensors(graph) -> Iterator:
    """Every tensor that can hold weights: initializers and tensor attributes, subgraphs too."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub)

