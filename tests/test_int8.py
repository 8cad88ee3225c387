"""--quantize int8: calibrated on real digits, checked on held-back ones, layers kept float when a
threshold fails, refused (exit 1, nothing written) when it still fails. The test's own oracle:
the frozen float graph in a TensorFlow session and the int8 model in onnxruntime, against labels."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf

from tfsurgery.cli import main
from int8_digits import CALIBRATE, TRAIN, digits_on_disk


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    pb, images, labels, graph_def = digits_on_disk(folder)
    samples = folder / "calibration.npz"
    unseen = slice(TRAIN + CALIBRATE, None)
    np.savez(folder / "labelled.npz", input=images[TRAIN:TRAIN + CALIBRATE],
             labels=labels[TRAIN:TRAIN + CALIBRATE])
    np.savez(folder / "gate.npz", input=images[unseen], labels=labels[unseen])
    last_relu = [n.name for n in graph_def.node if n.op == "Relu"][-1]
    return dict(pb=pb, samples=samples, graph_def=graph_def, images=images[unseen],
                labels=labels[unseen], folder=folder, last_relu=last_relu)


def tf_run(graph_def, output, images):
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(f"{output}:0", {"input:0": images})


def ort_run(path, images):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {session.get_inputs()[0].name: image[None]})[0]
                           for image in images])


def test_int8_with_labels_end_to_end_on_unseen_digits(digits_model, tmp_path):
    """--samples with a `labels` array, --check-samples (labelled) as the gate rows: float and
    int8 accuracy and their drop reported and gated; the test recomputes every number on the
    gate rows with its own oracle (TensorFlow float, onnxruntime int8, the labels)."""
    out, report = tmp_path / "digits_int8.onnx", tmp_path / "report.json"
    folder = digits_model["folder"]
    code = main(["export", str(digits_model["pb"]), "-o", str(out), "--quantize", "int8",
                 "--int8-min-speedup", "0",
                 "--samples", str(folder / "labelled.npz"), "--check-samples",
                 str(folder / "gate.npz"), "--int8-min-agreement", "0.97",
                 "--report-json", str(report), "-q"])
    assert code == 0
    ops = {node.op_type for node in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    images, labels = digits_model["images"], digits_model["labels"]
    reference = tf_run(digits_model["graph_def"], "Identity", images)
    got = ort_run(out, images)
    float_accuracy = np.mean(reference.argmax(-1) == labels)
    int8_accuracy = np.mean(got.argmax(-1) == labels)
    assert float_accuracy > 0.9                       # the CNN really learned the digits
    assert int8_accuracy >= float_accuracy - 0.01
    int8 = json.loads(report.read_text())["int8"]
    assert int8["passed"] and int8["format"] == "onnx"
    assert (int8["calibration_rows"], int8["selection_rows"], int8["gate_rows"]) == \
        (320, 80, len(images))
    accuracy = int8["accuracy"]
    assert accuracy["rows"] == len(images) and accuracy["passed"]
    assert accuracy["float_accuracy"] == pytest.approx(float_accuracy)
    assert accuracy["int8_accuracy"] == pytest.approx(int8_accuracy)
    assert accuracy["drop"] == pytest.approx(float_accuracy - int8_accuracy)
    gate = int8["outputs"][0]
    assert gate["measure"] == "top1_agreement" and gate["compared"] == len(images)
    assert gate["value"] == pytest.approx(np.mean(reference.argmax(-1) == got.argmax(-1)))
    assert gate["value"] > gate["lower_bound"] >= 0.97
    assert int8["int8_bytes"] < int8["float_bytes"]


def sqnr_run(digits_model, tmp_path, min_sqnr, cap="1"):
    out, report = tmp_path / "relu_int8.onnx", tmp_path / "report.json"
    code = main(["export", str(digits_model["pb"]), "-o", str(out), "--quantize", "int8",
                 "--int8-min-speedup", "0",
                 "--samples", str(digits_model["samples"]), "--report-json", str(report),
                 "--outputs", digits_model["last_relu"], "--int8-min-sqnr", str(min_sqnr),
                 "--int8-max-float-layers", cap, "-q"])
    return code, out, json.loads(report.read_text())["int8"]


def test_most_sensitive_layer_kept_float_or_refused_with_sensitivities(digits_model, tmp_path):
    code, out, refused = sqnr_run(digits_model, tmp_path, 200)
    assert code == 1 and not out.exists()
    assert not refused["passed"] and len(refused["kept_float"]) == 1
    assert set(refused["sensitivities"]) == {n for n in refused["sensitivities"]} and \
        len(refused["sensitivities"]) == refused["layers"] == 2
    plain = refused["plain_outputs"][0]["value"]
    one_float = refused["outputs"][0]["value"]
    assert refused["kept_float"][0] == max(refused["sensitivities"],
                                           key=refused["sensitivities"].get)
    assert one_float > plain + 0.5             # keeping that layer float really helps
    code, out, passed = sqnr_run(digits_model, tmp_path, (plain + one_float) / 2)
    assert code == 0 and out.exists()
    assert passed["kept_float"] == refused["kept_float"]
    # the test's own oracle: SQNR of the written model against TensorFlow on the unseen digits
    images = digits_model["images"][:50]
    ref = tf_run(digits_model["graph_def"], digits_model["last_relu"], images).astype(np.float64)
    got = ort_run(out, images).astype(np.float64)
    sqnr = 20 * np.log10(np.linalg.norm(ref) / np.linalg.norm(got - ref))
    assert sqnr > plain - 3


@pytest.mark.parametrize("case", ["no-samples", "nan", "too-few", "shape", "dtype",
                                  "sqnr-on-class-scores", "agreement-above-1", "check-too-few",
                                  "drop-without-labels", "labels-count", "labels-float",
                                  "nchw"])
def test_bad_int8_requests_are_one_line_exit_2(digits_model, tmp_path, capsys, case):
    images = digits_model["images"]
    extra = {"sqnr-on-class-scores": ["--int8-min-sqnr", "30", "--int8-min-agreement", "0.95"],
             "agreement-above-1": ["--int8-min-agreement", "99"],
             "check-too-few": ["--check-samples", str(tmp_path / "few.npz")],
             "drop-without-labels": ["--int8-max-accuracy-drop", "0.02"],
             "labels-count": ["--labels", str(tmp_path / "count.npy")],
             "labels-float": ["--labels", str(tmp_path / "float.npy")],
             "nchw": ["--inputs-as-nchw", "input"]}.get(case, [])
    np.savez(tmp_path / "few.npz", input=images[:5])
    np.save(tmp_path / "count.npy", np.zeros(7, dtype=np.int64))
    np.save(tmp_path / "float.npy", np.zeros(400, dtype=np.float32))
    arrays = {"nan": np.where(np.arange(images.size).reshape(images.shape) == 5, np.nan, images),
              "too-few": images[:6], "shape": images[:, :7], "dtype": images.astype(np.complex64)}
    args = ["export", str(digits_model["pb"]), "-o", str(tmp_path / "m.onnx"), "--quantize",
            "int8"]
    if case in arrays:
        np.savez(tmp_path / "s.npz", input=arrays[case])
        args += ["--samples", str(tmp_path / "s.npz")]
    elif case != "no-samples":
        args += ["--samples", str(digits_model["samples"])] + extra
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    if case == "no-samples":
        assert "int8 needs --samples" in err
    assert not (tmp_path / "m.onnx").exists()


def tflite_accuracy(path, images, labels):
    """Accuracy of a .tflite model in the interpreter; int8 I/O quantized by its own details."""
    interpreter = tf.lite.Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    given, taken = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    hits = 0
    for image, label in zip(images, labels):
        value = image[None]
        if given["dtype"] == np.int8:
            scale, zero = given["quantization"]
            value = np.clip(np.round(value / scale + zero), -128, 127).astype(np.int8)
        interpreter.set_tensor(given["index"], value)
        interpreter.invoke()
        hits += interpreter.get_tensor(taken["index"])[0].argmax() == label
    return hits / len(labels), given["dtype"]


@pytest.mark.parametrize("io_type", ["float32", "int8"])
def test_tflite_full_integer_on_unseen_digits_within_one_point(digits_model, tmp_path, io_type):
    """Labels from a file of their own (--labels) for --samples, and in the gate file."""
    out, report = tmp_path / "digits.tflite", tmp_path / "report.json"
    np.save(tmp_path / "labels.npy", np.load(digits_model["folder"] / "labelled.npz")["labels"])
    code = main(["optimize", str(digits_model["pb"]), "-o", str(tmp_path / "d.pb"), "--tflite",
                 str(out), "--tflite-io", io_type, "--quantize", "int8",
                 "--int8-min-speedup", "0", "--samples",
                 str(digits_model["samples"]), "--labels", str(tmp_path / "labels.npy"),
                 "--check-samples", str(digits_model["folder"] / "gate.npz"),
                 "--int8-min-agreement", "0.97", "--report-json", str(report), "-q"])
    assert code == 0
    images, labels = digits_model["images"], digits_model["labels"]
    float_accuracy = np.mean(tf_run(digits_model["graph_def"], "Identity", images)
                             .argmax(-1) == labels)
    int8_accuracy, input_type = tflite_accuracy(out, images, labels)
    assert int8_accuracy >= float_accuracy - 0.01
    assert input_type == (np.int8 if io_type == "int8" else np.float32)
    int8 = json.loads(report.read_text())["tflite_int8"]
    assert int8["passed"] and int8["io_type"] == io_type and int8["format"] == "tflite"
    assert bool(int8["io_quantization"]) == (io_type == "int8")
    assert int8["accuracy"]["float_accuracy"] == pytest.approx(float_accuracy)
    assert int8["accuracy"]["int8_accuracy"] == pytest.approx(int8_accuracy)


def test_check_samples_are_the_gate_rows(digits_model, tmp_path, capsys):
    """--check-samples: --samples calibrate and choose, the unseen digits gate; too few gate
    rows for the agreement threshold are refused before any work (exit 2), saying how many
    would do."""
    np.savez(tmp_path / "check.npz", input=digits_model["images"][:40])
    out, report = tmp_path / "m.onnx", tmp_path / "r.json"
    args = ["export", str(digits_model["pb"]), "-o", str(out), "--quantize", "int8",
            "--int8-min-speedup", "0", "--samples", str(digits_model["samples"]),
            "--check-samples", str(tmp_path / "check.npz"), "--report-json", str(report), "-q"]
    capsys.readouterr()
    assert main(args + ["--int8-min-agreement", "0.99"]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "40 gate rows cannot show top-1 agreement ≥ 0.99" in err and "takes 299" in err
    assert "--check-samples with at least 299 rows" in err and not report.exists()
    assert main(args + ["--int8-min-agreement", "0"]) == 0            # no agreement gate
    int8 = json.loads(report.read_text())["int8"]
    assert (int8["calibration_rows"], int8["selection_rows"], int8["gate_rows"]) == (320, 80, 40)
    ref = tf_run(digits_model["graph_def"], "Identity", digits_model["images"][:40])
    agreement = np.mean(ref.argmax(-1) == ort_run(out, digits_model["images"][:40]).argmax(-1))
    assert agreement == pytest.approx(int8["outputs"][0]["value"])
    assert int8["outputs"][0]["threshold"] == 0 and int8["passed"]


def test_tflite_int8_refused_when_it_misses(digits_model, tmp_path):
    out = tmp_path / "relu.tflite"
    code = main(["optimize", str(digits_model["pb"]), "-o", str(tmp_path / "d.pb"), "--tflite",
                 str(out), "--quantize", "int8", "--samples", str(digits_model["samples"]),
                 "--int8-min-speedup", "0",
                 "--outputs", digits_model["last_relu"], "--int8-min-sqnr", "200", "-q"])
    assert code == 1 and not out.exists() and not (tmp_path / "d.pb").exists()
