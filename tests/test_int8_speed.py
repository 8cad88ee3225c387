"""--int8-target and --int8-min-speedup end to end on a small CNN trained on real digits: the
target's settings are in the written model and the report, every int8 ONNX is timed against the
float ONNX before it is written, and an impossible minimum speed-up refuses with nothing written
(no timing is asserted: only that it was measured, and the refusal path). The agreement gate is
off here (``--int8-min-agreement 0``): accuracy is test_int8's."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf
from onnx import TensorProto, numpy_helper

from tfsurgery.cli import main
from int8_digits import CALIBRATE, TRAIN, digits_on_disk

QUICK = ["--int8-min-agreement", "0", "--int8-min-speedup", "0", "--int8-equalize", "off",
         "--int8-bias-correction", "off", "--int8-calibration", "minmax", "--int8-mode",
         "static", "-q"]


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits_speed")
    pb, images, _, graph_def = digits_on_disk(folder)
    return dict(pb=pb, samples=folder / "calibration.npz", graph_def=graph_def,
                images=images[TRAIN + CALIBRATE:])


def export(digits_model, tmp_path, *extra):
    out, report = tmp_path / "digits_int8.onnx", tmp_path / "report.json"
    code = main(["export", str(digits_model["pb"]), "-o", str(out), "--quantize", "int8",
                 "--samples", str(digits_model["samples"]), "--report-json", str(report),
                 *QUICK, *extra])
    return code, out, json.loads(report.read_text())["int8"]


def test_a_named_target_is_written_reported_and_timed(digits_model, tmp_path):
    code, out, int8 = export(digits_model, tmp_path, "--int8-target", "x86")
    assert code == 0, int8
    written = int8["target"]
    assert written["target"] == "x86" and written["activations"] == "uint8"
    assert "asked for" in written["why"]
    # the x86 guidance (7-bit per-channel) and onnxruntime's default weights both measured
    [note] = [n for n in int8["notes"] if n.startswith("static weights: ")]
    assert "7-bit per-channel (the x86 target's guidance)" in note
    assert "8-bit per-tensor (onnxruntime's default)" in note and "on the selection rows" in note
    speed = int8["speed"]
    assert speed["float_ms"] > 0 and speed["int8_ms"] > 0 and speed["passed"]
    assert speed["speedup"] == pytest.approx(speed["float_ms"] / speed["int8_ms"])
    model = onnx.load(str(out))
    inits = {i.name: i for i in model.graph.initializer}
    zero_points = {inits[n.input[2]].data_type for n in model.graph.node
                   if n.op_type == "QuantizeLinear"}
    assert zero_points == {TensorProto.UINT8}                   # uint8 activations
    weights = [numpy_helper.to_array(i) for i in model.graph.initializer
               if i.data_type == TensorProto.INT8 and len(i.dims) >= 2]
    assert weights                                  # 7-bit weights where the report says so
    assert (max(int(np.abs(w).max()) for w in weights) <= 64) == written["reduce_range"]
    scales = [n.input[1] for n in model.graph.node if n.op_type == "DequantizeLinear"
              and n.input[0] in {i.name for i in model.graph.initializer
                                 if i.data_type == TensorProto.INT8 and len(i.dims) >= 2}]
    assert all((len(inits[s].dims) == 1 and inits[s].dims[0] > 1) == written["per_channel"]
               for s in scales) and scales
    # the test's own oracle: TensorFlow float against onnxruntime int8 on unseen digits
    images = digits_model["images"]
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(digits_model["graph_def"], name="")
        with tf.compat.v1.Session(graph=graph) as session:
            reference = session.run("Identity:0", {"input:0": images})
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    got = np.concatenate([session.run(None, {name: image[None]})[0] for image in images])
    assert np.mean(reference.argmax(-1) == got.argmax(-1)) >= 0.95


def test_an_impossible_minimum_speedup_refuses_and_writes_nothing(digits_model, tmp_path,
                                                                  capsys):
    code, out, int8 = export(digits_model, tmp_path, "--int8-target", "arm",
                             "--int8-min-speedup", "1000")
    assert code == 1 and not out.exists()
    assert not list(tmp_path.glob(".digits_int8*"))               # no staging left behind
    assert int8["speed"]["min_speedup"] == 1000 and not int8["speed"]["passed"]
    assert int8["target"]["target"] == "arm" and int8["target"]["activations"] == "int8"
    err = capsys.readouterr().err
    assert "below --int8-min-speedup 1000 (float" in err and "nothing written" in err


def test_bad_speed_options_exit_2_before_any_work(digits_model, tmp_path, capsys):
    out = tmp_path / "never.onnx"
    command = ["export", str(digits_model["pb"]), "-o", str(out), "--quantize", "int8",
               "--samples", str(digits_model["samples"]), "-q"]
    assert main(command + ["--int8-min-speedup", "-1"]) == 2
    assert "--int8-min-speedup -1: give a ratio of 0 or more" in capsys.readouterr().err
    assert main(command + ["--int8-target", "riscv"]) == 2        # argparse's choices
    assert "invalid choice: 'riscv'" in capsys.readouterr().err
    assert not out.exists()
