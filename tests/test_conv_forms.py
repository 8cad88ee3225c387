"""Convolution forms (issue 23 item 3): a zero Pad before a SAME conv becomes EXPLICIT padding;
per-channel scales fold into Conv3D and transposed-conv weights (after and before them); TF1's
SpaceToBatchND → conv → BatchToSpaceND becomes one dilated conv. Each rule on random weights,
the numbers checked by the tests' own oracle (tests/oracle.py), and each refusal."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches, ops, optimize, report_of
from tfsurgery.models.common import BuiltModel

tf1 = tf.compat.v1
R = np.random.default_rng(23)


def _r(*shape):
    return R.standard_normal(shape).astype(np.float32)


def built(body, shape, name="input"):
    """A TF1 graph: ``body(placeholder)`` named ``output``."""
    with tf.Graph().as_default() as graph:
        x = tf1.placeholder(tf.float32, shape, name=name)
        tf.identity(body(x), name="output")
    return BuiltModel(graph.as_graph_def(), [name], ["output"])


def only(graph_def, op):
    (node,) = [n for n in graph_def.node if n.op == op]
    return node


def skipped(result, name):
    return [reason for _, reason in report_of(result, name).skipped]


def same_split(size, k, stride, dilation):
    """SAME's zeros (before, after) on one axis, as TensorFlow's docs state them."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return [total // 2, total - total // 2]


# ---------------------------------------------------------------- Pad before a SAME conv
@pytest.mark.parametrize("size,pads,k,stride,dilation,fmt", [
    ((9, 8), ((1, 2), (2, 1)), 3, 1, 1, "NHWC"),
    ((9, 8), ((1, 0), (0, 3)), 3, 2, 1, "NHWC"),       # stride 2: SAME's split depends on size
    ((10, 7), ((2, 2), (0, 1)), 3, 1, 2, "NHWC"),      # dilated
    ((8, 9), ((1, 2), (3, 0)), 4, 2, 1, "NHWC"),       # even kernel: the extra zero after
    ((9, 8), ((1, 2), (2, 1)), 3, 2, 1, "NCHW")])
def test_a_zero_pad_before_a_same_conv_becomes_explicit_padding(size, pads, k, stride,
                                                                   dilation, fmt):
    nchw = fmt == "NCHW"
    shape = (None, 3) + size if nchw else (None,) + size + (3,)
    table = [[0, 0], [0, 0]] + [list(p) for p in pads] if nchw else \
        [[0, 0]] + [list(p) for p in pads] + [[0, 0]]
    kernel = _r(k, k, 3, 4)

    def body(x):
        return tf.nn.conv2d(tf.pad(x, table), kernel, stride, "SAME", data_format=fmt,
                            dilations=dilation)
    result = optimize(built(body, shape), bn_fold=False)
    assert "Pad" not in ops(result.graph_def)
    conv = only(result.graph_def, "Conv2D")
    assert conv.attr["padding"].s == b"EXPLICIT"
    expected = [[0, 0], [0, 0]] if nchw else [[0, 0]]
    for n, (p0, p1) in zip(size, pads):
        extra = same_split(n + p0 + p1, k, stride, dilation)
        expected.append([p0 + extra[0], p1 + extra[1]])
    expected += [] if nchw else [[0, 0]]
    assert list(conv.attr["explicit_paddings"].list.i) == list(np.ravel(expected))
    assert_matches(result, 1e-5)


def test_a_pad_and_same_that_add_up_to_same_padding_give_a_same_conv():
    """A stride-2 conv on 8 rows: SAME adds (0, 1); Pad (0, 0) rows, but the columns: 7 padded
    to 8 by (1, 0) then SAME's (0, 1) = (1, 1) = SAME of 7."""
    kernel = _r(3, 3, 3, 2)
    result = optimize(built(lambda x: tf.nn.depthwise_conv2d(
        tf.pad(x, [[0, 0], [0, 0], [1, 0], [0, 0]]), kernel, [1, 2, 2, 1], "SAME"),
        (None, 8, 7, 3)), bn_fold=False)
    conv = only(result.graph_def, "DepthwiseConv2dNative")
    assert conv.attr["padding"].s == b"SAME" and "Pad" not in ops(result.graph_def)
    assert_matches(result, 1e-5)


def test_a_pad_before_a_same_conv_of_unknown_size_stays():
    kernel = _r(3, 3, 3, 4)
    result = optimize(built(lambda x: tf.nn.conv2d(
        tf.pad(x, [[0, 0], [1, 1], [2, 0], [0, 0]]), kernel, 2, "SAME"),
        (None, None, None, 3)), bn_fold=False)
    assert "Pad" in ops(result.graph_def)
    assert any("not static" in why for why in skipped(result, "fold-pad-into-conv"))
    assert_matches(result, 1e-5)


def test_a_pad_before_a_same_depthwise_conv_that_needs_explicit_padding_stays():
    kernel = _r(3, 3, 3, 2)
    result = optimize(built(lambda x: tf.nn.depthwise_conv2d(
        tf.pad(x, [[0, 0], [1, 2], [2, 1], [0, 0]]), kernel, [1, 1, 1, 1], "SAME"),
        (None, 9, 8, 3)), bn_fold=False)
    assert "Pad" in ops(result.graph_def)
    assert any("depthwise" in why for why in skipped(result, "fold-pad-into-conv"))
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("fill", [0.5, None])
def test_a_nonzero_or_reflected_border_before_a_same_conv_stays(fill):
    kernel = _r(3, 3, 3, 4)
    table = [[0, 0], [1, 1], [1, 1], [0, 0]]

    def body(x):
        padded = tf.pad(x, table, mode="REFLECT") if fill is None else \
            tf.pad(x, table, constant_values=fill)
        return tf.nn.conv2d(padded, kernel, 1, "SAME")
    result = optimize(built(body, (None, 6, 6, 3)), bn_fold=False)
    assert {"Pad", "PadV2", "MirrorPad"} & set(ops(result.graph_def))
    assert only(result.graph_def, "Conv2D").attr["padding"].s == b"SAME"
    assert_matches(result, 1e-5)
