"""A run's outcome (``Result``) and what is done with it before anything is written: the
fail-closed gate (``require_verified``), the check against the original (``verify_result`` on
``check_batches``), the inputs and reference every later check uses, and the two things a
Result does itself: ``save`` (the .pb) and ``export_onnx``."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

from tensorflow.core.framework import graph_pb2

from tfsurgery import io, pipeline, preprocessing, progress, report
from tfsurgery.verify import localize, string_inputs
from tfsurgery.export import onnx as onnx_export
from tfsurgery.verify import samples as samples_mod
from tfsurgery.verify import check as verify_mod
from tfsurgery.export.artefacts import Batch
from tfsurgery.contract import Options, TransformReport
from tfsurgery.errors import (InputError, OnnxUnconvertible, OriginalDoesNotRun, Unverified,
                              VerificationError)
from tfsurgery.graph import Graph
from tfsurgery.interface import indexed, unused_inputs
from tfsurgery.ops import PLACEHOLDER_OPS, node_name
from tfsurgery.trust.outside import with_allowed_ops


@dataclasses.dataclass
class Result:
    graph_def: graph_pb2.GraphDef
    reports: List[TransformReport]
    inputs: List[str]
    outputs: List[str]
    training_flags: List[str]
    original: graph_pb2.GraphDef        # the original, with the declared interface applied
    tolerance: float = verify_mod.DEFAULT_TOLERANCE
    # what the original is fed besides the inputs: training flags False, dropout knobs at their
    # inference value, stand-ins for the inputs the optimized graph dropped
    original_extra_feeds: Dict[str, object] = dataclasses.field(default_factory=dict)
    timeout: float = verify_mod.DEFAULT_TIMEOUT
    user_feeds: Dict[str, object] = dataclasses.field(default_factory=dict)   # --feed values
    verification: Optional[verify_mod.Verification] = None
    verification_error: Optional[str] = None    # why the check could not compare (then raised)
    verify_skipped: bool = False        # verify=False / --no-verify: the caller chose no check
    preprocess: Optional[preprocessing.Preprocessor] = None   # raw inputs → the original's
    weights: str = "float32"            # "float16"/"int8": float16-/int8-weights ran (--store-weights)
    # inputs no output reads after optimization → the stand-in value the original was fed
    unused_inputs: Dict[str, object] = dataclasses.field(default_factory=dict)
    frozen_form: str = ""               # how the source was frozen (io.Loaded.frozen_form)
    # what loading trusted (--trust-model) and imported (--import): io.Loaded.trust_notes
    trust_notes: List[str] = dataclasses.field(default_factory=list)
    # what declaring the inputs did (a PlaceholderWithDefault or a dequeue made a Placeholder)
    declared_inputs: List[str] = dataclasses.field(default_factory=list)
    divergence: Optional[localize.Divergence] = None  # where a failed check went wrong
    samples: Optional[samples_mod.Samples] = None   # the user's input values (--samples)
    params: Dict[str, object] = dataclasses.field(default_factory=dict)   # transforms' own
    check_n: int = 1                    # seeded random batches compared (--check-n)
    # a layer whose change the check cannot see does not make it "cannot verify" (the user said so)
    accept_blind_spots: bool = False
    # outputs that may be class scores (top-1 agreement is checked): found on the run's index
    class_outputs: Optional[List[str]] = None
    # how the graph was made, to make it again without a transform (the ONNX fallback)
    transforms: List[str] = dataclasses.field(default_factory=list)
    pass_options: Optional[Options] = None     # the transforms' Options
    seed: int = 0                       # of the random check batches
    # nodes acting outside the graph that the user allowed to run (--allow-op): outside.Finding
    outside_allowed: List[object] = dataclasses.field(default_factory=list)

    def save(self, path, *, allow_unverified: bool = False) -> Path:
        """Write the optimized graph (see :func:`save`)."""
        return save(self, path, allow_unverified=allow_unverified)

    def export_onnx(self, path, **options):
        """Convert and check in onnxruntime (see :func:`export_onnx`)."""
        return export_onnx(self, path, **options)

    # the older names (review §3.2), kept for callers written against them
    before = property(lambda self: self.original)
    settings = property(lambda self: self.original_extra_feeds)
    given = property(lambda self: self.user_feeds)

    @property
    def allowed_ops(self) -> List[str]:
        """The ops acting outside the graph this run was allowed to run (later checks and
        exports of the result run them too)."""
        return sorted({finding.op for finding in self.outside_allowed})

    @property
    def verified(self) -> bool:
        """The check ran and passed: only then may the result be saved or exported without
        ``allow_unverified=True``."""
        return self.verification is not None and self.verification.passed

    def as_report(self) -> dict:
        extra = {"training_flags": self.training_flags,
                 "inference_values": {k: float(v) for k, v in self.original_extra_feeds.items()
                                      if k not in self.unused_inputs},
                 "unused_inputs": list(self.unused_inputs), "frozen_form": self.frozen_form,
                 "declared_inputs": list(self.declared_inputs),
                 "allowed_outside_ops": [f.as_dict() for f in self.outside_allowed],
                 "trust": list(self.trust_notes)}
        drawn = {name: string_inputs.describe(self.original, name) for name in self.inputs
                 if node_name(name) not in {node_name(k) for k in self.user_feeds or {}}}
        if any(drawn.values()):                    # test strings from the graph's vocabulary
            extra["string_inputs"] = {name: line for name, line in drawn.items() if line}
        if self.verification_error:
            extra["verification_error"] = self.verification_error
        if self.verify_skipped:
            extra["verification_skipped"] = True
        if self.divergence is not None:
            extra["divergence"] = self.divergence.as_dict()
        return report.build_report(self.original, self.graph_def, self.reports,
                                   inputs=self.inputs, outputs=self.outputs,
                                   verification=self.verification, extra=extra)


def float16_min_elements(result: Result) -> int:
    fn = pipeline.lookup("float16-weights")
    return (result.params.get("float16-weights") or fn.params_type()).min_elements


def int8_min_elements(result: Result) -> int:
    fn = pipeline.lookup("int8-weights")
    return (result.params.get("int8-weights") or fn.params_type()).min_elements


def require_verified(result: Result, *, allow_unverified: bool = False) -> None:
    """Fail closed: a result is saved or exported only when its check passed, or when the
    caller explicitly chose to skip the check (``allow_unverified=True``)."""
    if result.verified:
        return
    if result.verification is not None or result.verification_error:
        reason = result.verification_error or result.verification.failure()
        raise Unverified(f"refusing to write a result that failed verification: {reason}")
    if not allow_unverified:
        raise Unverified("refusing to write a result that was not verified; verify it "
                         "(verify=True) or pass allow_unverified=True (the CLI: --no-verify)")


@with_allowed_ops
def verify_result(result: Result, *, feeds: Optional[Mapping[str, object]] = None,
                  seed: int = 0) -> verify_mod.Verification:
    """Verify ``result`` against its original: same inputs (``feeds`` where given), the
    original's switches at their inference values."""
    try:
        return verify_mod.verify_batches(
            result.original, result.graph_def, result.inputs, result.outputs, result.original_extra_feeds,
            batches=check_batches(result, feeds, seed), tolerance=result.tolerance,
            class_outputs=class_outputs_of(result), timeout=result.timeout,
            preprocess=result.preprocess,
            correspondence=getattr(result.reports, "correspondence", {}),
            accept_blind=result.samples is not None or result.accept_blind_spots,
            reference_note=_reference_note(result.original_extra_feeds, bool(result.preprocess)))
    except OriginalDoesNotRun as error:
        raise InputError(str(error)) from None


check = verify_result                   # the older name (review §3.2)


SAMPLE_BATCH_ROWS = 32      # single samples stacked into one run where the batch is free


def check_batches(result: Result, feeds: Optional[Mapping[str, object]], seed: int) -> list:
    """(label, given values, seed) per batch to compare: the rows of ``--samples`` (single
    samples stacked up to SAMPLE_BATCH_ROWS where the batch dimension is free), then seeded
    random batches up to ``--check-n`` in all (the first of them the only one without
    samples). ``feeds`` (--feed) win over samples for the inputs they name."""
    user = dict(feeds or {})
    if result.samples is None:
        return [(f"batch {k + 1} (seed {seed + k})", user, seed + k)
                for k in range(result.check_n)]
    stacked = _stackable(result)
    batches = []
    for k, (first, given) in enumerate(result.samples.batches(SAMPLE_BATCH_ROWS if stacked
                                                              else 1)):
        batches.append((f"sample row {first}", {**given, **user}, seed + k))
    batches += [(f"random batch {k + 1} (seed {seed + len(batches) + k})", user,
                 seed + len(batches) + k) for k in range(result.check_n - 1)]
    return batches


def _stackable(result: Result) -> bool:
    """Single-sample rows can share one run when every such input leaves its batch free."""
    shapes = samples_mod.input_specs(result.original, result.samples.inputs)
    return all(result.samples.batched[name] or (shapes[name].shape and
                                                shapes[name].shape[0] is None)
               for name in result.samples.inputs)


CLASS_SCORE_OPS = frozenset({"Softmax", "LogSoftmax", "MatMul", "BiasAdd"})


def class_score_outputs(graph, outputs: Sequence[str]) -> List[str]:
    """Outputs that may be class scores — a Softmax/LogSoftmax, or logits from a dense layer
    (through Identity); verification checks the rank (2) and width (≥ 2) on the values.
    ``graph``: the original, as a Graph (the run's index) or a GraphDef."""
    graph = indexed(graph)
    return [name for name in outputs
            if graph.op(graph.resolve(name)) in CLASS_SCORE_OPS]


def class_outputs_of(result: Result) -> List[str]:
    if result.class_outputs is None:            # a Result built by hand
        result.class_outputs = class_score_outputs(result.original, result.outputs)
    return result.class_outputs


def _reference_note(settings: Mapping[str, object], preprocessed: bool = False) -> str:
    fed = " fed the verifier's NumPy preprocessing of the raw inputs" if preprocessed else ""
    if not settings:
        return f"the original graph{fed}"
    shown = ", ".join(f"{name}={value}" for name, value in list(settings.items())[:4])
    more = f" and {len(settings) - 4} more" if len(settings) > 4 else ""
    return f"the original graph{fed} with {shown}{more}"


@with_allowed_ops
def save(result: Result, path, *, input_path=None, allow_unverified: bool = False) -> Path:
    """Write the optimized graph (atomically, never over ``input_path``) — only a verified
    result, unless ``allow_unverified`` (see :func:`require_verified`)."""
    if not isinstance(result, Result):
        raise TypeError("api.save takes the Result of api.optimize (a verified graph); write a "
                        "GraphDef of your own with tfsurgery.io.save_graph_def")
    require_verified(result, allow_unverified=allow_unverified)
    return io.save_graph_def(result.graph_def, path, input_path=input_path)


@with_allowed_ops
def export_onnx(result: Result, path, *, opset: Optional[int] = None,
                inputs_as_nchw: Sequence[str] = (), ort_optimize: bool = True,
                fusions: Union[bool, str, Sequence[str]] = "auto",
                input_path=None, batch: Optional[Batch] = None,
                allow_unverified: bool = False) -> onnx_export.OnnxExport:
    """Convert the optimized graph with tf2onnx and check it in onnxruntime against TensorFlow
    (``export_reference``), with the run's tolerance; the checked record, written (with a
    ``batch``: when the whole run has passed). Fails closed exactly where ``api.write`` does,
    and nothing is written: ``ExportError`` when tf2onnx, the checker or onnxruntime refuses
    the model; ``OnnxCheckFailed`` (an ExportError carrying ``max_error``, ``tolerance``,
    ``output`` and the whole record as ``export``) when onnxruntime's outputs differ.

    Never worse than tf2onnx on the graph before our transforms: when tf2onnx refuses the
    optimized graph but converts the original, the transform that made it unconvertible is
    found (``without_unconvertible``), and the graph made without it — verified against the
    original like any result — is exported instead; ``left_out`` in the record says which and
    why."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"exporting to ONNX with tf2onnx: {path}")
    settings = dict(opset=opset, inputs_as_nchw=list(inputs_as_nchw), ort_optimize=ort_optimize,
                    input_path=input_path, batch=batch, fuse=fusions)
    try:
        exported = _export_onnx(result, path, **settings)
    except OnnxUnconvertible as refused:
        convertible, left_out = without_unconvertible(result, refused, opset)
        exported = _export_onnx(convertible, path, **settings)
        exported.left_out = left_out
    return onnx_export.require_passed(exported)


def _export_onnx(result: Result, path, **settings) -> onnx_export.OnnxExport:
    return onnx_export.export(result.graph_def, result.inputs, result.outputs, path,
                              tolerance=result.tolerance, feeds=feeds_for_checks(result),
                              parts=result.verification.parts if result.verification else None,
                              timeout=result.timeout,
                              float16_min_elements=(float16_min_elements(result)
                                                    if result.weights == "float16" else None),
                              int8_min_elements=(int8_min_elements(result)
                                                 if result.weights == "int8" else None),
                              more_feeds=(result.verification.more_feeds
                                          if result.verification is not None else None),
                              expected=export_reference(result), **settings)


MAX_LEFT_OUT = 3        # transforms left out of one ONNX export before giving up


def without_unconvertible(result: Result, refused: OnnxUnconvertible, opset: Optional[int]):
    """(a verified Result tf2onnx converts, [{"transform", "why", "verification"}]): the run
    made again without the transform after which tf2onnx refuses the graph — found as
    localization finds the one that moved the numbers, bisecting over the pipeline's prefixes
    (tfsurgery.verify.localize) — and again, up to MAX_LEFT_OUT of them. ``refused`` is raised again,
    with the reason, when tf2onnx refuses the original too, or leaving transforms out does not
    give a convertible graph that verifies."""
    if result.pass_options is None or not result.transforms:       # a Result built by hand
        raise refused
    progress.say("tf2onnx refuses the optimized graph: finding the transform that made it "
                 "unconvertible")
    opset = onnx_export.DEFAULT_OPSET if opset is None else opset
    reasons: Dict[int, str] = {}        # id(graph_def) → tf2onnx's refusal, for the report

    def converts(graph_def) -> bool:
        reason = onnx_export.refusal(graph_def, _placeholders(graph_def, result),
                                     result.outputs, opset=opset)
        if reason is not None:
            reasons[id(graph_def)] = reason
        return reason is None

    if not converts(result.original):
        raise OnnxUnconvertible(f"{refused} (tf2onnx refuses the original graph too)") from None
    transforms, left_out, reason = list(result.transforms), [], str(refused)
    changed = {r.name for r in result.reports if r.rewritten or r.removed_nodes or r.pruned}
    while len(left_out) < MAX_LEFT_OUT:
        _, high, runs = localize.first_failing_prefix(result.original, transforms,
                                                      result.pass_options, converts,
                                                      changed=changed)
        culprit = transforms[high - 1]
        why = reason if high == len(transforms) else reasons[id(runs[high][0])]
        left_out.append({"transform": culprit, "why": why})
        transforms = [name for name in transforms if name != culprit]
        graph_def, reports = pipeline.run(result.original, transforms, result.pass_options)
        graph_def = _without_inputs(graph_def, result)
        if converts(graph_def):
            twin = _verified_twin(result, graph_def, reports, transforms, refused, left_out)
            for entry in left_out:
                entry["verification"] = twin.verification.summary()
            progress.say("exporting to ONNX without " +
                         ", ".join(entry["transform"] for entry in left_out))
            return twin, left_out
        reason = reasons[id(graph_def)]
    tried = ", ".join(entry["transform"] for entry in left_out)
    raise OnnxUnconvertible(f"{refused} (and without {tried} too)") from None


def _placeholders(graph_def, result: Result) -> List[str]:
    """The inputs tf2onnx is given for a graph of this run: the result's, and whichever of the
    switches the original is fed (training flags, knobs, dropped inputs) are placeholders
    still."""
    names = list(result.inputs) + [n for n in result.original_extra_feeds
                                   if n not in result.inputs]
    ops = {node.name: node.op for node in graph_def.node}
    return [n for n in names if ops.get(verify_mod.node_name(n)) in PLACEHOLDER_OPS]


def _without_inputs(graph_def, result: Result):
    """The run's dropped inputs (``result.unused_inputs``) removed where nothing reads them."""
    graph = Graph(graph_def)
    dropped = [verify_mod.node_name(n) for n in result.unused_inputs]
    idle = unused_inputs(graph, dropped, result.outputs)
    graph.remove([n for n in dropped if n in idle and n in graph])
    return graph.to_graph_def()


def _verified_twin(result: Result, graph_def, reports, transforms, refused, left_out) -> Result:
    """The result made again (``graph_def``), verified against the original as any result is
    (the same inputs, batches and tolerance); ``refused`` again when it does not pass."""
    twin = dataclasses.replace(result, graph_def=graph_def, reports=reports,
                               transforms=list(transforms), verification=None,
                               verification_error=None, divergence=None, verify_skipped=False)
    tried = ", ".join(entry["transform"] for entry in left_out)
    try:
        twin.verification = verify_result(twin, feeds=result.user_feeds, seed=result.seed)
    except (InputError, VerificationError) as error:
        raise OnnxUnconvertible(f"{refused} (without {tried} it converts, but cannot be "
                                f"verified: {error})") from None
    if not twin.verification.passed:
        raise OnnxUnconvertible(f"{refused} (without {tried} it converts, but fails "
                                f"verification: {twin.verification.failure()})") from None
    return twin


def feeds_for_checks(result: Result) -> Dict[str, object]:
    """The inputs every later check uses: verification's, or (unverified) made the same way
    (raw inputs over their whole range where preprocessing is in the graph)."""
    if result.verification is not None:
        return result.verification.feeds
    feeds = verify_mod.make_feeds(result.graph_def, result.inputs, given=result.user_feeds)
    return result.preprocess.raw_feeds(feeds, 0) if result.preprocess else feeds


check_feeds = feeds_for_checks          # the older name (review §3.2)


def export_reference(result: Result) -> Optional[Dict[str, object]]:
    """What exports are compared with. With preprocessing in the graph: the ORIGINAL graph fed
    the verifier's own NumPy preprocessing of the same raw inputs (as the .pb was verified),
    never the graph under test. Otherwise (None) the optimized graph in TensorFlow, which
    verification compared with the original."""
    if result.preprocess is None or result.verification is None:
        return None
    return result.verification.expected
