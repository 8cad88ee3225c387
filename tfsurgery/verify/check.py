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
  by one rounding step (relative 2^-23), or when its float weights each move one step up or
  down at random (what recomputing every weight in float32, as folding does, may add), the
  larger — excuses at most NOISE_FACTOR × that floor, capped at NOISE_CAP, and only when the
  reference is deterministic (two runs agree bit for bit).
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

from tfsurgery.errors import OriginalDoesNotRun, VerificationError
from tfsurgery.ops import node_name, tensor_name
# the names callers know, re-exported: UNKNOWN_BATCH, placeholder_shape
from tfsurgery.verify.runs import (DEFAULT_TIMEOUT, UNKNOWN_BATCH, UNKNOWN_DIMS,  # noqa: F401
                            GraphTimeout, OutputError, Runner, float_weights, free_dim_size,
                            has_free_dims, make_feeds, nudge, output_error, placeholder_shape,
                            reround, run_graph, shape_hint)
from tfsurgery.verify import scales
from tfsurgery.verify import sensitivity as sensitivity_mod
from tfsurgery.verify import token_inputs
from tfsurgery.verify.reference import comparable_reference
# the verdict and the widening, re-exported for callers that know them here
from tfsurgery.verify.verdict import (DEFAULT_TOLERANCE, NOISE_CAP, NOISE_FACTOR,  # noqa: F401
                                      Verification, Watching, compared_real_numbers,
                                      is_class_scores, top1_agreement, worst_error)
from tfsurgery.verify.widen import (WIDE_BYTES, _consumed_error, _excuse,  # noqa: F401
                                    _same_shapes, _stacked_rows, _widened_note,
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
                                 f"{shape_hint(inputs, given, error)}") from None
    empty = [o for o, value in zip(outputs, expected) if np.size(value) == 0]
    if empty:
        raise OriginalDoesNotRun(f"output '{empty[0]}' is empty on test inputs"
                                 f"{shape_hint(inputs, given)}")
    return feeds, expected, size


def verify(original, optimized, inputs: Sequence[str], outputs: Sequence[str],
           settings: Mapping[str, object] = (), *, tolerance: float = DEFAULT_TOLERANCE,
           seed: int = 0, given: Optional[Mapping[str, np.ndarray]] = None,
           timeout: float = DEFAULT_TIMEOUT, reference_note: Optional[str] = None,
           preprocess=None, comparable=None, watching: Optional[Watching] = None,
           correspondence: Optional[Mapping[str, str]] = None) -> Verification:
    """Compare every output of ``optimized`` with ``original`` on the same feeds — and what an
    output-only comparison is blind to (tfsurgery.verify.sensitivity): the logits under saturating
    heads, argmax and integer outputs; where a 1% change of a layer's weights would not show,
    every tensor both graphs have, by name or by ``correspondence`` (optimized tensor → the
    original's it stands for, declared by the transforms). ``settings`` are values the original
    is fed besides the inputs: training flags False, dropout knobs at their inference value (a
    list of names means bool flags set False). ``preprocess`` (see
    tfsurgery.preprocessing.Preprocessor): the optimized graph takes raw inputs, the original
    their preprocessed values, computed by the hook in NumPy. ``comparable``: what
    ``comparable_reference`` made of the two for these settings, when the caller has it.
    ``watching``: the first batch's decisions, for the next."""
    settings = _settings(settings)
    watching = Watching() if watching is None else watching
    raw = None
    if preprocess is not None:
        raw, given = _preprocessed_feeds(original, optimized, inputs, outputs, preprocess,
                                         seed=seed, given=given)
    reference, optimized, random_note = comparable or comparable_reference(
        original, optimized, {node_name(k): v for k, v in settings.items()}, given)
    run = dict(seed=seed, given=given, timeout=timeout, random=raw is None)
    started = time.perf_counter()
    with _open(reference, timeout) as ref, \
            Runner(optimized, timeout=timeout, label="the optimized graph") as opt:
        plan = _plan(ref, opt, outputs, settings, watching, raw, correspondence)
        compared = _compare(ref, opt, reference, inputs, outputs, plan, watching, raw, run)
        if plan.first:
            watching.notes += token_inputs.notes(reference, inputs, given)
            compared = _watch_sensitivity(ref, opt, reference, inputs, outputs, plan, compared,
                                          watching, raw, run, tolerance, started)
        verification = _verdict(compared, plan, outputs, tolerance, raw, watching, opt.graph)
        if verification.max_error > tolerance or verification.hidden:
            _noise_floor(verification, ref, compared.feeds, plan.fed, plan.reference,
                         plan, compared.expected,
                         {n: compared.wide[n] for n in {e.name for e in verification.hidden}},
                         dict(plan.wide), watching.wide_rows, fixed=given or {})
            _excuse(verification, opt.graph)
    if raw is None:
        more_errors, verification.more_feeds = _second_size(
            reference, optimized, inputs, (plan.reference, plan.optimized, plan.names),
            settings, compared.size, seed=seed, given=given, timeout=timeout,
            scale=watching.scale or 1.0, parts=plan.parts)
        verification.outputs += more_errors
        for label in verification.more_feeds:   # the same output at another size: its floor
            verification.noise_floors.update({f"{n}{label}": f for n, f in
                                              list(verification.noise_floors.items())
                                              if n in plan.names})
    verification.reference = _reference_text(reference_note, settings, random_note)
    return verification


@dataclasses.dataclass
class Plan:
    """What one batch fetches: the outputs and the logits under them (labels ``names``; the
    tensors in each graph), what the reference is fed besides the inputs (``fed``: settings,
    the probed kernels at their own values), and on the first batch the layers to probe and the
    intermediate pairs (optimized tensor, the original's) compared besides."""
    names: List[str]
    reference: List[str]
    optimized: List[str]
    fed: Dict[str, np.ndarray]
    first: bool
    layers: list = dataclasses.field(default_factory=list)      # sampled, in probing order
    total_layers: int = 0
    wide: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    unpaired: List[str] = dataclasses.field(default_factory=list)
    correspondence: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # label → the parts the original's structure makes of it, each judged at its own scale
    parts: Dict[str, scales.Parts] = dataclasses.field(default_factory=dict)

    def error(self, label: str, expected, actual) -> OutputError:
        """An output's (or logits') error, judged as ``parts`` says; its dtype must not change."""
        return scales.judged_error(label, expected, actual, self.parts.get(label))


@dataclasses.dataclass
class Compared:
    """One comparison's values: the feeds, the reference's and the optimized graph's values of
    the plan's outputs and logits, and of its intermediate pairs (optimized name → both)."""
    feeds: Dict[str, np.ndarray]
    expected: list
    actual: list
    size: int
    wide: Dict[str, tuple]


def _open(reference, timeout: float) -> Runner:
    try:
        return Runner(reference, timeout=timeout, label="the original graph")
    except VerificationError as error:
        raise OriginalDoesNotRun(f"the input graph does not run on test inputs: {error}") \
            from None


def _plan(ref, opt, outputs, settings, watching, raw, correspondence) -> Plan:
    """The outputs and their logits; on the first batch, the layers to probe (their kernels
    fed at their own values, so the probes reuse the first run's executor) and — with more
    layers than are probed one by one — the intermediate pairs, fetched in the same runs."""
    watches, unpaired = sensitivity_mod.watched(ref.graph, opt.graph, outputs)
    first = watching.sensitivity is None
    layers = sensitivity_mod.weight_layers(ref.graph, outputs) if first else []
    sampled = sensitivity_mod.probed_order(layers)
    kernels = sum(layer.kind == "kernel" for layer in layers)
    plan = Plan(names=list(outputs) + [w.label for w in watches],
                reference=list(outputs) + [w.reference for w in watches],
                optimized=list(outputs) + [w.optimized for w in watches],
                fed={**settings, **sensitivity_mod.kernel_feeds(sampled)}, first=first,
                layers=sampled, total_layers=kernels, unpaired=unpaired,
                correspondence=dict(correspondence or {}))
    plan.parts = {label: found for label, tensor in zip(plan.names, plan.reference)
                  if (found := scales.parts_of(ref.graph, tensor)) is not None}
    if first and kernels > sensitivity_mod.PROBE_MAX_LAYERS:
        plan.wide = _pairs(ref, opt, plan, settings)
    return plan


def _pairs(ref, opt, plan: Plan, settings) -> List[Tuple[str, str]]:
    return sensitivity_mod.comparable_tensors(ref.graph, opt.graph, plan.optimized, settings,
                                              plan.correspondence)


def _compare(ref, opt, reference, inputs, outputs, plan: Plan, watching, raw, run) -> Compared:
    """Both graphs on one batch: the plan's outputs and logits on every row, its intermediate
    pairs on the rows that fit WIDE_BYTES (in the same runs when all do)."""
    wide_ref, wide_opt = [r for _, r in plan.wide], [o for o, _ in plan.wide]
    if plan.wide:
        watching.wide_rows = wide_rows(run["given"] or {}, ref.graph, wide_ref)
    joined = watching.wide_rows is None
    try:
        feeds, expected, size = _scaled_reference(
            ref, reference, inputs, outputs, plan.reference + (wide_ref if joined else []),
            plan.fed, watching, **run)
        actual = opt.run(feeds if raw is None else raw,
                         plan.optimized + (wide_opt if joined else []))
        if plan.wide and not joined:
            if _stacked_rows(feeds, ref.graph) is None:       # an input's rows are not free
                watching.wide_rows = None
            part = first_rows(feeds, watching.wide_rows)
            expected = list(expected) + ref.run({**part, **plan.fed}, wide_ref)
            actual = list(actual) + opt.run(_result_rows(part, raw, watching), wide_opt)
    except (OriginalDoesNotRun, VerificationError) as error:
        if isinstance(error, GraphTimeout) or \
                len(plan.reference) + len(plan.wide) == len(outputs):
            raise
        # a tensor besides the outputs had no value on these inputs: the outputs alone
        watching.notes.append(f"only the outputs were compared: {error}")
        plan.names, plan.reference, plan.optimized, plan.wide = \
            list(outputs), list(outputs), list(outputs), []
        feeds, expected, size = _scaled_reference(ref, reference, inputs, outputs,
                                                  plan.reference, plan.fed, watching, **run)
        actual = opt.run(feeds if raw is None else raw, plan.optimized)
    count = len(plan.reference)
    return Compared(feeds, list(expected[:count]), list(actual[:count]), size,
                    _same_shapes(plan.wide, expected[count:], actual[count:]))


def _verdict(compared: Compared, plan: Plan, outputs, tolerance, raw, watching,
             graph) -> Verification:
    errors = [plan.error(n, e, a)
              for n, e, a in zip(plan.names, compared.expected, compared.actual)]
    verification = Verification(errors, tolerance,
                                feeds=compared.feeds if raw is None else raw,
                                expected=dict(zip(outputs, compared.expected)),
                                actual=dict(zip(outputs, compared.actual)))
    verification.watching = watching
    verification.parts = {n: p for n, p in plan.parts.items() if n in outputs}
    verification.blind = list(watching.blind)
    verification.intermediate = [_consumed_error(n, e, a)
                                 for n, (e, a) in compared.wide.items()]
    _excuse(verification, graph)
    return verification


# ---------------------------------------------------------------- can the check see a change?
def _watch_sensitivity(ref, opt, reference, inputs, outputs, plan: Plan, compared: Compared,
                       watching, raw, run, tolerance, started) -> Compared:
    """The first batch: would a 1% change of each sampled layer show in what is compared? Where
    one would not: widen (every tensor both graphs have, or that corresponds) and probe again;
    then smaller scales of the random inputs; a layer no scale shows leaves the check blind
    (``Watching.blind``: "cannot verify" unless the user accepts it)."""
    watching.notes += plan.unpaired
    if _outputs_moved(plan, compared, max(tolerance, NOISE_CAP)):   # beyond any allowance:
        # the check fails whatever the probes would say
        watching.sensitivity = sensitivity_mod.Sensitivity(
            error="not measured: the outputs already differ beyond any noise floor")
        return compared
    scales = _smaller_scales(compared.feeds, inputs, run, watching)
    spent = 0.0                     # every probing pass counts in the time the report gives
    while True:
        found = _probe(ref, plan, compared, watching, tolerance, started)
        if not found.sees and not plan.wide:
            plan.wide = _pairs(ref, opt, plan, plan.fed)
            compared = _widen(ref, opt, plan, compared, watching, raw)
            spent += found.seconds
            found = _probe(ref, plan, compared, watching, tolerance, started)
        spent += found.seconds
        found.seconds = spent
        if found.sees or found.error or not scales or _outputs_moved(plan, compared, tolerance):
            break           # (outputs that moved already fail the check: keep that comparison)
        unnoticed, scale = found.unnoticed[0], scales.pop(0)
        watching.notes.append(f"random inputs scaled by {scale:g}: at scale "
                              f"{watching.scale:g} a {found.change:.0%} change of '{unnoticed}' "
                              "did not show")
        watching.scale = scale
        compared = _compare(ref, opt, reference, inputs, outputs, plan, watching, raw, run)
    watching.sensitivity = found
    # a weight whose change shows nowhere, one that could not be probed, a deadline that ended
    # before every weight was seen: "cannot verify", never a pass
    watching.blind = [] if found.sees else list(found.unnoticed) or [found.error]
    watching.notes.append(_widened_note(watching, len(compared.wide)) if plan.wide else
                          f"sensitivity: {found.line()}")
    return compared


def _outputs_moved(plan: Plan, compared: Compared, tolerance: float) -> bool:
    return any(plan.error(n, e, a).max_rel > tolerance
               for n, e, a in zip(plan.names, compared.expected, compared.actual))


def _smaller_scales(feeds, inputs, run, watching) -> List[float]:
    """The input scales left to try for the probes: smaller ones, where random floats are fed."""
    fixed = {node_name(k) for k in (run["given"] or {})}
    floats = [n for n in inputs if feeds[n].dtype.kind == "f" and node_name(n) not in fixed]
    if not (run["random"] and floats):
        return []
    return [s for s in sensitivity_mod.SCALES if s < (watching.scale or 1.0)]


def _result_rows(part, raw, watching):
    """What the optimized graph is fed for the rows the original is fed ``part`` of: the same,
    or with preprocessing in the graph the raw values those rows were computed from."""
    return part if raw is None else first_rows(raw, watching.wide_rows)


def _widen(ref, opt, plan: Plan, compared: Compared, watching, raw=None) -> Compared:
    """``compared`` with the plan's intermediate pairs on the rows that fit WIDE_BYTES; the
    outputs alone where they have no value. With preprocessing in the graph (``raw``), the
    original is fed the preprocessed rows and the result their raw values."""
    wide_ref, wide_opt = [r for _, r in plan.wide], [o for o, _ in plan.wide]
    watching.wide_rows = wide_rows(compared.feeds, ref.graph, wide_ref)
    part = first_rows(compared.feeds, watching.wide_rows)
    try:
        expected = ref.run({**part, **plan.fed}, wide_ref)
        actual = opt.run(_result_rows(part, raw, watching), wide_opt)
    except VerificationError as error:
        watching.notes.append(f"the comparison could not be widened ({error})")
        plan.wide = []
        return compared
    compared.wide = _same_shapes(plan.wide, expected, actual)
    return compared


def _probe(ref, plan: Plan, compared: Compared, watching, tolerance, started):
    """The sampled layers probed against every compared value: the outputs and logits on every
    row, the intermediate tensors on the rows they were compared on."""
    fetches, baseline, feeds = list(plan.reference), list(compared.expected), compared.feeds
    # the outputs and logits first (one cheap run); the intermediate tensors where they do not
    # move (on the rows they were compared on)
    stages = [({**feeds, **plan.fed}, fetches, baseline)]
    if compared.wide:
        sources = dict(plan.wide)
        wide_ref = [sources[n] for n in compared.wide]
        wide_feeds = feeds if watching.wide_rows is None else \
            first_rows(compared.feeds, watching.wide_rows)
        stages.append(({**wide_feeds, **plan.fed}, wide_ref,
                       [e for e, _ in compared.wide.values()]))
    budget = max(sensitivity_mod.PROBE_MIN_SECONDS,
                 sensitivity_mod.PROBE_SHARE * (time.perf_counter() - started))
    # the probe moves are judged as the check judges: an output by its parts (the probe hands
    # back each baseline value with its move, so the value says which output it is)
    parts = {id(value): plan.parts.get(label)
             for label, value in zip(plan.names, compared.expected) if label in plan.parts}

    def relative_error(expected, moved) -> float:
        return scales.judged_error("", expected, moved, parts.get(id(expected)),
                                   same_dtype=False).max_rel
    return sensitivity_mod.probe(
        ref.run, plan.layers, plan.total_layers, {**feeds, **plan.fed}, fetches, baseline,
        tolerance, budget, relative_error=relative_error,
        deadline=max(budget, ref.timeout), neutral=getattr(ref.graph, "_tfsurgery_neutral", []),
        unprobeable=getattr(ref.graph, "_tfsurgery_unprobeable", []), stages=stages)


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


def _noise_floor(verification, ref, feeds, settings, fetches, plan: Plan, expected, wide,
                 sources, rows: Optional[int] = None, fixed: Mapping[str, object] = ()) -> None:
    """Three more runs of the reference (only when something exceeds the tolerance): are its
    runs deterministic, and how far do its values move for a one-rounding-step change of the
    float inputs, and of its float weights (each one step up or down, seeded — the rounding a
    transform that recomputes every weight adds, W·s of a folded batch norm)? The larger move
    is the floor. Each output gets its own, per part it is judged by (``plan.parts``), and so
    does each intermediate tensor: a floor is never lent to another value. The values
    the user ``fixed`` (--feed: a scale a ``tf.case`` selects on, say) are not moved; where the
    moved values make the reference fail, that move gives no floor.
    ``wide``: optimized name → values of the intermediate tensors; ``sources``: their names in
    the reference."""
    names = plan.names
    wide_names = list(wide)
    wide_sources = [sources.get(n, n) for n in wide_names]
    values = list(expected) + [wide[n][0] for n in wide_names]

    def reference(feeds, weights=None):   # the outputs on every row, intermediate tensors on
        fed = {**settings, **(weights or {})}     # those compared; weights over probed kernels
        if rows is None or not wide_names:
            return ref.run({**feeds, **fed}, list(fetches) + wide_sources)
        return list(ref.run({**feeds, **fed}, list(fetches))) + \
            ref.run({**first_rows(feeds, rows), **fed}, wide_sources)
    again = reference(feeds)
    verification.deterministic = all(_identical(a, b) for a, b in zip(values, again))
    if not verification.deterministic:
        return
    kept = {node_name(k) for k in fixed}
    weights = {k: v for k, v in float_weights(ref.graph).items() if k not in kept}
    moves = {"inputs": ({**nudge(feeds), **{k: v for k, v in feeds.items()
                                           if node_name(k) in kept}}, None)}
    if weights:
        moves["weights"] = (feeds, reround(weights))
    floors = {}
    for source, (moved, moved_weights) in moves.items():
        try:
            nudged = reference(moved, moved_weights)
        except VerificationError as error:
            verification.watching.notes.append(
                f"no float32 noise floor from its {source}: the original does not run with "
                f"them one rounding step away ({error})")
            continue
        floors[source] = [scales.part_errors(plan.error(n, e, a))
                          for n, e, a in zip(names, values, nudged)] + \
            [[output_error(n, e, a).max_rel]
             for n, e, a in zip(wide_names, values[len(names):], nudged[len(names):])]
    if not floors:
        return
    outputs = {source: max((max(p) for p in f[:len(names)]), default=0.0)
               for source, f in floors.items()}
    verification.noise_source = max(outputs, key=outputs.get)
    verification.noise_floor = outputs[verification.noise_source]
    verification.noise_floors = {       # per output and part: the larger of the two moves
        n: tuple(max(parts) for parts in zip(*(f[i] for f in floors.values())))
        for i, n in enumerate(names)}
    verification.intermediate_allowed = {
        n: max(verification.tolerance, min(NOISE_FACTOR * max(f[i][0] for f in floors.values()),
                                           NOISE_CAP))
        for i, n in enumerate(wide_names, start=len(names))}


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
                   accept_blind: bool = False, **options) -> Verification:
    """``verify`` on each batch — (label, given values, seed of the random rest): N seeded
    random batches (--check-n), the rows of the user's samples — merged into one verdict: every
    output on every batch, the worst batch named, and top-1 agreement over all rows of each
    class-score output in ``class_outputs`` (a flip where the original's top-2 margin exceeds
    the tolerance fails the check). The first batch's feeds are what exports are checked on.
    ``accept_blind``: a layer whose change the check cannot see is noted, not "cannot verify"
    (the user's own samples were compared, or the user said so)."""
    merged = None
    expected: Dict[str, list] = {name: [] for name in class_outputs}
    actual: Dict[str, list] = {name: [] for name in class_outputs}
    comparable = comparable_reference(                 # the same for every batch: made once
        original, optimized, {node_name(k): v for k, v in _settings(settings).items()},
        next((given for _, given, _ in batches if given), None))
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
        merged.noise_floors.update({f"{name} [{label}]": floors    # each its own, renamed
                                    for name, floors in one.noise_floors.items()})
        if one.noise_floor > merged.noise_floor:
            merged.noise_floor, merged.noise_source = one.noise_floor, one.noise_source
        merged.deterministic = merged.deterministic and one.deterministic
        merged.batches += 1
    for name in class_outputs:
        if all(is_class_scores(value) for value in expected[name] + actual[name]):
            merged.agreement[name] = top1_agreement(np.concatenate(expected[name]),
                                                    np.concatenate(actual[name]), tolerance)
    merged.blind_accepted = accept_blind
    return merged


def _second_size(reference, optimized, inputs, fetches, settings, first: int, *,
                 scale: float = 1.0, parts=None, **run):
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
    return ([scales.judged_error(f"{name}{label}", e, a, (parts or {}).get(name))
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
