"""Cross-layer equalization before int8 (``--int8-equalize``): what the transform needs from data,
and the transform run on the optimized graph.

``equalize-cross-layer`` is exact through ReLU and the identity. Through ReLU6 it needs to know
which channels ever reach the clip at 6: :func:`activation_maxima` runs the graph on the
calibration rows and takes, per channel, the largest value entering each ReLU6 that follows a
linear layer. The caller verifies the result in float against the original like every transform.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from tfsurgery import pipeline
from tfsurgery.contract import Options, TransformReport, with_params
from tfsurgery.cpu_layout import runnable
from tfsurgery.graph import Graph
from tfsurgery.ops import tensor_name
from tfsurgery.samples import Samples
from tfsurgery.tfsession import plain_session_config
from tfsurgery.transforms import equalize_cross_layer as transform

NAME = "equalize-cross-layer"


def relu6_inputs(graph_def) -> Dict[str, Tuple[str, int]]:
    """ReLU6 → (the tensor it reads, its channel axis), for each ReLU6 after a linear layer
    (directly or through a bias)."""
    graph = Graph(graph_def, check_inputs=False)
    found = {}
    for node in graph.nodes_with_ops((transform.CLIP,)):
        ref = graph.inputs(node.name)[0]
        producer = ref
        if graph.op(producer) in transform.BIASES:
            producer = graph.inputs(producer.node)[0]
        if graph.op(producer) not in transform.LINEAR:
            continue
        channel_last = transform._channel_last(graph, producer.node)
        found[node.name] = (str(ref), -1 if channel_last else 1)
    return found


def activation_maxima(graph_def, samples: Samples, tensors: Dict[str, Tuple[str, int]]
                      ) -> Dict[str, Tuple[float, ...]]:
    """Per ReLU6 of ``tensors``, per channel: the largest value entering it over ``samples``
    (one TensorFlow session, row by row)."""
    import tensorflow as tf
    if not tensors:
        return {}
    names = list(tensors)
    fetches = [tensor_name(tensors[name][0]) for name in names]
    maxima: Dict[str, np.ndarray] = {}
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(runnable(graph_def), name="")
        with tf.compat.v1.Session(graph=graph, config=plain_session_config()) as session:
            for feeds in samples.feeds():
                values = session.run(fetches, {tensor_name(k): v for k, v in feeds.items()})
                for name, value in zip(names, values):
                    axis = tensors[name][1] % value.ndim
                    per_channel = np.moveaxis(value, axis, -1).reshape(-1, value.shape[axis])
                    top = per_channel.max(axis=0).astype(np.float64)
                    maxima[name] = top if name not in maxima else np.maximum(maxima[name], top)
    return {name: tuple(float(v) for v in values) for name, values in maxima.items()}


def equalize(graph_def, inputs: Sequence[str], outputs: Sequence[str],
             calibration: Samples) -> Tuple[object, TransformReport]:
    """``graph_def`` after equalize-cross-layer (ReLU6 pairs with the calibration rows' ranges)
    and its report."""
    maxima = activation_maxima(graph_def, calibration, relu6_inputs(graph_def))
    fn = transform.equalize_cross_layer
    options = Options(inputs=list(inputs), outputs=list(outputs),
                      params={NAME: with_params(fn, {"activation_max": maxima})})
    after, reports = pipeline.run(graph_def, [NAME], options)
    return after, reports[0]
