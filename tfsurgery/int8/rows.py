"""The user's rows cut in three disjoint sets, and the float reference on them.

- **calibration** rows: the backend computes activation ranges from these, nothing else;
- **selection** rows: every choice is measured here and only here;
- **gate** rows: the one model chosen is measured here once, after every choice is made.

The reference is the float ORIGINAL in TensorFlow, fed what verification feeds it.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsurgery.cpu_layout import runnable
from tfsurgery.errors import ExportError, InputError, VerificationError
from tfsurgery.ops import first_line, node_name, tensor_name
from tfsurgery.trust.outside import refuse
from tfsurgery.verify.reference import comparable_reference
from tfsurgery.verify.samples import Samples
from tfsurgery.tfsession import plain_session_config

SELECTION_FRACTION = 0.2           # of --samples: rows that choose (the rest calibrate/gate)
GATE_FRACTION = 0.4                # of --samples: rows that judge the chosen model
MIN_ROWS = 8                       # at least this many selection and gate rows


@dataclasses.dataclass
class Rows:
    """The three disjoint sets of rows."""
    calibration: Samples
    selection: Samples
    gate: Samples

    def sizes(self) -> Dict[str, int]:
        return {"calibration": self.calibration.rows, "selection": self.selection.rows,
                "gate": self.gate.rows}


def split_rows(samples: Samples, gate: Optional[Samples] = None, *,
               gate_fraction: float = GATE_FRACTION,
               selection_fraction: float = SELECTION_FRACTION, seed: int = 0) -> Rows:
    """``samples`` cut by a seeded shuffle into calibration, selection and gate rows (or, with
    ``gate`` given, into calibration and selection rows, ``gate`` judging)."""
    if gate is not None:
        if gate.rows < MIN_ROWS:
            raise InputError(f"{gate.source}: {gate.rows} rows are too few to gate int8 on; "
                             f"give at least {MIN_ROWS}")
        gate_fraction = 0.0
    if not 0 <= gate_fraction < 1 or not 0 < selection_fraction < 1 or \
            gate_fraction + selection_fraction >= 1:
        raise InputError(f"the gate share {gate_fraction:g} and selection share "
                         f"{selection_fraction:g} must leave rows to calibrate on")
    count = samples.rows
    chosen = max(MIN_ROWS, int(round(count * selection_fraction)))
    judged = 0 if gate is not None else max(MIN_ROWS, int(round(count * gate_fraction)))
    if count - chosen - judged < 1:
        raise InputError(f"{samples.source}: {count} rows are too few for {judged} gate rows, "
                         f"{chosen} selection rows and at least one calibration row; give at "
                         f"least {chosen + judged + 1} rows")
    order = np.random.default_rng(seed).permutation(count)
    selection = samples.take(order[:chosen])
    calibration = samples.take(order[chosen + judged:])
    judging = gate if gate is not None else samples.take(order[chosen:chosen + judged])
    return Rows(calibration, selection, judging)


def float_reference(original, optimized, settings: Dict[str, object], outputs: Sequence[str],
                    rows: Samples, timeout: float) -> List[List[np.ndarray]]:
    """The float ORIGINAL in TensorFlow on every row, [row][output]: the graph as the user gave
    it, fed besides each row what verification feeds it (``settings``: a ``keep_prob`` at 1,
    a training flag False — ``Result.original_extra_feeds``), its random ops made comparable
    with ``optimized`` as verification makes them. One session for all rows, within
    ``timeout`` seconds per row."""
    import tensorflow as tf
    extra = {node_name(k): np.asarray(v) for k, v in settings.items()}
    try:
        reference, _, _ = comparable_reference(original, optimized, extra)
        reference = runnable(reference, label="the original graph")
    except VerificationError as error:
        raise ExportError(f"no float reference for int8: {error}") from None
    present = {n.name for n in reference.node}
    fixed = {tensor_name(k): v for k, v in extra.items() if k in present}
    options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(timeout * 1000)))
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(reference, name="")
        with tf.compat.v1.Session(graph=graph, config=plain_session_config()) as session:
            fetches = [tensor_name(o) for o in outputs]
            result = []
            for feeds in rows.feeds():
                feed = dict(fixed)
                feed.update({tensor_name(k): v for k, v in feeds.items()
                             if node_name(k) in present})
                if not result:
                    refuse(reference, outputs, list(feed), where="the original graph")
                try:
                    result.append(session.run(fetches, feed, options=options))
                except (tf.errors.OpError, ValueError, KeyError, TypeError) as error:
                    raise ExportError("no float reference for int8: the original graph does "
                                      f"not run on the samples: "
                                      f"{first_line(getattr(error, 'message', str(error)))}"
                                      ) from None
            return result
