"""The Python API, and the one facade the CLI uses: load → optimize (+ verify) → save / export.

Defaults (tolerance, output paths) are decided here, once. Everything below this layer (io, pipeline,
verify, report, onnx_export, picture, latency) is reached through these functions.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tensorflow.core.framework import graph_pb2

from tfsurgery import (io, latency, onnx_export, pipeline, picture, preprocessing, report,
                       verify as verify_mod)
from tfsurgery import artefacts, localize, progress, savedmodel_export, tflite_export
from tfsurgery import compare as compare_mod, samples as samples_mod
from tfsurgery import equalize as equalize_mod
from tfsurgery import int8_bench, quantize as quantize_mod
from tfsurgery import quantize_tflite
from tfsurgery.artefacts import Artefact, Batch  # noqa: F401 - Batch: the CLI's, via api
from tfsurgery.errors import (ExportError, InputError, OriginalDoesNotRun,  # noqa: F401
                              StructureError, TransformError, UnknownTransform, Unverified,
                              VerificationError, VerificationFailed, WriteFailed)
from tfsurgery.graph import Graph
from tfsurgery.interface import (check_fed, find_dropout_knobs, find_training_flags, indexed,
                                 resolve_interface, unused_inputs, with_declared_inputs)
from tfsurgery.ops import PLACEHOLDER_OPS, node_name
from tfsurgery.report import format_table, op_histogram, summary, transform_lines  # noqa: F401
from tfsurgery.contract import Options, TransformReport, with_params

DEMO_NAME = "article_cnn"
# --weights float16: each weight is rounded to float16 (relative error up to 2^-11); through a
# few layers the outputs move by up to ~1e-3 of their magnitude, so verification allows 1e-2.
FLOAT16_TOLERANCE = 1e-2
# --weights int8: each weight moves by at most half its channel's step, max|W_c|/254 (0.4% of
# the channel's largest weight; about 1% of a layer's output magnitude, rms, for weights that
# look Gaussian). Compounded over a few layers and taken at the worst output element, outputs
# move by a few % of their magnitude: verification allows 5e-2 (and no top-1 flip beyond it).
INT8_WEIGHTS_TOLERANCE = 5e-2
WEIGHTS = ("float32", "float16", "int8")
WEIGHT_TRANSFORMS = {"float16": "float16-weights", "int8": "int8-weights"}
log = logging.getLogger("tfsurgery")


@dataclasses.dataclass
class Source:
    """A loaded graph and what is known of its interface."""

    graph_def: graph_pb2.GraphDef
    label: str
    path: Optional[Path] = None
    inputs: List[str] = dataclasses.field(default_factory=list)
    outputs: List[str] = dataclasses.field(default_factory=list)
    training_flags: List[str] = dataclasses.field(default_factory=list)
    signature: dict = dataclasses.field(default_factory=dict)   # a SavedModel's (io.Loaded)
    frozen_form: str = ""          # how a SavedModel/Keras model was frozen (io.Loaded)


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
    weights: str = "float32"            # "float16"/"int8": float16-/int8-weights ran (--weights)
    # inputs no output reads after optimization → the stand-in value the original was fed
    unused_inputs: Dict[str, object] = dataclasses.field(default_factory=dict)
    frozen_form: str = ""               # how the source was frozen (io.Loaded.frozen_form)
    divergence: Optional[localize.Divergence] = None  # where a failed check went wrong
    samples: Optional[samples_mod.Samples] = None   # the user's input values (--samples)
    params: Dict[str, object] = dataclasses.field(default_factory=dict)   # transforms' own
    check_n: int = 1                    # seeded random batches compared (--check-n)
    # outputs that may be class scores (top-1 agreement is checked): found on the run's index
    class_outputs: Optional[List[str]] = None

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
    def verified(self) -> bool:
        """The check ran and passed: only then may the result be saved or exported without
        ``allow_unverified=True``."""
        return self.verification is not None and self.verification.passed

    def as_report(self) -> dict:
        extra = {"training_flags": self.training_flags,
                 "inference_values": {k: float(v) for k, v in self.original_extra_feeds.items()
                                      if k not in self.unused_inputs},
                 "unused_inputs": list(self.unused_inputs), "frozen_form": self.frozen_form}
        if self.verification_error:
            extra["verification_error"] = self.verification_error
        if self.verify_skipped:
            extra["verification_skipped"] = True
        if self.divergence is not None:
            extra["divergence"] = self.divergence.as_dict()
        return report.build_report(self.original, self.graph_def, self.reports,
                                   inputs=self.inputs, outputs=self.outputs,
                                   verification=self.verification, extra=extra)


def load(path, signature: str = "serving_default") -> Source:
    """A frozen .pb/.pbtxt, a SavedModel directory (``signature``) or a .keras/.h5 file."""
    path = Path(path)
    progress.say(f"loading {path}")
    loaded = io.load_model(path, signature)
    return Source(loaded.graph_def, label=path.name, path=path, inputs=loaded.inputs,
                  outputs=loaded.outputs, signature=loaded.signature,
                  frozen_form=loaded.frozen_form)


def as_source(model) -> Source:
    """A Source from what a user has: a Source, a path (.pb/.pbtxt, SavedModel, .keras/.h5)
    or a GraphDef (inputs and outputs detected)."""
    if isinstance(model, Source):
        return model
    if isinstance(model, (str, os.PathLike)):
        return load(model)
    if isinstance(model, graph_pb2.GraphDef):
        return Source(model, label="graph")
    raise TypeError(f"optimize takes a path, a GraphDef or an api.Source, not "
                    f"{type(model).__name__}")


def demo() -> Source:
    """The embedded demo: the article's CNN (TF1 style, conds on a training flag)."""
    from tfsurgery.models.tf1 import article_cnn      # the demo is built on demand only
    built = article_cnn()
    return Source(built.graph_def, label=f"demo model '{DEMO_NAME}'", inputs=built.inputs,
                  outputs=built.outputs,
                  training_flags=[built.training_flag] if built.training_flag else [])


def default_output_path(source: Source) -> Path:
    """``<input stem>_optimized.pb`` (or ``.pbtxt``) beside the input; for the demo, here."""
    if source.path is None:
        return Path.cwd() / f"{DEMO_NAME}_optimized.pb"
    suffix = ".pbtxt" if source.path.suffix.lower() == ".pbtxt" else ".pb"
    return source.path.with_name(f"{_stem(source)}_optimized{suffix}")


def default_onnx_path(source: Source) -> Path:
    """``<input stem>.onnx`` beside the input; for the demo, here."""
    if source.path is None:
        return Path.cwd() / f"{DEMO_NAME}.onnx"
    return source.path.with_name(f"{_stem(source)}.onnx")


def _stem(source: Source) -> str:
    return source.path.name if source.path.is_dir() else source.path.stem


def choose_transforms(names: Sequence = (), *, bn_fold: bool = False, enable: Sequence[str] = (),
                      disable: Sequence[str] = ()) -> List[str]:
    """The transforms to run, by name: ``names`` in order (``"default"`` stands for the default
    pipeline; a function marked ``@tfsurgery.transform("name")`` is registered and named), else
    the defaults (+ BN folding), with ``enable``/``disable`` applied. Unknown: ``InputError``."""
    names = [name if isinstance(name, str) else pipeline.register(name, "python")
             for name in names]
    try:
        return pipeline.resolve_transforms(names, bn_fold=bn_fold, enable=enable,
                                           disable=disable)
    except UnknownTransform as error:
        raise InputError(str(error)) from None


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
            seed: int = 0) -> compare_mod.Comparison:
    """Two graphs or artefacts on the same inputs: every tensor both have (TensorFlow B), or
    the outputs (ONNX / TFLite B); see tfsurgery.compare."""
    progress.say(f"comparing {b} with {a}")
    return compare_mod.compare(
        a, b, inputs=inputs, outputs=outputs, feeds=feeds, input_shapes=input_shapes,
        samples=samples, tolerance=verify_mod.DEFAULT_TOLERANCE if tolerance is None
        else tolerance, timeout=verify_mod.DEFAULT_TIMEOUT if timeout is None else timeout,
        seed=seed)


def load_plugins(specs: Sequence[str]) -> List[str]:
    """``--plugin PATH.py|module.name``: register the transforms each defines (their names)."""
    return [name for spec in specs for name in pipeline.load_plugin(spec)]


def list_transforms() -> List[tuple]:
    """(name, when it runs, where it comes from, what it does) for ours and every plugin known
    (installed entry points included)."""
    pipeline.load_entry_points()
    rows = []
    for name in list(pipeline.ORDER) + list(pipeline.USER):
        fn = pipeline.lookup(name)
        plugin = getattr(fn, "plugin", None)
        when = ("when named" if plugin else "default" if fn.default
                else "--bn-fold" if name == "fold-batch-norm" else "opt-in")
        doc = (sys.modules[fn.__module__].__doc__ if not plugin else fn.__doc__) or \
            fn.__doc__ or ""
        doc = doc.strip()
        summary = doc.split("\n")[0].split(": ", 1)[-1] if doc else ""
        params = ", ".join(f"{f.name}={f.default!r}" if f.default is not dataclasses.MISSING
                           else f.name for f in dataclasses.fields(fn.params_type)
                           if f.name != "specs")
        rows.append((name, when, plugin or "tfsurgery", summary[:70], params))
    return rows


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
    run in seconds; ``seed`` of the random inputs."""

    verify: bool = True
    tolerance: Optional[float] = None
    timeout: Optional[float] = None
    seed: int = 0


def optimize(source, transforms: Sequence = (), *, interface: Optional[Interface] = None,
             checks: Optional[Checks] = None, inputs: Sequence[str] = (),
             outputs: Sequence[str] = (), training_flags: Sequence[str] = (),
             inference_values: Optional[Mapping[str, object]] = None,
             input_shapes: Optional[Mapping[str, Sequence[Optional[int]]]] = None,
             feeds: Optional[Mapping[str, object]] = None, verify: bool = True,
             tolerance: Optional[float] = None, verify_timeout: Optional[float] = None,
             keep_asserts: bool = False, seed: int = 0,
             preprocess: Optional[preprocessing.Requested] = None,
             weights: str = "float32", samples=None, check_n: int = 1,
             transform_params: Optional[Mapping[str, Mapping[str, object]]] = None,
             exact: bool = False, layout: Optional[str] = None) -> Result:
    """Run ``transforms`` on the source graph, then check the numbers (``VerificationFailed``
    when they moved or could not be compared).

    ``source``: a path (.pb/.pbtxt, SavedModel directory, .keras/.h5), a GraphDef or a Source.
    ``transforms``: names and/or functions marked ``@tfsurgery.transform`` (``"default"``: our
    pipeline); empty: the default pipeline. ``interface`` and ``checks`` group the options
    below (the single keywords remain for the CLI and older callers).

    ``inputs`` may name any tensor (a dequeue output becomes a placeholder); ``input_shapes`` give
    inputs their shape (None for a free dimension); ``feeds`` give inputs the values verification
    and the ONNX check use; ``inference_values`` set placeholders (``keep_prob``: 1.0) besides the
    detected training flags and dropout knobs. ``preprocess`` (input dtype, channel reversal,
    mean/scale) bakes the input pipeline into the graph (add-preprocessing, run first).
    ``weights="float16"`` stores large float32 weights as float16 (float16-weights, run last)
    and verifies with ``FLOAT16_TOLERANCE`` unless a tolerance is given; ``weights="int8"``
    stores conv/matmul weights as int8 with per-channel scales (int8-weights, run last;
    ``INT8_WEIGHTS_TOLERANCE``). ``exact``: only rewrites
    that are bit-exact in IEEE arithmetic (simplify-algebra's reassociations are off).
    ``layout="NHWC"``: NCHW ops computed channels-last (layout-nhwc)."""
    if interface is not None:
        inputs, outputs, training_flags = interface.inputs, interface.outputs, \
            interface.training_flags
        inference_values, input_shapes, feeds = interface.inference_values, \
            interface.input_shapes, interface.feeds
    if checks is not None:
        verify, tolerance, verify_timeout, seed = checks.verify, checks.tolerance, \
            checks.timeout, checks.seed
    source = as_source(source)
    transforms = list(transforms) if transforms and all(isinstance(t, str) for t in transforms) \
        and pipeline.DEFAULT_WORD not in transforms else choose_transforms(transforms)
    transforms, default_tolerance = _with_weights(transforms, weights)
    if layout not in (None, "NHWC"):
        raise InputError(f"layout {layout!r}: only 'NHWC' is offered")
    if layout and "layout-nhwc" not in transforms:
        transforms = pipeline.resolve_transforms(transforms, enable=["layout-nhwc"])
    tolerance = default_tolerance if tolerance is None else tolerance
    timeout = verify_mod.DEFAULT_TIMEOUT if verify_timeout is None else verify_timeout
    flags = list(dict.fromkeys(list(training_flags) + source.training_flags))
    original = source.graph_def
    if input_shapes or any(_names_a_non_placeholder(original, name) for name in inputs):
        original = with_declared_inputs(original, list(inputs), dict(input_shapes or {}))
    # The run's one index: read first for the interface (dropout knobs, preprocessing, class
    # scores), then handed to the pipeline, which edits it (copy-on-write: ``original`` itself,
    # the verifier's reference, stays as given).
    graph = Graph(original)
    values = {**find_dropout_knobs(graph, exclude=list(inputs)), **(inference_values or {})}
    inputs, outputs = resolve_interface(original, list(inputs) or source.inputs,
                                        list(outputs) or source.outputs, flags)
    inputs = [name for name in inputs if name.split(":")[0] not in values]
    check_fed(original, inputs, outputs)
    if check_n < 1:
        raise InputError(f"--check-n must be at least 1, not {check_n}")
    if samples is not None and not isinstance(samples, samples_mod.Samples):
        samples = samples_mod.load(samples, samples_mod.input_specs(original, inputs))
    specs = preprocessing.resolve(graph, inputs, preprocess or preprocessing.Requested())
    preprocess_hook = preprocessing.preprocessor(graph, specs)     # the original's input dtypes
    class_outputs = class_score_outputs(graph, outputs)
    if specs and "add-preprocessing" not in transforms:
        transforms = ["add-preprocessing"] + list(transforms)
    params = transform_parameters(transform_params, keep_asserts=keep_asserts, specs=specs,
                                  exact=exact)
    options = Options(inputs=inputs, outputs=outputs, training_flags=flags,
                      inference_values=values, params=params)
    progress.say(f"optimizing {len(original.node)} nodes: {', '.join(transforms)}")
    try:
        reports = pipeline.apply(graph, transforms, options)
    except TransformError as error:
        raise InputError(str(error)) from None
    settings = {**{name: False for name in find_training_flags(original, flags)}, **values}
    switches = list(settings)
    inputs, unused = _drop_unused_inputs(original, graph, inputs, outputs, given=feeds,
                                         seed=seed)
    graph_def = graph.to_graph_def()
    for r in reports:
        if r.name == "add-preprocessing":
            r.notes.extend(preprocessing.outcome(graph_def, specs, reports))
    settings.update(unused)
    result = Result(graph_def, reports, inputs, outputs, switches, original, tolerance,
                    original_extra_feeds=settings, timeout=timeout,
                    user_feeds=dict(feeds or {}),
                    preprocess=preprocess_hook, weights=weights,
                    unused_inputs=unused, frozen_form=source.frozen_form, samples=samples,
                    check_n=check_n, params=params, class_outputs=class_outputs)
    if not verify:
        result.verify_skipped = True
        return result
    progress.say("verifying: running the original and the optimized graph")
    try:
        result.verification = verify_result(result, feeds=feeds, seed=seed)
    except VerificationError as error:
        result.verification_error = str(error)
        message = str(error) if str(error).startswith("cannot compare") else \
            f"cannot compare: {error}"
        raise VerificationFailed(message, result=result) from None
    if not result.verification.passed:
        result.divergence = _localize(result, original, transforms, options)
        where = f"; {result.divergence.line()}" if result.divergence else ""
        raise VerificationFailed(result.verification.failure() + where,
                                 verification=result.verification, result=result)
    return result


def transform_parameters(given: Optional[Mapping[str, Mapping[str, object]]] = None, *,
                         keep_asserts: bool = False, specs=None,
                         exact: bool = False) -> Dict[str, object]:
    """Each transform's own parameters for a run: ``given`` ({"fold-constants": {"max_bytes":
    1 << 20}}; values may be text, converted by the field's type), plus what the interface
    options decide (--keep-asserts, --exact, the preprocessing specs). Unknown names: ``InputError``."""
    params: Dict[str, object] = {}
    for name, values in dict(given or {}).items():
        fn = pipeline.lookup(name)
        if fn is None:
            raise InputError(f"--param {name}: unknown transform '{name}'")
        typed = {key: _typed(fn, key, value) for key, value in dict(values).items()}
        try:
            params[name] = with_params(fn, typed)
        except ValueError as error:
            raise InputError(f"--param {name}: {error}") from None
    if keep_asserts:
        params["strip-debug"] = dataclasses.replace(
            params.get("strip-debug") or pipeline.lookup("strip-debug").params_type(),
            keep_asserts=True)
    if exact:
        params["simplify-algebra"] = dataclasses.replace(
            params.get("simplify-algebra") or pipeline.lookup("simplify-algebra").params_type(),
            exact=True)
    if specs:
        params["add-preprocessing"] = dataclasses.replace(
            params.get("add-preprocessing") or
            pipeline.lookup("add-preprocessing").params_type(), specs=specs)
    return params


def _typed(fn, key: str, value):
    """A text value as the parameter's own type (bool, int, float; others as given)."""
    if not isinstance(value, str):
        return value
    default = next((f.default for f in dataclasses.fields(fn.params_type) if f.name == key), None)
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise InputError(f"--param {fn.transform_name}.{key}: {value!r} is not a "
                         f"{type(default).__name__}") from None
    return value


def _float16_min_elements(result: Result) -> int:
    fn = pipeline.lookup("float16-weights")
    return (result.params.get("float16-weights") or fn.params_type()).min_elements


def _int8_min_elements(result: Result) -> int:
    fn = pipeline.lookup("int8-weights")
    return (result.params.get("int8-weights") or fn.params_type()).min_elements


def _localize(result: Result, original, transforms, options) -> Optional[localize.Divergence]:
    """The first transform after which the worst batch fails, and the first tensor it changed
    (tfsurgery.localize); None where the inputs are preprocessed (raw and model values differ
    between the graphs before and after add-preprocessing)."""
    if result.preprocess is not None or not transforms:
        return None
    progress.say("localizing the failure: re-running the pipeline prefix by prefix")

    settings = {verify_mod.node_name(name): np.asarray(value)
                for name, value in result.original_extra_feeds.items()}
    passes = localize.quick_check(original, result.outputs,
                                  feeds=result.verification.worst_feeds, settings=settings,
                                  allowed=result.verification.allowed,
                                  class_outputs=_class_outputs(result),
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


def _with_weights(transforms: Sequence[str], weights: str):
    """The transforms for ``--weights`` (float16-weights or int8-weights last) and the default
    tolerance."""
    if weights not in WEIGHTS:
        raise InputError(f"--weights {weights}: choose one of {', '.join(WEIGHTS)}")
    if weights == "float32":
        return list(transforms), verify_mod.DEFAULT_TOLERANCE
    last = WEIGHT_TRANSFORMS[weights]
    return ([t for t in transforms if t not in WEIGHT_TRANSFORMS.values()] + [last],
            FLOAT16_TOLERANCE if weights == "float16" else INT8_WEIGHTS_TOLERANCE)


def _names_a_non_placeholder(graph_def, name: str) -> bool:
    node = next((n for n in graph_def.node if n.name == name.split(":")[0]), None)
    return node is not None and node.op not in PLACEHOLDER_OPS


def verify_result(result: Result, *, feeds: Optional[Mapping[str, object]] = None,
                  seed: int = 0) -> verify_mod.Verification:
    """Verify ``result`` against its original: same inputs (``feeds`` where given), the
    original's switches at their inference values."""
    try:
        return verify_mod.verify_batches(
            result.original, result.graph_def, result.inputs, result.outputs, result.original_extra_feeds,
            batches=check_batches(result, feeds, seed), tolerance=result.tolerance,
            class_outputs=_class_outputs(result), timeout=result.timeout,
            preprocess=result.preprocess,
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


def _class_outputs(result: Result) -> List[str]:
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


def save(result: Result, path, *, input_path=None, allow_unverified: bool = False) -> Path:
    """Write the optimized graph (atomically, never over ``input_path``) — only a verified
    result, unless ``allow_unverified`` (see :func:`require_verified`)."""
    if not isinstance(result, Result):
        raise TypeError("api.save takes the Result of api.optimize (a verified graph); write a "
                        "GraphDef of your own with tfsurgery.io.save_graph_def")
    require_verified(result, allow_unverified=allow_unverified)
    return io.save_graph_def(result.graph_def, path, input_path=input_path)


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


def export_onnx(result: Result, path, *, opset: Optional[int] = None,
                inputs_as_nchw: Sequence[str] = (), ort_optimize: bool = True,
                input_path=None, batch: Optional[Batch] = None,
                allow_unverified: bool = False) -> onnx_export.OnnxExport:
    """Convert the optimized graph with tf2onnx and check it in onnxruntime against TensorFlow
    (``export_reference``), with the run's tolerance. Raises ``ExportError`` when that fails
    (nothing written); with a ``batch``, written when the whole run has passed."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"exporting to ONNX with tf2onnx: {path}")
    return onnx_export.export(result.graph_def, result.inputs, result.outputs, path, opset=opset,
                              inputs_as_nchw=list(inputs_as_nchw), tolerance=result.tolerance,
                              feeds=feeds_for_checks(result), timeout=result.timeout,
                              ort_optimize=ort_optimize, input_path=input_path,
                              float16_min_elements=(_float16_min_elements(result)
                                                    if result.weights == "float16" else None),
                              int8_min_elements=(_int8_min_elements(result)
                                                 if result.weights == "int8" else None),
                              more_feeds=(result.verification.more_feeds
                                          if result.verification is not None else None),
                              expected=export_reference(result), batch=batch)


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


def draw(source: Source, result: Result, path, *, scope: Optional[str] = None,
         batch: Optional[Batch] = None) -> Path:
    """The graph before and after, side by side (needs the ``picture`` extra). Rendered now —
    a graph too big to draw is refused before anything is written — and written now, or with a
    ``batch`` when the whole run has passed."""
    path = Path(path)
    data = picture.drawing(source.graph_def, result.graph_def, path, scope=scope)
    artefacts.publish(lambda: io.write_atomically(path, data), batch)
    return path


def check_drawable(source: Source, scope: Optional[str] = None) -> None:
    """Right after loading: an original too big to draw (in ``scope``) is refused at once."""
    picture.check_drawable(source.graph_def, "the input graph", scope)


def check_runs(runs: int) -> None:
    """``bench``'s run count: the one check (the CLI calls it before minutes of work)."""
    if runs < 1:
        raise InputError(f"--runs must be at least 1, not {runs}")


def bench(source: Source, result: Result, *, runs: int = 50, onnx: bool = True) -> list:
    """Latency of the original and the optimized graph, in TensorFlow and onnxruntime."""
    check_runs(runs)
    feeds = feeds_for_checks(result)
    return latency.bench(result.original, result.graph_def, result.inputs, result.outputs,
                         result.original_extra_feeds, feeds=feeds, runs=runs, onnx=onnx,
                         original_feeds=(result.preprocess.model_feeds(feeds)
                                         if result.preprocess else None))


def bench_int8(source: Source, result: Result, int8: Result, *, runs: int = 50,
               onnx: bool = True, tflite: bool = True) -> List[int8_bench.Side]:
    """The float result and its int8-weight twin (``weights="int8"``, both verified) side by
    side in TensorFlow, onnxruntime and TFLite: sizes, latency (each runtime in its own
    process), and the int8 model's error against the float one in the same runtime. The float
    result must have passed its check; the int8 one must have been checked — a miss is timed
    too (nothing is written) and the caller says so."""
    import tempfile
    check_runs(runs)
    if int8.weights != "int8":
        raise InputError("bench_int8 compares with a result optimized with weights='int8'")
    require_verified(result)
    if int8.verification is None:          # measured, passed or not: bench writes nothing
        raise Unverified("bench_int8 needs the int8 result's check: optimize it with verify=True")
    runtimes = [r for r, wanted in zip(int8_bench.RUNTIMES, (True, onnx, tflite)) if wanted]
    progress.say(f"benchmarking float against int8 weights in {', '.join(runtimes)}")
    with tempfile.TemporaryDirectory() as work:
        return int8_bench.bench({"float": result.graph_def, "int8": int8.graph_def},
                                result.inputs, result.outputs, signature_for(source, result),
                                feeds=check_feeds(result),
                                tolerances={"float": result.tolerance, "int8": int8.tolerance},
                                int8_min_elements=_int8_min_elements(int8), work=Path(work),
                                runs=runs, runtimes=runtimes, timeout=result.timeout,
                                compare_on=_sample_feeds(result))


def _sample_feeds(result: Result) -> List[Dict[str, object]]:
    """Every batch of the user's samples as full feeds (the rest seeded random, as verification
    made them); none without --samples."""
    if result.samples is None:
        return []
    return [verify_mod.make_feeds(result.graph_def, result.inputs, seed, given=given)
            for _, given, seed in check_batches(result, result.given, 0)]


# ---------------------------------------------------------------- deployment artefacts
def wants_directory(output) -> bool:
    """``-o DIR/`` (a trailing slash) asks for a SavedModel."""
    return output is not None and str(output).endswith(("/", os.sep))


def check_saved_model_target(path, *, force: bool = False, input_path=None) -> None:
    """Before minutes of work: a file there, or a non-empty directory without --force: exit 2."""
    savedmodel_export.check_target(Path(path), force, input_path)


def signature_for(source: Source, result: Result) -> savedmodel_export.Signature:
    """A SavedModel input's own signature key, and its names for the tensors it names;
    otherwise ``serving_default`` with the graph's input and output names."""
    if source.signature:
        return savedmodel_export.Signature.kept(source.signature, result.inputs, result.outputs)
    return savedmodel_export.Signature.of_graph(result.inputs, result.outputs)


def pb_artefact(result: Result, path) -> Artefact:
    """The written .pb as an artefact: its check is the verification against the original."""
    v = result.verification
    return Artefact("pb", Path(path), artefacts.size_of(Path(path)),
                    v.max_error if v else float("nan"), v.allowed if v else result.tolerance,
                    bool(v and v.passed), "verification" if v
                    else "not verified (--no-verify)", weights=result.weights,
                    outputs=list(v.outputs) if v else [],
                    reference=(artefacts.ORIGINAL_REFERENCE if result.preprocess
                               else "the original graph"))


def export_saved_model(source: Source, result: Result, path, *, force: bool = False,
                       batch: Optional[Batch] = None, allow_unverified: bool = False) -> Artefact:
    """Write the optimized graph as a SavedModel; loaded back and its signature called on the
    verification inputs; written only if it matches the reference (``export_reference``)
    within the run's tolerance (with a ``batch``: when the whole run has passed)."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"writing the SavedModel {path}")
    return savedmodel_export.export(result.graph_def, signature_for(source, result), path,
                                    feeds=feeds_for_checks(result), tolerance=result.tolerance,
                                    timeout=result.timeout, force=force, input_path=source.path,
                                    weights=result.weights, expected=export_reference(result),
                                    batch=batch)


def export_tflite(source: Source, result: Result, path, batch: Optional[Batch] = None, *,
                  allow_unverified: bool = False) -> Artefact:
    """Convert with tf.lite.TFLiteConverter (float16 weights with --weights float16, dynamic-range
    int8 weights with --weights int8), run in the
    LiteRT interpreter on the verification inputs; written only if it matches the reference
    (``export_reference``; with a ``batch``: when the whole run has passed)."""
    require_verified(result, allow_unverified=allow_unverified)
    progress.say(f"converting to TensorFlow Lite: {path}")
    return tflite_export.export(result.graph_def, signature_for(source, result), path,
                                feeds=feeds_for_checks(result), tolerance=result.tolerance,
                                float16=result.weights == "float16",
                                int8=result.weights == "int8", timeout=result.timeout,
                                input_path=source.path, expected=export_reference(result),
                                batch=batch)


# ---------------------------------------------------------------- int8 (--quantize int8)
Int8Thresholds = quantize_mod.Thresholds
Int8Refused = quantize_mod.Int8Refused


def check_int8_request(samples_path, quantize, onnx: bool, nchw_inputs: Sequence[str] = (),
                       *, weights: str = "float32") -> None:
    """Bad --quantize requests, before any work: one line each (exit 2)."""
    if quantize and weights != "float32":
        raise InputError(f"--quantize {quantize} quantizes the float model: drop --weights "
                         f"{weights} (--weights int8 is storage only, float compute)")
    quantize_mod.check_request(samples_path, quantize, onnx, nchw_inputs)


TfliteInt8Refused = quantize_tflite.TfliteInt8Refused


def int8_samples(source: Source, result: Result, samples_path, *, check_samples=None,
                 check_fraction: float = 0.25):
    """(calibration rows, held-back check rows): --samples split, or all of it to calibrate
    and ``check_samples`` to check (at least 8 rows)."""
    specs = samples_mod.input_specs(source.graph_def, result.inputs)
    rows = samples_mod.load(samples_path, specs)
    if check_samples is None:
        return rows.split(check_fraction)
    check = samples_mod.load(check_samples, specs)
    if check.rows < 8:
        raise InputError(f"{check_samples}: {check.rows} rows are too few to check int8 on; "
                         "give at least 8")
    return rows, check


EQUALIZE_CHOICES = ("auto", "on", "off")
INT8_CALIBRATION_CHOICES = quantize_mod.CALIBRATION_CHOICES


def export_int8(source: Source, result: Result, float_model, path, *, calibration, check,
                thresholds: quantize_mod.Thresholds, batch: Optional[Batch] = None,
                calibration_method: str = "auto", equalize: str = "off",
                bias_correction: str = "off") -> quantize_mod.Int8Report:
    """Static int8 of the (checked) float ONNX ``float_model``, checked on ``check`` against the
    float ORIGINAL in TensorFlow; raises ``Int8Refused`` (with its report) when it misses.

    ``calibration_method``: "auto" (MinMax and Percentile tried, the best on the check rows
    kept) or one of "minmax", "percentile", "entropy". ``equalize``: "auto" also quantizes the cross-layer-equalized
    graph (verified in float against the original, exported next to ``float_model``) and keeps
    it only if it quantizes better; "on" uses it alone (an error when nothing could be
    equalized or it fails its float check); "off" never. ``bias_correction``: "auto" tries
    each attempt with and without bias correction and keeps the best; "on" only with; "off"
    only without."""
    if bias_correction not in EQUALIZE_CHOICES:
        raise InputError(f"--int8-bias-correction {bias_correction}: choose from "
                         f"{', '.join(EQUALIZE_CHOICES)}")
    if equalize not in EQUALIZE_CHOICES:
        raise InputError(f"--int8-equalize {equalize}: choose from {', '.join(EQUALIZE_CHOICES)}")
    quantize_mod.calibration_methods(calibration_method)          # a bad name: before any work
    candidates = {"plain": Path(float_model)}
    equalization: dict = {"asked": equalize}
    if equalize != "off":
        progress.say("cross-layer equalization before int8")
        equalized, equalization = equalized_result(result, calibration, check)
        equalization["asked"] = equalize
        if equalized is not None:
            twin = Path(float_model).with_name("equalized." + Path(float_model).name)
            exported = export_onnx(equalized, twin)
            equalization["onnx_max_error"] = float(exported.max_error)
            if exported.passed:
                candidates["equalized"] = twin
            else:
                equalization["why"] = (f"its ONNX differs from TensorFlow by "
                                       f"{exported.max_error:.3g}")
        if equalize == "on":
            if "equalized" not in candidates:
                raise ExportError(f"--int8-equalize on: {equalization['why']}")
            del candidates["plain"]
    progress.say(f"quantizing to int8 on {calibration.rows} calibration rows: {path}")
    expected = quantize_mod.reference_outputs(source.graph_def, result.outputs, check,
                                               result.timeout)
    try:
        report = quantize_mod.quantize(candidates, Path(path), outputs=result.outputs,
                                       calibration=calibration, check=check, expected=expected,
                                       thresholds=thresholds, batch=batch,
                                       timeout=result.timeout,
                                       calibration_method=calibration_method,
                                       bias_correction=bias_correction)
    except quantize_mod.Int8Refused as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report


def equalized_result(result: Result, calibration, check_rows=None
                     ) -> Tuple[Optional[Result], dict]:
    """``result`` after equalize-cross-layer, verified in float against the original like every
    transform — or None and why not (nothing equalized, or the check failed). Verification
    runs on the ``calibration`` and ``check_rows``."""
    graph_def, report = equalize_mod.equalize(result.graph_def, result.inputs, result.outputs)
    info = {"transform": report.as_dict(), "pairs": len(report.rewritten),
            "refused": len(report.skipped)}
    if not report.rewritten:
        info["why"] = ("no layer pair could be equalized" +
                       (f" ({report.skipped[0][0]}: {report.skipped[0][1]})"
                        if report.skipped else ""))
        return None, info
    rows = [r for r in (calibration, check_rows) if r is not None]
    equalized = dataclasses.replace(result, graph_def=graph_def,
                                    reports=list(result.reports) + [report], verification=None,
                                    verification_error=None, divergence=None,
                                    samples=samples_mod.concatenate(rows))
    try:
        equalized.verification = check(equalized, feeds=result.given or None)
    except VerificationError as error:
        info["why"] = f"the equalized graph could not be verified: {error}"
        return None, info
    info["verification"] = equalized.verification.as_dict()
    if not equalized.verification.passed:
        info["why"] = ("the equalized graph fails verification against the original: "
                       f"{equalized.verification.failure()}")
        return None, info
    return equalized, info


def export_tflite_int8(source: Source, result: Result, path, *, calibration, check,
                       thresholds: quantize_mod.Thresholds, int8_io: bool = False,
                       batch: Optional[Batch] = None, equalize: str = "off"):
    """Full-integer TFLite (calibration rows as representative dataset), checked in the LiteRT
    interpreter on ``check`` against the float ORIGINAL; raises ``TfliteInt8Refused``.
    ``equalize`` as for :func:`export_int8` (the converter's own calibration, no bias
    correction)."""
    require_verified(result)
    if equalize not in EQUALIZE_CHOICES:
        raise InputError(f"--int8-equalize {equalize}: choose from {', '.join(EQUALIZE_CHOICES)}")
    candidates = {"plain": result.graph_def}
    equalization: dict = {"asked": equalize}
    if equalize != "off":
        progress.say("cross-layer equalization before int8")
        equalized, equalization = equalized_result(result, calibration, check)
        equalization["asked"] = equalize
        if equalized is not None:
            candidates["equalized"] = equalized.graph_def
        elif equalize == "on":
            raise ExportError(f"--int8-equalize on: {equalization['why']}")
        if equalize == "on":
            del candidates["plain"]
    progress.say(f"converting to full-integer TensorFlow Lite: {path}")
    expected = quantize_mod.reference_outputs(source.graph_def, result.outputs, check,
                                               result.timeout)
    try:
        report = quantize_tflite.export(candidates, signature_for(source, result), path,
                                        outputs=result.outputs, calibration=calibration,
                                        check=check, expected=expected, thresholds=thresholds,
                                        int8_io=int8_io, input_path=source.path, batch=batch)
    except quantize_tflite.TfliteInt8Refused as refused:
        refused.report.equalization = equalization
        raise
    report.equalization = equalization
    return report


# ---------------------------------------------------------------- writing a run's artefacts
@dataclasses.dataclass
class Int8Targets:
    """Static int8 (``--quantize int8``) of the ONNX and/or TFLite target: calibrated on
    ``samples`` (a .npz/.npy/image folder), checked on held-back rows (``check_fraction`` of them,
    or ``check_samples``) against the float original with ``thresholds``. ``calibration``,
    ``equalize``, ``bias_correction``: see :func:`export_int8`; ``tflite_io``: the full-integer
    TFLite model's inputs and outputs, "float32" or "int8"."""

    samples: object = None
    check_samples: object = None
    check_fraction: float = 0.25
    thresholds: quantize_mod.Thresholds = dataclasses.field(
        default_factory=quantize_mod.Thresholds)
    calibration: str = "auto"
    equalize: str = "auto"
    bias_correction: str = "auto"
    tflite_io: str = "float32"


@dataclasses.dataclass
class Targets:
    """What :func:`write` writes: the frozen graph (``pb``), a ``saved_model`` directory
    (``force``: replace a non-empty one), a ``tflite`` file, an ``onnx`` model (``opset``,
    ``inputs_as_nchw``, ``ort_optimize``: onnxruntime's basic rewrites), each ``int8`` when
    given, and a ``picture`` of the graph before and after. ``allow_unverified``: the result
    was not checked on purpose (``--no-verify``)."""

    pb: Optional[Path] = None
    saved_model: Optional[Path] = None
    force: bool = False
    tflite: Optional[Path] = None
    onnx: Optional[Path] = None
    opset: Optional[int] = None
    inputs_as_nchw: Sequence[str] = ()
    ort_optimize: bool = True
    int8: Optional[Int8Targets] = None
    picture: Optional[Path] = None
    picture_scope: Optional[str] = None
    allow_unverified: bool = False


@dataclasses.dataclass
class Written:
    """What :func:`write` wrote — or, carried by ``WriteFailed``, what it had converted and
    checked when it stopped. ``artefacts``: one record per file, in the report's order (.pb,
    ONNX, SavedModel, TFLite; on a failure the failed ones); ``onnx``: the ONNX conversion (also
    the float model under int8) and ``onnx_record`` its report entry; ``int8``/``tflite_int8``:
    the int8 reports (also a refused one); ``checks``: the SavedModel/TFLite checks passed."""

    artefacts: List[Artefact] = dataclasses.field(default_factory=list)
    onnx: Optional[onnx_export.OnnxExport] = None
    onnx_record: Optional[dict] = None
    int8: Optional[quantize_mod.Int8Report] = None
    tflite_int8: Optional[quantize_tflite.TfliteInt8Report] = None
    checks: List[Artefact] = dataclasses.field(default_factory=list)
    picture: Optional[Path] = None
    published: bool = False

    def report(self) -> dict:
        """The report's entries for the artefacts (``--report-json``: artefacts, onnx, int8,
        tflite_int8)."""
        data: dict = {"artefacts": [a.as_dict() for a in self.artefacts]}
        if self.onnx_record is not None:
            data["onnx"] = self.onnx_record
        if self.int8 is not None:
            data["int8"] = self.int8.as_dict()
        if self.tflite_int8 is not None:
            data["tflite_int8"] = self.tflite_int8.as_dict()
        return data


def write(source, result: Result, targets: Targets) -> Written:
    """Write every target of ``targets`` together or not at all: each export is converted and
    checked in turn (ONNX — float, or int8 from the checked float model — then SavedModel, then
    TFLite, then the picture is drawn), held unpublished; only when all passed are they
    published, then the .pb saved. The first failure raises ``WriteFailed`` (its ``stage`` and
    the ``written`` records so far) with nothing written; a result whose check failed or never
    ran raises ``Unverified`` unless ``targets.allow_unverified``."""
    source = as_source(source)
    require_verified(result, allow_unverified=targets.allow_unverified)
    if targets.int8 is not None:              # what the CLI refuses before any work
        check_int8_request(targets.int8.samples, "int8",
                           targets.onnx is not None or targets.tflite is not None,
                           targets.inputs_as_nchw, weights=result.weights)
    written = Written()
    batch = Batch()
    # the samples are read once: calibration and check rows for ONNX and TFLite alike
    rows = _int8_rows(source, result, targets.int8) if targets.int8 is not None else None
    try:
        if targets.onnx is not None and targets.int8 is not None:
            _write_int8_onnx(source, result, targets, Path(targets.onnx), rows, written, batch)
        elif targets.onnx is not None:
            _write_onnx(source, result, targets, Path(targets.onnx), written, batch)
        if targets.saved_model is not None:
            _write_checked("SavedModel", written, lambda: export_saved_model(
                source, result, targets.saved_model, force=targets.force, batch=batch,
                allow_unverified=targets.allow_unverified))
        if targets.tflite is not None and targets.int8 is not None:
            _write_tflite_int8(source, result, targets, rows, written, batch)
        elif targets.tflite is not None:
            _write_checked("TFLite", written, lambda: export_tflite(
                source, result, targets.tflite, batch=batch,
                allow_unverified=targets.allow_unverified))
        if targets.picture:          # drawn before anything is written: it may refuse
            draw(source, result, targets.picture, scope=targets.picture_scope, batch=batch)
        batch.publish_all()
        if targets.onnx is not None:
            written.artefacts.insert(0, _onnx_artefact(written, Path(targets.onnx),
                                                       result.weights))
        if targets.pb is not None:
            save(result, targets.pb, input_path=source.path,
                 allow_unverified=targets.allow_unverified)
            written.artefacts.insert(0, pb_artefact(result, targets.pb))
        written.published = True
        written.picture = Path(targets.picture) if targets.picture else None
    finally:
        batch.discard()
        for artefact in written.artefacts:
            artefact.written = written.published
    return written


def _write_onnx(source: Source, result: Result, targets: Targets, path: Path, written: Written,
                batch: Optional[Batch]) -> None:
    """The ONNX conversion and its onnxruntime check, recorded in ``written``."""
    try:
        exported = export_onnx(result, path, opset=targets.opset,
                               inputs_as_nchw=list(targets.inputs_as_nchw),
                               ort_optimize=targets.ort_optimize, input_path=source.path,
                               batch=batch, allow_unverified=targets.allow_unverified)
    except ExportError as error:
        written.onnx_record = {"path": str(path), "passed": False, "error": str(error)}
        raise WriteFailed("ONNX export", str(error), written) from error
    written.onnx, written.onnx_record = exported, exported.as_dict()
    if not exported.passed:
        where = f"; {exported.divergence}" if exported.divergence else ""
        raise WriteFailed("ONNX check", f"onnxruntime differs from {exported.reference} by "
                                        f"{exported.max_error:.3g} (tolerance "
                                        f"{exported.tolerance:g}){where}", written)


def _int8_rows(source: Source, result: Result, int8: Int8Targets):
    return int8_samples(source, result, int8.samples, check_samples=int8.check_samples,
                        check_fraction=int8.check_fraction)


def _write_int8_onnx(source: Source, result: Result, targets: Targets, path: Path, rows,
                     written: Written, batch: Batch) -> None:
    """The float ONNX (checked as usual) in a scratch directory, then int8 from it, checked on
    the held-back rows against the float original."""
    int8 = targets.int8
    calibration, check = rows
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.float.", dir=path.parent) as scratch:
        _write_onnx(source, result, targets, Path(scratch) / path.name, written, None)
        try:
            report = export_int8(source, result, Path(scratch) / path.name, path,
                                 calibration=calibration, check=check,
                                 thresholds=int8.thresholds, batch=batch,
                                 calibration_method=int8.calibration, equalize=int8.equalize,
                                 bias_correction=int8.bias_correction)
        except Int8Refused as refused:
            written.int8 = refused.report
            raise WriteFailed("int8", str(refused), written) from refused
        except ExportError as error:
            raise WriteFailed("int8", str(error), written) from error
    written.int8 = report
    measures = ", ".join(f"{o.measure} {o.value:.4g}" for o in report.outputs)
    written.onnx_record.update(path=str(path), as_int8={      # what the artefact record says
        "weights": "int8", "max_error": float("nan"), "reference": "the float original",
        "checked_by": f"onnxruntime int8 on {report.check_rows} held-back rows against the "
                      f"float original: {measures}"})


def _onnx_artefact(written: Written, path: Path, weights: str) -> Artefact:
    """The published ONNX model (and its external data) as an artefact record."""
    exported = written.onnx
    data = path.with_name(path.name + ".data")
    size = path.stat().st_size + (data.stat().st_size if data.exists() else 0)
    artefact = Artefact("onnx", path, size, exported.max_error, exported.tolerance,
                        exported.passed, "onnxruntime", weights=weights,
                        outputs=list(exported.outputs), reference=exported.reference)
    return dataclasses.replace(artefact, **written.onnx_record.get("as_int8", {}))


ARTEFACT_FORMATS = {"SavedModel": "saved_model", "TFLite": "tflite"}


def _write_checked(kind: str, written: Written, export) -> None:
    """One checked export (SavedModel, TFLite), recorded in ``written``."""
    try:
        artefact = export()
    except ExportError as error:
        written.artefacts.append(Artefact.failed(ARTEFACT_FORMATS[kind], "", str(error)))
        raise WriteFailed(f"{kind} export", str(error), written) from error
    if not artefact.passed:
        written.artefacts.append(dataclasses.replace(artefact, bytes=0))
        raise WriteFailed(f"{kind} check", check_line(artefact), written)
    written.artefacts.append(artefact)
    written.checks.append(artefact)


def check_line(artefact: Artefact) -> str:
    """How an export was checked, in one line."""
    return (f"{artefact.checked_by}: max error {artefact.max_error:.3g} vs "
            f"{artefact.reference} (tolerance {artefact.tolerance:g})")


def _write_tflite_int8(source: Source, result: Result, targets: Targets, rows,
                       written: Written, batch: Batch) -> None:
    """Full-integer TFLite, checked on the held-back rows against the float original."""
    int8 = targets.int8
    calibration, check = rows
    try:
        report = export_tflite_int8(source, result, targets.tflite, calibration=calibration,
                                    check=check, thresholds=int8.thresholds,
                                    int8_io=int8.tflite_io == "int8", batch=batch,
                                    equalize=int8.equalize)
    except TfliteInt8Refused as refused:
        written.tflite_int8 = refused.report
        raise WriteFailed("TFLite int8", str(refused), written) from refused
    except ExportError as error:
        raise WriteFailed("TFLite int8", str(error), written) from error
    written.tflite_int8 = report
    written.artefacts.append(Artefact(
        "tflite", Path(targets.tflite), report.bytes, float("nan"), float("nan"), True,
        f"LiteRT int8 on {report.check_rows} held-back rows against the float original",
        weights="int8", reference="the float original"))
