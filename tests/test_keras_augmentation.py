"""Issue 43: augmentation layers a ``model.export()`` SavedModel serves applied (Keras 3's
RandomFlip, RandomRotation, ... default to training=True when the export traces them) are found
by what their ops compute and replaced by their inference behaviour. The oracle is Keras itself:
``model(x, training=False)``, against the optimized graph in a plain TF session and its ONNX in
onnxruntime. Randomness that is intended (a VAE's sampling layer) is kept and said."""
import numpy as np
import pytest

import keras
import oracle
from tfsurgery import api
from tfsurgery.cli import main

SIZE = 24


def image_model(*augmentation, seed=3):
    """augmentation → Rescaling → conv → softmax, random weights and biases."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((SIZE, SIZE, 3), name="image")
    x = inputs
    for layer in augmentation:
        x = layer(x)
    x = keras.layers.Rescaling(1 / 255.0)(x)
    x = keras.layers.Conv2D(4, 3, activation="relu", bias_initializer="random_normal")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax", bias_initializer="random_normal")(x)
    return keras.Model(inputs, outputs)


def images(batch=2, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (batch, SIZE, SIZE, 3)).astype("float32")


def exported(model, tmp_path):
    path = tmp_path / "served"
    model.export(str(path), verbose=False)
    return path


def optimized_answers(result, x):
    return oracle.run(result.graph_def, {result.inputs[0]: x}, result.outputs)[0]


def test_tutorial_model_export_optimizes_and_exports_to_onnx(tmp_path, capsys):
    """The issue's 'done when': flip, rotation and zoom inside the model; default options."""
    import onnxruntime
    model = image_model(keras.layers.RandomFlip("horizontal"), keras.layers.RandomRotation(0.1),
                        keras.layers.RandomZoom(0.1))
    x = images()
    expected = model(x, training=False).numpy()
    served = exported(model, tmp_path)
    import tensorflow as tf
    loaded = tf.saved_model.load(str(served))
    applied = loaded.serve(x).numpy()
    assert np.abs(applied - expected).max() > 1e-4      # the served graph does augment
    onnx_path = tmp_path / "model.onnx"
    assert main(["export", str(served), "-o", str(onnx_path)]) == 0
    err = capsys.readouterr().err
    assert "applied random augmentation" in err
    for layer in ("random_flip", "random_rotation", "random_zoom"):
        assert layer in err
    session = onnxruntime.InferenceSession(str(onnx_path))
    answers = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert np.abs(answers - expected).max() < 1e-4


LAYERS = {
    "flip": lambda: keras.layers.RandomFlip("horizontal_and_vertical"),
    "rotation": lambda: keras.layers.RandomRotation(0.2),
    "zoom": lambda: keras.layers.RandomZoom((-0.3, -0.1)),       # zoom in only: no neutral draw
    "translation": lambda: keras.layers.RandomTranslation(0.1, 0.2),
    "contrast": lambda: keras.layers.RandomContrast(0.5),
    "brightness": lambda: keras.layers.RandomBrightness(0.3),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_each_augmentation_layer_alone_becomes_its_inference_behaviour(tmp_path, kind):
    model = image_model(LAYERS[kind]())
    x = images(seed=1)
    result = api.optimize(str(exported(model, tmp_path)))
    report = next(r for r in result.reports if r.name == "remove-augmentation")
    assert len(report.rewritten) == 1 and report.warnings
    assert not {n.op for n in result.graph_def.node} & {"StatelessRandomUniformV2",
                                                          "ImageProjectiveTransformV3"}
    answers = optimized_answers(result, x)
    np.testing.assert_allclose(answers, model(x, training=False).numpy(), atol=1e-5)
    assert result.verification.passed and "augmentation" in result.verification.summary()


def test_random_crop_that_changes_the_size_is_kept_and_said(tmp_path):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.RandomCrop(SIZE - 8, SIZE - 8)(inputs)
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(x))
    result = api.optimize(str(exported(keras.Model(inputs, outputs), tmp_path)),
                          checks=api.Checks(verify=False))
    report = next(r for r in result.reports if r.name == "remove-augmentation")
    assert not report.rewritten
    assert any("image size" in why for _, why in report.skipped)


@keras.saving.register_keras_serializable(package="issue43")
class Sampling(keras.layers.Layer):
    """A VAE's reparameterisation: z = mean + exp(log_var / 2) · ε, meant to be random."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed = keras.random.SeedGenerator(7)

    def call(self, inputs):
        mean, log_var = inputs
        noise = keras.random.normal(keras.ops.shape(mean), seed=self.seed)
        return mean + keras.ops.exp(0.5 * log_var) * noise


def test_intended_randomness_is_kept_and_said(tmp_path):
    """The sampling draw meets the data after learned layers: kept, and the report says the
    graph stays random; the kept draw is seeded alike in both graphs, so verification compares.
    GaussianNoise (no draw at inference) leaves nothing to remove."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((6,))
    hidden = keras.layers.GaussianNoise(0.3)(inputs)
    mean = keras.layers.Dense(2, bias_initializer="random_normal")(hidden)
    log_var = keras.layers.Dense(2, bias_initializer="random_normal")(hidden)
    z = Sampling()([mean, log_var])
    outputs = keras.layers.Dense(3)(z)
    model = keras.Model(inputs, outputs)
    result = api.optimize(str(exported(model, tmp_path)))
    report = next(r for r in result.reports if r.name == "remove-augmentation")
    assert not report.rewritten
    assert any("sampling layer" in why for _, why in report.skipped)
    assert any("stays random" in line for line in report.warnings)
    assert {n.op for n in result.graph_def.node} & {"StatelessRandomNormalV2"}
    assert result.verification.passed
    # kept as served: the optimized graph answers as the served graph does (its stateless
    # draw's key is a constant of the frozen graph), not as a graph without the noise
    served = api.load(str(tmp_path / "served"))
    x = np.random.default_rng(2).standard_normal((4, 6)).astype("float32")
    expected = oracle.run(served.graph_def, {served.inputs[0]: x}, served.outputs)[0]
    np.testing.assert_allclose(optimized_answers(result, x), expected, rtol=1e-5, atol=1e-6)
    mean_only = model.layers[-1](model.layers[2](x))         # z = mean: the noise removed
    assert np.abs(expected - mean_only.numpy()).max() > 1e-3


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic"])
def test_preprocessing_layers_fold_where_exact(tmp_path, interpolation):
    """Resizing and CenterCrop at the input size are the identity; Rescaling and Normalization
    fold into the first (VALID) conv: the input goes straight into it."""
    keras.utils.set_random_seed(8)
    inputs = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.Resizing(SIZE, SIZE, interpolation=interpolation)(inputs)
    x = keras.layers.CenterCrop(SIZE, SIZE)(x)
    x = keras.layers.Rescaling(1 / 127.5, offset=-1)(x)
    x = keras.layers.Normalization(mean=[0.1, -0.2, 0.05], variance=[0.5, 0.8, 1.3])(x)
    x = keras.layers.Conv2D(4, 3, bias_initializer="random_normal")(x)
    outputs = keras.layers.Dense(2, bias_initializer="random_normal")(keras.layers.Flatten()(x))
    model = keras.Model(inputs, outputs)
    path = tmp_path / "pre.keras"
    model.save(path)
    result = api.optimize(str(path))
    readers = [n for n in result.graph_def.node if "image" in n.input]
    assert [n.op for n in readers] == ["Conv2D"]
    x = images(seed=2)
    np.testing.assert_allclose(optimized_answers(result, x), model(x, training=False).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_a_shift_before_zero_padding_is_kept_and_said(tmp_path):
    """Normalization's mean cannot fold into a SAME conv (its zero border would move): a Sub
    stays before it, with the reason in the report; the scale still folds."""
    keras.utils.set_random_seed(9)
    inputs = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.Normalization(mean=[0.1, -0.2, 0.05], variance=[0.5, 0.8, 1.3])(inputs)
    x = keras.layers.Conv2D(4, 3, padding="same", bias_initializer="random_normal")(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    path = tmp_path / "pre.keras"
    model.save(path)
    result = api.optimize(str(path))
    fold = next(r for r in result.reports if r.name == "fold-affine-into-linear")
    assert any("padding" in why or "pad" in why for _, why in fold.skipped)
    x = images(seed=3)
    np.testing.assert_allclose(optimized_answers(result, x), model(x, training=False).numpy(),
                               rtol=1e-4, atol=1e-4)
