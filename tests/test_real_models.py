"""Real-model patterns: Keras 3 (decomposed BN), Keras 2 (keras_learning_phase), SavedModel and
.keras inputs, Dense/Conv3D/transposed-conv folding, standalone BN, constant folding limits."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches, optimize, ops, report_of, source_of
from tfsurgery.models import keras_models, tf1
from tfsurgery.contract import Options
from tfsurgery.models.common import BuiltModel
from tfsurgery import api, io, pipeline
from tfsurgery.graph import Graph

BN_OPS = {"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "Rsqrt"}
LINEAR_OPS = {"Conv2D", "DepthwiseConv2dNative", "Conv3D", "MatMul", "Conv2DBackpropInput"}
BIAS_OPS = {"BiasAdd", "Add", "AddV2", "Mul", "Sub"}


def assert_one_bias_per_linear_op(graph_def):
    """After every conv/matmul: at most one bias op, and no per-channel Mul/Add chain."""
    graph = Graph(graph_def)
    for node in graph:
        if node.op not in LINEAR_OPS:
            continue
        readers = graph.consumers(node.name)
        if len(readers) == 1 and graph.op(readers[0].node) in ("BiasAdd",):
            after = graph.consumers(readers[0].node)      # e.g. swish reads it twice: fine
            chained = [r for r in after if len(after) == 1 and graph.op(r.node) in BIAS_OPS
                       and any(graph.is_const(i) for i in graph.inputs(r.node))]
            assert not chained, (node.name, [r.node for r in chained])


def assert_lean(result, tolerance=1e-5):
    """No BN, cond or dropout left; outputs within ``tolerance`` or, for deep networks that
    amplify float32 rounding, within the verification's noise-floor allowance."""
    assert not BN_OPS & set(ops(result.graph_def))
    assert not {"Switch", "Merge", "RandomUniform"} & set(ops(result.graph_def))
    assert_one_bias_per_linear_op(result.graph_def)
    v = result.verification
    assert v.passed and v.max_error < max(tolerance, v.allowed), v.as_dict()


@pytest.mark.parametrize("builder", [keras_models.keras3_small, keras_models.keras3_conv3d,
                                     keras_models.keras3_conv_transpose])
def test_keras3_decomposed_batch_norm_folds(builder):
    built = builder(seed=21)
    assert "Rsqrt" in ops(built.graph_def)
    result = optimize(built)
    assert_lean(result)
    folded = report_of(result, "fold-batch-norm").rewritten
    assert folded and all("batchnorm" in line for line in folded)


def test_keras2_graph_with_learning_phase_dilated_conv_and_dense_bn():
    built = keras_models.tf_keras_model(seed=22)
    assert built.training_flag == "keras_learning_phase"
    result = optimize(built)
    assert_lean(result)
    # the BN after the ReLU before the Dense folds into the Dense (fold-affine-into-linear):
    # no affine op is left that is not a linear op's own bias
    assert "Mul" not in ops(result.graph_def)
    assert ops(result.graph_def).count("BiasAdd") <= ops(result.graph_def).count("Conv2D") + \
        ops(result.graph_def).count("DepthwiseConv2dNative") + ops(result.graph_def).count("MatMul")


def _dense_graph(transpose_b, seed=23):
    """x @ W (+b), then a per-channel scale and shift written in three different orders."""
    r = np.random.default_rng(seed)
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="input")
        w = r.standard_normal((5, 6) if transpose_b else (6, 5)).astype(np.float32)
        y = tf.matmul(x, tf.constant(w), transpose_b=transpose_b)
        y = tf.add(tf.constant(r.normal(size=5).astype(np.float32)), y)         # b + y
        y = tf.multiply(tf.constant(r.uniform(0.5, 2, 5).astype(np.float32)), y)  # s * y
        y = tf.subtract(y, tf.constant(r.normal(size=(1, 5)).astype(np.float32)))  # y - t
        y = tf.math.divide(y, tf.constant(r.uniform(1, 2, 5).astype(np.float32)))
        tf.nn.relu(y, name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_folds_any_order_of_mul_add_sub_div(transpose_b):
    result = optimize(_dense_graph(transpose_b))
    assert sorted(ops(result.graph_def)) == ["BiasAdd", "Const", "Const", "MatMul",
                                              "Placeholder", "Relu"]
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_batch_norm_after_nothing_foldable_becomes_mul_and_bias_add(data_format):
    r = np.random.default_rng(24)
    with tf1.v1_graph() as graph:
        shape = [2, 5, 5, 3] if data_format == "NHWC" else [2, 3, 5, 5]
        x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
        y = tf.nn.relu(x)
        bn = {k: tf.constant(v) for k, v in tf1.random_bn(r, 3).items()}
        tf.identity(tf1.fused_bn(y, bn, data_format=data_format), name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]))
    assert sorted(set(ops(result.graph_def)) - {"Const"}) == ["BiasAdd", "Identity", "Mul",
                                                             "Placeholder", "Relu"]
    assert_matches(result, 1e-5)


def test_constant_folding_never_folds_random_ops_or_blows_up():
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [4], name="input")
        big = tf.fill([512, 1024], tf.constant(2.0))            # 2 MiB from 8 bytes of input
        noise = tf.random.uniform([4], seed=1)
        folded = tf.math.rsqrt(tf.constant([4.0, 16.0, 1.0, 0.25]) + 0.0)
        tf.add(tf.reduce_sum(x * folded + noise), big, name="output")
    gd = graph.as_graph_def()
    options = Options(inputs=["input"], outputs=["output"])
    out, reports = pipeline.run(gd, ["fold-constants"], options)
    kept = set(ops(out))
    assert {"RandomUniform", "Fill"} <= kept and "Rsqrt" not in kept
    skipped = reports[0].skipped
    assert [node for node, why in skipped if "bytes" in why] == [big.op.name]
    value = Graph(out).const_value(next(n.name for n in out.node if n.name.endswith("Rsqrt")))
    np.testing.assert_allclose(value, [0.5, 0.25, 1.0, 2.0])


# ---------------------------------------------------------------- SavedModel and .keras inputs
@pytest.fixture(scope="module")
def keras_model():
    import keras
    inp = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(4, 3, name="conv")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling2D()(
        keras.layers.ReLU()(x)))
    model = keras.Model(inp, x)
    r = np.random.default_rng(25)
    for w in model.weights:                     # nothing at its fresh value: biases, BN stats
        w.assign(r.uniform(0.5, 1.5, w.shape).astype(np.float32))
    return model


@pytest.mark.parametrize("kind", ["keras", "saved_model"])
def test_saved_model_and_keras_files_are_frozen_with_real_names(keras_model, tmp_path, kind):
    path = tmp_path / ("m.keras" if kind == "keras" else "sm")
    keras_model.save(path) if kind == "keras" else keras_model.export(str(path), verbose=False)
    source = api.load(path)
    assert source.inputs == ["image"] and source.outputs
    result = api.optimize(source, api.choose_transforms(bn_fold=True))
    assert_lean(result)
    expected = keras_model(np.ones((1, 8, 8, 3), np.float32)).numpy()
    from tfsurgery.verify.check import run_graph
    actual = run_graph(result.graph_def, {"image": np.ones((1, 8, 8, 3), np.float32)},
                       result.outputs)[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-5)
    assert api.default_output_path(source).name == f"{path.stem}_optimized.pb"


def test_unknown_signature_and_unfrozen_graph_are_clear_errors(keras_model, tmp_path):
    keras_model.export(str(tmp_path / "sm"), verbose=False)
    with pytest.raises(io.InputError, match="no signature 'nope'.*serving_default"):
        api.load(tmp_path / "sm", signature="nope")
    with tf1.v1_graph() as graph:
        v = tf.compat.v1.get_variable("w", [2], use_resource=False)
        tf.identity(v * 2.0, name="output")
    (tmp_path / "vars.pb").write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(io.InputError, match="still holds variables.*freeze.*SavedModel"):
        api.load(tmp_path / "vars.pb")


# ---------------------------------------------------------------- Keras applications (slow)
@pytest.mark.slow
@pytest.mark.parametrize("name, max_nodes", [("MobileNetV2", 275), ("ResNet50", 300),
                                             ("EfficientNetB0", None)])
def test_keras_applications_reach_the_floor(name, max_nodes):
    built = keras_models.keras_application(name, seed=26)
    result = optimize(built)
    assert_lean(result, tolerance=1e-4)
    if max_nodes:
        assert len(result.graph_def.node) <= max_nodes
    assert "IdentityN" not in ops(result.graph_def)


@pytest.mark.parametrize("data_format", ["NDHWC", "NCDHW"])
def test_conv3d_with_fused_batch_norm_folds_in_both_layouts(data_format):
    r = np.random.default_rng(27)
    with tf1.v1_graph() as graph:
        shape = [2, 4, 4, 4, 3] if data_format == "NDHWC" else [2, 3, 4, 4, 4]
        x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
        kernel = tf.constant(r.standard_normal((2, 2, 2, 3, 5)).astype(np.float32))
        y = tf.raw_ops.Conv3D(input=x, filter=kernel, strides=[1] * 5, padding="SAME",
                              data_format=data_format)
        bn = {k: tf.constant(v) for k, v in tf1.random_bn(r, 5).items()}
        tf.nn.relu(tf1.fused_bn(y, bn, data_format=data_format), name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]))
    assert sorted(set(ops(result.graph_def))) == ["BiasAdd", "Const", "Conv3D", "Placeholder",
                                                  "Relu"]
    assert_matches(result, 1e-5)
