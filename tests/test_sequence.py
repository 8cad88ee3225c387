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
    model = onnx.load(str(tmp_path / "m.onnx"))
    assert {"Loop", "LSTM", "GRU", "Scan"} & {n.op_type for n in model.graph.node}
