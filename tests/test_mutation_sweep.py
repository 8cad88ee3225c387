"""Issue 49: the mutation sweep on small models of each family — every weight layer ×1.05
through a user's transform is caught (exit 1 / VerificationFailed, nothing written), the change
confirmed by TensorFlow in the test's own session; the unmutated twins pass. A 24-layer model,
more weight layers than the probe's share of the time used to cover, is probed whole: mutated,
refused; unmutated, it passes having seen every weight (or says it cannot verify — never a
silent pass). Models: random weights, biases and normalization statistics."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.models.common import BuiltModel, rng
from tfsurgery.models.keras_models import _keras3_built
from tfsurgery.models.recurrent import keras3_lowered
from tfsurgery.verify import sensitivity
from models import tf1

import oracle
from mutation_sweep import swept

L = tf.keras.layers


def cnn_relu6():
    inp = tf.keras.Input((12, 12, 3), name="input")
    x = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(8, 3, padding="same")(inp)))
    x = L.ReLU(6.0)(L.BatchNormalization()(L.DepthwiseConv2D(3, padding="same")(x)))
    x = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(8, 1)(x)))
    out = L.Dense(5, activation="softmax")(L.GlobalAveragePooling2D()(x))
    return _keras3_built(tf.keras.Model(inp, out), 1)


def conv1d_audio():
    """Conv1D ReLU6 stack (each kernel a Const → ExpandDims in the frozen graph)."""
    inp = tf.keras.Input((32, 1), name="input")
    x = inp
    for filters in (8, 8, 12):
        x = L.Conv1D(filters, 3, padding="same", activation="relu6")(x)
    out = L.Dense(4)(L.GlobalAveragePooling1D()(x))
    return _keras3_built(tf.keras.Model(inp, out), 2)


def einsum_transformer(seed: int = 3):
    """One encoder block: tf_keras MultiHeadAttention (EinsumDense: Einsum ops reading their
    kernels), LayerNorm, a feed-forward layer, pooled into a dense head."""
    import tf_keras
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)
    K = tf_keras.layers
    inp = tf_keras.Input((8, 16), name="input")
    x = K.LayerNormalization()(inp + K.MultiHeadAttention(2, 8)(inp, inp))
    x = K.Dense(16, activation="relu")(x)
    model = tf_keras.Model(inp, K.Dense(3)(K.GlobalAveragePooling1D()(x)))
    r = rng(seed)
    for weight in model.weights:        # random kernels, biases, LayerNorm scales and shifts
        weight.assign(r.normal(0.5 if "gamma" in weight.name else 0.0, 0.3, weight.shape))
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, 8, 16], tf.float32, name="input"))
    frozen = convert_variables_to_constants_v2(function)
    return BuiltModel(frozen.graph.as_graph_def(), ["input"],
                      [t.op.name for t in frozen.outputs])


def concat_head_detector(seed: int = 4, classes: int = 3):
    """YOLO-style: a conv trunk, one head conv split into xy / wh / objectness / classes and
    concatenated back — boxes in pixels (×640), scores in [0, 1]."""
    r = rng(seed)
    with tf1.v1_graph() as graph:
        x = tf1.image_input(None, 8, 3)
        for i in range(2):
            with tf.compat.v1.variable_scope(f"trunk_{i}"):
                x = tf.nn.relu(tf1.conv(x, r, 8))
        with tf.compat.v1.variable_scope("head"):
            head = tf1.conv(x, r, 5 + classes)
        xy, wh, objectness, scores = tf.split(head, [2, 2, 1, classes], axis=-1)
        boxes = tf.concat([tf.sigmoid(xy) * 640.0, tf.exp(wh) * 640.0], axis=-1)
        out = tf.concat([boxes, tf.sigmoid(objectness), tf.sigmoid(scores)], axis=-1)
        tf.reshape(out, [-1, 64, 5 + classes], name="output")
    return tf1.freeze(graph, ["output"])


def deep_dense(layers: int = 24, seed: int = 5, width: int = 16):
    """24 dense layers (tanh): more weight layers than the old probe covered in its time share."""
    r = rng(seed)
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, width], name="input")
        for i in range(layers):
            with tf.compat.v1.variable_scope(f"layer_{i}"):
                x = tf.tanh(tf1.dense(x, r, width))
        tf.identity(x, name="output")
    return tf1.freeze(graph, ["output"])


@pytest.mark.parametrize("family", ["cnn_relu6", "conv1d_audio", "einsum_transformer"])
def test_keras_families_every_mutation_is_caught(family):
    model = globals()[family]()
    result = swept(model.graph_def, model.inputs, model.outputs, family)
    kinds = {o.target.kind for o in result.outcomes}
    assert kinds == {"kernel"}, result.line()
    if family == "einsum_transformer":
        readers = [o.target.reader for o in result.outcomes]
        assert sum("einsum" in r for r in readers) == 4, readers   # query, key, value, output


@pytest.mark.parametrize("channel", [False, True])
def test_the_concat_head_detector_every_mutation_is_caught(channel):
    """Whole kernels, and each kernel's last output channel alone — for the head conv a class
    score in [0, 1] beside boxes ×640: the probe tries every channel of the kernel nearest the
    output, so the check widens to the head conv's own output where that channel shows."""
    swept(concat_head_detector(), ["input"], ["output"], "detector", channel=channel)


def test_an_lstm_every_mutation_is_caught():
    model, _ = keras3_lowered("LSTM", seed=6, units=4, features=3, dropout=0.0)
    swept(model.graph_def, model.inputs, model.outputs, "lstm")


def test_24_layers_mutated_refused_unmutated_passes_having_seen_every_weight(tmp_path,
                                                                              capsys):
    graph = deep_dense()
    source = api.Source(graph, "deep", inputs=["input"], outputs=["output"])
    result = api.optimize(source)
    check = result.verification
    found = check.watching.sensitivity
    assert check.passed, check.failure()
    # every weight was probed, not a sample: 24 kernels and 24 biases, one channel of each
    # kernel and all 16 of the last (nearest the output)
    assert found.layers == 24 and found.weights == 48 and found.probed == 48 and found.complete
    assert found.channels == 23 * sensitivity.PROBE_CHANNELS + 16 and "not probed" not in check.summary()
    if found.seconds > found.budget:
        assert "extended" in check.summary()
    oracle.assert_same_outputs(graph, result.graph_def, ["input"], ["output"], rtol=1e-4)
    # a middle layer 5% off, through a plugin on the command line: exit 1, nothing written
    model, plugin, out = tmp_path / "deep.pb", tmp_path / "mine.py", tmp_path / "out.pb"
    model.write_bytes(graph.SerializeToString())
    plugin.write_text(PLUGIN)
    code = main([str(model), "--plugin", str(plugin), "--transforms", "default,mutate-middle",
                 "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "verification FAILED" in err and not out.exists(), err
    feeds = oracle.random_feeds(graph, ["input"], seed=0)
    mutated = tf.compat.v1.GraphDef()
    mutated.CopyFrom(graph)
    const = next(n for n in mutated.node if n.name == "layer_12/kernel")
    const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
        tf.make_ndarray(const.attr["value"].tensor) * 1.05))
    before, after = (oracle.run(g, feeds, ["output"])[0] for g in (graph, mutated))
    assert not np.array_equal(before, after)


PLUGIN = '''
import tfsurgery

@tfsurgery.transform("mutate-middle")
def mutate_middle(graph, options):
    """The kernel of layer 12 of 24 times 1.05."""
    report = tfsurgery.TransformReport("mutate-middle")
    graph.set_const_value("layer_12/kernel", graph.const_value("layer_12/kernel") * 1.05)
    report.rewritten.append("layer_12/kernel")
    return report
'''
