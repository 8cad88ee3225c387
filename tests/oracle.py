"""The tests' own oracle: run GraphDefs in plain TensorFlow sessions and compare the numbers.

Nothing here comes from tfsurgery (not its verifier, not its reference builder, not its NCHW
run form): a bug there cannot hide a bug in a transform. Each test states what it feeds — its
own seeded inputs, the training flags and dropout knobs at their inference values.

Channels-first convolutions and pooling run on the CPU only with TensorFlow's oneDNN kernels. Where
they are off, :func:`run` wraps each such op in transposes itself (``_channels_last``): a few lines
of its own, so the oracle runs on every CPU and shares nothing with the code under test.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

NHWC_ONLY_ON_CPU = {"Conv2D": 0, "DepthwiseConv2dNative": 0, "MaxPool": 0, "AvgPool": 0,
                    "Conv3D": 0, "MaxPool3D": 0, "AvgPool3D": 0, "Conv2DBackpropInput": 2}


def session_config():
    """Grappler off: the graph runs as written."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def tensor(name: str) -> str:
    return name if ":" in name else name + ":0"


def run(graph_def, feeds: Mapping[str, object], fetches: Sequence[str]) -> list:
    """Fetch ``fetches`` of ``graph_def`` fed ``feeds`` (names with or without ``:0``)."""
    try:
        return _run(graph_def, feeds, fetches)
    except tf.errors.OpError as error:
        if "NHWC" not in str(error) and "data_format" not in str(error):
            raise
    return _run(_channels_last(graph_def), feeds, fetches)


def _run(graph_def, feeds, fetches) -> list:
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        present = {n.name for n in graph_def.node}
        feed = {tensor(k): v for k, v in feeds.items() if k.split(":")[0] in present}
        with tf.compat.v1.Session(graph=graph, config=session_config()) as session:
            return session.run([tensor(f) for f in fetches], feed)


def random_feeds(graph_def, inputs: Sequence[str], seed: int = 0, *, batch: int = 2,
                 free: int = 16) -> Dict[str, np.ndarray]:
    """Seeded normal floats (small ints, random bools) shaped by each placeholder."""
    rng = np.random.default_rng(seed)
    nodes = {n.name: n for n in graph_def.node}
    feeds = {}
    for name in inputs:
        node = nodes[name.split(":")[0]]
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
        dims = tf.TensorShape(node.attr["shape"].shape).as_list()
        shape = [d if d is not None else (batch if i == 0 else free) for i, d in enumerate(dims)]
        if dtype.is_bool:
            value = rng.random(shape) < 0.5
        elif dtype.is_integer:
            value = rng.integers(0, 10, size=shape)
        else:
            value = rng.standard_normal(shape)
        feeds[name] = np.asarray(value).astype(dtype.as_numpy_dtype)
    return feeds


def relative_error(expected, actual) -> float:
    """max |actual − expected| / max |expected| (finite values; NaN/Inf must match)."""
    expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    assert expected.shape == actual.shape, (expected.shape, actual.shape)
    for kind in (np.isnan, np.isposinf, np.isneginf):
        assert np.array_equal(kind(expected), kind(actual)), "NaN/Inf in different places"
    finite = np.isfinite(expected)
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(expected[finite]))), np.finfo(np.float32).tiny)
    return float(np.max(np.abs(actual[finite] - expected[finite]))) / scale


def assert_same_outputs(original, result, inputs: Sequence[str], outputs: Sequence[str], *,
                        seed: int = 0, feeds: Optional[Mapping[str, object]] = None,
                        original_feeds: Optional[Mapping[str, object]] = None,
                        result_outputs: Optional[Sequence[str]] = None,
                        rtol: float = 1e-4, batch: int = 2) -> float:
    """Run both graphs on the same inputs (``feeds``, else seeded random ones) and assert every
    output agrees within ``rtol`` of its magnitude. ``original_feeds``: what only the original
    is fed (training flags False, keep_prob 1.0). Returns the worst relative error."""
    feeds = dict(feeds) if feeds is not None else random_feeds(original, inputs, seed,
                                                                batch=batch)
    expected = run(original, {**feeds, **dict(original_feeds or {})}, outputs)
    actual = run(result, feeds, list(result_outputs or outputs))
    worst = 0.0
    for name, e, a in zip(outputs, expected, actual):
        error = relative_error(e, a)
        assert error <= rtol, f"output {name}: relative error {error:.3g} > {rtol:g}"
        worst = max(worst, error)
    return worst


# ---------------------------------------------------------------- NCHW without oneDNN
def _channels_last(graph_def):
    """Each NCHW op above as transpose → NHWC op → transpose, keeping its name for readers."""
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    for node in graph_def.node:
        fmt = node.attr["data_format"].s.decode(errors="replace") \
            if "data_format" in node.attr else ""
        if node.op not in NHWC_ONLY_ON_CPU or not fmt.startswith("NC"):
            out.node.add().CopyFrom(node)
            continue
        rank = len(fmt)
        to_last = [0] + list(range(2, rank)) + [1]
        to_first = [0, rank - 1] + list(range(1, rank - 1))
        inner = out.node.add()
        inner.CopyFrom(node)
        inner.name = node.name + "/oracle_nhwc"
        inner.attr["data_format"].s = b"NHWC" if rank == 4 else b"NDHWC"
        if "_output_shapes" in inner.attr:
            del inner.attr["_output_shapes"]
        for attr in ("strides", "ksize", "dilations"):
            if attr in node.attr and len(node.attr[attr].list.i) == rank:
                values = list(node.attr[attr].list.i)
                inner.attr[attr].list.i[:] = [values[i] for i in to_last]
        if "explicit_paddings" in node.attr and \
                len(node.attr["explicit_paddings"].list.i) == 2 * rank:
            pairs = np.reshape(list(node.attr["explicit_paddings"].list.i), (rank, 2))
            inner.attr["explicit_paddings"].list.i[:] = [int(v) for v in pairs[to_last].ravel()]
        data = NHWC_ONLY_ON_CPU[node.op]
        _add_const(out, node.name + "/oracle_to_last", to_last)
        _add_const(out, node.name + "/oracle_to_first", to_first)
        _add_transpose(out, node.name + "/oracle_in", node.input[data],
                       node.name + "/oracle_to_last", _element_type(node))
        inner.input[data] = node.name + "/oracle_in"
        if node.op == "Conv2DBackpropInput":
            gather = out.node.add(name=node.name + "/oracle_sizes", op="GatherV2",
                                  input=[node.input[0], node.name + "/oracle_to_last",
                                         node.name + "/oracle_axis"])
            for attr in ("Tparams", "Tindices", "Taxis"):
                gather.attr[attr].type = tf.int32.as_datatype_enum
            _add_const(out, node.name + "/oracle_axis", 0)
            inner.input[0] = gather.name
        _add_transpose(out, node.name, inner.name, node.name + "/oracle_to_first",
                       _element_type(node))
    return out


def _element_type(node):
    return node.attr["T"].type if "T" in node.attr else tf.float32.as_datatype_enum


def _add_const(graph_def, name, values):
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = tf.int32.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(values, np.int32)))


def _add_transpose(graph_def, name, source, perm, dtype):
    node = graph_def.node.add(name=name, op="Transpose", input=[source, perm])
    node.attr["T"].type = dtype
    node.attr["Tperm"].type = tf.int32.as_datatype_enum
