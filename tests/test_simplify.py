"""simplify-arithmetic: every rule on a small random graph, the refusals, and random chains of
no-ops thrown at it (the numbers must not move)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from conftest import assert_matches, ops, optimize, property_examples, report_of
from tfsurgery.contract import Options
from tfsurgery.models.common import BuiltModel

R = np.random.default_rng(11)


def build(body, shape=(2, 3, 4)):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
        tf.identity(body(x * tf.constant(R.standard_normal(shape[-1]).astype(np.float32))),
                    name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


NO_OPS = {
    "x*1": lambda x: x * 1.0,
    "1*x": lambda x: tf.math.multiply(tf.constant(1.0), x),
    "x+0": lambda x: x + 0.0,
    "0+x": lambda x: tf.math.add(tf.constant(0.0), x),
    "x-0": lambda x: x - 0.0,
    "x/1": lambda x: x / 1.0,
    "cast": lambda x: tf.raw_ops.Cast(x=x, DstT=tf.float32),
    "neg-neg": lambda x: -(-x),
    "transpose-identity": lambda x: tf.transpose(x, [0, 1, 2]),
    "transpose-pair": lambda x: tf.transpose(tf.transpose(x, [0, 2, 1]), [0, 2, 1]),
    "reshape-same": lambda x: tf.reshape(x, [2, 3, 4]),
    "reshape-reshape": lambda x: tf.reshape(tf.reshape(x, [6, 4]), [2, 3, 4]) * 2.0,
    "x+zeros[4]": lambda x: x + tf.zeros([4]),
    "expand-squeeze": lambda x: tf.squeeze(tf.expand_dims(x, 1), [1]),
}


@pytest.mark.parametrize("rule", sorted(NO_OPS))
def test_each_no_op_goes_and_the_numbers_hold(rule):
    built = build(NO_OPS[rule])
    result = optimize(built, bn_fold=False)
    assert report_of(result, "simplify-arithmetic").rewritten, rule
    assert not {"Neg", "Cast", "Transpose", "Sub", "RealDiv"} & set(ops(result.graph_def))
    assert ops(result.graph_def).count("Reshape") <= 1
    assert_matches(result, 0.0)


def test_transposes_that_do_not_cancel_become_one():
    built = build(lambda x: tf.transpose(tf.transpose(x, [1, 0, 2]), [0, 2, 1]))
    result = optimize(built, bn_fold=False)
    assert ops(result.graph_def).count("Transpose") == 1
    assert_matches(result, 0.0)


def test_times_zero_is_never_simplified():
    built = build(lambda x: x * 0.0 + 1.0)
    result = optimize(built, bn_fold=False)
    assert "Mul" in ops(result.graph_def)


def test_a_broadcasting_neutral_constant_is_kept():
    """x[2,3] + zeros[1,1,3]: the result has rank 3, not x's rank 2."""
    built = build(lambda x: x + tf.zeros([1, 1, 3]), shape=(2, 3))
    result = optimize(built, bn_fold=False)
    assert "AddV2" in ops(result.graph_def)
    assert_matches(result, 1e-4)


def test_unknown_shapes_are_refused_with_a_reason():
    built = build(lambda x: x + tf.zeros([4]), shape=(None, None, 4))
    result = optimize(built, bn_fold=False)
    assert "AddV2" in ops(result.graph_def)
    assert any("not known" in why for _, why in report_of(result, "simplify-arithmetic").skipped)


def test_an_output_that_is_a_no_op_keeps_its_name():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        tf.math.multiply(tf.nn.relu(x), 1.0, name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]), bn_fold=False)
    output = next(n for n in result.graph_def.node if n.name == "output")
    assert output.op == "Identity"
    assert_matches(result, 1e-4)


@settings(max_examples=property_examples(default=25), deadline=None)
@given(st.lists(st.sampled_from(sorted(NO_OPS)), min_size=1, max_size=6))
def test_random_chains_of_no_ops_change_nothing(chain):
    def body(x):
        for rule in chain:
            x = tf.nn.relu(NO_OPS[rule](x)) - 0.5
        return x
    result = optimize(build(body), bn_fold=False)
    assert_matches(result, 1e-6)


# ---------------------------------------------------------------- merge-duplicates
def test_duplicate_subgraphs_merge_to_a_fixpoint():
    """Two copies of relu(x*W + b) with equal (separately stored) constants become one."""
    w = R.standard_normal(4).astype(np.float32)
    b = R.standard_normal(4).astype(np.float32)

    def body(x):
        one = tf.nn.relu(x * tf.constant(w) + tf.constant(b))
        two = tf.nn.relu(x * tf.constant(w.copy()) + tf.constant(b.copy()))
        return one * two
    from tfsurgery.transforms import DEFAULT_TRANSFORMS, ORDER
    chosen = [n for n in ORDER if n in DEFAULT_TRANSFORMS or n == "merge-duplicates"]
    # exact: no constant push-down into the input's own scale (x*c0)*W, which is not bit-exact
    result = optimize(build(body), chosen, bn_fold=False, exact=True)
    merged = report_of(result, "merge-duplicates")
    assert len(merged.rewritten) >= 5         # 2 consts, Mul, AddV2, Relu
    assert ops(result.graph_def).count("Relu") == 1
    assert_matches(result, 0.0)


def _passes_run(monkeypatch):
    """The names of the passes the pipeline runs, in order, as it runs them."""
    from tfsurgery import pipeline
    calls, run_pass = [], pipeline._run_pass

    def recording(graph, name, options):
        calls.append(name)
        return run_pass(graph, name, options)
    monkeypatch.setattr(pipeline, "_run_pass", recording)
    return calls


def test_equal_constants_merged_alone_do_not_rerun_passes_that_read_constants_by_value(
        monkeypatch):
    """Blocks with equal weights fold into equal constants, which merge-duplicates merges: no
    reader of anything else changed, so fold-batch-norm and fold-affine (which read constants by
    value, and ran after every other change) are not run again for it; simplify-arithmetic,
    which does not say so, still is."""
    from tfsurgery.models.synthetic import repeated_blocks
    built = repeated_blocks(3, seed=5)
    calls = _passes_run(monkeypatch)
    result = optimize(built, bn_fold=True)
    merged = report_of(result, "merge-duplicates")
    assert len(merged.rewritten) >= 4 and merged.shared_constants_only
    for name in ("fold-batch-norm", "fold-affine-into-linear"):
        assert calls.count(name) == 1, (name, calls)
    assert calls.count("simplify-arithmetic") == 2, calls
    assert "FusedBatchNormV3" not in ops(result.graph_def)
    assert "fixpoint reached" in result.reports[-1].notes[-1]
    assert_matches(result, 1e-5)


def test_merged_equal_nodes_that_are_not_constants_run_the_folds_again():
    """A conv read by two equal batch norms cannot fold (two readers); once merge-duplicates
    makes them one, fold-batch-norm runs again and folds it."""
    kernel = R.standard_normal((3, 3, 3, 4)).astype(np.float32)
    params = [R.uniform(0.5, 1.5, 4), R.standard_normal(4), R.standard_normal(4),
              R.uniform(0.5, 2.0, 4)]
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, (2, 6, 6, 3), name="input")
        conv = tf.nn.conv2d(x, tf.constant(kernel), 1, "SAME")

        def bn():
            gamma, beta, mean, var = (tf.constant(p.astype(np.float32)) for p in params)
            return tf.compat.v1.nn.fused_batch_norm(conv, gamma, beta, mean, var,
                                                    is_training=False)[0]
        tf.identity(tf.nn.relu(bn()) * bn(), name="output")
    built = BuiltModel(graph.as_graph_def(), ["input"], ["output"])
    result = optimize(built, bn_fold=True)
    assert "FusedBatchNormV3" not in ops(result.graph_def)
    assert any("FusedBatchNorm" in line for line in report_of(result, "merge-duplicates").rewritten)
    assert_matches(result, 1e-5)


def test_random_ops_and_different_values_never_merge():
    def body(x):
        noise = tf.random.uniform([4], seed=1) + tf.random.uniform([4], seed=1)
        return x * tf.constant([1.0, 2, 3, 4]) + x * tf.constant([1.0, 2, 3, 5]) + noise * 0
    built = build(body)
    graph_def = optimize(built, ["merge-duplicates"], bn_fold=False, verify=False).graph_def
    assert ops(graph_def).count("RandomUniform") == 2
    assert ops(graph_def).count("Mul") >= 2


# ---------------------------------------------------------------- fold-pad-into-conv
def _padded_conv(conv, *, pad_value=0.0, mirror=False, other_reader=False, padding="VALID",
                 shape=(1, 9, 8, 3), paddings=((0, 0), (1, 2), (2, 1), (0, 0)), dilation=1):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
        if mirror:
            padded = tf.pad(x, paddings, mode="REFLECT")
        else:
            padded = tf.pad(x, paddings, constant_values=pad_value)
        kernel = tf.constant(R.standard_normal((3, 3, 3, 2)).astype(np.float32))
        if conv == "Conv2D" and dilation > 1:
            y = tf.nn.conv2d(padded, kernel, 1, padding, dilations=dilation)
        elif conv == "Conv2D":
            y = tf.nn.conv2d(padded, kernel, [1, 2, 2, 1], padding)
        else:
            y = tf.nn.depthwise_conv2d(padded, kernel, [1, 2, 2, 1], padding)
        if other_reader:
            y = tf.reduce_sum(y) + tf.reduce_sum(padded)
        tf.identity(y, name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


@pytest.mark.parametrize("conv", ["Conv2D"])
def test_a_zero_pad_becomes_the_convs_explicit_padding(conv):
    result = optimize(_padded_conv(conv), bn_fold=False)
    assert report_of(result, "fold-pad-into-conv").rewritten
    assert not {"Pad", "PadV2"} & set(ops(result.graph_def))
    node = next(n for n in result.graph_def.node if n.op == conv)
    assert node.attr["padding"].s == b"EXPLICIT"
    assert list(node.attr["explicit_paddings"].list.i) == [0, 0, 1, 2, 2, 1, 0, 0]
    assert_matches(result, 1e-5)


@pytest.mark.parametrize("case,why", [
    (dict(mirror=True), None), (dict(pad_value=1.5), "not zero"),
    (dict(other_reader=True), "other readers")])
def test_pads_that_are_not_zero_borders_of_one_conv_stay(case, why):
    result = optimize(_padded_conv("Conv2D", **case), bn_fold=False)
    assert {"Pad", "PadV2", "MirrorPad"} & set(ops(result.graph_def))
    skipped = report_of(result, "fold-pad-into-conv").skipped
    assert why is None or any(why in reason for _, reason in skipped)
    assert_matches(result, 1e-4)


@pytest.mark.parametrize("conv,shape,paddings,dilation", [
    # Keras' correct_pad before a stride-2 conv on an even size: one row/column after
    ("Conv2D", (1, 8, 6, 3), ((0, 0), (0, 1), (0, 1), (0, 0)), 1),
    ("DepthwiseConv2dNative", (1, 8, 6, 3), ((0, 0), (0, 1), (0, 1), (0, 0)), 1),
    # odd size, stride 2, k 3: SAME adds one on each side
    ("DepthwiseConv2dNative", (1, 9, 7, 3), ((0, 0), (1, 1), (1, 1), (0, 0)), 1),
    # stride 1, dilation 2, k 3: SAME adds two on each side
    ("Conv2D", (1, 7, 7, 3), ((0, 0), (2, 2), (2, 2), (0, 0)), 2)])
def test_a_pad_that_is_same_padding_makes_the_conv_same(conv, shape, paddings, dilation):
    result = optimize(_padded_conv(conv, shape=shape, paddings=paddings, dilation=dilation),
                      bn_fold=False)
    assert not {"Pad", "PadV2"} & set(ops(result.graph_def))
    node = next(n for n in result.graph_def.node if n.op == conv)
    assert node.attr["padding"].s == b"SAME"
    assert_matches(result, 1e-5)


def test_a_pad_that_is_not_same_padding_stays_before_a_depthwise_conv():
    """Depthwise + EXPLICIT padding aborts TF under Grappler's remapper (see the transform's doc;
    tests/test_deploy.py runs such a model through a loaded SavedModel)."""
    result = optimize(_padded_conv("DepthwiseConv2dNative"), bn_fold=False)
    assert "Pad" in set(ops(result.graph_def))
    skipped = report_of(result, "fold-pad-into-conv").skipped
    assert any("depthwise" in reason for _, reason in skipped)
    assert_matches(result, 1e-4)


def test_string_constants_merge_by_content_only():
    from tfsurgery.graph import Graph
    from tfsurgery.contract import Options
    from tfsurgery.transforms.merge_duplicates import merge_duplicates
    with tf.Graph().as_default() as graph:
        a, b, c = tf.constant(["x", "y"]), tf.constant(["x", "y"]), tf.constant(["x", "z"])
        tf.identity(tf.strings.join([a, b, c]), name="output")
    index = Graph(graph.as_graph_def())
    report = merge_duplicates(index, Options(outputs=["output"]))
    assert len(report.rewritten) == 1 and sum(n.op == "Const" for n in index) == 2


# ---------------------------------------------------------------- the pipeline's fixpoint
def test_passes_repeat_while_one_exposes_work_for_another():
    """A dead reader keeps the inner Transpose shared, so simplify-arithmetic must wait: prune
    removes the reader, and only a second round composes the pair (and drops it)."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3, 4], name="input")
        inner = tf.transpose(x * tf.constant(R.standard_normal(4).astype(np.float32)), [0, 2, 1])
        tf.nn.relu(inner, name="dead_reader")
        tf.identity(tf.transpose(inner, [0, 2, 1]) + 1.0, name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]), bn_fold=False)
    assert "Transpose" not in ops(result.graph_def)
    simplify = report_of(result, "simplify-arithmetic")
    assert any(note.startswith("round 2:") for note in simplify.notes)
    assert len(simplify.rewritten) == 1 and simplify.removed_nodes == 1   # booked once each
    assert [r.name for r in result.reports].count("simplify-arithmetic") == 1
    assert "fixpoint reached" in report_of(result, "prune").notes[-1]
    assert_matches(result, 0.0)


def test_the_fixpoint_is_bounded(monkeypatch):
    """Two passes that keep changing the graph for each other stop at MAX_ROUNDS, and the
    report says so."""
    from tfsurgery import pipeline
    from tfsurgery.contract import TransformReport
    calls = []

    def restless(name):
        def run(graph, options):
            calls.append(name)
            graph.remove([graph.add_const("restless", 1.0)])
            report = TransformReport(name)
            report.rewritten.append("again")
            return report
        run.repeat, run.transform_name = True, name
        return run
    for name in ("remove-identity", "prune"):
        monkeypatch.setitem(pipeline.REGISTRY, name, restless(name))
    built = build(lambda x: x * 2.0)
    _, reports = pipeline.run(built.graph_def, ["remove-identity", "prune"],
                              Options(outputs=["output"]))
    assert len(calls) == 2 * pipeline.MAX_ROUNDS
    assert len(reports) == 2 and len(reports[0].rewritten) == pipeline.MAX_ROUNDS
    assert "bound" in reports[-1].notes[-1]


def test_a_reshape_that_keeps_its_inputs_batch_gets_a_constant_shape():
    """Keras' Reshape layer: reshape(x, [shape(x)[0], 1, 1, C]) → reshape(x, [-1, 1, 1, C])."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 5, 5, 6], name="input")
        pooled = tf.reduce_mean(x * R.standard_normal(6).astype(np.float32), [1, 2])
        y = tf.reshape(pooled, tf.stack([tf.shape(pooled)[0], 1, 1, 6]))
        wrong = tf.reshape(pooled, tf.stack([tf.shape(pooled)[0], 2, 3]))   # 6 = 2*3: also fine
        tf.identity(y * tf.reduce_sum(wrong), name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]), bn_fold=False)
    assert not {"Shape", "Pack", "StridedSlice"} & set(ops(result.graph_def))
    assert len([r for r in report_of(result, "simplify-arithmetic").rewritten
                if "batch" in r]) == 2
    assert_matches(result, 1e-5)


def test_a_batch_reshape_with_unknown_inner_dims_is_kept():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 6], name="input")
        tf.identity(tf.reshape(x, tf.stack([tf.shape(x)[0], 1, 6])) * 2.0, name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]), bn_fold=False,
                      verify=False)
    assert "Shape" in ops(result.graph_def)


# ---------------------------------------------------------------- biases and reductions
def _two_branch_sum(*, other_reader=False, bias_shapes=((4,), (4,))):
    """conv_a(x) + b1 and conv_b(x) + b2, summed (ResNet's projection shortcut after BN folding)."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 5, 5, 3], name="input")
        branches = []
        for shape in bias_shapes:
            kernel = tf.constant(R.standard_normal((1, 1, 3, 4)).astype(np.float32))
            z = tf.nn.conv2d(x, kernel, 1, "VALID")
            branches.append(tf.nn.bias_add(z, tf.constant(
                R.standard_normal(shape).astype(np.float32))) if shape else z)
        y = tf.raw_ops.AddV2(x=branches[0], y=branches[1])
        if other_reader:
            y = y * tf.reduce_sum(branches[1])
        tf.identity(tf.nn.relu(y), name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


def test_two_summed_branches_keep_one_bias():
    result = optimize(_two_branch_sum(), bn_fold=False)
    assert ops(result.graph_def).count("BiasAdd") == 1
    assert any("one bias" in r for r in report_of(result, "simplify-arithmetic").rewritten)
    assert_matches(result, 1e-5)


def test_a_bias_someone_else_reads_stays():
    result = optimize(_two_branch_sum(other_reader=True), bn_fold=False)
    assert ops(result.graph_def).count("BiasAdd") == 2
    assert_matches(result, 1e-4)


def _mean_then_reshape(shape, axes, target, keep_reader=False, broadcast=True):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
        scaled = x * tf.constant(R.standard_normal(shape[-1]).astype(np.float32))
        mean = tf.reduce_mean(scaled, axes)
        y = tf.reshape(mean, target) * tf.constant(R.standard_normal(shape[-1]).astype(np.float32))
        if keep_reader:
            y = y + tf.reduce_sum(mean)
        tf.identity(scaled * y if broadcast else scaled * tf.reduce_sum(y), name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


def test_a_reshape_restoring_reduced_dims_becomes_keep_dims():
    """Keras' squeeze-excite: mean over H, W, then reshape to [-1, 1, 1, C]."""
    result = optimize(_mean_then_reshape([None, 5, 6, 4], [1, 2], [-1, 1, 1, 4]), bn_fold=False)
    assert "Reshape" not in ops(result.graph_def)
    mean = next(n for n in result.graph_def.node if n.op == "Mean")
    assert mean.attr["keep_dims"].b
    assert_matches(result, 1e-6)


@pytest.mark.parametrize("case", [
    dict(shape=[2, 5, 6, 4], axes=[1, 2], target=[2, 1, 4, 1], broadcast=False),   # dims moved
    dict(shape=[2, 5, 6, 4], axes=[1, 2], target=[-1, 1, 1, 4], keep_reader=True),
    dict(shape=[None, None, 6, 4], axes=[2], target=[-1, 6, 1, 4])])   # wrong size at axis 1
def test_reshapes_that_are_not_keep_dims_stay(case):
    result = optimize(_mean_then_reshape(**case), bn_fold=False,
                      verify=case["shape"][1] is not None)
    assert "Reshape" in ops(result.graph_def)
    if case["shape"][1] is not None:
        assert_matches(result, 1e-4)
