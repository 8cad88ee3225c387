"""Preprocessing options checked against the graph, and the verifier's own NumPy preprocessing.

``resolve`` turns the user's ``--input-dtype/--reverse-input-channels/--mean-values/--scale-values``
into one ``Preprocessing`` per input (bad input → InputError, exit 2). ``Preprocessor`` is the
verification hook: it makes raw feeds for the optimized graph (uint8: the whole 0–255 range) and
computes what the ORIGINAL graph is fed, m = (reverse(x) - mean) / scale, in NumPy from the
options — never from the transform under test.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfsurgery.errors import InputError
from tfsurgery.graph import Graph
from tfsurgery.interface import indexed
from tfsurgery.ops import node_name
from tfsurgery.contract import Preprocessing
from tfsurgery.image_layout import channel_axis, is_image

Named = Tuple[Optional[str], object]       # (input name or None, value) as the options give it


@dataclasses.dataclass
class Requested:
    """The user's preprocessing options, each optionally naming its input."""

    input_dtype: Optional[Named] = None
    reverse_input_channels: Optional[Named] = None     # (name or None, True)
    mean_values: Optional[Named] = None
    scale_values: Optional[Named] = None

    def given(self) -> Dict[str, Named]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def parse_values(text: str) -> Named:
    """``[NAME=]V[,V...]`` → (NAME or None, tuple of floats)."""
    name, _, values = text.rpartition("=")
    try:
        numbers = tuple(float(v) for v in values.split(","))
    except ValueError:
        raise InputError(f"'{text}': expected [NAME=]V[,V...] with numbers") from None
    if not all(np.isfinite(numbers)):
        raise InputError(f"'{text}': values must be finite numbers")
    return (name or None), numbers


def parse_dtype(text: str) -> Named:
    import tensorflow as tf
    name, _, dtype = text.rpartition("=")
    try:
        parsed = tf.dtypes.as_dtype(dtype)
    except TypeError:
        raise InputError(f"--input-dtype: unknown dtype '{dtype}'") from None
    if parsed.is_quantized or not (parsed.is_integer or parsed.is_floating):
        raise InputError(f"--input-dtype: {dtype} is not an integer or float dtype (e.g. uint8, "
                         "float16)")
    return (name or None), dtype


def resolve(graph, inputs: Sequence[str], requested: Requested) -> Dict[str, Preprocessing]:
    """One checked ``Preprocessing`` per input the options name (``graph``: the original, as a
    Graph — the run's index — or a GraphDef)."""
    given = requested.given()
    if not given:
        return {}
    graph = indexed(graph)
    specs: Dict[str, Preprocessing] = {}
    for option, (name, value) in given.items():
        target = _target(graph, inputs, name, option)
        spec = specs.setdefault(target, Preprocessing())
        if option == "input_dtype":
            spec.dtype = value
        elif option == "reverse_input_channels":
            spec.reverse = True
        elif option == "mean_values":
            spec.mean = value
        else:
            if any(v == 0 for v in value):
                raise InputError("--scale-values: a scale of 0 (division by zero)")
            spec.scale = value
    for name, spec in specs.items():
        _check(graph, name, spec)
    return specs


def _target(graph: Graph, inputs: Sequence[str], name: Optional[str], option: str) -> str:
    flag = "--" + option.replace("_", "-")
    names = [node_name(i) for i in inputs]
    if name is not None:
        if node_name(name) not in names:
            raise InputError(f"{flag}: '{name}' is not an input (inputs: {', '.join(names)})")
        return node_name(name)
    images = [n for n in names if is_image(graph, n)] or names
    if len(images) != 1:
        raise InputError(f"{flag}: several inputs, name one with NAME=... "
                         f"({', '.join(names)})")
    return images[0]


def _check(graph: Graph, name: str, spec: Preprocessing) -> None:
    import tensorflow as tf
    model = tf.dtypes.as_dtype(graph.node(name).attr["dtype"].type)
    if not model.is_floating:
        raise InputError(f"input '{name}' is {model.name}, not float: preprocessing needs a "
                         "float model input")
    axis = channel_axis(graph, name)
    shape = graph.attr(name, "shape")
    per_channel = any(len(v) > 1 for v in (spec.mean or (), spec.scale or ()))
    if spec.reverse and not is_image(graph, name):
        raise InputError(f"--reverse-input-channels: input '{name}' is not an image (rank 4)")
    if (spec.reverse or per_channel) and axis is None:
        raise InputError(f"input '{name}': its channel axis cannot be known (no NHWC/NCHW op "
                         "reads it)")
    channels = None if axis is None or shape.rank is None else shape.as_list()[axis]
    for flag, values in (("--mean-values", spec.mean), ("--scale-values", spec.scale)):
        if values and len(values) > 1 and len(values) != channels:
            raise InputError(f"{flag}: {len(values)} values for input '{name}' with "
                             f"{channels} channels (give 1 or {channels})")
    spec.channel_axis = axis


def model_values(raw: np.ndarray, spec: Preprocessing, dtype) -> np.ndarray:
    """What the original graph sees for raw input ``raw``: (reverse(x) - mean) / scale."""
    x = np.asarray(raw).astype(np.float64)
    if spec.reverse:
        x = np.flip(x, axis=spec.channel_axis)
    rank = x.ndim
    for values, apply in ((spec.mean, np.subtract), (spec.scale, np.divide)):
        if values:
            v = np.asarray(values, np.float64)
            if v.size > 1:
                v = v.reshape((-1,) + (1,) * (rank - 1 - spec.channel_axis))
            x = apply(x, v)
    return x.astype(dtype)


@dataclasses.dataclass
class Preprocessor:
    """The verification hook: raw feeds for the optimized graph, model feeds for the original."""

    specs: Mapping[str, Preprocessing]
    model_dtypes: Mapping[str, object]          # input name → the original's numpy dtype

    def raw_feeds(self, feeds: Dict[str, np.ndarray], seed: int) -> Dict[str, np.ndarray]:
        """Feeds made for the optimized graph, integer inputs spread over their whole range."""
        rng = np.random.default_rng(seed + 1)
        raw = dict(feeds)
        for key, value in feeds.items():
            spec = self.specs.get(node_name(key))
            if spec is None or value.dtype.kind not in "ui" or value.size < 2:
                continue
            info = np.iinfo(value.dtype)
            low, high = max(info.min, 0), min(info.max, 255) if info.max <= 255 else info.max
            full = rng.integers(low, int(high) + 1, size=value.shape, dtype=np.int64).ravel()
            full[:2] = low, high                         # both ends always present
            raw[key] = full.reshape(value.shape).astype(value.dtype)
        return raw

    def model_feeds(self, raw: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        return {key: (model_values(value, self.specs[node_name(key)],
                                   self.model_dtypes[node_name(key)])
                      if node_name(key) in self.specs else value)
                for key, value in raw.items()}


def preprocessor(graph, specs: Mapping[str, Preprocessing]) -> Optional[Preprocessor]:
    """The hook for ``specs``, with the ORIGINAL's input dtypes (``graph``: a Graph or a
    GraphDef of the original — never the optimized graph, whose inputs take raw values)."""
    if not specs:
        return None
    import tensorflow as tf
    graph = indexed(graph)
    dtypes = {name: tf.dtypes.as_dtype(graph.node(name).attr["dtype"].type).as_numpy_dtype
              for name in specs}
    return Preprocessor(dict(specs), dtypes)


STEPS = ("sub_mean", "reverse_channels", "scale")      # add-preprocessing's foldable nodes


def outcome(graph_def, specs: Mapping[str, Preprocessing], reports) -> List[str]:
    """Per input, in words: which preprocessing steps folded (into which layer) and which stay
    in the optimized graph, with the reason the folding transform gave."""
    present = {n.name for n in graph_def.node}
    folded = {entry.split(" ")[0]: entry for r in reports for entry in r.rewritten
              if " → " in str(entry)}
    reasons = {node: reason for r in reports for node, reason in r.skipped}
    lines = []
    for name in specs:
        done, left = [], []
        for step in STEPS:
            node = f"{name}/preprocess/{step}"
            if node in present:
                why = reasons.get(node, "it reaches no linear layer it can fold into")
                left.append(f"{node} ({why})")
            elif node in folded:
                done.append(folded[node])
        if f"{name}/preprocess/cast" in present:
            left.insert(0, f"{name}/preprocess/cast (the new input dtype)")
        axis = specs[name].channel_axis
        where = "" if axis is None else f" (channel axis {axis}, from the graph's data format)"
        lines.append(f"{name}{where}: folded {'; '.join(done) or 'nothing'}; "
                     f"stays {'; '.join(left) or 'nothing'}")
    return lines
