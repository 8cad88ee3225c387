"""The transform contract (ground floor): what a transform is given and what it reports.

A transform is a function ``fn(graph, options) -> TransformReport`` marked with
``@transform("kebab-name")``; one with settings declares them as a small dataclass
(``@transform("name", params=MyParams)``) and reads its instance with
``options.params_for(fn)``. The shared ``Options`` hold only the run's interface. It edits the ``Graph`` it is given (the pipeline's private copy) and
says what it matched, rewrote and skipped (with why). Which transforms exist, and in what order
they run, is listed once in ``tfsurgery.transforms``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

from tfsurgery.graph import Graph
from tfsurgery.ops import tensor_name


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
    """What every transform may know beyond the graph: the run's interface — and, by transform
    name, each transform's own parameters (see ``params_for``)."""

    inputs: List[str] = dataclasses.field(default_factory=list)
    outputs: List[str] = dataclasses.field(default_factory=list)
    training_flags: List[str] = dataclasses.field(default_factory=list)   # user-named flags
    # placeholder → its inference value: dropout knobs, --training-flag NAME=VALUE
    inference_values: Dict[str, object] = dataclasses.field(default_factory=dict)
    params: Dict[str, object] = dataclasses.field(default_factory=dict)   # name → its params
    # ``protected`` for the interface it was computed from (asked per node in hot loops)
    _protected: Tuple[tuple, frozenset] = dataclasses.field(
        default=((), frozenset()), init=False, repr=False, compare=False)

    def params_for(self, fn):
        """The parameters of transform ``fn`` for this run: the ones given, else its defaults."""
        given = self.params.get(fn.transform_name)
        return given if given is not None else fn.params_type()

    @property
    def protected(self) -> frozenset:
        """Node names no transform may delete or rename: the graph's interface."""
        interface = (*self.inputs, None, *self.outputs)      # the lists may change in place
        if self._protected[0] != interface:
            self._protected = (interface, frozenset(name.split(":")[0]
                                                    for name in self.inputs + self.outputs))
        return self._protected[1]


@dataclasses.dataclass
class TransformReport:
    """What one transform did: matched patterns, rewritten nodes, skips with reasons."""

    name: str
    matched: int = 0
    rewritten: List[str] = dataclasses.field(default_factory=list)
    skipped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)
    # what the user must hear even with -q (served augmentation removed): also in notes
    warnings: List[str] = dataclasses.field(default_factory=list)
    removed_nodes: int = 0
    seconds: float = 0.0
    # nodes no output needs, pruned before the work (the pipeline books them to prune)
    pruned: List[str] = dataclasses.field(default_factory=list)
    # nodes deleted outright, none of them rewritten (prune's work): counted in removed_nodes
    removed: List[str] = dataclasses.field(default_factory=list)
    # every change was an input-less Const merged into an equal one: no other node's readers
    # changed, only which of two equal constants a node reads (see ``transform``)
    shared_constants_only: bool = False
    # result tensor → the tensor of the graph this transform was given that it stands for,
    # where the name changed (``corresponds``); a tensor that keeps its name stands for its
    # namesake without saying so. Verification compares every such pair.
    correspondence: Dict[str, str] = dataclasses.field(default_factory=dict)

    def skip(self, node: str, reason: str) -> None:
        self.skipped.append((node, reason))

    def corresponds(self, result_tensor: str, original_tensor: str) -> None:
        """Declare that ``result_tensor`` (a node or ``node:port`` of the graph this transform
        leaves) holds the values ``original_tensor`` held in the graph it was given — a fused
        op's output for the subgraph's it replaced — so that verification compares the two."""
        self.correspondence[tensor_name(result_tensor)] = tensor_name(original_tensor)

    def changed(self, result_tensor: str) -> None:
        """Declare that ``result_tensor`` kept its name but not its values (a concat part's conv
        whose weights took the batch norm after the concat): verification does not pair it by
        name with the original's tensor of that name."""
        self.correspondence[tensor_name(result_tensor)] = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "matched": self.matched, "rewritten": self.rewritten,
                "skipped": [{"node": n, "reason": r} for n, r in self.skipped],
                "notes": self.notes, "warnings": self.warnings,
                "removed_nodes": self.removed_nodes,
                "removed": self.removed, "correspondence": dict(self.correspondence),
                "seconds": round(self.seconds, 4)}


Transform = Callable[[Graph, Options], TransformReport]


@dataclasses.dataclass
class NoParams:
    """A transform without parameters."""


def transform(name: str, *, default: bool = True, repeat: bool = False,
              constants_by_value: bool = False,
              params: type = NoParams) -> Callable[[Transform], Transform]:
    """Name a transform function; ``default=False`` keeps it out of a plain run (it is asked for,
    e.g. ``fold-batch-norm`` by ``--bn-fold``). ``repeat=True``: a simplification the pipeline
    runs again while other passes keep changing the graph (each can expose work for another).
    ``constants_by_value=True``: it reads constants only by value and never needs a constant to
    be one node (two readers of equal constants are as good as two readers of one), so equal
    constants merged into one give it no new work: the pipeline does not run it again for such a
    change alone (``TransformReport.shared_constants_only``).
    ``params``: the dataclass of its own parameters, with their defaults."""
    def decorate(fn: Transform) -> Transform:
        fn.transform_name = name
        fn.default = default
        fn.repeat = repeat
        fn.constants_by_value = constants_by_value
        fn.params_type = params
        return fn
    return decorate


def with_params(fn, values) -> object:
    """``fn``'s parameters with ``values`` (a mapping of field → value) over its defaults;
    an unknown field is a ``ValueError`` naming the ones it has."""
    fields = {f.name for f in dataclasses.fields(fn.params_type)}
    unknown = [key for key in values if key not in fields]
    if unknown:
        raise ValueError(f"transform '{fn.transform_name}' has no parameter '{unknown[0]}'"
                         f" (it has: {', '.join(sorted(fields)) or 'none'})")
    return dataclasses.replace(fn.params_type(), **values)
