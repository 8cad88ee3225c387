"""Proof that the numbers did not change: run both graphs on the same feeds and compare outputs.

Feeds are random but seeded, shaped from each placeholder's ``shape`` attribute or the user's
``--input-shape`` (unknown batch → 2; other unknown dims → 16, then 32, 64, ... until the original
runs and every output is non-empty — five poolings of 16 leave nothing). The user's ``--feed``
values replace the random ones. The original runs with its training flags and inference knobs at
their inference values. The error of an output is max|optimized − original| / max|original| over
the finite values; NaN and ±Inf must sit at exactly the same positions in both.

It never passes without comparing real numbers:
- random ops get the same fixed seeds in both graphs; those the transforms removed (dropout,
  noise) take their expected or neutral value in the reference, built from the original by
  ``tfsurgery.verify.reference`` — never by the transform under test. No neutral value: the check says
  it cannot compare.
- the float32 *noise floor* — how far the original's own outputs move when its float inputs move
  by one rounding step (relative 2^-23) — excuses at most NOISE_FACTOR × that floor, capped at
  NOISE_CAP, and only when the reference is deterministic (two runs agree bit for bit).
- what an output-only comparison is blind to — saturated softmax/sigmoid heads, argmax and
  integer outputs, layers whose change the random inputs clip away — is compared too: the logits
  under such outputs, and where a 1% change of a layer's weights would not show, every tensor
  both graphs have (``tfsurgery.verify.sensitivity``).
- every graph run has a deadline (``timeout`` seconds, default DEFAULT_TIMEOUT): an empty queue or
  an endless while loop fails the check with a message instead of hanging.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tensorflow.core.framework import graph_pb2

from tfsurgery.errors import OriginalDoesNotRun, VerificationError
from tfsurgery.ops import node_name, tensor_name
# the names callers know, re-exported: UNKNOWN_BATCH, placeholder_shape
from tfsurgery.verify.runs import (DEFAULT_TIMEOUT, UNKNOWN_BATCH, UNKNOWN_DIMS,  # noqa: F401
                            GraphTimeout, OutputError, Runner, has_free_dims, make_feeds, nudge,
                            output_error, placeholder_shape, run_graph)
from tfsurgery.verify import sensitivity as sensitivity_mod
from tfsurgery.verify.reference import comparable_reference
# the verdict and the widening, re-exported for callers that know them here
from tfsurgery.verify.verdict import (DEFAULT_TOLERANCE, NOISE_CAP, NOISE_FACTOR,  # noqa: F401
                                      Verification, Watching, compared_real_numbers,
                                      is_class_scores, top1_agreement, worst_error)
from tfsurgery.verify.widen import (WIDE_BYTES, _consumed_error, _excuse,  # noqa: F401
                                    _same_shapes, _stacked_rows, _widened, _widened_note,
                                    first_rows, wide_rows)


# ---------------------------------------------------------------- the check
def run_reference(original, inputs: Sequence[str], outputs: Sequence[str],
                  settings: Mapping[str, np.ndarray], *, seed: int, given, timeout: float,
                  size: Optional[int] = None, scale: float = 1.0, runner=None):
    """Feeds for which the original runs with non-empty outputs, and its values of ``outputs``
    (any tensors; ``runner``: the original already open). An original that cannot run at all
    is the user's input at fault."""
    size = free_dim_size(original, inputs, outputs, given) if size is None else size
    feeds = make_feeds(original, inputs, seed, given=given, unknown_dim=size, scale=scale)
    try:
        if runner is None:
            expected = run_graph(original, {**feeds, **settings}, outputs, timeout=timeout,
                                 label="the original graph")
        else:
            expected = runner.run({**feeds, **settings}, outputs)
    except GraphTimeout:
        raise                    # a deadline is no proof the input is bad: exit 1, not 2
    except VerificationError as error:
        raise OriginalDoesNotRun(f"the input graph does not run on test inputs: {error}"
                                 f"{_shape_hint(inputs, given)}") from None
    empty = [o for o, value in zip(outputs, expected) if np.size(value) == 0]
    if empty:
        raise OriginalDoesNotRun(f"output '{empty[0]}' is empty on test inputs"
                                 f"{_shape_hint(inputs, given)}")
    return feeds, expected, size


def free_dim_size(graph_def, inputs: Sequence[str], outputs: Sequence[str], given=None) -> int:
    """The size for free dimensions: the first of UNKNOWN_DIMS for which TensorFlow's shape
    inference gives every output a non-empty shape (five poolings leave nothing of 16). Decided
    statically: running a kernel on an empty tensor can crash the process."""
    if not has_free_dims(graph_def, inputs):
        return UNKNOWN_DIMS[0]
    import tensorflow as tf
    for size in UNKNOWN_DIMS:
        feeds = make_feeds(graph_def, inputs, given=given, unknown_dim=size)
        sized = graph_pb2.GraphDef()
        sized.CopyFrom(graph_def)
        placeholders = {node.name: node for node in sized.node}
        for name, value in feeds.items():
            shape = placeholders[node_name(name)].attr["shape"].shape
            shape.Clear()
            for dim in np.shape(value):
                shape.dim.add(size=dim)
        with tf.Graph().as_default() as graph:
            try:
                tf.compat.v1.import_graph_def(sized, name="")
            except ValueError:            # shape inference: a dimension became negative
                continue
            shapes = [graph.get_tensor_by_name(tensor_name(o)).shape for o in outputs]
        if all(shape.rank is None or 0 not in shape.as_list() for shape in shapes):
            return size
    return UNKNOWN_DIMS[-1]


def _shape_hint(inputs: Sequence[str], given) -> str:
    free = [n for n in inputs if node_name(n) not in {node_name(k) for k in (given or {})}]
    return (f"; give real sizes with --input-shape {free[0]}=D0,D1,... or values with --feed"
            if free else "; check the --feed values")


def verify(original, optimized, inputs: Sequence[str], outputs: Sequence[str],
           settings: Mapping[str, object] = (), *, tolerance: float = DEFAULT_TOLERANCE,
           seed: int = 0, given: Optional[Mapping[str, np.ndarray]] = None,
           timeout: float = DEFAULT_TIMEOUT, reference_note: Optional[str] = None,
           preprocess=None, comparable=None, watching: Optional[Watching] = None) -> Verification:
    """Compare every output of ``optimized`` with ``original`` on the same feeds — and what an
    output-only comparison is blind to (tfsurgery.verify.sensitivity): the logits under saturating
    heads, argmax and integer outputs; where a 1% change of a layer's weights would not show,
    every tensor both graphs have. ``settings`` are values the original is fed besides the
    inputs: training flags False, dropout knobs at their inference value (a list of names means
    bool flags set False). ``preprocess`` (see tfsurgery.preprocessing.Preprocessor): the
    optimized graph takes raw inputs, the original their preprocessed values, computed by the
    hook in NumPy. ``comparable``: what ``comparable_reference`` made of the two for these
    settings, when the caller has it. ``watching``: the first batch's decisions, for the next."""
    settings = _settings(settings)
    watching = Watching() if watching is None else watching
    raw = None
    if preprocess is not None:
        raw, given = _preprocessed_feeds(original, optimized, inputs, outputs, preprocess,
                                         seed=seed, given=given)
    reference, optimized, random_note = comparable or comparable_reference(
        original, optimized, {node_name(k): v for k, v in settings.items()})
    started = time.perf_counter()
    try:
        ref = Runner(reference, timeout=timeout, label="the original graph")
    except VerificationError as error:
        raise OriginalDoesNotRun(f"the input graph does not run on test inputs: {error}") \
            from None
    with ref, Runner(optimized, timeout=timeout, label="the optimized graph") as opt:
        watches, unpaired = sensitivity_mod.watched(ref.graph, opt.graph, outputs)
        first = watching.sensitivity is None        # the first batch measures, and widens
        layers = sensitivity_mod.weight_layers(ref.graph) if first else []
        # the kernels fed at their own values: the probes then reuse the reference's first
        # run's executor (TensorFlow builds one per set of fed and fetched tensors)
        fed = {**settings, **sensitivity_mod.kernel_feeds(layers)}
        fetch_ref = list(outputs) + [w.reference for w in watches]
        fetch_opt = list(outputs) + [w.optimized for w in watches]
        names = list(outputs) + [w.label for w in watches]
        # too many layers to probe them all in the time: widen at once, in the same runs
        wide_names = sensitivity_mod.comparable_tensors(ref.graph, opt.graph, fetch_opt,
                                                        settings) \
            if first and raw is None and len(layers) > sensitivity_mod.PROBE_MAX_LAYERS else []
        run = dict(seed=seed, given=given, timeout=timeout, random=raw is None)
        if wide_names:
            watching.wide_rows = wide_rows(given or {}, ref.graph, wide_names)
        joined = wide_names if watching.wide_rows is None else []   # fetched with the outputs
        try:
            feeds, expected, size = _scaled_reference(ref, reference, inputs, outputs,
                                                      fetch_ref + joined, fed, watching, **run)
            actual = opt.run(feeds if raw is None else raw, fetch_opt + joined)
            if wide_names and not joined:
                if _stacked_rows(feeds, ref.graph) is None:   # an input's rows are not free
                    watching.wide_rows = None
                part = first_rows(feeds, watching.wide_rows)
                expected = list(expected) + ref.run({**part, **fed}, wide_names)
                actual = list(actual) + opt.run(part, wide_names)
        except (OriginalDoesNotRun, VerificationError) as error:
            if isinstance(error, GraphTimeout) or \
                    len(fetch_ref) + len(wide_names) == len(outputs):
                raise
            # a tensor besides the outputs had no value on these inputs: the outputs alone
            watching.notes.append(f"only the outputs were compared: {error}")
            fetch_ref, fetch_opt, names, wide_names = list(outputs), list(outputs), \
                list(outputs), []
            feeds, expected, size = _scaled_reference(ref, reference, inputs, outputs,
                                                      fetch_ref, fed, watching, **run)
            actual = opt.run(feeds if raw is None else raw, fetch_opt)
        count = len(fetch_ref)
        wide = _same_shapes(wide_names, expected[count:], actual[count:])
        expected, actual = expected[:count], actual[:count]
        errors = [output_error(n, e, a) for n, e, a in zip(names, expected, actual)]
        if first:
            watching.notes += unpaired
            if wide_names:
                watching.sensitivity = sensitivity_mod.Sensitivity(layers=len(layers))
                watching.notes.append(_widened_note(watching, len(wide)))
            else:
                budget = max(sensitivity_mod.PROBE_MIN_SECONDS,
                             sensitivity_mod.PROBE_SHARE * (time.perf_counter() - started))
                watching.sensitivity = sensitivity_mod.probe(
                    ref.run, layers, {**feeds, **fed}, fetch_ref, expected, tolerance, budget,
                    relative_error=lambda e, m: output_error("", e, m).max_rel)
                if watching.sensitivity.complete:
                    watching.notes.append(f"sensitivity: {watching.sensitivity.line()}")
                else:
                    wide = _widened(ref, opt, feeds, raw, fed, fetch_opt, watching)
        verification = Verification(errors, tolerance, feeds=feeds if raw is None else raw,
                                    expected=dict(zip(outputs, expected)),
                                    actual=dict(zip(outputs, actual)))
        verification.watching = watching
        verification.intermediate = [_consumed_error(n, e, a) for n, (e, a) in wide.items()]
        _excuse(verification, opt.graph)
        if verification.max_error > tolerance or verification.hidden:
            _noise_floor(verification, ref, feeds, fed, fetch_ref, names, expected,
                         {n: wide[n] for n in {e.name for e in verification.hidden}},
                         watching.wide_rows, fixed=given or {})
            _excuse(verification, opt.graph)
    if raw is None:
        more_errors, verification.more_feeds = _second_size(
            reference, optimized, inputs, (fetch_ref, fetch_opt, names), settings, size,
            seed=seed, given=given, timeout=timeout, scale=watching.scale or 1.0)
        verification.outputs += more_errors
    verification.reference = _reference_text(reference_note, settings, random_note)
    return verification


def _scaled_reference(ref, reference, inputs, outputs, fetches, settings, watching, *, seed,
                      given, timeout, random: bool):
    """The reference's run; on the first batch, with random float inputs scaled down (SCALES)
    while every saturating head output is saturated on them."""
    run = dict(seed=seed, given=given, timeout=timeout, runner=ref)
    if watching.scale is not None:
        return run_reference(reference, inputs, fetches, settings, scale=watching.scale, **run)
    found = first = run_reference(reference, inputs, fetches, settings, **run)
    heads = [n for n in outputs if sensitivity_mod.head_op(ref.graph, n)]
    fixed = {node_name(k) for k in (given or {})}
    floats = [n for n in inputs if found[0][n].dtype.kind == "f" and node_name(n) not in fixed]
    watching.scale = 1.0
    if not (random and heads and floats):
        return found
    saturated = lambda values: [n for n, v in zip(outputs, values)      # noqa: E731
                                if sensitivity_mod.saturated(ref.graph, n, v)]
    if len(saturated(found[1])) < len(heads):
        return found
    watching.saturated = saturated(found[1])
    for scale in sensitivity_mod.SCALES[1:]:
        found = run_reference(reference, inputs, fetches, settings, scale=scale, **run)
        if len(saturated(found[1])) < len(heads):
            watching.scale = scale
            watching.notes.append(
                f"random inputs scaled by {scale:g}: at scale 1, "
                f"{', '.join(repr(n) for n in watching.saturated)} saturated in every row")
            return found
    watching.notes.append(
        f"{', '.join(repr(n) for n in watching.saturated)} saturated on random inputs at every "
        f"scale tried ({', '.join(f'{s:g}' for s in sensitivity_mod.SCALES)}): the logits "
        "feeding them were compared instead; give real inputs with --samples")
    return first


def _noise_floor(verification, ref, feeds, settings, fetches, names, expected, wide,
                 rows: Optional[int] = None, fixed: Mapping[str, object] = ()) -> None:
    """Two more runs of the reference (only when something exceeds the tolerance): are its runs
    deterministic, and how far do its values move for a one-rounding-step change of the float
    inputs? The outputs share one floor; each intermediate tensor gets its own. The values the
    user ``fixed`` (--feed: a scale a ``tf.case`` selects on, say) are not moved; where the
    moved inputs still make the reference fail, there is no floor (the tolerance alone)."""
    wide_names = list(wide)
    values = list(expected) + [wide[n][0] for n in wide_names]

    def reference(feeds):     # the outputs on every row, intermediate tensors on those compared
        if rows is None or not wide_names:
            return ref.run({**feeds, **settings}, list(fetches) + wide_names)
        return list(ref.run({**feeds, **settings}, list(fetches))) + \
            ref.run({**first_rows(feeds, rows), **settings}, wide_names)
    again = reference(feeds)
    verification.deterministic = all(_identical(a, b) for a, b in zip(values, again))
    if not verification.deterministic:
        return
    kept = {node_name(k) for k in fixed}
    moved = {**nudge(feeds), **{k: v for k, v in feeds.items() if node_name(k) in kept}}
    try:
        nudged = reference(moved)
    except VerificationError as error:
        verification.watching.notes.append(f"no float32 noise floor: the original does not run "
                                           f"on inputs one rounding step away ({error})")
        return
    floors = [output_error(n, e, a).max_rel
              for n, e, a in zip(names + wide_names, values, nudged)]
    verification.noise_floor = max(floors[:len(names)], default=0.0)
    verification.intermediate_allowed = {
        n: max(verification.tolerance, min(NOISE_FACTOR * f, NOISE_CAP))
        for n, f in zip(wide_names, floors[len(names):])}


def _reference_text(note: Optional[str], settings: Mapping[str, np.ndarray],
                    random_note: Optional[str]) -> str:
    """What the optimized graph was compared with, from what was actually fed: the caller's
    note, else the original with the settings it was given; plus its random ops' treatment."""
    if note:
        text = note
    elif settings:
        shown = ", ".join(f"{node_name(k)}={np.asarray(v).tolist()}"
                          for k, v in list(settings.items())[:4])
        text = f"the original graph with {shown}{' and more' if len(settings) > 4 else ''}"
    else:
        text = "the original graph"
    return f"{text}, {random_note}" if random_note else text


def verify_batches(original, optimized, inputs: Sequence[str], outputs: Sequence[str],
                   settings: Mapping[str, object] = (), *,
                   batches: Sequence[Tuple[str, Optional[Mapping[str, np.ndarray]], int]],
                   class_outputs: Sequence[str] = (), tolerance: float = DEFAULT_TOLERANCE,
                   **options) -> Verification:
    """``verify`` on each batch — (label, given values, seed of the random rest): N seeded
    random batches (--check-n), the rows of the user's samples — merged into one verdict: every
    output on every batch, the worst batch named, and top-1 agreement over all rows of each
    class-score output in ``class_outputs`` (a flip where the original's top-2 margin exceeds
    the tolerance fails the check). The first batch's feeds are what exports are checked on."""
    merged = None
    expected: Dict[str, list] = {name: [] for name in class_outputs}
    actual: Dict[str, list] = {name: [] for name in class_outputs}
    comparable = comparable_reference(                 # the same for every batch: made once
        original, optimized, {node_name(k): v for k, v in _settings(settings).items()})
    watching = Watching()                              # decided by the first batch
    for label, given, seed in batches:
        one = verify(original, optimized, inputs, outputs, settings, tolerance=tolerance,
                     seed=seed, given=given, comparable=comparable, watching=watching,
                     **options)
        for name in class_outputs:
            expected[name].append(np.asarray(one.expected[name]))
            actual[name].append(np.asarray(one.actual[name]))
        if merged is None:
            merged, merged.worst_batch = one, label
            merged.worst, merged.worst_feeds = (given, seed), one.feeds
            continue
        if one.max_error > merged.max_error:
            merged.worst_batch, merged.worst, merged.worst_feeds = label, (given, seed), \
                one.feeds
        merged.outputs += [dataclasses.replace(o, name=f"{o.name} [{label}]")
                           for o in one.outputs]
        merged.noise_floor = max(merged.noise_floor, one.noise_floor)
        merged.deterministic = merged.deterministic and one.deterministic
        merged.batches += 1
    for name in class_outputs:
        if all(is_class_scores(value) for value in expected[name] + actual[name]):
            merged.agreement[name] = top1_agreement(np.concatenate(expected[name]),
                                                    np.concatenate(actual[name]), tolerance)
    return merged


def _second_size(reference, optimized, inputs, fetches, settings, first: int, *,
                 scale: float = 1.0, **run):
    """Free dimensions are checked at a second, larger size too: a loop whose trip count, or a
    reshape whose size, became a constant cannot pass. Errors are named ``output@size``.
    ``fetches``: (the reference's tensors, the optimized graph's, their names). Returns
    (errors, {"@size": the feeds}) — the ONNX check reuses those feeds."""
    if not has_free_dims(reference, inputs):
        return [], {}
    fetch_ref, fetch_opt, names = fetches
    larger = [size for size in UNKNOWN_DIMS if size > first] or [first + 1]
    try:
        more_feeds, expected, _ = run_reference(reference, inputs, fetch_ref, settings,
                                                size=larger[0], scale=scale, **run)
    except OriginalDoesNotRun:
        return [], {}        # the original itself needs the first size: nothing more to learn
    actual = run_graph(optimized, more_feeds, fetch_opt, timeout=run["timeout"],
                       label="the optimized graph")
    label = f"@{larger[0]}"
    return ([output_error(f"{name}{label}", e, a)
             for name, e, a in zip(names, expected, actual)], {label: more_feeds})


def _preprocessed_feeds(original, optimized, inputs, outputs, preprocess, *, seed, given):
    """Raw feeds for the optimized graph (the user's where given) and the original's feeds."""
    size = free_dim_size(original, inputs, outputs, given)
    made = make_feeds(optimized, inputs, seed, given=given, unknown_dim=size)
    fixed = {node_name(k) for k in (given or {})}
    raw = {**preprocess.raw_feeds(made, seed),
           **{k: v for k, v in made.items() if node_name(k) in fixed}}
    return raw, preprocess.model_feeds(raw)


def _identical(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc")


def _settings(settings) -> Dict[str, np.ndarray]:
    if isinstance(settings, Mapping):
        return {tensor_name(k): np.asarray(v) for k, v in settings.items()}
    return {tensor_name(name): np.bool_(False) for name in settings}
