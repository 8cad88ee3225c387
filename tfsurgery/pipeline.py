"""Run named transforms in order over one graph index, checking the graph after every pass.

The caller's GraphDef is never mutated. A transform that leaves a broken graph (dangling input,
bad port, colocation naming a deleted node, a cycle outside a while loop) stops the run with its
name: ``StructureError``, never a written file.
"""
from __future__ import annotations

import logging
import time
from typing import List, Optional, Sequence, Tuple

from tensorflow.core.framework import graph_pb2

from tfsurgery.errors import StructureError, UnknownTransform
from tfsurgery.graph import Graph
from tfsurgery.transform import Options, TransformReport
from tfsurgery.transforms import DEFAULT_TRANSFORMS, ORDER, REGISTRY

log = logging.getLogger("tfsurgery")


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
    graph = Graph(graph_def)
    reports = []
    for name in transforms:
        before = len(graph)
        start = time.perf_counter()
        report = REGISTRY[name](graph, options)
        report.seconds = time.perf_counter() - start
        report.removed_nodes = before - len(graph)
        reports.append(report)
        problem = graph.structure_problem()
        if problem:
            raise StructureError(f"transform '{name}' left a broken graph: {problem}")
        log.debug("%s: %d rewritten, %d skipped, %d nodes left (%.3f s)", name,
                  len(report.rewritten), len(report.skipped), len(graph), report.seconds)
    return graph.to_graph_def(), reports
