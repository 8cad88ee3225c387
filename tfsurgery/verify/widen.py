"""Widening a check: the intermediate tensors both graphs have, compared besides the outputs
where the outputs alone are blind (``tfsurgery.verify.sensitivity`` decides when), within a
memory budget, and the differences a rewrite made inside excused."""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from tfsurgery.ops import tensor_name
from tfsurgery.verify import sensitivity as sensitivity_mod
from tfsurgery.verify.runs import OutputError, output_error
from tfsurgery.verify.verdict import Verification, Watching

# The widened comparison's values, both graphs together: a Keras ResNet50 at 224 holds 186 MiB
# of them per row and graph, so 32 stacked --samples rows took 12.7 GB (docs/int8.md, Memory).
WIDE_BYTES = 1 << 30


def _consumed_error(name: str, reference: np.ndarray, result: np.ndarray) -> OutputError:
    """``output_error`` of an intermediate tensor, computed in ``result``'s own memory where it
    may be (the value is not needed afterwards; large tensors, no temporaries)."""
    if not (isinstance(result, np.ndarray) and result.flags.writeable and
            result.dtype == reference.dtype and result.dtype.kind == "f" and
            result.dtype.itemsize >= 4 and result.shape == reference.shape and result.size):
        return output_error(name, reference, result)
    magnitude = float(max(reference.max(), -reference.min()))
    if not np.isfinite(magnitude):      # NaN/Inf in the reference: compared by position and
        return output_error(name, reference, result)    # sign (before ``result`` is reused:
    np.subtract(result, reference, out=result)          # −inf − −inf is NaN)
    np.abs(result, out=result)
    max_abs = float(result.max())
    if not np.isfinite(max_abs):        # NaN/Inf in the result only: a mismatch
        return OutputError(name, float("inf"), float("inf"), tuple(reference.shape),
                           scale=magnitude)
    return OutputError(name, max_abs, max_abs / max(magnitude, np.finfo(np.float32).tiny),
                       tuple(reference.shape), scale=magnitude)


def _same_shapes(pairs, expected, actual) -> Dict[str, tuple]:
    """Optimized name → (reference value, optimized value) of each (optimized, reference) pair
    whose values have one shape and are not empty."""
    return {mine: (e, a) for (mine, _), e, a in zip(pairs, expected, actual)
            if np.shape(e) == np.shape(a) and np.size(e)}


def wide_rows(feeds: Mapping[str, np.ndarray], graph, names: Sequence[str],
              budget: Optional[int] = None) -> Optional[int]:
    """How many first rows of ``feeds`` the widened comparison of ``names`` runs on: as many as
    keep their values in both graphs within ``budget`` bytes (at least one); None (every row)
    when they all fit, or when ``feeds`` are not rows stacked along the inputs' free batch."""
    budget = WIDE_BYTES if budget is None else budget
    rows = _stacked_rows(feeds, graph)
    per_row = 2 * sum(_row_bytes(graph.get_tensor_by_name(tensor_name(n))) for n in names)
    if rows is None or rows * per_row <= budget:
        return None
    return max(1, budget // per_row)


def first_rows(feeds: Mapping[str, np.ndarray], rows: Optional[int]) -> Mapping[str, np.ndarray]:
    return feeds if rows is None else {k: v[:rows] for k, v in feeds.items()}


def _stacked_rows(feeds: Mapping[str, np.ndarray], graph) -> Optional[int]:
    """The rows of ``feeds`` when every one is an input of ``graph`` whose first dimension is
    free and they all have the same number of rows; else None."""
    sizes = set()
    for name, value in feeds.items():
        try:
            shape = graph.get_tensor_by_name(tensor_name(name)).shape
        except (KeyError, ValueError):
            return None
        if shape.rank is None or shape.rank < 1 or shape[0] is not None or np.ndim(value) < 1:
            return None
        sizes.add(len(value))
    return sizes.pop() if len(sizes) == 1 else None


def _row_bytes(tensor) -> int:
    """One row's bytes of ``tensor`` by its static shape (free dimensions counted as 1)."""
    if tensor.shape.rank is None:
        return 0
    return int(np.prod([d or 1 for d in tensor.shape.as_list()])) * tensor.dtype.size


def _widened_note(watching: Watching, count: int) -> str:
    found = watching.sensitivity
    rows = "" if watching.wide_rows is None else \
        (f" on the first {watching.wide_rows} row(s) of the batch (their values within "
         f"{WIDE_BYTES >> 20} MiB)")
    return (f"{found.line()}: also compared {count} intermediate tensors both graphs have "
            f"(under the same name and shape, or declared to correspond by a transform){rows}; "
            "give real inputs with --samples for a check on the data the model is meant for")


def _excuse(verification: Verification, graph) -> None:
    """The intermediate tensors beyond their bound that only a rewrite changed inside
    (tfsurgery.verify.sensitivity.excused)."""
    errors = {e.name: e.max_rel for e in verification.intermediate}
    bounds = {name: verification.bound(name) for name in errors}
    differing = [name for name, error in errors.items() if error > bounds[name]]
    excused: set = set()
    while True:         # to a fixed point: an excused reader counts as a matching one
        more = {name for name in differing if name not in excused and
                sensitivity_mod.excused(graph, name, errors, bounds, frozenset(excused))}
        if not more:
            break
        excused |= more
    verification.excused = [name for name in differing if name in excused]
