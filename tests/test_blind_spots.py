"""Verification sees through what hides an error from an output-only comparison: a 1.05× change
to any ONE conv/matmul kernel, made by a user's transform run after the default pipeline, fails
the check — on an article-style TF1 CNN whose softmax saturates on random inputs, on a
random-weight Keras MobileNetV2 (ReLU6 clipping, many layers), and on a graph whose only output
is the integer argmax of several heads. The tests' own oracle (plain TF sessions) shows each
mutation is real where the outputs barely move; the unmutated graphs still pass."""
import numpy as np
import pytest
import tensorflow as tf

import tfsurgery
from tfsurgery import api, pipeline
from tfsurgery.cli import main
from tfsurgery.errors import VerificationFailed
from models import keras_models, tf1

import oracle

TOLERANCE = 1e-4
WEIGHT_OPS = ("Conv2D", "DepthwiseConv2dNative", "MatMul")


@pytest.fixture
def users(monkeypatch):
    """A clean registry of users' transforms for each test."""
    monkeypatch.setattr(pipeline, "USER", {})


# ---------------------------------------------------------------- the graphs
def saturating_article_cnn(seed: int = 3):
    """The article's style, built here: three conv → cond batch norm (on a `training`
    placeholder) → ReLU → cond dropout → max-pool blocks, a dense layer, a softmax. Random
    weights, biases and BN statistics; a dense layer large enough that the softmax saturates on
    random inputs (as the issue's article CNN did)."""
    r = np.random.default_rng(seed)
    with tf1.v1_graph() as graph:
        x = tf1.image_input(None, 24, 3)
        training = tf1.training_placeholder()
        for i, channels in enumerate((8, 12, 16), start=1):
            with tf.compat.v1.variable_scope(f"conv_{i}"):
                x = tf1.conv(x, r, channels)
            with tf.compat.v1.variable_scope(f"bn_{i}"):
                x = tf1.bn_under_cond(x, training, tf1.bn_variables(r, channels))
            x = tf.nn.relu(x, name=f"relu_{i}")
            with tf.compat.v1.name_scope(f"dropout_{i}"):
                x = tf1.dropout_under_cond(x, training)
            x = tf.nn.max_pool2d(x, 2, 2, "SAME", name=f"pool_{i}")
        x = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))], name="flatten")
        with tf.compat.v1.variable_scope("dense"):
            x = tf1.dense(x, r, 10, gain=20.0)
        tf.nn.softmax(x, name="output")
    return tf1.freeze(graph, ["output"])


def argmax_heads(seed: int = 0, heads: int = 4, classes: int = 10):
    """A captcha reader's shape: conv trunk → dense → `heads` dense digit heads; the only output
    is the int64 argmax of each head, stacked ([N, heads])."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 12, 12, 1], name="input")
        with tf.compat.v1.variable_scope("trunk"):
            x = tf.nn.relu(tf1.conv(x, r, 8))
        x = tf.reshape(x, [-1, 12 * 12 * 8])
        with tf.compat.v1.variable_scope("fc"):
            x = tf.nn.relu(tf1.dense(x, r, 32))
        digits = []
        for k in range(heads):
            with tf.compat.v1.variable_scope(f"digit_{k}"):
                digits.append(tf.argmax(tf1.dense(x, r, classes, gain=3.0), axis=1))
        tf.stack(digits, axis=1, name="digits")
    return tf1.freeze(graph, ["digits"])


@pytest.fixture(scope="module")
def article_graph():
    return saturating_article_cnn()


@pytest.fixture(scope="module")
def mobilenet():
    """Keras MobileNetV2 with random weights (alpha 0.35, 96×96: small and fast), frozen."""
    return keras_models.keras_application("MobileNetV2", input_size=96, alpha=0.35)


def kernels(graph_def):
    return [n.name for n in graph_def.node if n.op in WEIGHT_OPS]


# ---------------------------------------------------------------- the mutation
def scale_one_kernel(name: str, layer: str, factor: float = 1.05):
    """A user's transform: the weights of ``layer`` (found by name after the default pipeline
    kept it) times ``factor``."""
    @tfsurgery.transform(name)
    def scale(graph, options):
        report = tfsurgery.TransformReport(name)
        kernel = graph.inputs(layer)[1]
        graph.set_input(layer, 1, graph.add_const(layer + "/scaled",
                                                  graph.const_value(kernel) * factor))
        report.rewritten.append(layer)
        return report
    return scale


PLUGIN = '''
import tfsurgery

@tfsurgery.transform("scale-one-kernel")
def scale_one_kernel(graph, options):
    """The weights of one layer times 1.05."""
    report = tfsurgery.TransformReport("scale-one-kernel")
    layer = {layer!r}
    kernel = graph.inputs(layer)[1]
    graph.set_input(layer, 1, graph.add_const(layer + "/scaled",
                                              graph.const_value(kernel) * 1.05))
    report.rewritten.append(layer)
    return report
'''


def fails_through_api(graph_def, inputs, outputs, layer, **source):
    built = api.Source(graph_def, "mutated", inputs=inputs, outputs=outputs, **source)
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(built, ["default", scale_one_kernel("scale-" + layer.replace("/", "-"),
                                                         layer)])
    return failed.value


def fails_through_cli(tmp_path, capsys, graph_def, layer):
    model, plugin, out = tmp_path / "model.pb", tmp_path / "mine.py", tmp_path / "out.pb"
    model.write_bytes(graph_def.SerializeToString())
    plugin.write_text(PLUGIN.format(layer=layer))
    code = main([str(model), "--plugin", str(plugin), "--transforms",
                 "default,scale-one-kernel", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "verification FAILED" in err, err
    assert not out.exists()
    return err


def softmax_input(graph_def, output="output"):
    """The oracle's own look-up: the tensor a Softmax output reads."""
    nodes = {n.name: n for n in graph_def.node}
    return nodes[output].input[0]


# ---------------------------------------------------------------- article CNN
ARTICLE_KERNELS = ["conv_1/Conv2D", "conv_2/Conv2D", "conv_3/Conv2D", "dense/MatMul"]


def test_the_article_cnn_saturates_so_outputs_alone_are_blind(article_graph, users):
    """The oracle's view of the problem: each kernel ×1.05 moves the logits by percent while the
    softmax moves by less than the tolerance on random inputs."""
    assert kernels(article_graph) == ARTICLE_KERNELS
    feeds = {**oracle.random_feeds(article_graph, ["input"], seed=0), "training": False}
    logits = softmax_input(article_graph)
    before, before_logits = oracle.run(article_graph, feeds, ["output", logits])
    assert np.all(before.max(axis=1) > 0.999)                      # saturated
    hidden = 0
    for layer in ARTICLE_KERNELS:
        graph = tf.compat.v1.GraphDef()
        graph.CopyFrom(article_graph)
        kernel = next(n for n in graph.node if n.name == layer).input[1].replace("/read", "")
        const = next(n for n in graph.node if n.name == kernel)
        value = tf.make_ndarray(const.attr["value"].tensor) * 1.05
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        after, after_logits = oracle.run(graph, feeds, ["output", logits])
        assert oracle.relative_error(before_logits, after_logits) > 10 * TOLERANCE
        hidden += oracle.relative_error(before, after) < TOLERANCE
    assert hidden >= 2          # most of the four changes are invisible in the softmax


@pytest.mark.parametrize("layer", ARTICLE_KERNELS)
def test_one_kernel_of_the_article_cnn_times_1_05_fails_the_api(article_graph, users, layer):
    failed = fails_through_api(article_graph, ["input"], ["output"], layer,
                               training_flags=["training"])
    errors = {o.name: o.max_rel for o in failed.verification.outputs}
    assert errors["logits of 'output'"] > TOLERANCE               # seen in the logits
    # the oracle: the result's logits really moved (its softmax reads them)
    result = failed.result.graph_def
    feeds = oracle.random_feeds(article_graph, ["input"], seed=0)
    expected = oracle.run(article_graph, {**feeds, "training": False},
                          [softmax_input(article_graph)])[0]
    actual = oracle.run(result, feeds, [softmax_input(result)])[0]
    assert oracle.relative_error(expected, actual) > TOLERANCE


@pytest.mark.parametrize("layer", ["conv_1/Conv2D", "dense/MatMul"])
def test_one_kernel_of_the_article_cnn_times_1_05_fails_the_cli(article_graph, users, layer,
                                                                  tmp_path, capsys):
    fails_through_cli(tmp_path, capsys, article_graph, layer)


def test_the_article_cnn_unmutated_passes_and_says_what_it_compared(article_graph):
    source = api.Source(article_graph, "article", inputs=["input"], outputs=["output"],
                        training_flags=["training"])
    result = api.optimize(source)
    v = result.verification
    assert v.passed and "logits of 'output'" in {o.name for o in v.outputs}
    text = v.summary()
    assert "logits of 'output': max error" in text
    assert "saturated" in text and v.watching.saturated == ["output"]
    oracle.assert_same_outputs(article_graph, result.graph_def, ["input"],
                               ["output", softmax_input(article_graph)],
                               result_outputs=["output", softmax_input(result.graph_def)],
                               original_feeds={"training": False}, rtol=1e-5)


# ---------------------------------------------------------------- MobileNetV2
MOBILENET_KERNELS = 53      # 52 convolutions (35 Conv2D, 17 depthwise) and the classifier


def test_mobilenet_has_the_kernels_the_parametrization_covers(mobilenet, mobilenet_optimized):
    assert len(kernels(mobilenet.graph_def)) == MOBILENET_KERNELS
    assert len(kernels(mobilenet_optimized.graph_def)) == MOBILENET_KERNELS


@pytest.fixture(scope="module")
def mobilenet_optimized(mobilenet):
    """The default pipeline's result on MobileNetV2, verified: what a user's transform after
    "default" starts from."""
    source = api.Source(mobilenet.graph_def, "mobilenet", inputs=mobilenet.inputs,
                        outputs=mobilenet.outputs)
    return api.optimize(source)


@pytest.fixture(scope="module")
def mobilenet_moves(mobilenet, mobilenet_optimized):
    """The oracle, per kernel: how far the first tensor after the layer that the original also
    has (a folded batch norm's output) moves from the original's value when the layer's weights
    are ×1.05 — the optimized graph imported once into a plain TF session, the kernel fed."""
    original, result = mobilenet.graph_def, mobilenet_optimized.graph_def
    feeds = oracle.random_feeds(original, mobilenet.inputs, seed=0)
    layers = kernels(result)
    probes = [_first_common_after(original, result, layer) for layer in layers]
    before = dict(zip(probes, oracle.run(original, feeds, probes)))
    moves = {}
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(result, name="")
        with tf.compat.v1.Session(graph=graph, config=oracle.session_config()) as session:
            for layer, probe in zip(layers, probes):
                kernel = graph.get_operation_by_name(layer).inputs[1]
                scaled = session.run(kernel) * 1.05
                after = session.run(oracle.tensor(probe),
                                    {**{oracle.tensor(k): v for k, v in feeds.items()},
                                     kernel: scaled})
                moves[layer] = oracle.relative_error(before[probe], after)
    return moves


def _first_common_after(original, result, layer):
    """The first tensor downstream of ``layer`` in ``result`` that the original has under the
    same name and that is not a conv/matmul (whose raw output a fold legitimately changes)."""
    names = {n.name for n in original.node}
    ops = {n.name: n.op for n in result.node}
    readers = {}
    for node in result.node:
        for source in node.input:
            readers.setdefault(source.split(":")[0].lstrip("^"), []).append(node.name)
    frontier, seen = [layer], set()
    while frontier:
        name = frontier.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if name != layer and name in names and ops[name] not in WEIGHT_OPS:
            return name
        frontier += readers.get(name, [])
    raise AssertionError(f"nothing downstream of {layer} is common")


@pytest.mark.parametrize("index", range(MOBILENET_KERNELS))
def test_one_kernel_of_mobilenet_times_1_05_fails_the_api(mobilenet, mobilenet_moves, users,
                                                          monkeypatch, index):
    """Every kernel of MobileNetV2 ×1.05 by a user's transform after the default pipeline."""
    monkeypatch.setattr(api, "_localize", lambda *args: None)      # the verdict, not where
    layer = kernels(mobilenet.graph_def)[index]
    assert mobilenet_moves[layer] > 10 * TOLERANCE                 # the mutation is real
    failed = fails_through_api(mobilenet.graph_def, mobilenet.inputs, mobilenet.outputs, layer)
    assert not failed.verification.passed and failed.result.divergence is None


@pytest.mark.parametrize("index", [10, 40])
def test_one_kernel_of_mobilenet_times_1_05_fails_the_cli(mobilenet, users, monkeypatch,
                                                          tmp_path, capsys, index):
    monkeypatch.setattr(api, "_localize", lambda *args: None)
    fails_through_cli(tmp_path, capsys, mobilenet.graph_def,
                      kernels(mobilenet.graph_def)[index])


def test_mobilenet_unmutated_passes(mobilenet, mobilenet_optimized):
    result = mobilenet_optimized
    assert result.verification.passed, result.verification.failure()
    assert result.verification.intermediate          # widened: too many layers to probe
    assert "intermediate tensors" in result.verification.summary()
    oracle.assert_same_outputs(mobilenet.graph_def, result.graph_def, mobilenet.inputs,
                               mobilenet.outputs, rtol=1e-4)


# ---------------------------------------------------------------- integer argmax outputs
def test_one_head_of_an_argmax_output_times_1_05_is_caught(users):
    graph = argmax_heads()
    layer = "digit_2/MatMul"
    feeds = oracle.random_feeds(graph, ["input"], seed=0)
    failed = fails_through_api(graph, ["input"], ["digits"], layer)
    result = failed.result.graph_def
    # the oracle: the integer output hardly shows it, the head's logits do
    before, before_head = oracle.run(graph, feeds, ["digits", "digit_2/BiasAdd"])
    after, after_head = oracle.run(result, feeds, ["digits", "digit_2/BiasAdd"])
    assert np.count_nonzero(before != after) <= 1
    assert oracle.relative_error(before_head, after_head) > TOLERANCE
    errors = {o.name: o.max_rel for o in failed.verification.outputs}
    assert any(name.startswith("logits of 'digits'") and error > TOLERANCE
               for name, error in errors.items())


def test_an_argmax_output_unmutated_passes_with_each_heads_logits_compared():
    graph = argmax_heads()
    result = api.optimize(api.Source(graph, "digits", inputs=["input"], outputs=["digits"]))
    names = [o.name for o in result.verification.outputs]
    assert result.verification.passed
    assert len([n for n in names if n.startswith("logits of 'digits'")]) == 4
    oracle.assert_same_outputs(graph, result.graph_def, ["input"],
                               ["digits"] + [f"digit_{k}/BiasAdd" for k in range(4)], rtol=1e-5)


# ---------------------------------------------------------------- cannot compare
def test_cannot_compare_names_no_transform(tmp_path, capsys):
    """All-NaN original outputs: nothing to localize, only what the user can do."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        tf.identity(tf.math.log(-tf.abs(x) - 1.0) * 2.0, name="output")
    graph_def = graph.as_graph_def()
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(api.Source(graph_def, "nan", inputs=["input"], outputs=["output"]))
    message = str(failed.value)
    assert message.startswith("cannot compare") and "--feed" in message
    assert "diverging" not in message and failed.value.result.divergence is None
    path = tmp_path / "nan.pb"
    path.write_bytes(graph_def.SerializeToString())
    assert main([str(path), "-o", str(tmp_path / "out.pb")]) == 1
    err = capsys.readouterr().err
    assert "cannot compare" in err and "diverging" not in err
    assert np.isnan(oracle.run(graph_def, {"input": np.ones((2, 3), np.float32)},
                               ["output"])[0]).all()


# ---------------------------------------------------------------- widened, honestly
def deep_cond_bn_cnn(seed: int = 1, blocks: int = 18):
    """More conv layers than are probed one by one, each with a cond batch norm and ReLU6: the
    comparison is widened at once, and the live branch of every cond is compared."""
    r = np.random.default_rng(seed)
    with tf1.v1_graph() as graph:
        x = tf1.image_input(None, 8, 3)
        training = tf1.training_placeholder()
        for i in range(blocks):
            with tf.compat.v1.variable_scope(f"block_{i}"):
                x = tf1.conv(x, r, 6)
                with tf.compat.v1.variable_scope("bn"):
                    x = tf1.bn_under_cond(x, training, tf1.bn_variables(r, 6))
                x = tf.nn.relu6(x)
        x = tf.reduce_mean(x, axis=[1, 2])
        with tf.compat.v1.variable_scope("dense"):
            x = tf1.dense(x, r, 4)
        tf.identity(x, name="output")
    return tf1.freeze(graph, ["output"])


def test_a_deep_cond_bn_graph_is_widened_passes_and_catches_a_middle_layer(users):
    graph = deep_cond_bn_cnn()
    source = dict(inputs=["input"], outputs=["output"], training_flags=["training"])
    result = api.optimize(api.Source(graph, "deep", **source))
    v = result.verification
    assert v.passed, v.failure()
    compared = {e.name for e in v.intermediate}
    assert "block_9/bn/cond/FusedBatchNorm_1:0" in compared        # a live branch, compared
    assert "widened" not in v.summary() and "also compared" in v.summary()
    oracle.assert_same_outputs(graph, result.graph_def, ["input"], ["output"],
                               original_feeds={"training": False}, rtol=1e-4)
    failed = fails_through_api(graph, ["input"], ["output"], "block_9/Conv2D",
                               training_flags=["training"])
    assert failed.verification.hidden or failed.verification.max_error > TOLERANCE


# ---------------------------------------------------------------- a fed scale choosing a case
def scale_selected_upscaler(seed: int = 5):
    """The super-resolution corpus graph's pattern: a fed float ``scale`` picks a ``tf.case``
    branch (2 or 4), with no default: any other value trips the case's Assert. Random weights."""
    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 8, 8, 3], name="input")
        scale = tf.compat.v1.placeholder(tf.float32, [], name="scale")
        kernel = tf.constant(rng.normal(size=(3, 3, 3, 4)).astype(np.float32), name="kernel")
        bias = tf.constant(rng.normal(size=4).astype(np.float32), name="bias")
        features = tf.nn.relu(tf.nn.bias_add(
            tf.nn.conv2d(x, kernel, 1, "SAME", name="conv"), bias))
        branches = [(tf.equal(scale, s), lambda s=s: tf.image.resize(features, [8 * s, 8 * s]))
                    for s in (2, 4)]
        tf.identity(tf.compat.v1.case(branches, exclusive=True), name="output")
    return graph.as_graph_def()


def test_a_kernel_times_1_05_behind_a_fed_case_scale_is_reported_not_uncomparable(users):
    """The noise floor moves the random inputs by one rounding step, never the value the user
    fed: a moved scale (4.0000005) matches no case and the original's Assert fired, so a real
    5% error read "cannot compare". It reads the error now; the oracle confirms the mutation."""
    graph_def = scale_selected_upscaler()
    interface = api.Interface(inputs=["input", "scale"], outputs=["output"],
                              feeds={"scale": 4.0})
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(graph_def, ["default", scale_one_kernel("scale-conv", "conv")],
                     interface=interface)
    assert "cannot compare" not in str(failed.value) and "max error" in str(failed.value)
    result = failed.value.result
    x = np.random.default_rng(1).normal(size=(1, 8, 8, 3)).astype(np.float32)
    feeds = {"input": x, "scale": np.float32(4.0)}
    before = oracle.run(graph_def, feeds, ["output"])[0]
    after = oracle.run(result.graph_def, feeds, ["output"])[0]
    assert oracle.relative_error(before, after) > 1e-2          # the mutation is real
    assert api.optimize(graph_def, interface=interface).verified
