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


VOCABULARY_TEXT = ["the cat sat on the mat", "a dog ate my homework", "the dog sat still"]


def text_classifier(seed=6):
    keras.utils.set_random_seed(seed)
    vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=6)
    vectorize.adapt(VOCABULARY_TEXT)
    inputs = keras.Input((1,), dtype="string", name="text")
    x = keras.layers.Embedding(20, 4)(vectorize(inputs))
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(2, bias_initializer="random_normal")(x)
    return keras.Model(inputs, outputs), vectorize


def test_text_classifier_optimizes_without_a_feed(tmp_path):
    """The vocabulary stays in the frozen graph; the test strings are sentences of its words."""
    from tfsurgery.verify import string_inputs
    model, vectorize = text_classifier()
    result = optimized(model, tmp_path)
    assert result.verification.passed
    drawn = string_inputs.table_strings(result.graph_def, "text", [4, 1],
                                        np.random.default_rng(0))
    words = {w for line in drawn.ravel() for w in line.decode().split()}
    assert words and words <= set(vectorize.get_vocabulary())
    said = result.as_report()["string_inputs"]["text"]
    assert "sentences" in said and f"{len(vectorize.get_vocabulary()) - 2} keys" in said
    sentences = np.array([["the cat ate"], ["zebra on my mat"], [""]], dtype=object)
    answers = oracle.run(result.graph_def, {"text": sentences}, result.outputs)[0]
    np.testing.assert_allclose(answers, model(sentences, training=False).numpy(), atol=1e-6)


def test_string_lookup_input_gets_one_key_per_element(tmp_path):
    keras.utils.set_random_seed(7)
    lookup = keras.layers.StringLookup(vocabulary=["red", "green", "blue"])
    inputs = keras.Input((3,), dtype="string", name="colour")
    x = keras.layers.Flatten()(keras.layers.Embedding(5, 2)(lookup(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(2, bias_initializer="random_normal")(x))
    result = optimized(model, tmp_path)
    assert result.verification.passed
    from tfsurgery.verify import string_inputs
    drawn = string_inputs.table_strings(result.graph_def, "colour", [2, 3],
                                        np.random.default_rng(1))
    assert {v.decode() for v in drawn.ravel()} <= {"red", "green", "blue"}
    colours = np.array([["red", "blue", "pink"]], dtype=object)
    answers = oracle.run(result.graph_def, {"colour": colours}, result.outputs)[0]
    np.testing.assert_allclose(answers, model(colours, training=False).numpy(), atol=1e-6)


def test_onnx_names_the_token_ids_that_export_the_numeric_model(tmp_path, capsys):
    """tf2onnx has no string ops: the failure names the --inputs after the lookup, and with it
    the numeric model exports, matching Keras fed the same sentences."""
    import re
    import onnxruntime
    model, vectorize = text_classifier()
    path = tmp_path / "text.keras"
    model.save(path)
    onnx_path = tmp_path / "text.onnx"
    assert main(["export", str(path), "-o", str(onnx_path)]) == 1
    hint = re.search(r"--inputs (\S+) \(the token ids", capsys.readouterr().err)
    assert hint and not onnx_path.exists()
    assert main(["export", str(path), "-o", str(onnx_path), "--inputs", hint.group(1)]) == 0
    sentences = np.array([["the cat ate"], ["a dog sat on my homework"]], dtype=object)
    session = onnxruntime.InferenceSession(str(onnx_path))
    ids = vectorize(sentences[:, 0]).numpy().astype(session.get_inputs()[0].type == "tensor(int32)"
                                                    and "int32" or "int64")
    answers = session.run(None, {session.get_inputs()[0].name: ids})[0]
    np.testing.assert_allclose(answers, model(sentences, training=False).numpy(), atol=1e-5)
