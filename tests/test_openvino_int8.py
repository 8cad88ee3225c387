"""--quantize int8 with --openvino (issue 33, item 2): NNCF post-training quantization of the IR,
through the same int8 loop and gate as ONNX and TFLite — calibrated on real digits, chosen on
selection rows, judged on unseen gate rows against the float original — re-measured here with
the test's own oracle (TensorFlow float, OpenVINO int8 compiled by the test, the labels).

Skipped where OpenVINO or NNCF is missing: ``pip install -e ".[openvino]"``."""
import json

import numpy as np
import pytest

from int8_digits import CALIBRATE, TRAIN, digits_on_disk
import oracle
from tfsurgery.int8 import loop as int8_loop
from tfsurgery.int8.backends import openvino as quantize_openvino
from tfsurgery.cli import main
from tfsurgery.verify.samples import Samples

ov = pytest.importorskip("openvino", reason="OpenVINO not installed (pip install -e '.[openvino]')")
pytest.importorskip("nncf", reason="NNCF not installed (pip install -e '.[openvino]')")


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits_openvino")
    _, images, labels, graph_def = digits_on_disk(folder)
    seen, unseen = slice(TRAIN, TRAIN + CALIBRATE), slice(TRAIN + CALIBRATE, None)
    np.savez(folder / "labelled.npz", input=images[seen], labels=labels[seen])
    np.savez(folder / "gate.npz", input=images[unseen], labels=labels[unseen])
    np.savez(folder / "unlabelled.npz", input=images[seen])
    last_relu = [n.name for n in graph_def.node if n.op == "Relu"][-1]
    return dict(folder=folder, graph_def=graph_def, images=images[unseen],
                labels=labels[unseen], calibration=images[seen], last_relu=last_relu)


def int8_ir_outputs(directory, images) -> np.ndarray:
    """The test's own OpenVINO run of the int8 IR (the rest of the model at f32)."""
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(directory / "model.xml")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled([images])[compiled.output(0)]


def fake_quantized(directory) -> int:
    model = ov.Core().read_model(str(directory / "model.xml"))
    return sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())


def test_nncf_int8_passes_the_shared_gate_on_unseen_digits(digits_model, tmp_path, capsys):
    folder = digits_model["folder"]
    out, report = tmp_path / "ir", tmp_path / "report.json"
    code = main([str(folder / "digits.pb"), "-o", str(tmp_path / "digits.pb"),
                 "--openvino", str(out), "--quantize", "int8",
                 "--samples", str(folder / "labelled.npz"),
                 "--check-samples", str(folder / "gate.npz"), "--int8-min-agreement", "0.97",
                 "--report-json", str(report)])
    text = capsys.readouterr().out
    assert code == 0
    assert "int8 OpenVINO IR (NNCF)" in text and "no choice saw the gate rows" in text
    assert fake_quantized(out) >= 3                   # both convs and the dense layer's input
    images, labels = digits_model["images"], digits_model["labels"]
    (reference,) = oracle.run(digits_model["graph_def"], {"input": images}, ["Identity"])
    got = int8_ir_outputs(out, images)
    agreement = np.mean(reference.argmax(-1) == got.argmax(-1))
    float_accuracy = np.mean(reference.argmax(-1) == labels)
    int8_accuracy = np.mean(got.argmax(-1) == labels)
    assert float_accuracy > 0.9 and agreement >= 0.97
    assert int8_accuracy >= float_accuracy - 0.01
    data = json.loads(report.read_text())
    int8 = data["openvino_int8"]
    assert int8["passed"] and int8["format"] == "openvino"
    assert (int8["calibration_rows"], int8["selection_rows"], int8["gate_rows"]) == \
        (320, 80, len(images))
    gate = int8["outputs"][0]
    assert gate["measure"] == "top1_agreement" and gate["compared"] == len(images)
    assert gate["value"] == pytest.approx(agreement)
    assert gate["value"] >= gate["lower_bound"] >= 0.97
    assert int8["accuracy"]["int8_accuracy"] == pytest.approx(int8_accuracy)
    assert {a["method"] for a in int8["tried"]} >= {"NNCF performance", "NNCF mixed"}
    (artefact,) = [a for a in data["artefacts"] if a["format"] == "openvino"]
    assert artefact["weights"] == "int8" and artefact["written"]
    ir = ov.Core().read_model(str(out / "model.xml"))
    assert ir.get_rt_info(["tfsurgery", "inference_precision"]).astype(str) == "f32"


def test_a_missed_gate_writes_nothing_and_names_the_layers_kept_float(digits_model, tmp_path,
                                                                      capsys):
    """An SQNR no int8 model reaches on the last ReLU: the most sensitive layer is kept float
    (the cap: 1), the gate still refuses, exit 1, nothing written."""
    folder = digits_model["folder"]
    report = tmp_path / "report.json"
    code = main([str(folder / "digits.pb"), "-o", str(tmp_path / "digits.pb"),
                 "--outputs", digits_model["last_relu"], "--openvino", str(tmp_path / "ir"),
                 "--quantize", "int8", "--samples", str(folder / "unlabelled.npz"),
                 "--int8-min-sqnr", "200", "--int8-max-float-layers", "1",
                 "--int8-equalize", "off", "--report-json", str(report)])
    err = capsys.readouterr().err
    assert code == 1 and "OpenVINO int8 FAILED" in err and "nothing written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    int8 = json.loads(report.read_text())["openvino_int8"]
    assert not int8["passed"] and len(int8["kept_float"]) == 1
    assert int8["kept_float"][0] in err and set(int8["sensitivities"]) >= set(int8["kept_float"])


def test_a_layer_kept_float_has_no_fake_quantize_on_its_weights(digits_model, tmp_path):
    """The backend's IgnoredScope really keeps a layer float: in the model NNCF returns, that
    convolution's weights reach it unquantized while the other layers' do not."""
    rows = int8_loop.split_rows(Samples({"input": digits_model["calibration"]}, {"input": False},
                                        "digits"))
    backend = quantize_openvino.OpenvinoBackend(
        {"plain": digits_model["graph_def"]}, ["input"], ["Identity"], rows.calibration,
        tmp_path)
    choice = backend.choices()[0]
    layers = backend.layers(choice)
    assert len(layers) == 3                       # two convolutions and the dense layer
    kept = layers[0]
    model = backend.build(choice, [kept])

    def weights_quantized(op) -> bool:
        producer = op.input_value(1).get_node()
        while producer.get_type_name() in ("Convert", "Reshape", "Transpose", "Multiply",
                                           "Subtract"):
            producer = producer.input_value(0).get_node()
        return producer.get_type_name() == "FakeQuantize" or \
            producer.get_output_element_type(0).get_type_name() in ("i8", "u8")

    by_name = {op.get_friendly_name(): op for op in model.get_ops()}
    assert not weights_quantized(by_name[kept])
    assert all(weights_quantized(by_name[name]) for name in layers[1:])
    # and it still computes the float model's numbers closely (the test's own TF and OpenVINO)
    images = digits_model["images"][:64]
    (reference,) = oracle.run(digits_model["graph_def"], {"input": images}, ["Identity"])
    got = quantize_openvino.run(model, Samples({"input": images}, {"input": False}, "x"),
                                ["Identity"], "f32")
    assert np.mean(np.concatenate([g[0] for g in got]).argmax(-1) == reference.argmax(-1)) > 0.9
