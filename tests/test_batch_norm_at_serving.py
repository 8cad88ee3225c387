"""Issue 49: a Keras 3 image classifier with augmentation layers, exported with ``model.export()``,
serves its BatchNormalization in training mode — normalising each request by the batch's own
moments (``Mean``/``SquaredDifference``). use-moving-statistics makes the layer use its moving
statistics (named by the moving-average update the served graph computes), and the result is
verified against the original with the same layer in inference mode. The oracle is Keras:
``model(x, training=False)`` — against the optimized graph in a plain TF session, and its ONNX in
onnxruntime, at batch 4 and batch 1. Where the file has no moving statistics, the run is refused
naming the BatchNorm."""
import numpy as np
import pytest
import tensorflow as tf

import keras
import oracle
from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.contract import Options, TransformReport, transform
from tfsurgery.errors import InputError, VerificationFailed
from tfsurgery.graph import Graph
from tfsurgery.transforms import use_moving_statistics
from tfsurgery.transforms.use_moving_statistics import find_batch_moment_norms

SIZE = 16


def classifier(seed=5):
    """flip, rotation, zoom → Rescaling → conv → BatchNorm (random statistics) → ReLU → pool →
    Dropout → Dense softmax; random weights and biases."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.RandomFlip("horizontal")(inputs)
    x = keras.layers.RandomRotation(0.1)(x)
    x = keras.layers.RandomZoom(0.1)(x)
    x = keras.layers.Rescaling(1 / 255.0)(x)
    x = keras.layers.Conv2D(6, 3, bias_initializer="random_normal")(x)
    norm = keras.layers.BatchNormalization()
    x = keras.layers.ReLU()(norm(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.3)(x)
    outputs = keras.layers.Dense(4, activation="softmax", bias_initializer="random_normal")(x)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(seed)
    norm.set_weights([rng.uniform(0.5, 1.5, 6), rng.normal(0, 0.5, 6),      # gamma, beta
                      rng.normal(0, 0.3, 6), rng.uniform(0.02, 0.2, 6)])     # moving mean, var
    return model


def images(batch, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (batch, SIZE, SIZE, 3)).astype("float32")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = classifier()
    path = tmp_path_factory.mktemp("bn_at_serving") / "served"
    model.export(str(path), verbose=False)
    return model, path


def answers(graph_def, inputs, outputs, x):
    return oracle.run(graph_def, {inputs[0]: x}, outputs)[0]


def test_the_served_graph_normalises_by_the_batch(served):
    """The premise: the SavedModel as served holds batch moments (over the batch axis), and its
    update of the moving statistics names them."""
    _, path = served
    source = api.load(str(path))
    norms = find_batch_moment_norms(Graph(source.graph_def))
    assert len(norms) == 1 and norms[0].restorable and "batch_normalization" in norms[0].name


def test_the_result_answers_as_keras_in_inference_mode(served, tmp_path, capsys):
    import onnxruntime
    model, path = served
    out, onnx_path = tmp_path / "lean.pb", tmp_path / "model.onnx"
    assert main([str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert "use-moving-statistics" in printed.err and "batch_normalization" in printed.err
    assert "the model in inference mode (training=False)" in printed.out
    graph_def = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert not {"SquaredDifference", "RandomUniform", "StatelessRandomUniformV2"} & \
        {n.op for n in graph_def.node}
    source = api.load(str(path))
    assert main(["export", str(path), "-o", str(onnx_path)]) == 0
    session = onnxruntime.InferenceSession(str(onnx_path))
    for batch in (4, 1):                        # at batch 1 batch moments are nothing like it
        x = images(batch, seed=batch)
        expected = model(x, training=False).numpy()
        got = answers(graph_def, source.inputs, source.outputs, x)
        assert np.abs(got - expected).max() < 1e-4
        onnx_got = session.run(None, {session.get_inputs()[0].name: x})[0]
        assert np.abs(onnx_got - expected).max() < 1e-4
    loaded = tf.saved_model.load(str(path))       # (kept: its variables live as long as it)
    served_answer = loaded.serve(images(4)).numpy()
    assert np.abs(served_answer - model(images(4), training=False).numpy()).max() > 1e-3


@transform("scale-the-conv")
def _scale_the_conv(graph: Graph, options: Options) -> TransformReport:
    """A user's wrong transform: the conv's weights 5% off."""
    conv = next(n.name for n in graph if n.op == "Conv2D")
    kernel = graph.inputs(conv)[1]
    graph.set_input(conv, 1, graph.add_const(conv + "/scaled", graph.const_value(kernel) * 1.05))
    return TransformReport("scale-the-conv")


def _variance_off(graph: Graph, norm) -> None:
    """A wrong restoration: the moving variance taken 5% too large."""
    graph.rewire(norm.mean, norm.moving_mean)
    graph.rewire(norm.variance, graph.add_const(
        norm.variance.node + "/wrong", graph.const_value(norm.moving_variance) * 1.05))


@pytest.mark.parametrize("wrong", ["conv 5% off", "variance 5% off"])
def test_a_wrong_result_fails_against_the_model_in_inference_mode(served, wrong, monkeypatch):
    """The reference is the original with its own moving statistics, not what the transform
    restored: a conv 5% off (a user's transform after the default pipeline), or the moving
    variance 5% off in the restoring transform itself, fail; Keras confirms both."""
    model, path = served
    chosen = ["default", _scale_the_conv] if wrong == "conv 5% off" else ["default"]
    if wrong == "variance 5% off":
        monkeypatch.setattr(use_moving_statistics, "restore", _variance_off)
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(str(path), chosen)
    assert "cannot compare" not in str(failed.value)
    result = api.optimize(str(path), chosen, checks=api.Checks(verify=False))
    x = images(4, seed=9)
    got = answers(result.graph_def, result.inputs, result.outputs, x)
    assert np.abs(got - model(x, training=False).numpy()).max() > 1e-4


@pytest.fixture(scope="module")
def without_moving_statistics(tmp_path_factory):
    """A SavedModel normalising by batch moments with no moving statistics to use."""
    rng = np.random.default_rng(2)

    class Normalised(tf.Module):
        def __init__(self):
            self.kernel = tf.Variable(rng.normal(size=(3, 3, 3, 4)).astype("float32"))
            self.gamma = tf.Variable(rng.uniform(0.5, 1.5, 4).astype("float32"))

        @tf.function(input_signature=[tf.TensorSpec([None, SIZE, SIZE, 3], tf.float32)])
        def serve(self, x):
            y = tf.nn.conv2d(x, self.kernel, 1, "VALID")
            mean, variance = tf.nn.moments(y, [0, 1, 2])
            return tf.nn.relu(tf.nn.batch_normalization(y, mean, variance, None, self.gamma,
                                                        1e-3))

    module = Normalised()
    path = tmp_path_factory.mktemp("no_moving") / "served"
    tf.saved_model.save(module, str(path), signatures=module.serve)
    return path


def test_batch_moments_without_moving_statistics_are_refused_naming_the_batch_norm(
        without_moving_statistics, tmp_path, capsys):
    path, out = without_moving_statistics, tmp_path / "out.pb"
    with pytest.raises(InputError, match="BatchNorm '[^']*' .*normalises by the batch"):
        api.optimize(str(path))
    assert main([str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "moving statistics" in err and "Traceback" not in err and not out.exists()
    assert main([str(path), "-o", str(out), "--disable", "use-moving-statistics"]) == 0
    capsys.readouterr()
    x = images(3, seed=4)
    graph_def = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    loaded = tf.saved_model.load(str(path))
    served = loaded.serve(x).numpy()
    source = api.load(str(path))
    assert np.abs(answers(graph_def, source.inputs, source.outputs, x) - served).max() < 1e-4
