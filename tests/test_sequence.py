"""Sequence models end to end: Keras 3 LSTM/GRU (dropout and recurrent dropout) as .keras files
and SavedModels, frozen keeping their While loop, optimized and exported to ONNX that
onnxruntime runs and that matches TensorFlow — checked at two sequence lengths."""
import json

import numpy as np
import pytest

from tfsurgery.cli import main


@pytest.fixture(scope="module")
def recurrent_models(tmp_path_factory):
    import keras
    folder = tmp_path_factory.mktemp("recurrent")
    rng = np.random.default_rng(3)
    paths = {}
    for kind in ("LSTM", "GRU"):
        layer = getattr(keras.layers, kind)(6, dropout=0.25, recurrent_dropout=0.25)
        model = keras.Sequential([keras.Input((None, 4)), layer, keras.layers.Dense(3)])
        for weight in model.weights:               # random weights and biases, never zeros
            weight.assign(rng.normal(0, 0.5, weight.shape).astype("float32"))
        model.save(folder / f"{kind}.keras")
        model.export(str(folder / f"{kind}_saved_model"), verbose=False)
        paths[f"{kind}.keras"] = folder / f"{kind}.keras"
        paths[f"{kind}_saved_model"] = folder / f"{kind}_saved_model"
    return paths


@pytest.mark.parametrize("name", ["LSTM.keras", "LSTM_saved_model", "GRU.keras",
                                  "GRU_saved_model"])
def test_recurrent_models_export_to_onnx_that_matches(recurrent_models, name, tmp_path, capsys):
    import onnx
    report = tmp_path / "r.json"
    code = main([str(recurrent_models[name]), "-o", str(tmp_path / "m.pb"), "--bn-fold",
                 "--onnx", str(tmp_path / "m.onnx"), "--report-json", str(report)])
    err = capsys.readouterr().err
    assert code == 0, err
    data = json.loads(report.read_text())
    assert data["verification"]["passed"] is True and data["onnx"]["passed"] is True
    assert any("@" in o["name"] for o in data["verification"]["outputs"])   # a second length
    assert any("@" in o["name"] for o in data["onnx"]["outputs"])   # checked in ONNX too
    model = onnx.load(str(tmp_path / "m.onnx"))
    assert {"Loop", "LSTM", "GRU", "Scan"} & {n.op_type for n in model.graph.node}


@pytest.fixture(scope="module")
def lowered_lstm_pb(tmp_path_factory):
    """A Keras 3 LSTM frozen by TF2 with lowering (the Android-app form): its loop is
    Enter/Exit/NextIteration around TensorList ops."""
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)
    rng = np.random.default_rng(5)
    model = keras.Sequential([keras.Input((None, 4)), keras.layers.LSTM(8), keras.layers.Dense(3)])
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.5, weight.shape).astype("float32"))
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, None, 4], tf.float32))
    graph_def = convert_variables_to_constants_v2(function).graph.as_graph_def()
    path = tmp_path_factory.mktemp("lowered") / "lstm_lowered.pb"
    path.write_bytes(graph_def.SerializeToString())
    return path


def test_lowered_loop_converts_through_tensor_arrays(lowered_lstm_pb, tmp_path, capsys):
    """tf2onnx leaves TensorList ops in a lowered loop unconverted; their TensorArray twins
    (tensor_list_loops) it turns into a Loop, checked against TensorFlow at two lengths."""
    import onnx
    report = tmp_path / "r.json"
    code = main([str(lowered_lstm_pb), "-o", str(tmp_path / "m.pb"),
                 "--onnx", str(tmp_path / "m.onnx"), "--report-json", str(report)])
    err = capsys.readouterr().err
    assert code == 0, err
    data = json.loads(report.read_text())
    assert data["onnx"]["passed"] is True
    assert any("@" in o["name"] for o in data["onnx"]["outputs"])
    assert "Loop" in {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
