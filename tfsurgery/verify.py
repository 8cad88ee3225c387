"""Proof that the numbers did not change: run both graphs on the same feeds and compare outputs.

Feeds are random but seeded, shaped from each placeholder's ``shape`` attribute (unknown batch → 2,
other unknown dims → 16). The original runs with its training flags fed ``False``. The error of an
output is max|optimized − original| / max|original|, i.e. scaled to the output's magnitude.

Float32 arithmetic done in another order (a folded weight is rounded once, not twice) differs in the
last bit, and a deep network can amplify that: the *noise floor* is how far the original's own
outputs move when its float inputs move by one rounding step (relative 2^-23). A result passes if
its error is within the tolerance, or within NOISE_FACTOR × the noise floor — the original itself
cannot be reproduced more closely than that in float32. Both figures are reported.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.errors import InputError, OriginalDoesNotRun, VerificationError
from tfsurgery.graph import Graph
from tfsurgery.ops import tensor_name
from tfsurgery.tfsession import plain_session_config

UNKNOWN_BATCH = 2
UNKNOWN_DIM = 16
DEFAULT_TOLERANCE = 1e-4
NOISE_FACTOR = 4


@dataclasses.dataclass
class OutputError:
    name: str
    max_abs: float
    max_rel: float          # max_abs scaled by the output's magnitude
    shape: tuple

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Verification:
    outputs: List[OutputError]
    tolerance: float
    reference: str = "original graph, training flags False"
    noise_floor: float = 0.0        # the original's own output change for a 1-ulp input change

    @property
    def max_error(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    @property
    def allowed(self) -> float:
        return max(self.tolerance, NOISE_FACTOR * self.noise_floor)

    @property
    def passed(self) -> bool:
        return self.max_error <= self.allowed

    def as_dict(self) -> dict:
        return {"passed": self.passed, "max_error": self.max_error, "tolerance": self.tolerance,
                "noise_floor": self.noise_floor, "allowed": self.allowed,
                "reference": self.reference, "outputs": [o.as_dict() for o in self.outputs]}


def placeholder_shape(node) -> List[int]:
    import tensorflow as tf
    shape = tf.TensorShape(node.attr["shape"].shape) if "shape" in node.attr else \
        tf.TensorShape(None)
    if shape.rank is None:       # guessing a rank can crash TF kernels outright (oneDNN aborts)
        raise InputError(f"input '{node.name}' has unknown rank, so no test input can be "
                                 "made for it; give the placeholder a shape, or use --no-verify")
    return [d if d is not None else (UNKNOWN_BATCH if i == 0 else UNKNOWN_DIM)
            for i, d in enumerate(shape.as_list())]


def make_feeds(graph_def, inputs: Sequence[str], seed: int = 0) -> Dict[str, np.ndarray]:
    """Seeded random values for every input placeholder."""
    import tensorflow as tf
    rng = np.random.default_rng(seed)
    graph = Graph(graph_def, check_inputs=False)
    feeds = {}
    for name in inputs:
        node = graph.node(name.split(":")[0])
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
        shape = placeholder_shape(node)
        if dtype.is_bool:
            value = rng.random(shape) < 0.5
        elif dtype.is_integer:
            value = rng.integers(0, 10, size=shape)
        else:
            value = rng.standard_normal(shape)
        feeds[name] = np.asarray(value).astype(dtype.as_numpy_dtype)
    return feeds


def run_graph(graph_def, feeds: Dict[str, np.ndarray], outputs: Sequence[str]) -> List[np.ndarray]:
    """Run a GraphDef once in a TF1 Session."""
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        try:
            tf.compat.v1.import_graph_def(graph_def, name="")
        except (ValueError, TypeError, tf.errors.OpError) as error:   # e.g. an unknown op
            raise VerificationError(f"TensorFlow cannot import the graph: "
                                    f"{str(error).splitlines()[0]}") from None
        with tf.compat.v1.Session(graph=graph, config=plain_session_config()) as session:
            try:
                return session.run([tensor_name(o) for o in outputs],
                                   {tensor_name(k): v for k, v in feeds.items()})
            except (ValueError, KeyError, TypeError) as error:   # e.g. a feed of the wrong shape
                raise VerificationError(f"TensorFlow cannot run the graph: "
                                        f"{str(error).splitlines()[0]}") from None
            except tf.errors.OpError as error:
                message = " ".join(error.message.split())[:300]
                raise VerificationError(f"TensorFlow cannot run the graph: {message}") from None


def output_error(name: str, reference: np.ndarray, result: np.ndarray) -> OutputError:
    reference, result = np.asarray(reference), np.asarray(result)
    if reference.shape != result.shape:
        return OutputError(name, float("inf"), float("inf"), tuple(result.shape))
    if reference.dtype.kind not in "fc":
        wrong = float(np.count_nonzero(reference != result))
        return OutputError(name, wrong, wrong, tuple(reference.shape))
    ref64, res64 = reference.astype(np.float64), result.astype(np.float64)
    same_nan = np.isnan(ref64) & np.isnan(res64)
    diff = np.where(same_nan, 0.0, np.abs(ref64 - res64))
    max_abs = float(np.max(diff, initial=0.0))
    if np.isnan(max_abs):
        return OutputError(name, float("inf"), float("inf"), tuple(reference.shape))
    magnitude = float(np.max(np.abs(np.where(same_nan, 0.0, ref64)), initial=0.0))
    return OutputError(name, max_abs, max_abs / max(magnitude, np.finfo(np.float32).tiny),
                       tuple(reference.shape))


def nudge(feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Float feeds moved by about one float32 rounding step; others unchanged."""
    step = np.float32(2.0 ** -23)
    return {k: (v * (1 + step)).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in feeds.items()}


def verify(original, optimized, inputs: Sequence[str], outputs: Sequence[str],
           training_flags: Sequence[str] = (), *, tolerance: float = DEFAULT_TOLERANCE,
           seed: int = 0, feeds: Optional[Dict[str, np.ndarray]] = None,
           reference_note: Optional[str] = None) -> Verification:
    """Compare every output of ``optimized`` with ``original`` on the same random feeds."""
    feeds = make_feeds(original, inputs, seed) if feeds is None else feeds
    flags = {name: np.bool_(False) for name in training_flags}
    try:
        expected = run_graph(original, {**feeds, **flags}, outputs)
    except VerificationError as error:
        raise OriginalDoesNotRun(f"the input graph does not run: {error}") from None
    optimized_inputs = {n.name for n in optimized.node}
    actual = run_graph(optimized, {k: v for k, v in feeds.items()
                                   if k.split(":")[0] in optimized_inputs}, outputs)
    errors = [output_error(name, e, a) for name, e, a in zip(outputs, expected, actual)]
    verification = Verification(errors, tolerance)
    if verification.max_error > tolerance:      # only then is the floor worth a third run
        nudged = run_graph(original, {**nudge(feeds), **flags}, outputs)
        verification.noise_floor = max(output_error(n, e, a).max_rel
                                       for n, e, a in zip(outputs, expected, nudged))
    if reference_note:
        verification.reference = reference_note
    return verification
