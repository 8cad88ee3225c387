"""What every check shares: seeded test feeds shaped from the placeholders, graphs run within a
deadline (once, or imported once and run as often as needed), and the error measure — an
output's max |optimized − original| / max |original| over its finite values, NaN and ±Inf
matched by position. ``tfsurgery.verify.check`` builds the check on these (and re-exports them)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
from tensorflow.core.framework import graph_pb2, types_pb2

from tfsurgery.cpu_layout import runnable
from tfsurgery.errors import InputError, VerificationError
from tfsurgery.graph import Graph
from tfsurgery.ops import first_line, node_name, tensor_name
from tfsurgery.trust.outside import refuse
from tfsurgery.tfsession import plain_session_config
from tfsurgery.verify import string_inputs

# the inputs token ids and masks come in (token_inputs looks at these only)
_INT_OR_BOOL = frozenset({types_pb2.DT_INT32, types_pb2.DT_INT64, types_pb2.DT_INT16,
                          types_pb2.DT_INT8, types_pb2.DT_UINT8, types_pb2.DT_UINT16,
                          types_pb2.DT_UINT32, types_pb2.DT_UINT64, types_pb2.DT_BOOL})
UNKNOWN_BATCH = 2
UNKNOWN_DIMS = (16, 32, 64, 128, 256)   # tried in turn for dims the graph leaves free
DEFAULT_TIMEOUT = 120.0                 # seconds per graph run


class GraphTimeout(VerificationError):
    """A graph did not finish within its deadline."""


@dataclasses.dataclass
class OutputError:
    name: str
    max_abs: float
    max_rel: float          # max_abs scaled by the output's magnitude (finite values)
    shape: tuple
    nonfinite: int = 0      # NaN/Inf values in the reference (matched by position)
    reason: str = ""        # why nothing could be compared value by value: "dtype int64 became
    #                         float32", "shape (2, 3) became (3, 2)"
    # the scale the error was judged at (tfsurgery.verify.scales): the whole tensor's largest
    # value, or each part's own (``parts``: one PartError per part the model's structure makes)
    scale: float = 0.0
    parts: tuple = ()
    judged: str = ""        # in words: "the whole tensor", "each part of its Concat ..."

    def as_dict(self) -> dict:
        return {"name": self.name, "max_abs": float(self.max_abs),
                "max_rel": float(self.max_rel), "shape": [int(d) for d in self.shape],
                "nonfinite": int(self.nonfinite), "reason": self.reason,
                "scale": {"judged": self.judged or "the whole tensor",
                          "magnitude": float(self.scale),
                          "parts": [p.as_dict() for p in self.parts]}}


@dataclasses.dataclass
class PartError:
    """One part of an output judged at its own scale: ``where`` says which (``axis 1 [4:5]``),
    ``scale`` its largest reference value (at least PART_FLOOR of the whole's)."""
    where: str
    max_abs: float
    max_rel: float
    scale: float

    def as_dict(self) -> dict:
        return {"where": self.where, "max_abs": float(self.max_abs),
                "max_rel": float(self.max_rel), "scale": float(self.scale)}


# ---------------------------------------------------------------- feeds
def placeholder_shape(node, unknown_dim: int = UNKNOWN_DIMS[0]) -> List[int]:
    import tensorflow as tf
    shape = tf.TensorShape(node.attr["shape"].shape) if "shape" in node.attr else \
        tf.TensorShape(None)
    if shape.rank is None:       # guessing a rank can crash TF kernels outright (oneDNN aborts)
        raise InputError(f"input '{node.name}' has unknown rank, so no test input can be made "
                         f"for it; give it with --input-shape {node.name}=D0,D1,... or a value "
                         f"with --feed {node.name}=VALUE")
    return [d if d is not None else (UNKNOWN_BATCH if i == 0 else unknown_dim)
            for i, d in enumerate(shape.as_list())]


def _node_lookup(graph):
    """name → NodeDef: the run's index when one is handed down (a Graph), else a plain dict of
    the GraphDef's nodes (the placeholders' attributes are all feeds need; no full index)."""
    return graph.node if isinstance(graph, Graph) else \
        {node.name: node for node in graph.node}.__getitem__


def has_free_dims(graph, inputs: Sequence[str]) -> bool:
    """Does any input leave a non-batch dimension free (so a larger test size may help)?
    ``graph``: a GraphDef or a Graph."""
    node = _node_lookup(graph)
    for name in inputs:
        dims = node(node_name(name)).attr["shape"].shape.dim
        if any(d.size < 0 for d in list(dims)[1:]):
            return True
    return False


def make_feeds(graph, inputs: Sequence[str], seed: int = 0, *,
               given: Optional[Mapping[str, np.ndarray]] = None,
               unknown_dim: int = UNKNOWN_DIMS[0],
               scalar_if_unknown_rank: bool = False,
               scale: float = 1.0) -> Dict[str, np.ndarray]:
    """Seeded random values for every input placeholder (floats standard normal × ``scale``);
    ``given`` values win.
    ``scalar_if_unknown_rank``: stand-in values for inputs nothing reads any more, where any
    value does (a scalar for an input of unknown rank instead of an error). ``graph``: a
    GraphDef or a Graph."""
    import tensorflow as tf
    given = {node_name(k): v for k, v in (given or {}).items()}
    rng = np.random.default_rng(seed)
    lookup = _node_lookup(graph)
    tokens = _token_inputs(graph, inputs, lookup, given)
    feeds = {}
    for name in inputs:
        node = lookup(node_name(name))
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
        if node.name in given:
            feeds[name] = _given_value(node, given[node.name], dtype)
            continue
        if dtype == tf.string:
            strings = string_inputs.table_strings(graph, node.name,
                                                  placeholder_shape(node, unknown_dim), rng)
            if strings is not None:
                feeds[name] = strings
                continue
            raise InputError(
                f"input '{node.name}' is a string tensor (encoded bytes: a file, a WAV, a JPEG): "
                f"random values cannot stand in for it; feed a real one with --feed "
                f"{node.name}=VALUES.npy, or make a decoded tensor the input with --inputs "
                "NODE:PORT (e.g. the decoder's output)")
        unknown_rank = "shape" not in node.attr or node.attr["shape"].shape.unknown_rank
        shape = [] if scalar_if_unknown_rank and unknown_rank else \
            placeholder_shape(node, unknown_dim)
        if name in tokens:                  # ids within their table, masks with valid rows
            value = tokens[name].values(rng, shape, dtype.as_numpy_dtype)
        elif dtype.is_bool:
            value = rng.random(shape) < 0.5
        elif dtype.is_integer:
            value = rng.integers(0, 10, size=shape)
        else:
            value = rng.standard_normal(shape) * scale
        feeds[name] = np.asarray(value).astype(dtype.as_numpy_dtype)
    return feeds


def _token_inputs(graph, inputs, lookup, given) -> dict:
    """What ``token_inputs`` reads from the graph for the integer and bool inputs not given
    (looked for only when there are such inputs)."""
    from tfsurgery.verify import token_inputs
    wanted = [n for n in inputs if node_name(n) not in given and
              lookup(node_name(n)).attr["dtype"].type in _INT_OR_BOOL]
    return token_inputs.find(graph, wanted) if wanted else {}


def _given_value(node, value, dtype) -> np.ndarray:
    """A --feed value cast to the input's dtype and checked against its declared shape."""
    import tensorflow as tf
    value = np.asarray(value)
    try:
        cast = value.astype(dtype.as_numpy_dtype)
    except (TypeError, ValueError):
        raise InputError(f"--feed {node.name}: {value.dtype} values cannot be fed to a "
                         f"{dtype.name} input") from None
    if value.dtype.kind == "f" and dtype.is_integer and not np.array_equal(cast, value):
        raise InputError(f"--feed {node.name}: {value.ravel()[:3].tolist()}... are not "
                         f"integers, and the input is {dtype.name}")
    declared = tf.TensorShape(node.attr["shape"].shape) if "shape" in node.attr else \
        tf.TensorShape(None)
    if not declared.is_compatible_with(cast.shape):
        raise InputError(f"--feed {node.name}: a value of shape {list(cast.shape)} does not fit "
                         f"the input's shape {declared}")
    return cast


def free_dim_size(graph_def, inputs: Sequence[str], outputs: Sequence[str], given=None) -> int:
    """The size for free dimensions: the first of the given values' sizes, then of
    UNKNOWN_DIMS, for which TensorFlow's shape inference gives every output a non-empty shape
    (five poolings leave nothing of 16). Decided statically: running a kernel on an empty
    tensor can crash the process."""
    if not has_free_dims(graph_def, inputs):
        return UNKNOWN_DIMS[0]
    import tensorflow as tf
    # a given value's sizes first: a fed padding mask [2, 8] makes the token ids [2, 8] too
    fed_sizes = [int(d) for v in (given or {}).values() for d in np.shape(v)[1:] if d > 0]
    for size in dict.fromkeys(fed_sizes + list(UNKNOWN_DIMS)):
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


def shape_hint(inputs: Sequence[str], given, error=None) -> str:
    free = [n for n in inputs if node_name(n) not in {node_name(k) for k in (given or {})}]
    if free and " is not in [0, " in str(error or ""):     # a Gather's index out of its table
        return ("; an integer input indexes a table the random ids do not fit: give real "
                "inputs with --samples PATH or --feed NAME=VALUES.npy")
    return (f"; give real sizes with --input-shape {free[0]}=D0,D1,... or values with --feed"
            if free else "; check the --feed values")


def nudge(feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Float feeds moved by about one float32 rounding step; others unchanged."""
    step = np.float32(2.0 ** -23)
    return {k: (v * (1 + step)).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in feeds.items()}


def float_weights(graph) -> Dict[str, np.ndarray]:
    """The float32 constants of more than one value of an imported tf.Graph (kernels, biases,
    batch-norm statistics; scalars such as an epsilon or a clip bound are left out)."""
    import tensorflow as tf
    weights = {}
    for op in graph.get_operations():
        if op.type == "Const" and op.outputs[0].dtype == tf.float32 and \
                (op.outputs[0].shape.num_elements() or 0) > 1:
            weights[op.name] = tf.make_ndarray(op.get_attr("value"))
    return weights


def reround(weights: Dict[str, np.ndarray], seed: int = 0) -> Dict[str, np.ndarray]:
    """Each weight moved one float32 rounding step up or down, the signs seeded at random: the
    noise a transform that recomputes every weight in float32 (a folded W·s) may add."""
    rng = np.random.default_rng(seed)
    return {name: np.nextafter(value, np.where(rng.random(value.shape) < 0.5, -np.inf, np.inf)
                               .astype(np.float32)).astype(np.float32)
            for name, value in weights.items()}


# ---------------------------------------------------------------- running
def run_graph(graph_def, feeds: Dict[str, np.ndarray], outputs: Sequence[str], *,
              timeout: float = DEFAULT_TIMEOUT, label: str = "the graph") -> List[np.ndarray]:
    """Run a GraphDef once in a TF1 Session, within ``timeout`` seconds."""
    with Runner(graph_def, timeout=timeout, label=label) as runner:
        return runner.run(feeds, outputs)


class Runner:
    """A GraphDef imported once into an open TF1 Session, run as often as needed (the reference
    of a check: its outputs, the sensitivity probes, the noise floor), each run within
    ``timeout`` seconds. ``graph``: the imported tf.Graph (dtypes, shapes, consumers)."""

    def __init__(self, graph_def, *, timeout: float = DEFAULT_TIMEOUT,
                 label: str = "the graph"):
        import tensorflow as tf
        self.label, self.timeout = label, timeout
        self._given, self._scanned = graph_def, set()      # what each run may reach: scanned
        graph_def = runnable(graph_def, label=label)     # NCHW ops on a CPU without oneDNN
        with tf.Graph().as_default() as graph:
            try:
                tf.compat.v1.import_graph_def(graph_def, name="")
            except (ValueError, TypeError, tf.errors.OpError) as error:   # e.g. an unknown op
                raise VerificationError(f"TensorFlow cannot import {label}: "
                                        f"{first_line(error)}") from None
        self.graph = graph
        self.present = {n.name for n in graph_def.node}
        self.session = tf.compat.v1.Session(graph=graph, config=plain_session_config())

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    def _refuse_outside(self, outputs: Sequence[str], feed) -> None:
        """Before a run: what it would run acts outside the graph only where allowed
        (``outside.allowing``), else ``UnsafeModel`` — every path that runs a graph comes here."""
        key = (tuple(sorted(outputs)), tuple(sorted(feed)))
        if key not in self._scanned:
            refuse(self._given, outputs, list(feed), where=self.label)
            self._scanned.add(key)

    def run(self, feeds: Dict[str, np.ndarray], outputs: Sequence[str]) -> List[np.ndarray]:
        import tensorflow as tf
        feed = {tensor_name(k): v for k, v in feeds.items() if node_name(k) in self.present}
        self._refuse_outside(outputs, feed)
        options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(self.timeout * 1000)))
        label, timeout = self.label, self.timeout
        try:
            return self.session.run([tensor_name(o) for o in outputs], feed, options=options)
        except tf.errors.DeadlineExceededError:
            raise GraphTimeout(
                f"{label} did not finish within {timeout:g} s (an empty input queue, or a "
                "loop the test inputs never end?); give real inputs with --feed NAME=VALUE "
                "or --input-shape, or a longer --verify-timeout") from None
        except (ValueError, KeyError, TypeError) as error:   # e.g. a feed of the wrong shape
            raise VerificationError(f"TensorFlow cannot run {label}: "
                                    f"{first_line(error)}") from None
        except tf.errors.OpError as error:
            raise VerificationError(f"TensorFlow cannot run {label}: "
                                    f"{first_line(error.message)}") from None


# ---------------------------------------------------------------- comparing
def output_error(name: str, reference: np.ndarray, result: np.ndarray, *,
                 same_dtype: bool = False) -> OutputError:
    """max |result − reference| / max |reference| over the finite values; NaN and ±Inf must sit
    at the same positions (with the same sign) in both, in every shape (a scalar too).
    ``same_dtype``: a result of another dtype than the reference's is an error even where its
    values are equal (int64 → float32, bool → int8: the interface changed)."""
    reference, result = np.asarray(reference), np.asarray(result)
    if reference.shape != result.shape:
        return OutputError(name, float("inf"), float("inf"), tuple(result.shape),
                           reason=f"shape {tuple(reference.shape)} became {tuple(result.shape)}")
    if same_dtype and reference.dtype != result.dtype:
        return OutputError(name, float("inf"), float("inf"), tuple(reference.shape),
                           reason=f"dtype {reference.dtype} became {result.dtype}")
    if reference.dtype.kind != "f":
        wrong = float(np.count_nonzero(reference != result))
        return OutputError(name, wrong, wrong, tuple(reference.shape))
    max_abs, magnitude, nonfinite = measure(reference, result)
    return OutputError(name, max_abs, float(max_abs / max(magnitude, np.finfo(np.float32).tiny)),
                       tuple(reference.shape), nonfinite, scale=magnitude)


def measure(reference: np.ndarray, result: np.ndarray):
    """(max |result − reference| over the finite values, max |reference| there, how many
    reference values are NaN/Inf) of two float arrays of one shape; the difference is infinite
    where NaN, +Inf or −Inf do not sit at the same positions in both."""
    if reference.dtype == result.dtype and reference.dtype.itemsize >= 4:
        # the common case (all finite: NaN/Inf make these NaN), without float64 copies
        with np.errstate(invalid="ignore"):
            max_abs = float(np.max(np.abs(reference - result), initial=0.0))
        magnitude = float(np.max(np.abs(reference), initial=0.0))
        if np.isfinite(max_abs) and np.isfinite(magnitude):
            return max_abs, magnitude, 0
    ref64, res64 = reference.astype(np.float64), result.astype(np.float64)
    finite = np.isfinite(ref64)
    nonfinite = int(finite.size - np.count_nonzero(finite))
    same_specials = all(np.array_equal(kind(ref64), kind(res64))
                        for kind in (np.isnan, np.isposinf, np.isneginf))
    magnitude = float(np.max(np.abs(ref64[finite]), initial=0.0))
    if not same_specials:          # NaN/Inf where the original has none, or the reverse
        return float("inf"), magnitude, nonfinite
    return float(np.max(np.abs(ref64[finite] - res64[finite]), initial=0.0)), magnitude, \
        nonfinite
