"""Named transforms, run in order over one graph index.

A transform is a function ``fn(graph, options) -> TransformReport`` registered under a kebab-case name
with ``@register("name")``. It edits the ``Graph`` it is given (the pipeline's private copy) and says
what it matched, rewrote and skipped (with why). The caller's GraphDef is never mutated.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tensorflow.core.framework import graph_pb2

from tfsurgery.graph import Graph

# The order transforms run in when all are asked for (DESIGN.md).
DEFAULT_ORDER = (
    "freeze-training-flags",
    "remove-switch-merge",
    "remove-dropout",
    "remove-identity",
    "fold-constants",
    "fold-batch-norm",
    "prune",
)
# The transforms that run without --bn-fold / --transforms.
DEFAULT_TRANSFORMS = tuple(t for t in DEFAULT_ORDER if t != "fold-batch-norm")

# Modules under transforms/ that register themselves on import.
_TRANSFORM_MODULES = (
    "transforms.freeze_training_flags",
    "transforms.remove_switch_merge",
    "transforms.remove_dropout",
    "transforms.remove_identity",
    "transforms.fold_constants",
    "transforms.fold_batch_norm",
    "transforms.prune",
)


@dataclasses.dataclass
class Options:
    """What a run knows beyond the graph: its inputs/outputs and the user's choices."""

    inputs: List[str] = dataclasses.field(default_factory=list)
    outputs: List[str] = dataclasses.field(default_factory=list)
    training_flags: List[str] = dataclasses.field(default_factory=list)   # user-named flags
    fold_constants_max_bytes: int = 64 << 20   # a folded constant may not be larger than this

    @property
    def protected(self) -> set:
        """Node names no transform may delete or rename: the graph's interface."""
        return {name.split(":")[0] for name in self.inputs + self.outputs}


@dataclasses.dataclass
class TransformReport:
    """What one transform did: matched patterns, rewritten nodes, skips with reasons."""

    name: str
    matched: int = 0
    rewritten: List[str] = dataclasses.field(default_factory=list)
    skipped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)
    removed_nodes: int = 0
    seconds: float = 0.0

    def skip(self, node: str, reason: str) -> None:
        self.skipped.append((node, reason))

    def as_dict(self) -> dict:
        return {"name": self.name, "matched": self.matched, "rewritten": self.rewritten,
                "skipped": [{"node": n, "reason": r} for n, r in self.skipped],
                "notes": self.notes, "removed_nodes": self.removed_nodes,
                "seconds": round(self.seconds, 4)}


log = logging.getLogger("tfsurgery")
Transform = Callable[[Graph, Options], TransformReport]
_REGISTRY: Dict[str, Transform] = {}


def register(name: str) -> Callable[[Transform], Transform]:
    def decorate(fn: Transform) -> Transform:
        _REGISTRY[name] = fn
        fn.transform_name = name
        return fn
    return decorate


def registry() -> Dict[str, Transform]:
    for module in _TRANSFORM_MODULES:
        importlib.import_module(module)
    return dict(_REGISTRY)


class UnknownTransform(ValueError):
    pass


class TransformError(ValueError):
    """The graph cannot be transformed as asked, through no fault of the transform (e.g. an output
    that does not exist at inference). The CLI reports it as bad input."""


def resolve_transforms(names: Optional[Sequence[str]] = None, *, bn_fold: bool = False) -> List[str]:
    """The transform names to run: the user's list (checked), or the defaults (+ BN folding)."""
    known = registry()
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UnknownTransform(f"unknown transform {', '.join(map(repr, unknown))}; "
                                   f"known: {', '.join(known)}")
        chosen = list(names)
        if bn_fold and "fold-batch-norm" not in chosen:
            chosen.insert(chosen.index("prune") if "prune" in chosen else len(chosen),
                          "fold-batch-norm")
        return chosen
    return list(DEFAULT_ORDER if bn_fold else DEFAULT_TRANSFORMS)


def run(graph_def: graph_pb2.GraphDef, transforms: Sequence[str],
        options: Options) -> Tuple[graph_pb2.GraphDef, List[TransformReport]]:
    """Apply ``transforms`` in order to a copy of ``graph_def``."""
    known = registry()
    graph = Graph(graph_def)
    reports = []
    for name in transforms:
        if name not in known:
            raise UnknownTransform(f"unknown transform '{name}'")
        before = len(graph)
        start = time.perf_counter()
        report = known[name](graph, options)
        report.seconds = time.perf_counter() - start
        report.removed_nodes = before - len(graph)
        reports.append(report)
        log.debug("%s: %d rewritten, %d skipped, %d nodes left (%.3f s)", name,
                  len(report.rewritten), len(report.skipped), len(graph), report.seconds)
    return graph.to_graph_def(), reports
