"""fold-batch-norm through a concat: a batch norm after ConcatV2 of convs/matmuls is split by the
concat's slices and folded into each input (graph_transforms' TestFoldFusedBatchNormsWithConcat),
and left alone, with the reason reported, whenever one condition fails."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches, ops, optimize, report_of
from tfsurgery.models.common import BuiltModel
from tfsurgery.models.tf1 import v1_graph

R = np.random.default_rng(11)
BN_OPS = {"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"}


def const(shape, low=None, high=None):
    value = R.uniform(low, high, shape) if low is not None else R.standard_normal(shape)
    return tf.constant(value.astype(np.float32))


def batch_norm(x, channels, kind, data_format="NHWC"):
    """FusedBatchNorm/V2/V3 at inference, or Keras 3's decomposed x * s + t (random stats)."""
    gamma, beta = const([channels], 0.5, 1.5), const([channels])
    mean, var = const([channels]), const([channels], 0.5, 2.0)
    if kind == "decomposed":
        shape = [1, channels, 1, 1] if data_format == "NCHW" and x.shape.rank == 4 else [channels]
        scale = tf.reshape(gamma * tf.math.rsqrt(var + 1e-3), shape)
        return x * scale + tf.reshape(beta - mean * gamma * tf.math.rsqrt(var + 1e-3), shape)
    op = {"FusedBatchNorm": tf.raw_ops.FusedBatchNorm, "FusedBatchNormV2":
          tf.raw_ops.FusedBatchNormV2, "FusedBatchNormV3": tf.raw_ops.FusedBatchNormV3}[kind]
    return op(x=x, scale=gamma, offset=beta, mean=mean, variance=var, epsilon=1e-3,
              data_format=data_format, is_training=False)[0]


def conv_branches(x, data_format, kinds=("conv", "conv_bias", "depthwise")):
    """One branch per kind, each with its own random weights: 2, 3 and 4 output channels."""
    branches = []
    for i, kind in enumerate(kinds):
        if kind == "depthwise":
            y = tf.nn.depthwise_conv2d(x, const([2, 2, 2, 2]), [1, 1, 1, 1], "SAME",
                                       data_format=data_format)
        else:
            y = tf.nn.conv2d(x, const([2, 2, 2, 2 + i]), [1, 1, 1, 1], "SAME",
                             data_format=data_format)
        if kind == "conv_bias":
            y = tf.nn.bias_add(y, const([2 + i]), data_format=data_format)
        branches.append(y)
    return branches


def channel_axis(data_format):
    return 1 if data_format == "NCHW" else -1


def conv_concat_graph(kind, data_format, axis=None, kinds=("conv", "conv_bias", "depthwise")):
    with v1_graph() as graph:
        shape = [2, 2, 5, 5] if data_format == "NCHW" else [2, 5, 5, 2]
        x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
        branches = conv_branches(x, data_format, kinds)
        axis = channel_axis(data_format) if axis is None else axis
        y = tf.concat(branches, axis, name="concat")
        channels = y.shape[1 if data_format == "NCHW" else 3]
        y = batch_norm(y, channels, kind, data_format)
        tf.nn.relu(y, name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


CASES = [(kind, "NHWC") for kind in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
                                     "decomposed")] + \
        [("FusedBatchNormV3", "NCHW"), ("decomposed", "NCHW")]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(case))
def folded_concat(request):
    kind, data_format = request.param
    kinds = ("conv", "conv_bias", "depthwise")
    built = conv_concat_graph(kind, data_format, kinds=kinds)
    return built, optimize(built), len(kinds)


def test_batch_norm_after_concat_folds_into_every_conv(folded_concat):
    built, result, branches = folded_concat
    left = ops(result.graph_def)
    assert not BN_OPS & set(left)
    assert "Mul" not in left and "AddV2" not in left and "Add" not in left
    assert left.count("BiasAdd") == branches             # one per conv, none after the concat
    assert left.count("ConcatV2") == 1
    assert any("(split by concat)" in line
               for line in report_of(result, "fold-batch-norm").rewritten)
    assert_matches(result, 1e-4)


def test_folded_concat_exports_to_onnx_as_convs_and_a_concat(tmp_path):
    """In ONNX the block is what no ONNX optimizer makes of it: Conv ×3, Concat, Relu (tf2onnx
    and onnxruntime cannot fold a BatchNormalization through a Concat)."""
    from conftest import source_of
    from tfsurgery import api
    built = conv_concat_graph("decomposed", "NCHW")
    exported = api.export_onnx(optimize(built), tmp_path / "concat.onnx")
    assert exported.passed
    assert exported.op_histogram == {"Conv": 3, "Concat": 1, "Relu": 1}
    plain = api.export_onnx(api.optimize(source_of(built), ["prune"]), tmp_path / "plain.onnx")
    assert plain.op_histogram == {"Conv": 3, "Concat": 1, "Mul": 1, "Add": 1, "Relu": 1}


def test_concat_along_a_spatial_axis_gives_every_conv_the_whole_batch_norm():
    """GT TestFoldFusedBatchNormsWithConcat(split=false): concat along width, not channels."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 2], name="input")
        a = tf.nn.conv2d(x, const([2, 2, 2, 3]), [1, 1, 1, 1], "SAME")
        b = tf.nn.bias_add(tf.nn.conv2d(x, const([1, 1, 2, 3]), [1, 1, 1, 1], "SAME"),
                           const([3]))
        y = batch_norm(tf.concat([a, b], 2), 3, "FusedBatchNormV3")
        tf.identity(y, name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]))
    assert "FusedBatchNormV3" not in ops(result.graph_def)
    assert ops(result.graph_def).count("BiasAdd") == 2
    assert_matches(result, 1e-4)


@pytest.mark.parametrize("with_bias", [False, True])
def test_decomposed_batch_norm_after_concat_of_matmuls(with_bias):
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [3, 4], name="input")
        first = tf.matmul(x, const([4, 3]))
        second = tf.matmul(x, const([5, 4]), transpose_b=True)
        if with_bias:
            first = tf.nn.bias_add(first, const([3]))
        y = batch_norm(tf.concat([first, second], 1), 8, "decomposed")
        tf.identity(y, name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]))
    left = ops(result.graph_def)
    assert "Mul" not in left and "AddV2" not in left and left.count("BiasAdd") == 2
    assert_matches(result, 1e-4)


def test_concat_v1_op_and_a_scale_only_map():
    """The old Concat op (axis first) and a lone per-channel Mul: no zero BiasAdd is added."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 2], name="input")
        a, b = conv_branches(x, "NHWC", ("conv", "conv"))
        y = tf.raw_ops.Concat(concat_dim=tf.constant(3), values=[a, b])
        y = y * const([5])
        tf.identity(y * const([5]), name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]))
    left = ops(result.graph_def)
    assert "Mul" not in left and "BiasAdd" not in left and left.count("Concat") == 1
    assert_matches(result, 1e-4)


def test_keras3_concatenate_then_batch_normalization():
    """Keras 3, frozen: Conv2D / Conv2D(use_bias=False) / DepthwiseConv2D → Concatenate →
    BatchNormalization, and Dense + Dense → Concatenate → BatchNormalization. The weights reach
    the convs through ReadVariableOp Identities that a NoOp also control-reads: that is not
    sharing (regression: the fold was refused as 'weights shared')."""
    from tfsurgery.models.keras_models import _keras3_built
    k = tf.keras
    image = k.Input((6, 6, 3))
    branches = [k.layers.Conv2D(4, 3, padding="same")(image),
                k.layers.Conv2D(5, 1, use_bias=False)(image),
                k.layers.DepthwiseConv2D(3, padding="same")(image)]
    y = k.layers.ReLU()(k.layers.BatchNormalization()(k.layers.Concatenate()(branches)))
    flat = k.layers.Flatten()(y)
    z = k.layers.Concatenate()([k.layers.Dense(6)(flat), k.layers.Dense(3)(flat)])
    model = _keras3_built(k.Model(image, k.layers.BatchNormalization()(z)), seed=5)
    result = optimize(model)
    left = ops(result.graph_def)
    assert not {"Mul", "AddV2", "Sub", "Rsqrt"} & set(left)
    assert left.count("BiasAdd") == 5                    # one per conv/dense, none after concats
    assert len(report_of(result, "fold-batch-norm").rewritten) == 2
    assert_matches(result, 1e-4)


# ---------------------------------------------------------------- refusals: graph left alone
def refusal_graph(case):
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 2], name="input")
        weights = const([2, 2, 2, 3])
        a = tf.nn.conv2d(x, weights, [1, 1, 1, 1], "SAME", name="conv_a")
        if case == "shared_weights":
            b = tf.nn.conv2d(x, weights, [1, 1, 1, 1], "SAME", name="conv_b")
        elif case == "placeholder_weights":
            w = tf.compat.v1.placeholder(tf.float32, [2, 2, 2, 3], name="weights")
            b = tf.nn.conv2d(x, w, [1, 1, 1, 1], "SAME", name="conv_b")
        elif case == "not_a_conv":
            b = tf.nn.relu(tf.nn.conv2d(x, const([2, 2, 2, 3]), [1, 1, 1, 1], "SAME"))
        else:
            b = tf.nn.conv2d(x, const([2, 2, 2, 3]), [1, 1, 1, 1], "SAME", name="conv_b")
        y = tf.concat([a, b], 3, name="concat")
        out = batch_norm(y, 6, "FusedBatchNormV3")
        extra = {"conv_output_read_twice": b, "concat_read_twice": y}.get(case)
        if extra is not None:
            out = out + tf.reduce_mean(extra)
        tf.identity(out, name="output")
    inputs = ["input", "weights"] if case == "placeholder_weights" else ["input"]
    return BuiltModel(graph.as_graph_def(), inputs, ["output"])


@pytest.mark.parametrize("case, reason", [
    ("shared_weights", "shared with other nodes"),
    ("placeholder_weights", "not constant"),
    ("not_a_conv", "not every input of the concat is a conv/matmul"),
    ("conv_output_read_twice", "conv_b is read by more than the concat"),
    ("concat_read_twice", "output of concat has other consumers"),
])
def test_unsafe_concat_folds_are_refused_with_the_reason(case, reason):
    """No conv's weights change; the BN becomes Mul + BiasAdd after the concat, as any batch norm
    with nothing to fold into, and the report says why it did not go into the convs."""
    built = refusal_graph(case)
    result = optimize(built)
    report = report_of(result, "fold-batch-norm")
    assert "FusedBatchNormV3" not in ops(result.graph_def) and "Mul" in ops(result.graph_def)
    assert [r for n, r in report.skipped if n == "concat" and reason in r], report.skipped
    assert not [line for line in report.rewritten if "split by" in line]
    assert_matches(result, 1e-4)


def test_a_parts_conv_keeps_its_name_but_is_never_compared_by_it(folded_concat):
    """Each conv before the concat took the batch norm's scale: it keeps its name, so the fold
    says its values changed (``report.changed``), and verification's widened comparison never
    pairs it by name with the original's conv (it differs by design; a NCHW conv run
    channels-last on a CPU without oneDNN neither)."""
    from tfsurgery.verify.sensitivity import comparable_tensors
    built, result, _ = folded_concat
    declared = result.reports.correspondence
    convs = {n.name + ":0" for n in result.graph_def.node
             if n.op in ("Conv2D", "DepthwiseConv2dNative")}
    assert convs and all(declared.get(conv) == "" for conv in convs)
    graphs = []
    for graph_def in (built.graph_def, result.graph_def):
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(graph_def, name="")
        graphs.append(graph)
    paired = {mine for mine, _ in comparable_tensors(*graphs, (), correspondence=declared)}
    assert not paired & convs
    unmarked = comparable_tensors(*graphs, (), correspondence={})
    assert {mine for mine, _ in unmarked} & convs      # what the declaration keeps out
    assert_matches(result, 1e-4)
