"""int8's Percentile and Entropy calibrations hold one calibration row's activations at a
time (onnxruntime's own calibrator keeps every row's until it builds its histograms: about
90 MiB per row for a Keras ResNet50 at 224; docs/int8.md, Memory) and give onnxruntime's own
ranges — the oracle is onnxruntime's own calibrator (the same bins) on the same rows. Counted,
never timed."""
import json
import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tfsurgery.int8.backends import onnx as quantize
from tfsurgery.int8.backends import onnx_ranges
from tfsurgery.verify.samples import Samples

ROWS = 6


def conv_model(path, seed=0):
    """Conv → Relu → Conv → Add of the input's projection, random weights and biases."""
    r = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(r.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (4, 8, 3, 3)),
                                   ("b2", (4,)), ("w3", (4, 3, 1, 1)))]
    nodes = [helper.make_node("Conv", ["input:0", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Conv", ["input:0", "w3"], ["c3"], name="conv3"),
             helper.make_node("Add", ["c2", "c3"], ["output"], name="add")]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info(
        "input:0", TensorProto.FLOAT, [None, 3, 8, 8])], [helper.make_tensor_value_info(
            "output", TensorProto.FLOAT, [None, 4, 8, 8])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def rows(seed=1):
    values = np.random.default_rng(seed).standard_normal((ROWS, 3, 8, 8)).astype(np.float32)
    values[2] *= 7                                   # a row with wider ranges than the first
    return Samples({"input": values}, {"input": False}, "rows")


def calibrated(model, samples, cache, monkeypatch, held, method):
    """``method``'s calibration into ``cache``; ``held``: how many earlier rows' activations were
    still alive each time onnxruntime ran a row."""
    alive = []
    run = ort.InferenceSession.run

    def counted(self, output_names, input_feed, run_options=None):
        held.append(sum(any(ref() is not None for ref in row) for row in alive))
        values = run(self, output_names, input_feed, run_options)
        alive.append([weakref.ref(v) for v in values if isinstance(v, np.ndarray)])
        return values
    with monkeypatch.context() as patch:
        patch.setattr(ort.InferenceSession, "run", counted)
        quantize._quantize_static(model, cache.with_suffix(".onnx"), samples, [], cache,
                                  method=method)
    return json.loads(cache.read_text())


@pytest.mark.parametrize("method", ["Percentile", "Entropy"])
def test_histograms_hold_one_row_and_give_onnxruntimes_ranges(tmp_path, monkeypatch, method):
    model, samples = conv_model(tmp_path / "float.onnx"), rows()
    held: list = []
    ours = calibrated(model, samples, tmp_path / "ours.json", monkeypatch, held, method)
    assert len(held) >= 2 * ROWS and max(held) <= 1   # two passes, one earlier row at most
    theirs_held: list = []
    monkeypatch.setattr(onnx_ranges, "_row_by_row_histograms", lambda *args: None)
    theirs = calibrated(model, samples, tmp_path / "theirs.json", monkeypatch, theirs_held,
                        method)                      # onnxruntime's own collection
    assert max(theirs_held) >= ROWS - 1              # which keeps every row's
    assert ours == theirs and ours["data"]
