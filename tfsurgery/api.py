"""The Python API, and the one facade the CLI uses: load → optimize (+ verify) → save / export /
write. Defaults (tolerance, output paths) are decided here and in the modules it re-exports:

- ``source``: ``load``, ``demo``, ``Source`` and the default output paths;
- ``plan``: the transforms chosen by name, their parameters, ``--store-weights``;
- ``result``: ``Result``, the fail-closed gate, verification, ``save``, ``export_onnx``;
- ``writer``: ``write(source, result, Targets(...))`` → ``Written``, and the single exports;
- ``int8``: ``--quantize int8`` for ONNX and TFLite; ``bench``: latency;
- ``batch``: every model in a folder, each in its own process (``api.batch.run``).

Everything below this layer (io, pipeline, verify, report, onnx_export, picture, latency) is
reached through these names; ``api.X`` works for each of them.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

import numpy as np
from tensorflow.core.framework import graph_pb2

from tfsurgery import io, pipeline, picture, preprocessing, progress, report  # noqa: F401
from tfsurgery.export import onnx as onnx_export
from tfsurgery.verify import (check as verify_mod, compare as compare_mod, localize,
                             samples as samples_mod)
from tfsurgery.trust import outside
from tfsurgery import batch  # noqa: F401 - batch: the CLI's, via api
from tfsurgery.export.artefacts import Artefact, Batch  # noqa: F401 - Batch: the CLI's, via api
from tfsurgery.errors import (CannotVerify, ExportError, InputError, MissingPackage,  # noqa: F401
                              OnnxCheckFailed, OriginalDoesNotRun, StructureError, TransformError,
                              UnknownTransform, UnsafeModel, Unverified, VerificationError,
                              VerificationFailed, WriteFailed)
from tfsurgery.graph import Graph
from tfsurgery.trust.keras import import_modules  # noqa: F401 - the CLI's, via api
from tfsurgery.interface import (check_fed, find_dropout_knobs, find_training_flags,
                                 needs_declaring, resolve_interface, unused_inputs,
                                 with_declared_inputs)
from tfsurgery.ops import node_name
from tfsurgery.report import format_table, op_histogram, summary, transform_lines  # noqa: F401
from tfsurgery.contract import Options
# the public names of the modules the facade stands on (``api.X`` for each)
from tfsurgery.source import (DEMO_NAME, Source, as_source, default_onnx_path,  # noqa: F401
                              default_output_path, demo, load, scan, signature_for)
from tfsurgery.plan import (FLOAT16_TOLERANCE, INT8_WEIGHTS_TOLERANCE,  # noqa: F401
                            WEIGHT_TRANSFORMS, WEIGHTS, choose_transforms, list_transforms,
                            load_plugins, transform_parameters, with_weights)
from tfsurgery.result import (SAMPLE_BATCH_ROWS, Result, check, check_batches,  # noqa: F401
                              check_feeds, class_outputs_of, class_score_outputs, export_onnx,
                              export_reference, feeds_for_checks, require_verified, save,
                              verify_result)
from tfsurgery.int8.config import (EQUALIZE_CHOICES, INT8_CALIBRATION_CHOICES,  # noqa: F401
                            INT8_MODES, Int8Refused, Int8Thresholds, TfliteInt8Refused,
                            check_int8_request, check_int8_rows, check_int8_speed_request,
                            equalized_result, export_int8, export_tflite_int8, int8_samples)
from tfsurgery.int8.options import Int8Config  # noqa: F401
from tfsurgery.int8.speed import Int8TooSlow  # noqa: F401
from tfsurgery.export.exporters import Exporter, Written, register as register_exporter  # noqa: F401
from tfsurgery.export.formats import (OPENVINO_PRECISIONS, check_drawable,  # noqa: F401
                                      check_line, check_openvino_target,
                                      check_saved_model_target, draw, export_openvino,
                                      export_saved_model, export_tflite, pb_artefact,
                                      wants_directory)
from tfsurgery.export.writer import Int8Targets, Targets, write  # noqa: F401
from tfsurgery.export.fusion_choice import requested as onnx_fusions  # noqa: F401
from tfsurgery.bench.command import (RUNTIMES, bench, bench_int8, bench_runtimes,  # noqa: F401
                             check_plot, check_runs, check_runtimes, write_bench_plot)

log = logging.getLogger("tfsurgery")


def requested_preprocessing(dtype: Optional[str] = None, reverse=None, mean: Optional[str] = None,
                            scale: Optional[str] = None) -> preprocessing.Requested:
    """The CLI's preprocessing options (``[NAME=]VALUE`` texts) as a request; bad text:
    ``InputError`` naming the option."""
    def parsed(flag, text, parse):
        if text is None:
            return None
        try:
            return parse(text)
        except InputError as error:
            raise InputError(f"{flag}: {error}" if flag not in str(error) else str(error)) \
                from None
    return preprocessing.Requested(parsed("--input-dtype", dtype, preprocessing.parse_dtype),
                                   reverse,
                                   parsed("--mean-values", mean, preprocessing.parse_values),
                                   parsed("--scale-values", scale, preprocessing.parse_values))


def compare(a, b, *, inputs: Sequence[str] = (), outputs: Sequence[str] = (),
            feeds: Optional[Mapping[str, object]] = None,
            input_shapes: Optional[Mapping[str, Sequence[Optional[int]]]] = None, samples=None,
            tolerance: Optional[float] = None, timeout: Optional[float] = None,
            seed: int = 0, allow_ops: Sequence[str] = (), trust: bool = False,
            imports: Sequence[str] = ()) -> compare_mod.Comparison:
    """Two graphs or artefacts on the same inputs: every tensor both have (TensorFlow B), or
    the outputs (ONNX / TFLite B); see tfsurgery.verify.compare. A graph whose run would act outside
    it (tfsurgery.trust.outside) is ``UnsafeModel`` unless its ops are in ``allow_ops``;
    ``trust``/``imports``: as :func:`load` (a Keras file's stored code, the modules defining its
    custom layers)."""
    progress.say(f"comparing {b} with {a}")
    with outside.allowing(allow_ops):
        return _compare(a, b, inputs, outputs, feeds, input_shapes, samples, tolerance,
                        timeout, seed, trust, imports)


def _compare(a, b, inputs, outputs, feeds, input_shapes, samples, tolerance, timeout, seed,
             trust, imports):
    return compare_mod.compare(
        a, b, inputs=inputs, outputs=outputs, feeds=feeds, input_shapes=input_shapes,
        samples=samples, tolerance=verify_mod.DEFAULT_TOLERANCE if tolerance is None
        else tolerance, timeout=verify_mod.DEFAULT_TIMEOUT if timeout is None else timeout,
        seed=seed, trust=trust, imports=imports)


def check_output_paths(paths: Sequence, *, opset: Optional[int] = None,
                       picture_path: Optional[str] = None) -> None:
    """Before minutes of work: every output writable, the opset supported, drawing possible."""
    if opset is not None:
        onnx_export.check_opset(opset)
    if picture_path:
        if Path(picture_path).suffix.lower() not in (".svg", ".png"):
            raise InputError(f"{picture_path}: --picture must end in .svg or .png")
        picture.check_available()
    for path in paths:
        if path:
            io.check_writable(path)


check_outputs = check_output_paths      # the older name (review §3.2)


@dataclasses.dataclass
class Interface:
    """What the graph's interface is and what its inputs take: ``inputs`` (any tensor; a
    dequeue output becomes a placeholder), ``outputs``, ``training_flags`` (bool switches to
    freeze False), ``inference_values`` (``{"keep_prob": 1.0}``), ``input_shapes`` (None for a
    free dimension), ``feeds`` (the values checks feed, instead of random ones)."""

    inputs: Sequence[str] = ()
    outputs: Sequence[str] = ()
    training_flags: Sequence[str] = ()
    inference_values: Optional[Mapping[str, object]] = None
    input_shapes: Optional[Mapping[str, Sequence[Optional[int]]]] = None
    feeds: Optional[Mapping[str, object]] = None


@dataclasses.dataclass
class Checks:
    """How the result is checked: ``verify=False`` skips it (explicitly: the result cannot then
    be saved without ``allow_unverified``); ``tolerance`` relative to each output's magnitude
    (default 1e-4; 1e-2 with float16 weights, 5e-2 with int8 weights); ``timeout`` per graph
    run in seconds; ``seed`` of the random inputs; ``accept_blind_spots``: see ``CannotVerify``."""

    verify: bool = True
    tolerance: Optional[float] = None
    timeout: Optional[float] = None
    seed: int = 0
    accept_blind_spots: bool = False


@dataclasses.dataclass
class RunOptions:
    """What the run does besides its transforms: ``keep_asserts`` (strip-debug keeps Assert,
    CheckNumerics and Print); ``preprocess`` (a ``preprocessing.Requested``: input dtype,
    channel reversal, mean/scale baked into the graph, add-preprocessing run first);
    ``weights`` ("float16": large float32 weights stored as float16, checked with
    ``FLOAT16_TOLERANCE``; "int8": conv/matmul weights as int8 with per-channel scales,
    ``INT8_WEIGHTS_TOLERANCE``; either run last, the tolerance unless ``Checks`` gives one);
    ``samples`` (your input values, a path or ``samples.Samples``: every row is checked);
    ``check_n`` (seeded random batches compared); ``transform_params`` (each transform's own,
    ``{"fold-constants": {"max_bytes": 1 << 20}}``); ``exact`` (only rewrites bit-exact in IEEE
    arithmetic: simplify-algebra's reassociations off); ``layout`` ("NHWC": NCHW ops computed
    channels-last, layout-nhwc); ``allow_ops`` (op names, e.g. ``["ReadFile"]``: the graph may
    run them although they act outside it; otherwise such a graph is ``UnsafeModel``, see
    tfsurgery.trust.outside; transforms never evaluate them); ``trust_model``, ``imports`` (a
    source given as a path is loaded as :func:`load` with ``trust``/``imports``: a Keras file's
    stored code, the modules defining its custom layers)."""

    keep_asserts: bool = False
    preprocess: Optional[preprocessing.Requested] = None
    weights: str = "float32"
    samples: object = None
    check_n: int = 1
    transform_params: Optional[Mapping[str, Mapping[str, object]]] = None
    exact: bool = False
    layout: Optional[str] = None
    allow_ops: Sequence[str] = ()
    trust_model: bool = False
    imports: Sequence[str] = ()


GROUPS = {"interface": Interface, "checks": Checks, "options": RunOptions}
# optimize's flat keywords of earlier releases → (group, field): deprecated, gone next release
FLAT_KEYWORDS = {**{f.name: ("interface", f.name) for f in dataclasses.fields(Interface)},
                 "verify": ("checks", "verify"), "tolerance": ("checks", "tolerance"),
                 "verify_timeout": ("checks", "timeout"), "seed": ("checks", "seed"),
                 **{f.name: ("options", f.name) for f in dataclasses.fields(RunOptions)}}


def grouped(interface: Optional[Interface] = None, checks: Optional[Checks] = None,
            options: Optional[RunOptions] = None, **flat) -> dict:
    """``optimize``'s three groups, with flat keywords (``verify=False``, ``weights="int8"``)
    moved into theirs. A group given is complete (its defaults included), so a flat keyword
    for a given group would set one option twice: ``InputError``, never a silent override.
    An unknown keyword: ``TypeError``, as Python says it."""
    given = {"interface": interface, "checks": checks, "options": options}
    moved: dict = {group: {} for group in GROUPS}
    for keyword, value in flat.items():
        if keyword not in FLAT_KEYWORDS:
            raise TypeError(f"optimize() got an unexpected keyword argument {keyword!r}")
        group, field = FLAT_KEYWORDS[keyword]
        if given[group] is not None:
            raise InputError(f"{keyword}= and {group}= both set {group}.{field}: give it once, "
                             f"in {GROUPS[group].__name__}(...)")
        moved[group][field] = value
    return {group: given[group] if given[group] is not None else kind(**moved[group])
            for group, kind in GROUPS.items()}


def optimize(source, transforms: Sequence = (), *, interface: Optional[Interface] = None,
             checks: Optional[Checks] = None, options: Optional[RunOptions] = None,
             **flat_keywords) -> Result:
    """Run ``transforms`` on the source graph, then check the numbers (``VerificationFailed``
    when they moved or could not be compared).

    ``source``: a path (.pb/.pbtxt, SavedModel directory, .keras/.h5), a GraphDef or a Source.
    ``transforms``: names and/or functions marked ``@tfsurgery.transform`` (``"default"``: our
    pipeline); empty: the default pipeline. ``interface``: what the graph takes and gives
    (:class:`Interface`); ``checks``: how the result is checked (:class:`Checks`); ``options``:
    what else the run does (:class:`RunOptions`: weights, preprocessing, samples, ...). The flat
    keywords of earlier releases (``verify=False``, ``weights="float16"``, ...) still work for
    this release, with a ``DeprecationWarning``; see :func:`grouped`."""
    if flat_keywords:
        warnings.warn(f"optimize({', '.join(k + '=' for k in flat_keywords)}...): flat "
                      "keywords are deprecated and go in the next release; pass "
                      "interface=Interface(...), checks=Checks(...), options=RunOptions(...)",
                      DeprecationWarning, stacklevel=2)
    groups = grouped(interface, checks, options, **flat_keywords)
    options = groups["options"]
    with outside.allowing(options.allow_ops):
        source = as_source(source, trust=options.trust_model, imports=options.imports)
        with outside.allowing(source.allowed_ops):
            return _optimize(source, transforms, groups["interface"], groups["checks"],
                             options)


def _planned_transforms(transforms: Sequence, options: RunOptions):
    """The transforms by name (``--store-weights``' transform last, layout-nhwc where asked) and the
    default tolerance the weights imply."""
    transforms = list(transforms) if transforms and all(isinstance(t, str) for t in transforms) \
        and pipeline.DEFAULT_WORD not in transforms else choose_transforms(transforms)
    transforms, default_tolerance = with_weights(transforms, options.weights)
    if options.layout not in (None, "NHWC"):
        raise InputError(f"layout {options.layout!r}: only 'NHWC' is offered")
    if options.layout and "layout-nhwc" not in transforms:
        transforms = pipeline.resolve_transforms(transforms, enable=["layout-nhwc"])
    if options.check_n < 1:
        raise InputError(f"--check-n must be at least 1, not {options.check_n}")
    return transforms, default_tolerance


@dataclasses.dataclass
class _Resolved:
    """The interface a run uses, decided before anything runs."""
    original: graph_pb2.GraphDef        # with the declared inputs applied
    declared: List[str]                 # what declaring them did
    graph: Graph
    inputs: List[str]
    outputs: List[str]
    flags: List[str]
    values: dict                        # inference values of dropout knobs

    @property
    def fed(self) -> List[str]:
        """What verification feeds: the inputs, the knobs' values, the training flags."""
        return [*self.inputs, *self.values, *self.flags]


def _resolved_interface(source: Source, interface: Interface) -> _Resolved:
    inputs = list(interface.inputs)
    flags = list(dict.fromkeys(list(interface.training_flags) + source.training_flags))
    original, declared = source.graph_def, []
    if interface.input_shapes or needs_declaring(original, inputs):
        original = with_declared_inputs(original, inputs, dict(interface.input_shapes or {}),
                                        notes=declared)
    # The run's one index: read first for the interface (dropout knobs, preprocessing, class
    # scores), then handed to the pipeline, which edits it (copy-on-write: ``original`` itself,
    # the verifier's reference, stays as given).
    graph = Graph(original)
    values = {**find_dropout_knobs(graph, exclude=inputs), **(interface.inference_values or {})}
    inputs, outputs = resolve_interface(original, inputs or source.inputs,
                                        list(interface.outputs) or source.outputs, flags)
    inputs = [name for name in inputs if name.split(":")[0] not in values]
    check_fed(original, inputs, outputs)
    return _Resolved(original, declared, graph, inputs, outputs, flags, values)


def outside_ops(source, interface: Optional[Interface] = None) -> List[outside.Finding]:
    """The nodes of ``source`` that would act outside the graph when its outputs are computed
    from its inputs (tfsurgery.trust.outside), found without running anything; allowed or not."""
    source = as_source(source)
    resolved = _resolved_interface(source, interface or Interface())
    return outside.find(resolved.original, resolved.outputs, resolved.fed)


def _optimize(source: Source, transforms: Sequence, interface: Interface, checks: Checks,
              options: RunOptions) -> Result:
    transforms, default_tolerance = _planned_transforms(transforms, options)
    feeds = interface.feeds
    resolved = _resolved_interface(source, interface)
    original, declared, graph = resolved.original, resolved.declared, resolved.graph
    inputs, outputs, flags, values = (resolved.inputs, resolved.outputs, resolved.flags,
                                      resolved.values)
    # before anything of the graph runs: what verification runs (the outputs, from the inputs
    # and the values it feeds) may not act outside the graph unless allowed
    allowed_findings = outside.refuse(original, outputs, resolved.fed, where=source.label)
    samples = options.samples
    if samples is not None and not isinstance(samples, samples_mod.Samples):
        samples = samples_mod.load(samples, samples_mod.input_specs(original, inputs))
    specs = preprocessing.resolve(graph, inputs, options.preprocess or preprocessing.Requested())
    preprocess_hook = preprocessing.preprocessor(graph, specs)     # the original's input dtypes
    class_outputs = class_score_outputs(graph, outputs)
    if specs and "add-preprocessing" not in transforms:
        transforms = ["add-preprocessing"] + list(transforms)
    params = transform_parameters(options.transform_params, keep_asserts=options.keep_asserts,
                                  specs=specs, exact=options.exact)
    pass_options = Options(inputs=inputs, outputs=outputs, training_flags=flags,
                           inference_values=values, params=params)
    progress.say(f"optimizing {len(original.node)} nodes: {', '.join(transforms)}")
    try:
        reports = pipeline.apply(graph, transforms, pass_options)
    except TransformError as error:
        raise InputError(str(error)) from None
    settings = {**{name: False for name in find_training_flags(original, flags)}, **values}
    switches = list(settings)
    inputs, unused = _drop_unused_inputs(original, graph, inputs, outputs, given=feeds,
                                         seed=checks.seed)
    graph_def = graph.to_graph_def()
    for r in reports:
        if r.name == "add-preprocessing":
            r.notes.extend(preprocessing.outcome(graph_def, specs, reports))
    settings.update(unused)
    result = Result(graph_def, reports, inputs, outputs, switches, original,
                    default_tolerance if checks.tolerance is None else checks.tolerance,
                    original_extra_feeds=settings,
                    timeout=(verify_mod.DEFAULT_TIMEOUT if checks.timeout is None
                             else checks.timeout),
                    user_feeds=dict(feeds or {}), preprocess=preprocess_hook,
                    weights=options.weights, unused_inputs=unused,
                    frozen_form=source.frozen_form, trust_notes=list(source.trust_notes),
                    samples=samples, declared_inputs=declared, check_n=options.check_n,
                    accept_blind_spots=checks.accept_blind_spots,
                    params=params, class_outputs=class_outputs,
                    transforms=list(transforms), pass_options=pass_options,
                    seed=checks.seed, outside_allowed=allowed_findings)
    if not checks.verify:
        result.verify_skipped = True
        return result
    return _verified(result, transforms, pass_options, feeds, checks.seed)


def _verified(result: Result, transforms: Sequence[str], pass_options: Options, feeds,
              seed: int) -> Result:
    """``result`` checked against its original; ``VerificationFailed`` (carrying it, with where
    the numbers first went wrong) when they moved or could not be compared."""
    progress.say("verifying: running the original and the optimized graph")
    try:
        result.verification = verify_result(result, feeds=feeds, seed=seed)
    except VerificationError as error:
        result.verification_error = str(error)
        message = str(error) if str(error).startswith("cannot compare") else \
            f"cannot compare: {error}"
        raise VerificationFailed(message, result=result) from None
    if not result.verification.passed:
        # "cannot compare" (outputs all NaN), "cannot verify" (blind): nothing to localize
        blind = result.verification.failure().startswith("cannot verify")
        result.divergence = None if result.verification.uncomparable or blind else \
            _localize(result, result.original, transforms, pass_options)
        where = f"; {result.divergence.line()}" if result.divergence else ""
        raise (CannotVerify if blind else VerificationFailed)(
            result.verification.failure() + where, verification=result.verification, result=result)
    return result


def _localize(result: Result, original, transforms, options) -> Optional[localize.Divergence]:
    """The first transform after which the worst batch fails, and the first tensor it changed
    (tfsurgery.verify.localize); None where the inputs are preprocessed (raw and model values differ
    between the graphs before and after add-preprocessing)."""
    if result.preprocess is not None or not transforms:
        return None
    progress.say("localizing the failure: re-running the pipeline prefix by prefix")

    settings = {verify_mod.node_name(name): np.asarray(value)
                for name, value in result.original_extra_feeds.items()}
    passes = localize.quick_check(original, result.outputs,
                                  feeds=result.verification.worst_feeds, settings=settings,
                                  allowed=result.verification.allowed,
                                  class_outputs=class_outputs_of(result),
                                  timeout=result.timeout)
    try:
        changed = {r.name for r in result.reports
                   if r.rewritten or r.removed_nodes or r.pruned}
        return localize.locate(original, transforms, options, passes,
                               feeds=result.verification.worst_feeds, settings=settings,
                               tolerance=result.verification.allowed, timeout=result.timeout,
                               changed=changed)
    except (VerificationError, StructureError, TransformError) as error:
        return localize.Divergence(None, note=str(error))


def _drop_unused_inputs(original, graph: Graph, inputs: List[str], outputs: List[str], *,
                        given, seed: int):
    """Inputs no output of the optimized ``graph`` reads (a ``dropout`` rate that fed only the
    training side of a cond) leave its interface and the graph (edited in place): no value of
    theirs matters. The original is fed a stand-in there (the user's --feed value, else a seeded
    random one; a scalar where the rank is unknown). Returns (inputs, {dropped input: stand-in})."""
    unused = unused_inputs(graph, inputs, outputs)
    if not unused:
        return inputs, {}
    graph.remove([node_name(name) for name in unused])
    stand_ins = verify_mod.make_feeds(original, unused, seed, given=given,
                                      scalar_if_unknown_rank=True)
    return [n for n in inputs if n not in unused], stand_ins


def write_json(path, data: dict, *, input_path=None) -> None:
    path = Path(path)
    io.refuse_input(path, input_path)
    io.write_atomically(path, (json.dumps(data, indent=2, default=_json_value) + "\n").encode())


def comparison_table(before: graph_pb2.GraphDef, after: graph_pb2.GraphDef) -> str:
    """The before/after table: node count and the op counts that changed."""
    return format_table(report.comparison_rows(summary(before), summary(after)))


def _json_value(value):
    """numpy scalars and arrays as real JSON numbers/booleans/lists (never strings)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


