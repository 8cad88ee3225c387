"""Run named transforms in order over one graph index, checking the graph after every pass.

The caller's GraphDef is never mutated. A transform that leaves a broken graph (dangling input,
bad port, colocation naming a deleted node, a cycle outside a while loop) stops the run with its
name: ``StructureError``, never a written file.

Simplifications expose each other (a folded constant makes ``x*1`` visible; a bypassed no-op
makes two nodes duplicates), so after the first pass the transforms marked ``repeat`` run again,
in order, while the graph keeps changing — bounded by ``MAX_ROUNDS``. Only a transform that some
OTHER pass changed the graph for re-runs (each reaches its own fixpoint). Each transform keeps one
report: later rounds add their rewrites, removed nodes and time to it (and a note per round).
"""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tensorflow.core.framework import graph_pb2

from tfsurgery.errors import StructureError, UnknownTransform
from tfsurgery.graph import Graph, gc_paused
from tfsurgery.transform import Options, TransformReport
from tfsurgery.transforms import DEFAULT_TRANSFORMS, ORDER, REGISTRY

log = logging.getLogger("tfsurgery")
MAX_ROUNDS = 4      # the first pass over every transform, then up to 3 rounds of re-runs


def resolve_transforms(names: Optional[Sequence[str]] = None, *, bn_fold: bool = False) -> List[str]:
    """The transform names to run: the user's list (checked), or the defaults (+ BN folding)."""
    if names:
        unknown = [n for n in names if n not in REGISTRY]
        if unknown:
            raise UnknownTransform(f"unknown transform {', '.join(map(repr, unknown))}; "
                                   f"known: {', '.join(ORDER)}")
        chosen = list(names)
        if bn_fold and "fold-batch-norm" not in chosen:
            chosen.insert(chosen.index("prune") if "prune" in chosen else len(chosen),
                          "fold-batch-norm")
        return chosen
    return [name for name in ORDER if name in DEFAULT_TRANSFORMS or
            (bn_fold and name == "fold-batch-norm")]


def run(graph_def: graph_pb2.GraphDef, transforms: Sequence[str],
        options: Options) -> Tuple[graph_pb2.GraphDef, List[TransformReport]]:
    """Apply ``transforms`` in order to a copy of ``graph_def``."""
    unknown = [name for name in transforms if name not in REGISTRY]
    if unknown:
        raise UnknownTransform(f"unknown transform '{unknown[0]}'")
    # The index and the transforms' bookkeeping are millions of small objects that live until
    # the end; Python's cyclic collector would scan them again and again to find nothing.
    with gc_paused():
        return _run(graph_def, transforms, options)


def _run(graph_def: graph_pb2.GraphDef, transforms: Sequence[str],
         options: Options) -> Tuple[graph_pb2.GraphDef, List[TransformReport]]:
    graph = Graph(graph_def)
    reports: Dict[str, TransformReport] = {}
    seen_changes: Dict[str, int] = {}       # name → the change count when it last ran
    changes = 0
    rounds = 0
    for round_ in range(1, MAX_ROUNDS + 1):
        for name in transforms:
            if round_ > 1 and not (REGISTRY[name].repeat and changes > seen_changes[name]):
                continue                   # no other pass changed the graph since it last ran
            rounds = round_
            report = _run_pass(graph, name, options)
            if report.rewritten or report.removed_nodes or report.pruned:
                changes += 1
            seen_changes[name] = changes   # each pass reaches its own fixpoint
            _book(reports, name, report, round_)
        if rounds < round_:
            break                          # a fixpoint: no pass had anything new to look at
    _book_pruning(reports)
    unsettled = any(REGISTRY[name].repeat and changes > seen_changes[name] for name in transforms)
    if reports:
        last = reports[transforms[-1]]
        last.notes.append(f"pipeline: {rounds} round(s), " + (
            f"stopped at the bound of {MAX_ROUNDS} before a fixpoint" if unsettled
            else "fixpoint reached"))
    return graph.to_graph_def(), list(reports.values())


def _run_pass(graph: Graph, name: str, options: Options) -> TransformReport:
    """One transform over the graph, timed, with the structure checked after it."""
    before = len(graph)
    start = time.perf_counter()
    report = REGISTRY[name](graph, options)
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


def _book_pruning(reports: Dict[str, TransformReport]) -> None:
    """Nodes a transform pruned before its own work (so that readers no output needs cannot
    block it) are pruning's work, not the transform's: they are booked to prune's report."""
    early = [(name, report.pruned) for name, report in reports.items() if report.pruned]
    if not early:
        return
    prune = reports.setdefault("prune", TransformReport("prune"))
    for name, pruned in early:
        prune.matched += len(pruned)
        prune.rewritten.extend(pruned)
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
    first.skipped.extend(entry for entry in report.skipped if entry not in known)
    first.notes.extend(note for note in report.notes if note not in first.notes)
    first.removed_nodes += report.removed_nodes
    first.pruned.extend(report.pruned)
    first.seconds += report.seconds
    if report.rewritten or report.removed_nodes:
        first.notes.append(f"round {round_}: {len(report.rewritten)} more rewritten, "
                           f"{report.removed_nodes} more nodes removed")
