"""Cross-layer equalization before int8 (``--int8-equalize``): equalize-cross-layer run on the
optimized graph, data-free — through ReLU6 only the channels it proves never reach the clip
(the calibration rows' activation ranges are evidence, not proof: on a MobileNet they scaled
channels that then clipped on held-back rows, and the whole equalization failed verification).
The caller verifies the result in float against the original like every transform."""
from __future__ import annotations

from typing import Sequence, Tuple

from tfsurgery import pipeline
from tfsurgery.contract import Options, TransformReport
from tfsurgery.transforms import equalize_cross_layer as transform


def equalize(graph_def, inputs: Sequence[str],
             outputs: Sequence[str]) -> Tuple[object, TransformReport]:
    """``graph_def`` after equalize-cross-layer, and its report."""
    options = Options(inputs=list(inputs), outputs=list(outputs))
    after, reports = pipeline.run(graph_def, [transform.equalize_cross_layer.transform_name],
                                  options)
    return after, reports[0]
