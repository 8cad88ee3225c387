"""Each transform, checked by running the original and the optimized graph on the same inputs."""
import numpy as np
import pytest

from conftest import assert_same_numbers, consumers_of, optimize, ops, report_of
from tfsurgery.models import tf1
from tfsurgery.contract import Options
from tfsurgery import pipeline
from tfsurgery.verify import check as verify
from tfsurgery.graph import Graph

import oracle

EXACT = 1e-5          # float32 folding error, relative to the output's magnitude


def assert_matches(result, tolerance=EXACT):
    """The oracle's numbers first, then the verifier's verdict agreeing."""
    assert_same_numbers(result, tolerance=tolerance)
    assert result.verification is not None and result.verification.passed
    assert result.verification.max_error < tolerance, result.verification.as_dict()


def assert_folded_into_convs(graph_def, conv_ops=("Conv2D",)):
    """No BN left; every conv is read by exactly one BiasAdd, and nothing else adds after it."""
    assert not [op for op in ops(graph_def) if op.startswith("FusedBatchNorm")]
    graph = Graph(graph_def)
    convs = [n.name for n in graph if n.op in conv_ops]
    assert convs
    for conv in convs:
        assert consumers_of(graph_def, conv) == ["BiasAdd"], conv
        bias_add = graph.consumers(conv)[0].node
        assert not {"BiasAdd", "Add", "AddV2", "Mul"} & set(consumers_of(graph_def, bias_add))


# ---------------------------------------------------------------- the article's model
def test_article_model_is_lean_and_exact(article):
    result = optimize(article)
    out = result.graph_def
    forbidden = {"Switch", "Merge", "RandomUniform", "PlaceholderWithDefault", "Identity"}
    assert not forbidden & set(ops(out))
    assert "training" not in {n.name for n in out.node}
    assert_folded_into_convs(out)
    assert ops(out).count("Conv2D") == 3
    assert_matches(result)


@pytest.mark.parametrize("version", ["V1", "V2"])
def test_article_model_with_older_fused_batch_norm(version):
    result = optimize(tf1.article_cnn(seed=3, bn_version=version))
    assert_folded_into_convs(result.graph_def)
    assert_matches(result)


def test_without_bn_fold_batch_norms_stay_but_conds_go(article):
    result = optimize(article, bn_fold=False)
    assert ops(result.graph_def).count("FusedBatchNormV3") == 3
    assert not {"Switch", "Merge"} & set(ops(result.graph_def))
    assert_matches(result)


def test_the_input_graph_def_is_not_mutated(article):
    before = article.graph_def.SerializeToString(deterministic=True)
    optimize(article, verify=False)
    assert article.graph_def.SerializeToString(deterministic=True) == before


def test_running_twice_changes_nothing_more(article):
    once = optimize(article, verify=False)
    built = tf1.BuiltModel(once.graph_def, article.inputs, article.outputs, None)
    twice = optimize(built, verify=False)
    assert twice.graph_def.SerializeToString(deterministic=True) == once.graph_def.SerializeToString(deterministic=True)


def test_folded_bias_add_takes_the_batch_norm_name(article):
    out = optimize(article).graph_def
    by_name = {n.name: n for n in out.node}
    for i in (1, 2, 3):
        assert by_name[f"backend/bn_{i}/cond/FusedBatchNorm_1"].op == "BiasAdd"


# ---------------------------------------------------------------- freeze-training-flags
def test_user_named_training_flag_is_frozen(article):
    renamed = article.graph_def.__class__()
    renamed.CopyFrom(article.graph_def)
    for n in renamed.node:
        n.name = "mode_switch" if n.name == "training" else n.name
        for i, text in enumerate(n.input):
            if text.lstrip("^") == "training":
                n.input[i] = text.replace("training", "mode_switch")
    built = tf1.BuiltModel(renamed, article.inputs, article.outputs, None)
    untouched = optimize(built, ["remove-switch-merge"], bn_fold=False, verify=False)
    assert "Switch" in ops(untouched.graph_def)      # not a known name: left alone
    # Unfed, a PlaceholderWithDefault is its default (False): that alone collapses the conds.
    by_default = optimize(built)
    assert report_of(by_default, "freeze-placeholder-defaults").rewritten == ["mode_switch"]
    assert "Switch" not in ops(by_default.graph_def)
    frozen = optimize(built, training_flags=["mode_switch"])
    assert report_of(frozen, "freeze-training-flags").rewritten == ["mode_switch"]
    assert "Switch" not in ops(frozen.graph_def)
    assert_matches(frozen)


# ---------------------------------------------------------------- remove-switch-merge
@pytest.fixture(scope="module")
def nested():
    return tf1.nested_cond(seed=5)


def test_nested_and_shared_conds_collapse_by_value(nested):
    result = optimize(nested)
    assert not {"Switch", "Merge"} & set(ops(result.graph_def))
    assert_matches(result)


def test_switch_merge_keeps_the_true_side_when_the_predicate_is_true(nested):
    # Make `training` a constant True by hand and compare with the original fed True.
    graph = Graph(nested.graph_def)
    flag = graph.edit_node("training")
    flag.op = "Const"
    for key in list(flag.attr):
        del flag.attr[key]
    graph.remove_input("training", 0)
    graph.set_const_value("training", True)
    options = Options(inputs=nested.inputs, outputs=nested.outputs)
    out, _ = pipeline.run(graph.to_graph_def(), ["remove-switch-merge", "prune"], options)
    assert not {"Switch", "Merge"} & set(ops(out))
    feeds = verify.make_feeds(nested.graph_def, nested.inputs, seed=1)
    expected = verify.run_graph(nested.graph_def, {**feeds, "training": True}, nested.outputs)
    actual = verify.run_graph(out, feeds, nested.outputs)
    off = verify.run_graph(nested.graph_def, {**feeds, "training": False}, nested.outputs)
    assert not np.allclose(expected[0], off[0])          # the two sides really differ
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-6)


def test_while_loops_survive():
    built = tf1.while_loop(seed=2)
    result = optimize(built)
    kept = set(ops(result.graph_def))
    assert {"Enter", "Exit", "NextIteration", "LoopCond", "Merge", "Switch"} <= kept
    assert "RandomUniform" not in kept
    assert_matches(result)


# ---------------------------------------------------------------- remove-dropout
def test_dropout_outside_a_cond_becomes_identity():
    built = tf1.cond_dropout(seed=4)
    feeds = verify.make_feeds(built.graph_def, built.inputs)
    first, second = (verify.run_graph(built.graph_def, feeds, built.outputs)[0] for _ in "ab")
    assert not np.allclose(first, second)          # the original really is random
    result = optimize(built)
    assert not {"RandomUniform", "GreaterEqual", "SelectV2", "Switch"} & set(ops(result.graph_def))
    dropout = report_of(result, "remove-dropout")
    assert len(dropout.rewritten) == 1 and "identity" in dropout.notes[0]
    assert "dropout" in result.verification.reference
    # The oracle's expected value, by hand: dropout off means dropout_1's output is its input
    # (SelectV2(u >= rate, x / keep, 0) has mean x) — fed as such to the original itself.
    feeds = oracle.random_feeds(built.graph_def, built.inputs, seed=8)
    relu = oracle.run(built.graph_def, feeds, ["dense_1/Relu"])[0]
    expected = oracle.run(built.graph_def, {**feeds, "training": False,
                                            "dropout_1/SelectV2": relu}, built.outputs)[0]
    actual = oracle.run(result.graph_def, feeds, result.outputs)[0]
    assert oracle.relative_error(expected, actual) < EXACT
    assert result.verification.passed and result.verification.max_error < EXACT


# ---------------------------------------------------------------- fold-batch-norm
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("bias", ["biasadd", "add", "add_swapped", None])
def test_conv_bn_folds(data_format, bias):
    built = tf1.conv_bn(seed=11, data_format=data_format, bias=bias)
    result = optimize(built)
    assert_folded_into_convs(result.graph_def)
    bias_add = next(n for n in result.graph_def.node if n.op == "BiasAdd")
    assert bias_add.attr["data_format"].s.decode() == data_format
    assert_matches(result)


@pytest.mark.parametrize("version", ["V1", "V2"])
def test_every_fused_batch_norm_version_folds(version):
    result = optimize(tf1.conv_bn(seed=12, bn_version=version))
    assert_folded_into_convs(result.graph_def)
    assert_matches(result)


@pytest.mark.parametrize("multiplier, data_format", [(1, "NHWC"), (2, "NHWC"), (3, "NCHW")])
def test_depthwise_bn_folds(multiplier, data_format):
    result = optimize(tf1.depthwise_bn(seed=13, multiplier=multiplier, data_format=data_format))
    assert_folded_into_convs(result.graph_def, ("DepthwiseConv2dNative",))
    assert_matches(result)


def test_shared_weights_are_copied_not_scaled_twice():
    result = optimize(tf1.shared_weights_bn(seed=14))
    assert_folded_into_convs(result.graph_def)
    graph = Graph(result.graph_def)
    kernels = {graph.inputs(n.name)[1].node for n in graph if n.op == "Conv2D"}
    assert len(kernels) == 2                                  # one copy per conv
    assert_matches(result)


def test_mixed_precision_folds_in_float32_and_casts_back():
    result = optimize(tf1.mixed_precision_bn(seed=15), tolerance=5e-3)     # half precision
    assert_folded_into_convs(result.graph_def)
    graph = Graph(result.graph_def)
    conv = next(n for n in graph if n.op == "Conv2D")
    assert graph.const_value(graph.inputs(conv.name)[1]).dtype == np.float16
    assert_matches(result, tolerance=5e-3)                     # half precision


@pytest.mark.parametrize("builder, reason", [
    (tf1.multi_consumer_bn, "other consumers"),
    (tf1.training_bn, "training-mode"),
    (tf1.nonconst_weights_bn, "not constant"),
])
def test_unsafe_folds_leave_the_graph_alone_and_say_why(builder, reason):
    built = builder(seed=16)
    without = optimize(built, bn_fold=False, verify=False)
    result = optimize(built)
    assert result.graph_def.SerializeToString(deterministic=True) == without.graph_def.SerializeToString(deterministic=True)
    skipped = report_of(result, "fold-batch-norm").skipped
    assert skipped and all(reason in why for _, why in skipped), skipped
    if builder is not tf1.training_bn:     # batch statistics: the original is batch-dependent
        assert_matches(result)


# ---------------------------------------------------------------- remove-identity, prune
def test_identity_outputs_keep_their_names_and_dead_nodes_go():
    built = tf1.cond_dropout(seed=6)            # output is an Identity
    result = optimize(built, bn_fold=False)
    by_name = {n.name: n for n in result.graph_def.node}
    assert by_name["output"].op == "Identity"
    assert ops(result.graph_def).count("Identity") == 1
    graph = Graph(result.graph_def)
    assert graph.ancestors(["output"]) == set(graph.nodes)   # nothing unreachable left


def test_conds_on_data_dependent_predicates_are_kept_and_still_match():
    import tensorflow as tf
    from tfsurgery.models.common import BuiltModel
    r = np.random.default_rng(31)
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="input")
        training = tf1.training_placeholder()
        w = tf.constant(r.standard_normal((4, 4)).astype(np.float32))
        y = tf.compat.v1.cond(tf.reduce_mean(x) > 0, lambda: tf.matmul(x, w), lambda: -x)
        y = tf.compat.v1.cond(training, lambda: y * 2.0, lambda: tf.identity(y))
        tf.identity(y, name="output")
    built = BuiltModel(graph.as_graph_def(), ["input"], ["output"], "training")
    result = optimize(built)
    kept = ops(result.graph_def)
    assert kept.count("Switch") >= 2 and kept.count("Merge") == 1     # the data-dependent cond
    assert "training" not in {n.name for n in result.graph_def.node}
    assert_matches(result)
    for seed in (1, 2, 3):        # both sides of the kept cond
        feeds = verify.make_feeds(built.graph_def, built.inputs, seed=seed)
        feeds["input"] += seed - 2.0
        expected = verify.run_graph(built.graph_def, feeds, built.outputs)[0]
        np.testing.assert_allclose(verify.run_graph(result.graph_def, feeds, built.outputs)[0],
                                   expected, rtol=1e-6)
