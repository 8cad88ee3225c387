"""The graph builders build, run, and look the way the transforms' tests expect."""
import collections

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery.models import keras_models, synthetic, tf1

import oracle


# --- helpers ----------------------------------------------------------------------------------

def run(model, training=None, batch=2, seed=1):
    """Run the frozen graph's first output on seeded random inputs (the tests' own oracle)."""
    feeds = oracle.random_feeds(model.graph_def, model.inputs, seed, batch=batch)
    if training is not None:
        feeds[model.training_flag] = training
    return oracle.run(model.graph_def, feeds, model.outputs[:1])[0]


def ops(model):
    return collections.Counter(n.op for n in model.graph_def.node)


def nodes(model):
    return {n.name: n for n in model.graph_def.node}


def consumers(model):
    """input reference ("name" or "name:1") -> names of the nodes reading it."""
    out = collections.defaultdict(list)
    for n in model.graph_def.node:
        for ref in n.input:
            out[ref].append(n.name)
    return out


def const_value(model, name):
    return tf.make_ndarray(nodes(model)[name].attr["value"].tensor)


def assert_params_randomised(model):
    """No float weight Const is constant-valued (all zeros, all ones...): fresh-init values hide
    folding bugs."""
    for n in model.graph_def.node:
        if n.op != "Const":
            continue
        value = tf.make_ndarray(n.attr["value"].tensor)
        if value.dtype.kind == "f" and value.size > 1:
            assert np.ptp(value) > 0, f"{n.name} is constant-valued: {value.ravel()[:4]}"


def assert_bn_stats_random(model):
    """TF1-style Consts named .../moving_mean etc. have random, valid values."""
    found = collections.Counter()
    for n in model.graph_def.node:
        leaf = n.name.rsplit("/", 1)[-1]
        if n.op != "Const" or leaf not in ("moving_mean", "moving_variance", "gamma", "beta"):
            continue
        value = const_value(model, n.name)
        found[leaf] += 1
        assert np.all(value != 0), n.name
        if leaf == "moving_variance":
            assert np.all(value > 0), n.name
        if leaf in ("moving_variance", "gamma"):
            assert not np.allclose(value, 1.0), n.name
    assert found and len(set(found.values())) == 1, found


def assert_runs(model):
    y = run(model)
    assert np.all(np.isfinite(y))
    return y


def assert_training_flag_works(model):
    """Default == False; True changes the output (batch-statistics BN, dropout)."""
    default, off, on = run(model), run(model, False), run(model, True)
    assert np.all(np.isfinite(off)) and np.all(np.isfinite(on))
    np.testing.assert_array_equal(default, off)
    assert not np.allclose(off, on)


def run_or_skip_nchw(model):
    """NCHW models run on every CPU: the oracle wraps NCHW ops in transposes where oneDNN is
    off (tests/oracle.py)."""
    return assert_runs(model)


# --- the article's model ----------------------------------------------------------------------

@pytest.mark.parametrize("version,op", [("V1", "FusedBatchNorm"), ("V2", "FusedBatchNormV2"),
                                        ("V3", "FusedBatchNormV3")])
def test_article_cnn(version, op):
    m = tf1.article_cnn(bn_version=version)
    assert (m.inputs, m.outputs, m.training_flag) == (["input"], ["output"], "training")
    counts = ops(m)
    assert counts[op] == 6 and counts["Conv2D"] == 3 and counts["MaxPool"] == 3
    assert counts["Switch"] > 0 and counts["Merge"] == 6
    by_name = nodes(m)
    for i in (1, 2, 3):
        for name in ("conv_{i}/kernel", "conv_{i}/bias", "conv_{i}/Conv2D", "conv_{i}/BiasAdd",
                     "bn_{i}/gamma", "bn_{i}/beta", "bn_{i}/moving_mean",
                     "bn_{i}/moving_variance"):
            assert f"backend/{name.format(i=i)}" in by_name
        inference_bn = by_name[f"backend/bn_{i}/cond/FusedBatchNorm_1"]
        assert inference_bn.op == op and not inference_bn.attr["is_training"].b
        assert by_name[f"backend/bn_{i}/cond/FusedBatchNorm"].attr["is_training"].b
    assert by_name["head/dense/MatMul"].op == "MatMul"
    assert by_name["output"].op == "Softmax"
    assert_bn_stats_random(m)
    assert_params_randomised(m)
    assert_training_flag_works(m)


def test_article_cnn_size_knobs():
    m = tf1.article_cnn(image_size=8, channels=(2, 3, 4), classes=3, seed=5)
    assert run(m).shape == (2, 3)


# --- small TF1 graphs -------------------------------------------------------------------------

@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("bias,bias_op", [("biasadd", "BiasAdd"), ("add", "AddV2"),
                                          ("add_swapped", "AddV2"), (None, None)])
def test_conv_bn(data_format, bias, bias_op):
    m = tf1.conv_bn(data_format=data_format, bias=bias)
    by_name = nodes(m)
    conv = by_name["conv/Conv2D"]
    assert conv.attr["data_format"].s.decode() == data_format
    bn = by_name["bn/FusedBatchNorm"]
    assert bn.op == "FusedBatchNormV3" and bn.attr["data_format"].s.decode() == data_format
    assert not bn.attr["is_training"].b
    if bias_op:
        assert by_name[bn.input[0]].op == bias_op
        bias_input = 0 if bias == "add_swapped" else 1
        assert by_name[bn.input[0]].input[bias_input] == "conv/bias/read"
    else:
        assert bn.input[0] == "conv/Conv2D"
    assert_bn_stats_random(m)
    y = run_or_skip_nchw(m)
    assert y.shape == ((2, 4, 6, 6) if data_format == "NCHW" else (2, 6, 6, 4))


@pytest.mark.parametrize("version,op", [("V1", "FusedBatchNorm"), ("V2", "FusedBatchNormV2")])
def test_conv_bn_versions(version, op):
    m = tf1.conv_bn(bn_version=version, cin=2, cout=5, size=4, batch=3)
    assert ops(m)[op] == 1
    assert assert_runs(m).shape == (3, 4, 4, 5)


@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_depthwise_bn(multiplier, data_format):
    m = tf1.depthwise_bn(multiplier=multiplier, data_format=data_format)
    assert ops(m)["DepthwiseConv2dNative"] == 1 and ops(m)["FusedBatchNormV3"] == 1
    assert const_value(m, "depthwise/kernel").shape == (3, 3, 3, multiplier)
    assert_bn_stats_random(m)
    y = run_or_skip_nchw(m)
    assert y.shape[1 if data_format == "NCHW" else -1] == 3 * multiplier


def test_shared_weights_bn():
    m = tf1.shared_weights_bn()
    readers = consumers(m)["shared_kernel"]
    assert sorted(nodes(m)[r].op for r in readers) == ["Conv2D", "Conv2D"]
    assert ops(m)["FusedBatchNormV3"] == 2
    assert_bn_stats_random(m)
    assert_runs(m)


def test_multi_consumer_bn():
    m = tf1.multi_consumer_bn()
    assert sorted(consumers(m)["conv/Conv2D"]) == ["bn/FusedBatchNorm", "output"]
    assert_runs(m)


def test_training_bn():
    m = tf1.training_bn()
    assert nodes(m)["bn/FusedBatchNorm"].attr["is_training"].b
    y = assert_runs(m)
    assert not np.allclose(y, run(tf1.conv_bn()))  # batch statistics, not the moving ones


def test_nonconst_weights_bn():
    m = tf1.nonconst_weights_bn()
    assert m.inputs == ["input", "kernel"]
    assert nodes(m)["conv/Conv2D"].input[1] == "kernel"
    assert nodes(m)["kernel"].op == "Placeholder"
    assert_runs(m)


def test_cond_dropout():
    m = tf1.cond_dropout()
    counts = ops(m)
    assert counts["Switch"] > 0 and counts["Merge"] == 1
    random_ops = [n.name for n in m.graph_def.node if n.op == "RandomUniform"]
    assert any("cond" not in name for name in random_ops)   # dropout on the inference path
    assert any("cond" in name for name in random_ops)       # and one under the cond
    off = run(m, False)
    assert np.all(np.isfinite(off))
    assert not np.allclose(off, run(m, False))  # the unconditional dropout is random
    assert_params_randomised(m)


def test_nested_cond():
    m = tf1.nested_cond()
    by_name, readers = nodes(m), consumers(m)
    # nested: the inner cond's predicate is itself switched by the outer cond
    inner_pred = by_name["outer/cond/inner/pred_id"]
    assert by_name[inner_pred.input[0].split(":")[0]].op == "Switch"
    # one Switch, both ports read, feeding two different Merges
    shared = by_name["shared/switch"]
    assert shared.op == "Switch" and readers["shared/switch"] and readers["shared/switch:1"]
    merges = {c for port in ("shared/switch", "shared/switch:1")
              for reader in readers[port] for c in readers[reader]}
    assert merges == {"shared/merge_a", "shared/merge_b"}
    assert [by_name[c].op for c in readers["shared/merge_b:1"]] == ["Cast"]  # value_index
    assert ops(m)["Merge"] == 4
    assert_training_flag_works(m)


def test_while_loop():
    m = tf1.while_loop()
    counts = ops(m)
    for op in ("Enter", "Exit", "NextIteration", "LoopCond", "Switch", "Merge"):
        assert counts[op] > 0, op
    assert_training_flag_works(m)


def test_mixed_precision_bn():
    m = tf1.mixed_precision_bn()
    by_name = nodes(m)
    bn = by_name["bn/FusedBatchNorm"]
    assert bn.op == "FusedBatchNormV3"
    assert bn.attr["T"].type == tf.float16.as_datatype_enum
    assert bn.attr["U"].type == tf.float32.as_datatype_enum
    assert by_name["conv/Conv2D"].attr["T"].type == tf.float16.as_datatype_enum
    assert const_value(m, "conv/kernel").dtype == np.float16
    assert_bn_stats_random(m)
    assert run(m).dtype == np.float32 and np.all(np.isfinite(run(m)))


def test_seed_changes_weights():
    a, b = tf1.conv_bn(seed=0), tf1.conv_bn(seed=1)
    assert not np.allclose(const_value(a, "conv/kernel"), const_value(b, "conv/kernel"))
    np.testing.assert_array_equal(const_value(a, "bn/moving_mean"),
                                  const_value(tf1.conv_bn(seed=0), "bn/moving_mean"))


def test_tf1_builders_restore_control_flow_v2():
    assert tf.compat.v1.control_flow_v2_enabled()
    tf1.article_cnn()
    assert tf.compat.v1.control_flow_v2_enabled()


# --- Keras ------------------------------------------------------------------------------------

def assert_keras3_graph(m):
    by_name = nodes(m)
    assert by_name[m.inputs[0]].op == "Placeholder"
    assert by_name[m.outputs[0]].op == "Identity"
    assert m.training_flag is None
    counts = ops(m)
    assert not any(op.startswith("FusedBatchNorm") for op in counts)  # Keras 3 decomposes BN
    assert counts["Rsqrt"] > 0
    assert_params_randomised(m)
    y = run(m, batch=3)
    assert np.all(np.isfinite(y))
    assert np.ptp(y, axis=0).max() > 0  # output depends on the input
    return counts


def test_keras3_small():
    counts = assert_keras3_graph(keras_models.keras3_small())
    assert counts["Conv2D"] == 2 and counts["DepthwiseConv2dNative"] == 1
    assert counts["MatMul"] == 2 and counts["Rsqrt"] == 4


def test_keras3_conv3d():
    assert assert_keras3_graph(keras_models.keras3_conv3d())["Conv3D"] == 1


def test_keras3_conv_transpose():
    assert assert_keras3_graph(keras_models.keras3_conv_transpose())["Conv2DBackpropInput"] == 1


@pytest.mark.parametrize("name", [
    "MobileNetV2",
    pytest.param("ResNet50", marks=pytest.mark.slow),
    pytest.param("EfficientNetB0", marks=pytest.mark.slow),
])
def test_keras_application(name):
    m = keras_models.keras_application(name)
    assert assert_keras3_graph(m)["Conv2D"] > 30
    assert run(m).shape == (2, 1000)


def test_tf_keras_model():
    m = keras_models.tf_keras_model()
    assert m.training_flag == "keras_learning_phase"
    assert nodes(m)["keras_learning_phase"].op == "PlaceholderWithDefault"
    counts = ops(m)
    for op in ("Switch", "Merge", "FusedBatchNormV3", "DepthwiseConv2dNative",
               "SpaceToBatchND", "RandomUniform"):
        assert counts[op] > 0, op
    assert_params_randomised(m)
    assert_training_flag_works(m)


def test_tf1_after_keras_still_v1_control_flow():
    """Builders of both kinds share one pytest process without leaking global state."""
    keras_models.keras3_conv3d()
    assert ops(tf1.cond_dropout())["Switch"] > 0
    assert ops(keras_models.keras3_conv3d())["Switch"] == 0


# --- synthetic --------------------------------------------------------------------------------

def test_repeated_blocks():
    m = synthetic.repeated_blocks(5, channels=4, size=6)
    assert len(m.graph_def.node) == 10 * 5 + 2
    counts = ops(m)
    assert counts["Conv2D"] == counts["FusedBatchNormV3"] == counts["Relu"] == 5
    assert counts["Const"] == 6 * 5  # every block has its own weight Consts
    assert_bn_stats_random(m)
    y = assert_runs(m)
    assert y.shape == (2, 6, 6, 4) and np.any(y != 0)


def test_repeated_blocks_scale():
    assert len(synthetic.repeated_blocks(20000).graph_def.node) == 200002  # ~1 s to build
    y = assert_runs(synthetic.repeated_blocks(300))
    assert np.any(y != 0)
