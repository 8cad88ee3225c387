"""What every builder returns, and the random numbers every builder uses."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
from tensorflow.core.framework import graph_pb2


@dataclasses.dataclass
class BuiltModel:
    """A frozen graph plus its interface."""

    graph_def: graph_pb2.GraphDef
    inputs: List[str]                      # placeholder node names fed with data
    outputs: List[str]                     # node names whose outputs are the model's results
    training_flag: Optional[str] = None    # name of the bool training switch, if the graph has one


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)
