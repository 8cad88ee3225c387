"""Issue 43: every input structure Keras accepts loads from a ``.keras`` file — dict (named)
inputs as keras-hub backbones take, nested inputs, one input given as a one-element list — the
model called with the structure it was built with, the frozen inputs keeping their Keras names.
The oracle: the Keras model's own call on the same values, against the optimized graph in a
plain TF session. A model Keras cannot call: one line, exit 2, no traceback."""
import numpy as np
import pytest

import keras
import oracle
from tfsurgery import api
from tfsurgery.cli import main

LENGTH, VOCABULARY = 8, 50


def backbone_like(seed=1):
    """Token ids and a padding mask by name, as keras-hub backbones are built."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((LENGTH,), dtype="int32", name="token_ids")
    mask = keras.Input((LENGTH,), dtype="int32", name="padding_mask")
    embedded = keras.layers.Embedding(VOCABULARY, 4)(ids)
    kept = keras.ops.cast(keras.ops.expand_dims(mask, -1), "float32")
    pooled = keras.layers.GlobalAveragePooling1D()(embedded * kept)
    outputs = keras.layers.Dense(3, bias_initializer="random_normal")(pooled)
    return keras.Model({"token_ids": ids, "padding_mask": mask}, outputs)


def token_values(seed=0, batch=3):
    rng = np.random.default_rng(seed)
    return {"token_ids": rng.integers(0, VOCABULARY, (batch, LENGTH)).astype("int32"),
            "padding_mask": (rng.random((batch, LENGTH)) < 0.7).astype("int32")}


def optimized(model, tmp_path):
    path = tmp_path / "model.keras"
    model.save(path)
    return api.optimize(str(path))


def test_dict_inputs_load_and_verify_against_keras(tmp_path):
    model = backbone_like()
    result = optimized(model, tmp_path)
    assert sorted(result.inputs) == ["padding_mask", "token_ids"]
    assert result.verification.passed
    values = token_values()
    answers = oracle.run(result.graph_def, values, result.outputs)[0]
    np.testing.assert_allclose(answers, model(values, training=False).numpy(), atol=1e-5)


def test_nested_inputs_keep_their_structure_and_names(tmp_path):
    keras.utils.set_random_seed(2)
    a, b = keras.Input((4,), name="left"), keras.Input((4,), name="right")
    c = keras.Input((2,), name="extra")
    joined = keras.layers.Concatenate()([a, b, c])
    outputs = keras.layers.Dense(2, bias_initializer="random_normal")(joined)
    model = keras.Model({"pair": [a, b], "extra": c}, outputs)
    result = optimized(model, tmp_path)
    assert sorted(result.inputs) == ["extra", "left", "right"]
    rng = np.random.default_rng(3)
    values = {name: rng.standard_normal((2, 4 if name != "extra" else 2)).astype("float32")
              for name in ("left", "right", "extra")}
    answers = oracle.run(result.graph_def, values, result.outputs)[0]
    expected = model({"pair": [values["left"], values["right"]], "extra": values["extra"]},
                     training=False).numpy()
    np.testing.assert_allclose(answers, expected, atol=1e-5)


def test_one_input_given_as_a_one_element_list(tmp_path):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((5,), name="features")
    model = keras.Model([inputs], keras.layers.Dense(2, bias_initializer="random_normal")(inputs))
    result = optimized(model, tmp_path)
    assert result.inputs == ["features"]
    x = np.random.default_rng(5).standard_normal((3, 5)).astype("float32")
    answers = oracle.run(result.graph_def, {"features": x}, result.outputs)[0]
    np.testing.assert_allclose(answers, model([x], training=False).numpy(), atol=1e-5)


def test_a_keras_file_that_cannot_load_is_one_line(tmp_path, capsys):
    path = tmp_path / "broken.keras"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.pb")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.pb").exists()
