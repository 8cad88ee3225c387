"""The transform contract (ground floor): what a transform is given and what it reports.

A transform is a function ``fn(graph, options) -> TransformReport`` marked with
``@transform("kebab-name")``. It edits the ``Graph`` it is given (the pipeline's private copy) and
says what it matched, rewrote and skipped (with why). Which transforms exist, and in what order
they run, is listed once in ``tfsurgery.transforms``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

from tfsurgery.graph import Graph


@dataclasses.dataclass
class Preprocessing:
    """What one input's raw values become: m = (reverse(cast(x)) - mean) / scale (add-preprocessing).
    ``mean``/``scale`` hold one value or one per channel, in the model's channel order;
    ``channel_axis`` is resolved before the transform runs."""

    dtype: Optional[str] = None
    reverse: bool = False
    mean: Optional[Tuple[float, ...]] = None
    scale: Optional[Tuple[float, ...]] = None
    channel_axis: Optional[int] = None


@dataclasses.dataclass
class Options:
    """What a run knows beyond the graph: its inputs/outputs and the user's choices."""

    inputs: List[str] = dataclasses.field(default_factory=list)
    outputs: List[str] = dataclasses.field(default_factory=list)
    training_flags: List[str] = dataclasses.field(default_factory=list)   # user-named flags
    # placeholder → its inference value: dropout knobs, --training-flag NAME=VALUE
    inference_values: Dict[str, object] = dataclasses.field(default_factory=dict)
    fold_constants_max_bytes: int = 64 << 20   # a folded constant may not be larger than this
    keep_asserts: bool = False                 # strip-debug off (--keep-asserts)
    # input node name → its preprocessing (add-preprocessing)
    preprocessing: Dict[str, Preprocessing] = dataclasses.field(default_factory=dict)
    float16_min_elements: int = 64      # float16-weights: smaller float32 constants stay float32

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
    # nodes no output needs, pruned before the work (the pipeline books them to prune)
    pruned: List[str] = dataclasses.field(default_factory=list)

    def skip(self, node: str, reason: str) -> None:
        self.skipped.append((node, reason))

    def as_dict(self) -> dict:
        return {"name": self.name, "matched": self.matched, "rewritten": self.rewritten,
                "skipped": [{"node": n, "reason": r} for n, r in self.skipped],
                "notes": self.notes, "removed_nodes": self.removed_nodes,
                "seconds": round(self.seconds, 4)}


Transform = Callable[[Graph, Options], TransformReport]


def transform(name: str, *, default: bool = True,
              repeat: bool = False) -> Callable[[Transform], Transform]:
    """Name a transform function; ``default=False`` keeps it out of a plain run (it is asked for,
    e.g. ``fold-batch-norm`` by ``--bn-fold``). ``repeat=True``: a simplification the pipeline
    runs again while other passes keep changing the graph (each can expose work for another)."""
    def decorate(fn: Transform) -> Transform:
        fn.transform_name = name
        fn.default = default
        fn.repeat = repeat
        return fn
    return decorate
