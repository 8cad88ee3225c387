"""Running NCHW graphs on any CPU, for the run only.

TensorFlow's default (Eigen) CPU kernels refuse channels-first ``Conv2D``, depthwise and
transposed convolutions, pooling and ``SpaceToDepth``/``DepthToSpace`` ("only supports the NHWC
tensor format on the CPU"). Its oneDNN kernels run them, but TensorFlow turns those on only on
some CPUs (and never with ``TF_ENABLE_ONEDNN_OPTS=0``). So every graph the tool RUNS — the
original, the optimized graph, the references of the export checks, ``bench`` — goes through
:func:`runnable` first: where this process cannot run channels-first ops, each such op becomes

    Transpose(to channels-last) → the same op in NHWC/NDHWC → Transpose(back)

with its attributes (strides, ksize, dilations, explicit paddings) permuted alike. The numbers are
those of the op itself: a transpose moves values, it does not round them. The op's name now
names the transpose back, so every reader — and every fetch by name — sees the same tensor.
Both graphs of a comparison get the same treatment. The graph the tool WRITES keeps the user's
layout; ``--layout NHWC`` is the transform that changes it for good.
"""
from __future__ import annotations

import functools
import logging
from typing import List

import numpy as np

log = logging.getLogger("tfsurgery")

# Ops whose channels-first form the default CPU kernels refuse → the input that carries the
# image (the others are weights, sizes or scalars).
CHANNELS_FIRST_ONLY_WITH_ONEDNN = {
    "Conv2D": 0, "DepthwiseConv2dNative": 0, "Conv2DBackpropInput": 2, "MaxPool": 0,
    "AvgPool": 0, "MaxPoolV2": 0, "SpaceToDepth": 0, "DepthToSpace": 0,
    "Conv3D": 0, "MaxPool3D": 0, "AvgPool3D": 0, "Conv3DBackpropInputV2": 2,
}
# ...of which oneDNN has no channels-first kernel either (TF 2.21): wrapped on every CPU.
CHANNELS_FIRST_NEVER_ON_CPU = frozenset({"MaxPoolV2", "SpaceToDepth", "DepthToSpace"})
# Per-dimension list attributes, in the op's data format.
PER_DIMENSION_ATTRS = ("strides", "ksize", "dilations")
# Inputs holding a shape or per-dimension sizes in the op's data format.
PER_DIMENSION_INPUTS = {"Conv2DBackpropInput": (0,), "Conv3DBackpropInputV2": (0,),
                        "MaxPoolV2": (1, 2)}



# the channels-last op a wrapped NCHW op becomes (its name keeps the Transpose back)
INNER_SUFFIX = "/_channels_last"

def to_channels_last(rank: int) -> List[int]:
    """NCHW → NHWC (rank 4), NCDHW → NDHWC (rank 5)."""
    return [0] + list(range(2, rank)) + [1]


def to_channels_first(rank: int) -> List[int]:
    return [0, rank - 1] + list(range(1, rank - 1))


@functools.lru_cache(maxsize=None)
def channels_first_runs() -> bool:
    """Can this process run a channels-first Conv2D and MaxPool on the CPU? Asked once: oneDNN's
    kernels are chosen at start-up by CPU and ``TF_ENABLE_ONEDNN_OPTS``."""
    import tensorflow as tf
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True   # run as written
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [1, 1, 2, 2])
        y = tf.nn.max_pool2d(tf.nn.conv2d(x, tf.ones([1, 1, 1, 1]), 1, "VALID",
                                          data_format="NCHW"), 1, 1, "VALID", data_format="NCHW")
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            try:
                session.run(y, {x: np.ones([1, 1, 2, 2], np.float32)})
                return True
            except tf.errors.OpError:
                return False


def channels_first_nodes(graph_def) -> List[str]:
    """The nodes this CPU could not run as written."""
    only = None if not channels_first_runs() else CHANNELS_FIRST_NEVER_ON_CPU
    return [node.name for node in graph_def.node if _channels_first(node, only)]


def runnable(graph_def, *, label: str = "the graph"):
    """``graph_def`` in a form this process can run, computing the same values under the same
    names (the GraphDef itself when nothing needs to change)."""
    names = channels_first_nodes(graph_def)
    if not names:
        return graph_def
    log.debug("%s: %d NCHW ops run through transposes (TensorFlow's oneDNN kernels are off on "
              "this CPU, or have none for them; the written graph keeps its layout)", label,
              len(names))
    return rewritten(graph_def, only=None if not channels_first_runs()
                     else CHANNELS_FIRST_NEVER_ON_CPU)


def rewritten(graph_def, only=None):
    """Every channels-first op of the table above (or of ``only``) wrapped in transposes
    (whatever the CPU)."""
    from tensorflow.core.framework import graph_pb2
    result = graph_pb2.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if _channels_first(node, only):
            result.node.extend(_wrapped(node))
        else:
            result.node.add().CopyFrom(node)
    return result


def _channels_first(node, only=None) -> bool:
    if node.op not in (only or CHANNELS_FIRST_ONLY_WITH_ONEDNN) or "data_format" not in node.attr:
        return False
    return node.attr["data_format"].s.decode(errors="replace").startswith("NC")


def _wrapped(node) -> list:
    """[constants, transpose in, the op in channels-last form, transpose out (the op's name)]."""
    from tensorflow.core.framework import node_def_pb2
    fmt = node.attr["data_format"].s.decode(errors="replace")
    rank = len(fmt)
    inner = node_def_pb2.NodeDef()
    inner.CopyFrom(node)
    inner.name = node.name + INNER_SUFFIX
    inner.attr["data_format"].s = ("NHWC" if rank == 4 else "NDHWC").encode()
    if "_output_shapes" in inner.attr:            # recorded in the old layout
        del inner.attr["_output_shapes"]
    forward, back = to_channels_last(rank), to_channels_first(rank)
    for attr in PER_DIMENSION_ATTRS:
        if attr in inner.attr and len(inner.attr[attr].list.i) == rank:
            values = list(inner.attr[attr].list.i)
            inner.attr[attr].list.i[:] = [values[i] for i in forward]
    if "explicit_paddings" in inner.attr and len(inner.attr["explicit_paddings"].list.i) == 2 * rank:
        pairs = np.reshape(list(inner.attr["explicit_paddings"].list.i), (rank, 2))
        inner.attr["explicit_paddings"].list.i[:] = [int(v) for v in pairs[forward].ravel()]
    dtype = _element_type(node)
    made = []
    data = CHANNELS_FIRST_ONLY_WITH_ONEDNN[node.op]
    perm_in = _int_const(f"{node.name}/_channels_last/perm_in", forward)
    perm_out = _int_const(f"{node.name}/_channels_last/perm_out", back)
    made += [perm_in, perm_out]
    transpose_in = _transpose(f"{node.name}/_channels_last/input", inner.input[data],
                              perm_in.name, dtype)
    made.append(transpose_in)
    inner.input[data] = transpose_in.name
    for index in PER_DIMENSION_INPUTS.get(node.op, ()):
        gather = _gather(f"{node.name}/_channels_last/sizes_{index}", inner.input[index],
                         perm_in.name)
        made += gather
        inner.input[index] = gather[-1].name
    made.append(inner)
    outer = _transpose(node.name, inner.name, perm_out.name, dtype)
    if "_class" in node.attr:
        outer.attr["_class"].CopyFrom(node.attr["_class"])
    made.append(outer)
    return made


def _element_type(node) -> int:
    """The op's ``T`` (a SavedModel written with stripped defaults leaves float's out)."""
    if "T" in node.attr:
        return node.attr["T"].type
    from tensorflow.python.framework import op_def_registry
    default = next(a.default_value for a in op_def_registry.get(node.op).attr if a.name == "T")
    return default.type


def _int_const(name: str, values) -> object:
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = tf.int32.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(values, np.int32)))
    return node


def _transpose(name: str, source: str, perm: str, dtype) -> object:
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2
    node = node_def_pb2.NodeDef(name=name, op="Transpose", input=[source, perm])
    node.attr["T"].type = dtype
    node.attr["Tperm"].type = tf.int32.as_datatype_enum
    return node


def _gather(name: str, source: str, perm: str) -> list:
    """[axis, ``source[perm]``]: a shape or per-dimension sizes put in channels-last order."""
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2
    axis = _int_const(f"{name}/axis", 0)
    node = node_def_pb2.NodeDef(name=name, op="GatherV2", input=[source, perm, axis.name])
    for attr in ("Tparams", "Tindices", "Taxis"):
        node.attr[attr].type = tf.int32.as_datatype_enum
    node.attr["batch_dims"].i = 0
    return [axis, node]
