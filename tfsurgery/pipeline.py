"""Run named transforms in order over one graph index, checking the graph after every pass.

The caller's GraphDef is never mutated. A transform that leaves a broken graph (dangling input,
bad port, colocation naming a deleted node, a cycle outside a while loop) stops the run with its
name: ``StructureError``, never a written file.

Simplifications expose each other (a folded constant makes ``x*1`` visible; a bypassed no-op
makes two nodes duplicates), so after the first pass the transforms marked ``repeat`` run again,
in order, while the graph keeps changing — bounded by ``MAX_ROUNDS``. Only a transform that some
OTHER pass changed the graph for re-runs (each reaches its own fixpoint). Each transform keeps one
report: later rounds add their rewrites, removed nodes and time to it (and a note per round).

Correspondence: each transform may declare which tensor of its result stands for which tensor of
the graph it was given (``TransformReport.corresponds``); the pipeline composes them in the order
the passes ran into ``Reports.correspondence`` — result tensor → the original's tensor — for the
tensors whose names changed. Verification compares every such pair, besides same-named tensors.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tensorflow.core.framework import graph_pb2

from tfsurgery import progress
from tfsurgery.contract import Options, Transform, TransformReport
from tfsurgery.errors import InputError, StructureError, UnknownTransform
from tfsurgery.graph import Graph, gc_paused
from tfsurgery.ops import first_line, node_name
from tfsurgery.transforms import DEFAULT_TRANSFORMS, ORDER, REGISTRY
from tfsurgery.trust.user_code import import_user_code

log = logging.getLogger("tfsurgery")
MAX_ROUNDS = 4      # the first pass over every transform, then up to 3 rounds of re-runs


# ---------------------------------------------------------------- users' transforms
# Users' transforms: from --plugin files or modules, the ``tfsurgery.transforms`` entry-point
# group, or callables handed to api.optimize. They run, are structure-checked, verified and
# reported exactly like ours; they run only when named (``--transforms default,their-name``).
USER: Dict[str, Transform] = {}
ENTRY_POINT_GROUP = "tfsurgery.transforms"
DEFAULT_WORD = "default"            # in --transforms: the default pipeline, in its order


class PluginFailed(InputError):
    """A user's transform raised, or returned something that is not a TransformReport."""


def lookup(name: str) -> Optional[Transform]:
    return REGISTRY.get(name) or USER.get(name)


def register(fn, origin: str) -> str:
    """Make ``fn`` (marked with ``@tfsurgery.transform("name")``) runnable by name; returns it."""
    name = getattr(fn, "transform_name", None)
    if not callable(fn) or not name:
        raise InputError(f"{origin}: {fn!r} is not a transform; mark a function "
                         "fn(graph, options) -> TransformReport with @tfsurgery.transform('name')")
    if name in REGISTRY:
        if REGISTRY[name] is fn:
            return name
        raise InputError(f"{origin}: transform '{name}' has the name of one of tfsurgery's own; "
                         "choose another name")
    known = USER.get(name)
    if known is not None and known is not fn and defined_at(known) != defined_at(fn):
        raise InputError(f"{origin}: transform '{name}' is already registered by "
                         f"{getattr(known, 'plugin', 'another plugin')}")
    fn.plugin = origin
    USER[name] = fn          # a re-definition in the same place replaces the old one
    return name


def defined_at(fn) -> tuple:
    """Where a transform is defined: its module's file (its module's name where it has none, as
    a notebook's ``__main__``) and its qualified name. The same place defined again — a notebook
    cell run again, a plugin file loaded again — is the same transform, newer."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    where = getattr(module, "__file__", None)
    return (os.path.realpath(where) if where else fn.__module__,
            getattr(fn, "__qualname__", repr(fn)))


def load_plugin(spec: str) -> List[str]:
    """``--plugin PATH.py|module.name``: import it and register every transform it defines."""
    module = import_user_code(spec, "--plugin")
    found = [value for value in vars(module).values() if callable(value) and
             getattr(value, "transform_name", None) and
             getattr(value, "__module__", None) == module.__name__]
    if not found:
        raise InputError(f"--plugin {spec}: it defines no transform (mark a function with "
                         "@tfsurgery.transform('name'))")
    return [register(fn, spec) for fn in found]


def load_entry_points() -> List[str]:
    """Every transform installed under the ``tfsurgery.transforms`` entry-point group."""
    from importlib.metadata import entry_points
    names = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            fn = point.load()
        except Exception as error:  # noqa: BLE001 - whatever the user's code raises
            raise InputError(f"entry point '{point.name} = {point.value}' ({ENTRY_POINT_GROUP}) "
                             f"does not load: {first_line(error)}") from None
        names.append(register(fn, f"entry point {point.value}"))
    return names


def resolve_transforms(names: Optional[Sequence[str]] = None, *, bn_fold: bool = False,
                       enable: Sequence[str] = (), disable: Sequence[str] = ()) -> List[str]:
    """The transform names to run: the user's list (checked; ``default`` stands for the default
    pipeline), or the defaults (+ BN folding), with ``enable``/``disable`` applied."""
    names = list(names or ())
    asked = names + list(enable) + list(disable)
    if any(name != DEFAULT_WORD and lookup(name) is None for name in asked):
        load_entry_points()                     # installed plugins, only when asked for
    unknown = [name for name in asked if name != DEFAULT_WORD and lookup(name) is None]
    if unknown:
        raise UnknownTransform(f"unknown transform {', '.join(map(repr, unknown))}; "
                               f"known: {', '.join(list(ORDER) + list(USER))}")
    defaults = [name for name in ORDER if name in DEFAULT_TRANSFORMS or
                (bn_fold and name == "fold-batch-norm")]
    chosen = [n for name in names for n in (defaults if name == DEFAULT_WORD else [name])] \
        if names else list(defaults)
    if names and bn_fold and "fold-batch-norm" not in chosen:
        chosen.insert(chosen.index("prune") if "prune" in chosen else len(chosen),
                      "fold-batch-norm")
    for name in enable:                         # ours at their place in the order, users' last
        if name in chosen:
            continue
        if name in ORDER:
            later = [n for n in chosen if n in ORDER and ORDER.index(n) > ORDER.index(name)]
            chosen.insert(chosen.index(later[0]) if later else len(chosen), name)
        else:
            chosen.append(name)
    return [name for name in chosen if name not in disable]


class Reports(list):
    """The transforms' reports in order, and ``correspondence``: each tensor of the result whose
    name changed → the tensor of the original it stands for, composed over every pass."""

    def __init__(self, reports=(), correspondence: Optional[Dict[str, str]] = None):
        super().__init__(reports)
        self.correspondence: Dict[str, str] = dict(correspondence or {})


def compose(traced: Dict[str, str], declared: Dict[str, str]) -> Dict[str, str]:
    """``traced`` (tensor → the original's tensor) after a pass that ``declared`` result tensor
    → the tensor of its input it stands for: a declared source that was itself traced maps on
    to the original; others name the original's tensor directly (they kept their names)."""
    if not declared:
        return traced
    return {**traced, **{result: traced.get(source, source)
                         for result, source in declared.items()}}


def run(graph_def: graph_pb2.GraphDef, transforms: Sequence[str],
        options: Options) -> Tuple[graph_pb2.GraphDef, List[TransformReport]]:
    """Apply ``transforms`` in order to a copy of ``graph_def``."""
    _check_known(transforms)
    with gc_paused():          # see ``apply``
        graph = Graph(graph_def)
        reports = apply(graph, transforms, options)
        result = graph.to_graph_def()
        # freed while the collector is off: switched on again, it has the index's millions of
        # objects to scan no more (one collection of them cost 2-3% of a run)
        del graph
    return result, reports


def apply(graph: Graph, transforms: Sequence[str], options: Options) -> Reports:
    """Apply ``transforms`` in order to ``graph``, in place: the run's one index, which the
    caller built (checking its inputs) and may have read before (api.optimize detects the
    interface on it); the caller's GraphDef underneath is never mutated (copy-on-write)."""
    _check_known(transforms)
    # The index and the transforms' bookkeeping are millions of small objects that live until
    # the end; Python's cyclic collector would scan them again and again to find nothing.
    with gc_paused():
        return _run(graph, transforms, options)


def _check_known(transforms: Sequence[str]) -> None:
    unknown = [name for name in transforms if lookup(name) is None]
    if unknown:
        raise UnknownTransform(f"unknown transform '{unknown[0]}'")


def _run(graph: Graph, transforms: Sequence[str], options: Options) -> Reports:
    reports: Dict[str, TransformReport] = {}
    traced: Dict[str, str] = {}             # result tensor → the original's, where names changed
    seen_changes: Dict[str, int] = {}       # name → the change count it saw when it last ran
    changes = 0              # passes that changed the graph
    beyond_constants = 0     # of those, the ones that did more than merge equal constants

    def changes_seen_by(name: str) -> int:
        by_value = getattr(lookup(name), "constants_by_value", False)
        return beyond_constants if by_value else changes

    rounds = 0
    for round_ in range(1, MAX_ROUNDS + 1):
        for name in transforms:
            if round_ > 1 and not (lookup(name).repeat and
                                   changes_seen_by(name) > seen_changes[name]):
                continue                   # no other pass changed the graph since it last ran
            rounds = round_
            report = _run_pass(graph, name, options)
            traced = compose(traced, report.correspondence)
            if report.rewritten or report.removed_nodes or report.pruned:
                changes += 1
                if not report.shared_constants_only:
                    beyond_constants += 1
            seen_changes[name] = changes_seen_by(name)   # each pass reaches its own fixpoint
            _book(reports, name, report, round_)
        if rounds < round_:
            break                          # a fixpoint: no pass had anything new to look at
    _book_pruning(reports)
    unsettled = any(lookup(name).repeat and changes_seen_by(name) > seen_changes[name]
                    for name in transforms)
    if reports:
        last = reports[transforms[-1]]
        last.notes.append(f"pipeline: {rounds} round(s), " + (
            f"stopped at the bound of {MAX_ROUNDS} before a fixpoint" if unsettled
            else "fixpoint reached"))
    return Reports(reports.values(), {result: source for result, source in traced.items()
                                      if node_name(result) in graph and result != source})


def _run_pass(graph: Graph, name: str, options: Options) -> TransformReport:
    """One transform over the graph, timed, with the structure checked after it."""
    before = len(graph)
    progress.say(f"{name}")
    start = time.perf_counter()
    fn = lookup(name)
    plugin = getattr(fn, "plugin", None)
    report = fn(graph, options) if plugin is None else \
        _run_users(fn, name, plugin, graph, options)
    report.seconds = time.perf_counter() - start
    report.removed_nodes = before - len(graph) - len(report.pruned)
    # Until a pass changes something the graph is the input, which no pass is to blame for
    # (indexing checked its inputs and ports); the check walks the whole graph.
    problem = graph.structure_problem() if graph.edited else None
    if problem:
        raise StructureError(f"transform '{name}' left a broken graph: {problem}")
    log.debug("%s: %d rewritten, %d skipped, %d nodes left (%.3f s)", name,
              len(report.rewritten), len(report.skipped), len(graph), report.seconds)
    return report


def _run_users(fn, name: str, plugin: str, graph: Graph, options: Options) -> TransformReport:
    """A user's transform: whatever it raises is one line naming it (exit 2, nothing written)."""
    try:
        report = fn(graph, options)
    except Exception as error:  # noqa: BLE001 - the user's code
        raise PluginFailed(f"transform '{name}' (plugin {plugin}) failed: "
                           f"{type(error).__name__}: {first_line(error)}") from None
    if not isinstance(report, TransformReport):
        raise PluginFailed(f"transform '{name}' (plugin {plugin}) returned "
                           f"{type(report).__name__}, not a TransformReport")
    report.notes.append(f"a user's transform, from {plugin}")
    return report


def _book_pruning(reports: Dict[str, TransformReport]) -> None:
    """Nodes a transform pruned before its own work (so that readers no output needs cannot
    block it) are pruning's work, not the transform's: they are booked to prune's report."""
    early = [(name, report.pruned) for name, report in reports.items() if report.pruned]
    if not early:
        return
    prune = reports.setdefault("prune", TransformReport("prune"))
    for name, pruned in early:
        prune.matched += len(pruned)
        prune.removed.extend(pruned)
        prune.removed_nodes += len(pruned)
        prune.notes.append(f"{len(pruned)} of the removed nodes pruned before {name} ran "
                           "(readers no output needs must not block it)")


def _book(reports: Dict[str, TransformReport], name: str, report: TransformReport,
          round_: int) -> None:
    """One report per transform: a later round's work is added to its first round's."""
    first = reports.setdefault(name, report)
    if first is report:
        return
    known = set(first.skipped)
    repeated = [entry for entry in report.skipped if entry in known]
    first.matched += report.matched - len(repeated)    # a skip seen before is no new match
    first.rewritten.extend(report.rewritten)
    first.removed.extend(report.removed)
    first.skipped.extend(entry for entry in report.skipped if entry not in known)
    first.notes.extend(note for note in report.notes if note not in first.notes)
    first.warnings.extend(line for line in report.warnings if line not in first.warnings)
    first.removed_nodes += report.removed_nodes
    first.pruned.extend(report.pruned)
    first.correspondence.update(report.correspondence)
    first.seconds += report.seconds
    if report.rewritten or report.removed_nodes:
        first.notes.append(f"round {round_}: {len(report.rewritten)} more rewritten, "
                           f"{report.removed_nodes} more nodes removed")
