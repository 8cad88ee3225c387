"""Large synthetic graphs for scaling runs: n repeated conv(+bias) -> FusedBatchNormV3 -> Relu.

One block is built with TF ops (so every attr is what TF writes), then its NodeDefs are stamped
n times under `block_<i>/` and chained: 20k blocks (200k nodes) take seconds, not minutes.
All blocks share one set of random values but each has its own Const nodes, as a real graph does.
"""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfsurgery.models.common import BuiltModel, rng
from tfsurgery.models.tf1 import random_bias, random_bn, random_kernel

_INPUT = "input"


def _one_block(seed: int, channels: int, size: int) -> graph_pb2.GraphDef:
    """input -> conv/Conv2D + conv/BiasAdd -> bn/FusedBatchNormV3 -> Relu, all weights Const.

    The kernel gain (0.5) makes a block a contraction, so a chain of thousands of identical
    blocks settles to finite, non-zero values instead of overflowing or vanishing.
    """
    r = rng(seed)
    kernel = random_kernel(r, [3, 3, channels, channels], 9 * channels, gain=0.5)
    bias = random_bias(r, [channels])
    bn = random_bn(r, channels)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, size, size, channels], name=_INPUT)
        k = tf.constant(kernel, name="conv/kernel")
        x = tf.nn.conv2d(x, k, 1, "SAME", name="conv/Conv2D")
        x = tf.nn.bias_add(x, tf.constant(bias, name="conv/bias"), name="conv/BiasAdd")
        params = {name: tf.constant(value, name=f"bn/{name}") for name, value in bn.items()}
        x = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=params["gamma"], offset=params["beta"], mean=params["moving_mean"],
            variance=params["moving_variance"], epsilon=1e-3, is_training=False,
            name="bn/FusedBatchNormV3")[0]
        tf.nn.relu(x, name="Relu")
    return graph.as_graph_def()


def repeated_blocks(n_blocks: int, seed: int = 0, channels: int = 8, size: int = 8) -> BuiltModel:
    """`input` [None, size, size, channels] -> n_blocks x (conv+bias -> BN -> Relu) -> `output`.

    About 10 nodes per block: block_<i>/conv/{kernel,Conv2D,bias,BiasAdd},
    block_<i>/bn/{gamma,beta,moving_mean,moving_variance,FusedBatchNormV3}, block_<i>/Relu.
    """
    template = _one_block(seed, channels, size)
    block = [n for n in template.node if n.name != _INPUT]

    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(template.versions)
    graph_def.node.extend(n for n in template.node if n.name == _INPUT)
    previous = _INPUT
    for i in range(n_blocks):
        prefix = f"block_{i}/"
        for node in block:
            new = graph_def.node.add()
            new.CopyFrom(node)
            new.name = prefix + node.name
            # The template's inputs are plain names: the block input or a node of the block.
            new.input[:] = [previous if name == _INPUT else prefix + name for name in node.input]
        previous = prefix + "Relu"

    out = graph_def.node.add()
    out.name, out.op = "output", "Identity"
    out.input.append(previous)
    out.attr["T"].type = tf.float32.as_datatype_enum
    return BuiltModel(graph_def, [_INPUT], ["output"], None)
