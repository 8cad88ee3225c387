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


# ---------------------------------------------------------------- atrous flattening
ATROUS_PAIR = {"SpaceToBatchND", "BatchToSpaceND"}


def dilated(result, op="Conv2D"):
    conv = only(result.graph_def, op)
    assert not ATROUS_PAIR & set(ops(result.graph_def)), ops(result.graph_def)
    return conv


@pytest.mark.parametrize("rate", [2, 3])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("size", [(12, 12), (9, 10)])        # divisible by the rate or not
def test_atrous_conv2d_becomes_one_dilated_conv(rate, padding, size):
    kernel = _r(3, 3, 3, 4)
    result = optimize(built(lambda x: tf.nn.atrous_conv2d(x, kernel, rate, padding),
                            (None,) + size + (3,)), bn_fold=False)
    conv = dilated(result)
    assert list(conv.attr["dilations"].list.i) == [1, rate, rate, 1]
    assert conv.attr["padding"].s == padding.encode()
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("padding,dilations,kernel", [
    ("SAME", [2, 3], (3, 2)), ("VALID", [3, 2], (2, 3)), ("SAME", [4, 1], (3, 3))])
def test_convolution_with_dilations_per_axis_becomes_one_dilated_conv(padding, dilations, kernel):
    weights = _r(*kernel, 3, 5)
    result = optimize(built(lambda x: tf.nn.convolution(x, weights, padding=padding,
                                                        dilations=dilations),
                            (None, 11, 13, 3)), bn_fold=False)
    conv = dilated(result)
    assert list(conv.attr["dilations"].list.i) == [1] + dilations + [1]
    assert conv.attr["padding"].s == padding.encode()
    assert_matches(result, 1e-5)


def _space_to_batch_conv(x, kernel, block, paddings, crops, *, between=lambda y: y,
                         fmt="NHWC", depthwise=False, conv_padding="VALID"):
    """The pattern written by hand with raw ops (for forms TF's wrappers never emit)."""
    s2b = tf.raw_ops.SpaceToBatchND(input=x, block_shape=block, paddings=paddings)
    if depthwise:
        y = tf.nn.depthwise_conv2d(s2b, kernel, [1, 1, 1, 1], conv_padding)
    else:
        y = tf.nn.conv2d(s2b, kernel, 1, conv_padding, data_format=fmt)
    return tf.raw_ops.BatchToSpaceND(input=between(y), block_shape=block, crops=crops)


def test_paddings_that_are_neither_same_nor_valid_give_explicit_padding():
    """13 + 3 + 2 = 18 rows (block 2), 12 + 1 + 3 = 16 columns: crops (0, 0) and (0, 1) leave
    zeros (3, 2) and (1, 2) around the input."""
    kernel = _r(3, 3, 3, 4)
    result = optimize(built(lambda x: _space_to_batch_conv(
        x, kernel, [2, 2], [[3, 2], [1, 3]], [[0, 0], [0, 1]]), (None, 13, 12, 3)),
        bn_fold=False)
    conv = dilated(result)
    assert conv.attr["padding"].s == b"EXPLICIT"
    assert list(conv.attr["explicit_paddings"].list.i) == [0, 0, 3, 2, 1, 2, 0, 0]
    assert_matches(result, 1e-5)


def test_bias_batch_norm_and_relu_between_conv_and_batch_to_space_stay_after_the_conv():
    kernel, bias = _r(3, 3, 3, 4), _r(4)
    gamma, beta, mean = _r(4), _r(4), _r(4)
    var = np.abs(_r(4)) + 0.5

    def between(y):
        y = tf.nn.bias_add(y, bias)
        y, _, _ = tf1.nn.fused_batch_norm(y, gamma, beta, mean, var, is_training=False)
        return tf.nn.relu(y * _r(4))
    result = optimize(built(lambda x: _space_to_batch_conv(
        x, kernel, [2, 2], [[2, 3], [2, 2]], [[0, 1], [0, 0]], between=between),
        (None, 11, 12, 3)), bn_fold=False)
    conv = dilated(result)
    assert conv.attr["padding"].s == b"SAME"
    assert {"BiasAdd", "Relu"} <= set(ops(result.graph_def))
    assert_matches(result, 1e-5)


def test_a_channels_first_atrous_conv_flattens():
    """NCHW: the block covers (channels, rows, columns) with 1 on the channels."""
    kernel = _r(3, 3, 3, 4)
    result = optimize(built(lambda x: _space_to_batch_conv(
        x, kernel, [1, 2, 2], [[0, 0], [2, 3], [2, 2]], [[0, 0], [0, 1], [0, 0]], fmt="NCHW"),
        (None, 3, 11, 12)), bn_fold=False)
    conv = dilated(result)
    assert list(conv.attr["dilations"].list.i) == [1, 1, 2, 2]
    assert conv.attr["padding"].s == b"SAME"
    assert_matches(result, 1e-5)


def _dilated_depthwise_runs():
    with tf.Graph().as_default() as graph:
        y = tf.raw_ops.DepthwiseConv2dNative(input=tf.ones([1, 5, 5, 1]), filter=tf.ones(
            [3, 3, 1, 1]), strides=[1, 1, 1, 1], padding="SAME", dilations=[1, 2, 2, 1])
        import oracle
        with tf1.Session(graph=graph, config=oracle.session_config()) as session:
            try:
                session.run(y)
                return True
            except tf.errors.OpError:
                return False


def test_a_depthwise_atrous_conv_stays_unless_asked():
    kernel = _r(3, 3, 3, 2)
    model = built(lambda x: tf1.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME",
                                                    rate=[2, 2]), (None, 9, 10, 3))
    result = optimize(model, bn_fold=False)
    assert ATROUS_PAIR <= set(ops(result.graph_def))
    assert any("oneDNN" in why for why in skipped(result, "flatten-atrous-conv"))
    assert_matches(result, 1e-5)
    asked = optimize(model, bn_fold=False, verify=_dilated_depthwise_runs(),
                     transform_params={"flatten-atrous-conv": {"depthwise": True}})
    conv = dilated(asked, "DepthwiseConv2dNative")
    assert list(conv.attr["dilations"].list.i) == [1, 2, 2, 1]
    assert conv.attr["padding"].s == b"SAME"
    if _dilated_depthwise_runs():       # the default CPU kernel (no oneDNN) cannot run it
        assert_matches(asked, 1e-5)


@pytest.mark.parametrize("case,why", [
    (dict(crops=[[3, 0], [0, 0]]), "exceed paddings"),
    (dict(block_b2s=[4, 2]), "blocks differ"),
    (dict(conv_padding="SAME"), "not VALID"),
    (dict(between=lambda y: y + tf.ones([1, 6, 1, 4])), "per-pixel")])
def test_atrous_pairs_that_are_not_a_dilation_stay(case, why):
    kernel = _r(3, 3, 3, 4)
    block_b2s = case.pop("block_b2s", [2, 2])
    crops = case.pop("crops", [[0, 1], [0, 0]])

    def body(x):
        s2b = tf.raw_ops.SpaceToBatchND(input=x, block_shape=[2, 2],
                                        paddings=[[2, 3], [2, 2]])
        y = tf.nn.conv2d(s2b, kernel, 1, case.get("conv_padding", "VALID"))
        y = case.get("between", lambda v: v)(y)
        return tf.raw_ops.BatchToSpaceND(input=y, block_shape=block_b2s, crops=crops)
    result = optimize(built(body, (None, 11, 12, 3)), bn_fold=False)
    assert ATROUS_PAIR <= set(ops(result.graph_def))
    reasons = skipped(result, "flatten-atrous-conv")
    assert any(why in reason for reason in reasons), reasons
    assert_matches(result, 1e-5)


def test_an_atrous_conv_on_an_unknown_spatial_size_stays():
    kernel = _r(3, 3, 3, 4)
    result = optimize(built(lambda x: tf.nn.atrous_conv2d(x, kernel, 2, "SAME"),
                            (None, None, None, 3)), bn_fold=False)
    assert ATROUS_PAIR <= set(ops(result.graph_def))
    assert any("not constants" in why for why in skipped(result, "flatten-atrous-conv"))
    assert_matches(result, 1e-5)


def _deeplab_blocks():
    """Atrous conv → BN → ReLU at rate 2, then ASPP-like branches at rates 2 and 4 joined."""
    def bn(y, channels):
        var = np.abs(_r(channels)) + 0.5
        y, _, _ = tf1.nn.fused_batch_norm(y, _r(channels), _r(channels), _r(channels), var,
                                          is_training=False)
        return y

    def body(x):
        y = tf.nn.relu(bn(tf.nn.atrous_conv2d(x, _r(3, 3, 3, 6), 2, "SAME"), 6))
        branches = [tf.nn.relu(bn(tf.nn.atrous_conv2d(y, _r(3, 3, 6, 4), rate, "SAME"), 4))
                    for rate in (2, 4)]
        return tf.concat(branches, -1)
    return built(body, (None, 17, 15, 3))


def _assert_lean_dilated(graph_def):
    left = set(ops(graph_def))
    assert left == {"Placeholder", "Const", "Conv2D", "BiasAdd", "Relu", "ConcatV2",
                    "Identity"}, left
    rates = sorted(n.attr["dilations"].list.i[1] for n in graph_def.node if n.op == "Conv2D")
    assert rates == [2, 2, 4]


def test_deeplab_atrous_blocks_fold_their_batch_norms_under_bn_fold():
    """Each block becomes one dilated conv with its BN folded: nothing but convs, BiasAdds and
    ReLUs is left."""
    result = optimize(_deeplab_blocks(), bn_fold=True)
    _assert_lean_dilated(result.graph_def)
    assert_matches(result, 1e-4)


def test_deeplab_atrous_blocks_from_the_command_line(tmp_path):
    import oracle
    from tensorflow.core.framework import graph_pb2
    from tfsurgery.cli import main
    model = _deeplab_blocks()
    (tmp_path / "deeplab.pb").write_bytes(model.graph_def.SerializeToString())
    assert main([str(tmp_path / "deeplab.pb"), "-o", str(tmp_path / "lean.pb"), "--bn-fold",
                 "-q"]) == 0
    lean = graph_pb2.GraphDef.FromString((tmp_path / "lean.pb").read_bytes())
    _assert_lean_dilated(lean)
    oracle.assert_same_outputs(model.graph_def, lean, ["input"], ["output"], rtol=1e-4)


# ---------------------------------------------------------------- scales into Conv3D / transposed convs
def _conv3d(x, fmt, kernel_shape=(2, 3, 2, 3, 5), padding="SAME"):
    return tf.nn.conv3d(x, _r(*kernel_shape), [1] * 5, padding, data_format=fmt)


def _transposed(x, fmt, out_channels=5, size=(5, 6)):
    """A stride-2 transposed conv: filter [h, w, out, in]."""
    channels_first = fmt == "NCHW"
    shape = [2, out_channels, 2 * size[0], 2 * size[1]] if channels_first else \
        [2, 2 * size[0], 2 * size[1], out_channels]
    return tf.nn.conv2d_transpose(x, _r(3, 3, out_channels, 3), shape, 2, "SAME",
                                  data_format=fmt)


def _transposed3d(x, fmt="NDHWC"):
    return tf.nn.conv3d_transpose(x, _r(2, 3, 3, 4, 3), [2, 6, 8, 10, 4], 2, "SAME",
                                  data_format=fmt)


def _channel_vector(values, rank, channels_first):
    return values.reshape([-1] + [1] * (rank - 2)) if channels_first else values


def _mul_and_bn_after(y, channels, rank, channels_first):
    var = np.abs(_r(channels)) + 0.5
    y = y * _channel_vector(_r(channels), rank, channels_first)
    fmt = {4: "NCHW", 5: "NCDHW"}[rank] if channels_first else {4: "NHWC", 5: "NDHWC"}[rank]
    y, _, _ = tf1.nn.fused_batch_norm(y, _r(channels), _r(channels), _r(channels), var,
                                      is_training=False, data_format=fmt)
    return y


SCALED_OPS = {
    "Conv3D-NDHWC": (lambda x: _conv3d(x, "NDHWC"), (2, 4, 5, 6, 3), "Conv3D", 5, False),
    "Conv3D-NCDHW": (lambda x: _conv3d(x, "NCDHW"), (2, 3, 4, 5, 6), "Conv3D", 5, True),
    "transposed-NHWC": (lambda x: _transposed(x, "NHWC"), (2, 5, 6, 3), "Conv2DBackpropInput",
                        4, False),
    "transposed-NCHW": (lambda x: _transposed(x, "NCHW"), (2, 3, 5, 6), "Conv2DBackpropInput",
                        4, True),
    "transposed3d": (_transposed3d, (2, 3, 4, 5, 3), "Conv3DBackpropInputV2", 5, False),
}


@pytest.mark.parametrize("case", sorted(SCALED_OPS))
def test_a_per_channel_mul_and_batch_norm_after_fold_into_the_weights(case):
    conv, shape, op, rank, channels_first = SCALED_OPS[case]
    channels = 4 if op == "Conv3DBackpropInputV2" else 5

    def body(x):
        return tf.nn.relu(_mul_and_bn_after(conv(x), channels, rank, channels_first))
    result = optimize(built(body, shape), bn_fold=True)
    left = [o for o in ops(result.graph_def) if o not in ("Const", "Placeholder", "Identity")]
    assert sorted(left) == sorted([op, "BiasAdd", "Relu"]), left
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("case", sorted(SCALED_OPS))
def test_a_per_channel_scale_before_folds_into_the_weights(case):
    """Input channels: axis 3 of a Conv3D's [d, h, w, in, out]; the LAST axis of a transposed
    conv's [h, w, (d,) out, in]. Through a zero Pad on the spatial axes too."""
    conv, shape, op, rank, channels_first = SCALED_OPS[case]
    table = [[0, 0]] * rank
    table[2 if channels_first else 1] = [1, 0]

    def body(x):
        scaled = x * _channel_vector(_r(3), rank, channels_first)
        return conv(tf.pad(scaled, table) if op == "Conv3D" else scaled)
    result = optimize(built(body, shape), bn_fold=False)
    assert "Mul" not in ops(result.graph_def), ops(result.graph_def)
    assert_matches(result, 1e-5)


def test_a_shift_before_a_valid_conv3d_joins_its_bias():
    result = optimize(built(lambda x: _conv3d(x + _r(3), "NDHWC", padding="VALID"),
                            (2, 4, 5, 6, 3)), bn_fold=False)
    assert "AddV2" not in ops(result.graph_def) and "BiasAdd" in ops(result.graph_def)
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("case,why", [
    ("transposed-NHWC", "transposed conv"), ("Conv3D-NDHWC", "Conv3D")])
def test_a_shift_before_a_transposed_or_padding_conv3d_stays(case, why):
    conv, shape, op, rank, channels_first = SCALED_OPS[case]
    result = optimize(built(lambda x: conv(x + _r(3)), shape), bn_fold=False)
    assert "AddV2" in ops(result.graph_def)
    assert any(why in reason for reason in skipped(result, "fold-affine-into-linear"))
    assert_matches(result, 1e-5)


# ---------------------------------------------------------------- NCHW forms on any CPU
def test_cpu_layout_runs_an_nchw_conv_with_explicit_padding_and_dilations():
    """cpu_layout's channels-last form of an NCHW conv with EXPLICIT padding and dilations
    computes what the same conv computes on NHWC data (built here in plain TF)."""
    import oracle
    from tfsurgery import cpu_layout
    kernel, x = _r(3, 2, 3, 4), _r(2, 3, 11, 9)
    pads = [[0, 0], [0, 0], [3, 1], [0, 2]]
    with tf.Graph().as_default() as graph:
        inp = tf1.placeholder(tf.float32, [None, 3, 11, 9], name="input")
        tf.identity(tf.nn.conv2d(inp, kernel, [1, 1, 2, 1], pads, data_format="NCHW",
                                 dilations=[1, 1, 2, 3]), name="output")
    nchw = graph.as_graph_def()
    conv = only(nchw, "Conv2D")
    assert conv.attr["padding"].s == b"EXPLICIT"
    (actual,) = oracle._run(cpu_layout.rewritten(nchw), {"input": x}, ["output"])
    nhwc = [pads[0], pads[2], pads[3], pads[1]]
    with tf.Graph().as_default(), tf1.Session(config=oracle.session_config()) as session:
        expected = session.run(tf.transpose(tf.nn.conv2d(
            tf.transpose(x, [0, 2, 3, 1]), kernel, [1, 2, 1, 1], nhwc, dilations=[1, 2, 3, 1]),
            [0, 3, 1, 2]))
    assert oracle.relative_error(expected, actual) <= 1e-6


@pytest.mark.parametrize("rate", [2, 3])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_a_dilated_1d_convolution_becomes_one_dilated_conv(rate, padding):
    """tf.nn.convolution on [batch, width, channels]: ExpandDims → Conv2D → Squeeze inside the
    pair; a bias and a batch norm after it fold under --bn-fold."""
    kernel = _r(3, 3, 4)
    var = np.abs(_r(4)) + 0.5

    def body(x):
        y = tf.nn.bias_add(tf.nn.convolution(x, kernel, padding=padding, dilations=[rate]),
                           _r(4))
        y = (y - _r(4)) * (_r(4) / np.sqrt(var))        # a decomposed batch norm
        return tf.nn.relu(y)
    result = optimize(built(body, (None, 21, 3)), bn_fold=True)
    conv = dilated(result)
    assert list(conv.attr["dilations"].list.i) == [1, 1, rate, 1]
    assert conv.attr["padding"].s == padding.encode()
    assert not {"Sub", "Mul"} & set(ops(result.graph_def))
    assert_matches(result, 1e-5)


def test_keras_dilated_conv_and_batch_norm_become_one_dilated_conv():
    """Keras 3 writes Conv2D(dilation_rate=2) through tf.nn.convolution: the pair again."""
    from tfsurgery.models import keras_models
    layers = tf.keras.layers
    model = tf.keras.Sequential([tf.keras.Input((13, 11, 3)),
                                 layers.Conv2D(4, 3, dilation_rate=(2, 3), padding="same"),
                                 layers.BatchNormalization(), layers.ReLU(),
                                 layers.Conv2D(5, 2, dilation_rate=2, padding="valid")])
    keras = keras_models._keras3_built(model, 23)
    assert "SpaceToBatchND" in ops(keras.graph_def)
    result = optimize(keras, bn_fold=True)
    left = [o for o in ops(result.graph_def) if o not in ("Const", "Placeholder", "Identity")]
    assert sorted(left) == ["BiasAdd", "BiasAdd", "Conv2D", "Conv2D", "Relu"], left
    convs = [n for n in result.graph_def.node if n.op == "Conv2D"]
    assert sorted(list(n.attr["dilations"].list.i) for n in convs) == [[1, 2, 2, 1], [1, 2, 3, 1]]
    assert_matches(result, 1e-5)


def test_a_pad_before_an_atrous_conv_ends_in_its_explicit_padding():
    """Pad → (flattened) dilated conv with EXPLICIT padding: the pad's zeros join its own."""
    kernel = _r(3, 3, 3, 4)
    result = optimize(built(lambda x: _space_to_batch_conv(
        tf.pad(x, [[0, 0], [1, 0], [0, 2], [0, 0]]), kernel, [2, 2], [[3, 2], [1, 3]],
        [[0, 0], [0, 1]]), (None, 12, 10, 3)), bn_fold=False)
    conv = dilated(result)
    assert "Pad" not in ops(result.graph_def)
    assert list(conv.attr["explicit_paddings"].list.i) == [0, 0, 4, 2, 1, 4, 0, 0]
    assert_matches(result, 1e-5)


def test_one_space_to_batch_read_by_two_convs_flattens_both():
    """Two atrous convs of one input at one rate share a SpaceToBatchND once duplicates merge."""
    k1, k2 = _r(3, 3, 3, 4), _r(2, 2, 3, 4)

    def body(x):
        s2b = tf.raw_ops.SpaceToBatchND(input=x, block_shape=[2, 2], paddings=[[2, 3], [2, 2]])
        ys = [tf.raw_ops.BatchToSpaceND(input=tf.nn.conv2d(s2b, k, 1, "VALID"),
                                        block_shape=[2, 2], crops=crops)
              for k, crops in ((k1, [[0, 1], [0, 0]]), (k2, [[0, 3], [0, 2]]))]
        return ys[0][:, :9, :10] + ys[1][:, :9, :10]
    result = optimize(built(body, (None, 11, 12, 3)), bn_fold=False)
    assert not ATROUS_PAIR & set(ops(result.graph_def))
    convs = sorted((n.attr["padding"].s, list(n.attr["explicit_paddings"].list.i))
                   for n in result.graph_def.node if n.op == "Conv2D")
    assert convs == [(b"EXPLICIT", [0, 0, 2, 0, 2, 0, 0, 0]), (b"SAME", [])]
    assert_matches(result, 1e-5)


def test_a_batch_to_space_that_is_the_graph_output_keeps_its_name():
    kernel = _r(3, 3, 3, 4)
    with tf.Graph().as_default() as graph:
        x = tf1.placeholder(tf.float32, (None, 9, 10, 3), name="input")
        tf.nn.atrous_conv2d(x, kernel, 3, "SAME", name="atrous")
    model = BuiltModel(graph.as_graph_def(), ["input"], ["atrous/BatchToSpaceND"])
    result = optimize(model, bn_fold=False)
    assert not ATROUS_PAIR & set(ops(result.graph_def))
    assert "atrous/BatchToSpaceND" in {n.name for n in result.graph_def.node}
    assert_matches(result, 1e-5)


def test_flattened_dilated_convs_export_to_onnx_and_tflite(tmp_path):
    """A dilated conv with EXPLICIT padding and one with SAME (+ folded BN) leave as one conv
    each; onnxruntime and LiteRT, run here, compute what the original graph computes."""
    import onnxruntime
    import oracle
    from ai_edge_litert.interpreter import Interpreter
    from tfsurgery.cli import main
    kernel = _r(3, 3, 3, 4)
    model = built(lambda x: tf.nn.relu(_space_to_batch_conv(
        x, kernel, [2, 2], [[3, 2], [1, 3]], [[0, 0], [0, 1]])) + tf.reduce_mean(
        tf.nn.atrous_conv2d(x, _r(3, 3, 3, 4), 3, "SAME")), (None, 13, 12, 3))
    (tmp_path / "m.pb").write_bytes(model.graph_def.SerializeToString())
    assert main(["export", str(tmp_path / "m.pb"), "--bn-fold", "-q", "-o",
                 str(tmp_path / "m.onnx"), "--tflite", str(tmp_path / "m.tflite")]) == 0
    import onnx
    onnx_ops = [n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node]
    assert onnx_ops.count("Conv") == 2 and not {"SpaceToDepth", "DepthToSpace"} & set(onnx_ops)
    x = _r(1, 13, 12, 3)
    (expected,) = oracle.run(model.graph_def, {"input": x}, ["output"])
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"),
                                           providers=["CPUExecutionProvider"])
    (from_onnx,) = session.run(None, {session.get_inputs()[0].name: x})
    runner = Interpreter(model_path=str(tmp_path / "m.tflite")).get_signature_runner()
    from_tflite = runner(input=x)["output"]
    assert oracle.relative_error(expected, from_onnx) <= 1e-5
    assert oracle.relative_error(expected, from_tflite) <= 1e-5


def test_graph_transforms_flatten_atrous_case_ends_in_three_nodes():
    """graph_transforms' TestFlattenAtrousConv2D (its input a placeholder here, so that nothing
    folds it away): 3x3 input, block 2, paddings (1, 2), crops (0, 1), a 2x2 kernel → input,
    weights and one SAME conv of rate 2 called ``output``."""
    weights = _r(2, 2, 2, 1)
    with tf.Graph().as_default() as graph:
        x = tf1.placeholder(tf.float32, (1, 3, 3, 2), name="input")
        s2b = tf.raw_ops.SpaceToBatchND(input=x, block_shape=[2, 2], paddings=[[1, 2], [1, 2]])
        conv = tf.nn.conv2d(s2b, weights, 1, "VALID")
        tf.raw_ops.BatchToSpaceND(input=conv, block_shape=[2, 2], crops=[[0, 1], [0, 1]],
                                  name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]), bn_fold=False)
    assert sorted(n.op for n in result.graph_def.node) == ["Const", "Conv2D", "Placeholder"]
    conv = only(result.graph_def, "Conv2D")
    assert conv.name == "output" and conv.attr["padding"].s == b"SAME"
    assert list(conv.attr["dilations"].list.i) == [1, 2, 2, 1]
    assert_matches(result, 1e-6)



# ---------------------------------------------------------------- a scale before a Transpose
@pytest.mark.parametrize("scale", ["scalar", "divide"])
def test_a_scalar_scale_before_an_nhwc_to_nchw_transpose_folds(scale):
    """Mul(x, 1/255) → Transpose NHWC→NCHW → NCHW Conv2D (Grappler's FoldMulToTransposeConv):
    the scale moves after the Transpose, then into the weights."""
    def body(x):
        y = x * np.float32(1 / 255) if scale == "scalar" else x / np.float32(255)
        y = tf.transpose(y, [0, 3, 1, 2])
        return tf.nn.conv2d(y, _r(3, 3, 3, 4), 1, "VALID", data_format="NCHW")
    result = optimize(built(body, (2, 9, 8, 3)), bn_fold=False)
    assert not {"Mul", "RealDiv"} & set(ops(result.graph_def)), ops(result.graph_def)
    assert any("moved after" in line for line in
               report_of(result, "fold-affine-into-linear").rewritten)
    assert_matches(result, 1e-5)


def test_a_per_channel_scale_before_a_transpose_stays():
    """Its channel axis would move with the Transpose: refused (the Mul stays, numbers kept)."""
    def body(x):
        y = tf.transpose(x * _r(3), [0, 3, 1, 2])
        return tf.nn.conv2d(y, _r(3, 3, 3, 4), 1, "VALID", data_format="NCHW")
    result = optimize(built(body, (2, 9, 8, 3)), bn_fold=False)
    assert "Mul" in ops(result.graph_def)
    assert_matches(result, 1e-5)


def test_a_scale_before_a_transpose_read_elsewhere_stays():
    def body(x):
        y = x * np.float32(0.5)
        z = tf.nn.conv2d(tf.transpose(y, [0, 3, 1, 2]), _r(3, 3, 3, 4), 1, "VALID",
                         data_format="NCHW")
        return tf.reduce_sum(z) + tf.reduce_sum(y)
    result = optimize(built(body, (2, 9, 8, 3)), bn_fold=False)
    assert "Mul" in ops(result.graph_def)
    assert_matches(result, 1e-5)
