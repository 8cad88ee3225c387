"""--store-weights int8 (issue 24, items 5 and 6): int8 weight storage with per-channel scales and float
compute, in the .pb / SavedModel (Dequantize), ONNX (DequantizeLinear on int8 initializers) and
TFLite (dynamic range); and ``bench --int8``. The numbers are checked by the tests' own oracle:
the original and the result run in plain TensorFlow sessions (tests/oracle.py), onnxruntime and
the TFLite interpreter, on seeded inputs the tool never saw, and each stored weight against the
original constant with the bound symmetric int8 rounding allows (half a step, max|W_c| / 254).

The weights are random: these tests measure rounding error and sizes, never accuracy on real
data.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf
from onnx import numpy_helper

from tfsurgery import api
from tfsurgery.cli import main

import oracle

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = api.INT8_WEIGHTS_TOLERANCE      # 5e-2 of each output's magnitude
BIG = ("conv1/kernel", "conv2/kernel", "dense/kernel")     # 2304, 4608, 5760 values


def conv_matmul(seed: int = 0, data_format: str = "NHWC"):
    """x → conv 3×3×8×32 + bias → relu → conv 3×3×32×16 → depthwise 3×3×16×1 (144 values: stays
    float) → relu → max pool → flatten → matmul 576×10 + bias → logits. Frozen, randomised."""
    rng = np.random.default_rng(seed)

    def const(name, shape, scale):
        return tf.constant((rng.standard_normal(shape) * scale).astype(np.float32), name=name)
    nchw = data_format == "NCHW"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 12, 12] if nchw else
                                     [None, 12, 12, 8], name="x")
        h = tf.nn.conv2d(x, const(BIG[0], [3, 3, 8, 32], 0.2), 1, "SAME",
                         data_format=data_format)
        h = tf.nn.relu(tf.nn.bias_add(h, const("conv1/bias", [32], 0.1), data_format=data_format))
        h = tf.nn.conv2d(h, const(BIG[1], [3, 3, 32, 16], 0.08), 1, "SAME",
                         data_format=data_format)
        h = tf.nn.depthwise_conv2d(h, const("depthwise/kernel", [3, 3, 16, 1], 0.3),
                                   [1, 1, 1, 1], "SAME", data_format=data_format)
        h = tf.nn.max_pool2d(tf.nn.relu(h), 2, 2, "VALID", data_format=data_format)
        h = tf.reshape(h, [-1, 576])
        logits = tf.matmul(h, const(BIG[2], [576, 10], 0.06)) + const("dense/bias", [10], 0.1)
        tf.identity(logits, name="logits")
    return graph.as_graph_def()


def source(graph_def):
    return api.Source(graph_def, "conv_matmul", inputs=["x:0"], outputs=["logits:0"])


@pytest.fixture(scope="module")
def nhwc():
    original = conv_matmul()
    return original, api.optimize(source(original), weights="int8")


def const_values(graph_def):
    return {n.name: tf.make_ndarray(n.attr["value"].tensor) for n in graph_def.node
            if n.op == "Const"}


def channel_bound(value: np.ndarray, axis: int) -> np.ndarray:
    """Half an int8 step per channel, broadcast over the weight: max|W_c| / 127 / 2."""
    peak = np.max(np.abs(np.moveaxis(value, axis, -1)).reshape(-1, value.shape[axis]), axis=0)
    shape = [1] * value.ndim
    shape[axis] = -1
    return (peak / 127 / 2).reshape(shape)


# ---------------------------------------------------------------- the .pb in plain TensorFlow
def test_int8_graph_runs_in_tensorflow_within_the_bound(nhwc):
    original, result = nhwc
    assert result.verified and result.tolerance == TOLERANCE
    nodes = {n.name: n for n in result.graph_def.node}
    for name in BIG:                           # W is now Dequantize(qint8, min, max), per channel
        node = nodes[name]
        assert node.op == "Dequantize" and node.attr["mode"].s == b"SCALED"
        assert nodes[node.input[0]].attr["dtype"].type == tf.qint8.as_datatype_enum
    for name in ("conv1/bias", "depthwise/kernel", "dense/bias"):    # small: stay float32
        assert nodes[name].op == "Const"
        assert nodes[name].attr["dtype"].type == tf.float32.as_datatype_enum

    weights = const_values(original)
    stored = oracle.run(result.graph_def, {}, list(BIG))
    for name, value, axis in zip(BIG, stored, (3, 3, 1)):
        moved = np.abs(value - weights[name])
        assert np.all(moved <= channel_bound(weights[name], axis) * (1 + 1e-5)), name
        assert moved.max() > 0, f"{name} did not change: not int8"

    for seed in (11, 12):
        feeds = oracle.random_feeds(original, ["x"], seed=seed, batch=4)
        expected = oracle.run(original, feeds, ["logits"])[0]
        actual = oracle.run(result.graph_def, feeds, ["logits"])[0]
        error = oracle.relative_error(expected, actual)
        assert 1e-6 < error < TOLERANCE, error

    int8_bytes = sum(len(n.attr["value"].tensor.tensor_content) for n in result.graph_def.node
                     if n.op == "Const" and n.attr["dtype"].type == tf.qint8.as_datatype_enum)
    assert int8_bytes == sum(weights[name].size for name in BIG)      # one byte per weight
    ratio = result.graph_def.ByteSize() / original.ByteSize()
    assert ratio < 1 / 3, ratio      # about a quarter; biases, scales and structure stay
    note = next(r for r in result.reports if r.name == "int8-weights").notes[0]
    assert note.startswith("3 weights stored as int8")


def test_nchw_graph_in_process(tmp_path):
    original = conv_matmul(seed=3, data_format="NCHW")
    result = api.optimize(source(original), weights="int8")
    assert sum(n.op == "Dequantize" for n in result.graph_def.node) == 3
    feeds = oracle.random_feeds(original, ["x"], seed=5, batch=3)
    error = oracle.relative_error(oracle.run(original, feeds, ["logits"])[0],
                                  oracle.run(result.graph_def, feeds, ["logits"])[0])
    assert 1e-6 < error < TOLERANCE


def test_nchw_graph_cli_without_onednn(tmp_path):
    original = conv_matmul(seed=3, data_format="NCHW")
    path, out = tmp_path / "nchw.pb", tmp_path / "nchw_int8.pb"
    path.write_bytes(original.SerializeToString())
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONPATH": str(ROOT),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "tfsurgery.cli", "optimize", str(path),
                           "--store-weights", "int8", "-o", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    feeds = oracle.random_feeds(original, ["x"], seed=6, batch=3)
    error = oracle.relative_error(oracle.run(original, feeds, ["logits"])[0],
                                  oracle.run(result, feeds, ["logits"])[0])
    assert 1e-6 < error < TOLERANCE
    assert out.stat().st_size < 0.35 * path.stat().st_size


# ---------------------------------------------------------------- ONNX and TFLite
def test_onnx_has_int8_initializers_behind_dequantize_linear(nhwc, tmp_path):
    original, result = nhwc
    path = tmp_path / "int8.onnx"
    exported = result.export_onnx(path)
    assert exported.passed and exported.op_histogram["DequantizeLinear"] == 3
    model = onnx.load(str(path))
    initializers = {t.name: t for t in model.graph.initializer}
    for node in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        weights, scale, zero = (initializers[name] for name in node.input)
        assert weights.data_type == onnx.TensorProto.INT8
        axis = next(a.i for a in node.attribute if a.name == "axis")
        assert list(scale.dims) == [weights.dims[axis]]          # one scale per output channel
        assert not numpy_helper.to_array(zero).any()             # symmetric
    left = [t.name for t in model.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) >= 1024]
    assert not left, left
    assert path.stat().st_size < 0.35 * original.ByteSize()

    feeds = oracle.random_feeds(original, ["x"], seed=21, batch=4)
    expected = oracle.run(original, feeds, ["logits"])[0]
    int8_tf = oracle.run(result.graph_def, feeds, ["logits"])[0]
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for options, reference, bound in ((None, expected, TOLERANCE),
                                      (plain, int8_tf, 1e-4)):   # the very same int8 weights
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        actual = session.run(None, {session.get_inputs()[0].name: feeds["x"]})[0]
        assert oracle.relative_error(reference, actual) < bound


def test_tflite_is_dynamic_range_int8_and_matches_tensorflow(nhwc, tmp_path):
    original, result = nhwc
    path = tmp_path / "int8.tflite"
    artefact = api.export_tflite(source(original), result, path)
    assert artefact.passed and artefact.weights == "int8"
    from tfsurgery.export.tflite import interpreter_class
    interpreter = interpreter_class()[0](model_path=str(path))
    int8_weights = [d for d in interpreter.get_tensor_details()
                    if d["dtype"] == np.int8 and np.prod(d["shape"]) >= 1024]
    assert len(int8_weights) == 3
    assert path.stat().st_size < 0.35 * original.ByteSize()
    feeds = oracle.random_feeds(original, ["x"], seed=31, batch=1)
    runner = interpreter.get_signature_runner()
    actual = next(iter(runner(x=feeds["x"]).values()))
    expected = oracle.run(original, feeds, ["logits"])[0]
    assert oracle.relative_error(expected, actual) < TOLERANCE


def test_cli_writes_every_format_with_int8_weights(tmp_path, capsys):
    original = conv_matmul(seed=7)
    model = tmp_path / "model.pb"
    model.write_bytes(original.SerializeToString())
    report = tmp_path / "report.json"
    code = main([str(a) for a in (model, "--store-weights", "int8", "-o", tmp_path / "lean.pb",
                                  "--onnx", tmp_path / "lean.onnx", "--tflite",
                                  tmp_path / "lean.tflite", "--saved-model", tmp_path / "sm",
                                  "--report-json", report)])
    out = capsys.readouterr().out
    assert code == 0, out
    written = {a["format"]: a for a in json.loads(report.read_text())["artefacts"]}
    assert set(written) == {"pb", "onnx", "tflite", "saved_model"}
    for entry in written.values():
        assert entry["passed"] and entry["weights"] == "int8"
        # a quarter of 50 KiB of weights, plus each container's own few KiB (SavedModel: ~5)
        assert entry["bytes"] < 0.4 * model.stat().st_size, entry
    saved = tf.saved_model.load(str(tmp_path / "sm"))
    feeds = oracle.random_feeds(original, ["x"], seed=8, batch=2)
    actual = next(iter(saved.signatures["serving_default"](x=tf.constant(feeds["x"])).values()))
    expected = oracle.run(original, feeds, ["logits"])[0]
    assert oracle.relative_error(expected, actual.numpy()) < TOLERANCE


# ---------------------------------------------------------------- refusals
def non_float_graph(with_big_float32: bool):
    """A float64 conv kernel (2304 values), a float32 one of 288 values, and optionally a float32
    1×1×2×1024 kernel: only the last one is an int8 candidate."""
    rng = np.random.default_rng(2)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float64, [None, 8, 8, 16], name="x")
        wide = tf.constant(rng.standard_normal([3, 3, 16, 16]) * 0.1, name="double_kernel")
        h = tf.cast(tf.nn.conv2d(x, wide, 1, "SAME"), tf.float32)
        small = tf.constant((rng.standard_normal([3, 3, 16, 2]) * 0.1).astype(np.float32),
                            name="small")
        h = tf.nn.conv2d(h, small, 1, "SAME")
        if with_big_float32:
            big = tf.constant(rng.standard_normal([1, 1, 2, 1024]).astype(np.float32),
                              name="big")
            h = tf.nn.conv2d(h, big, 1, "SAME")
        tf.identity(tf.reduce_mean(h, axis=[1, 2]), name="y")
    return graph.as_graph_def()


def test_non_float_and_small_weights_stay_float():
    original = non_float_graph(True)
    result = api.optimize(api.Source(original, "g", inputs=["x:0"], outputs=["y:0"]),
                          ["strip-debug"], weights="int8")
    report = next(r for r in result.reports if r.name == "int8-weights")
    assert report.rewritten == ["big"]
    assert ("double_kernel", "a DT_DOUBLE weight: only float32 weights are stored as int8") in \
        report.skipped
    nodes = {n.name: n for n in result.graph_def.node}
    assert nodes["double_kernel"].op == "Const" and nodes["small"].op == "Const"
    assert nodes["small"].attr["dtype"].type == tf.float32.as_datatype_enum
    feeds = oracle.random_feeds(original, ["x"], seed=4)
    error = oracle.relative_error(oracle.run(original, feeds, ["y"])[0],
                                  oracle.run(result.graph_def, feeds, ["y"])[0])
    assert 0 < error < TOLERANCE


def test_no_int8_candidate_is_one_line_exit_2(tmp_path, capsys):
    model = tmp_path / "double.pb"
    model.write_bytes(non_float_graph(False).SerializeToString())
    code = main([str(model), "--store-weights", "int8", "-o", str(tmp_path / "out.pb")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "no float32 conv/matmul weight of at least 1024 values" in err
    assert "DT_DOUBLE" in err and not (tmp_path / "out.pb").exists()


def test_skipped_weights_are_reported():
    rng = np.random.default_rng(4)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 16], name="x")
        kernel = tf.constant(rng.standard_normal([3, 3, 16, 32]).astype(np.float32), name="k")
        shared = tf.constant(rng.standard_normal([1, 1, 32, 64]).astype(np.float32), name="s")
        h = tf.nn.conv2d(tf.nn.conv2d(x, kernel, 1, "SAME"), shared, 1, "SAME")
        tf.identity(tf.reduce_mean(h, axis=[1, 2, 3]) + tf.reduce_sum(shared), name="y")
    original = graph.as_graph_def()
    result = api.optimize(api.Source(original, "g", inputs=["x:0"], outputs=["y:0"]),
                          ["strip-debug"], weights="int8")
    report = next(r for r in result.reports if r.name == "int8-weights")
    assert report.rewritten == ["k"]
    assert any(name == "s" and "also read by" in why for name, why in report.skipped)
    feeds = oracle.random_feeds(original, ["x"], seed=9)
    error = oracle.relative_error(oracle.run(original, feeds, ["y"])[0],
                                  oracle.run(result.graph_def, feeds, ["y"])[0])
    assert 0 < error < TOLERANCE


def test_weights_int8_with_quantize_is_refused(tmp_path, capsys):
    model = tmp_path / "model.pb"
    model.write_bytes(conv_matmul().SerializeToString())
    code = main([str(model), "--store-weights", "int8", "--quantize", "int8", "--samples",
                 str(tmp_path / "none.npz"), "--onnx", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--store-weights" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------- bench --int8
STATIC_TOLERANCE = 0.15    # static int8 quantizes activations too: a coarser step than weights


def test_bench_reports_float_and_int8_per_runtime(tmp_path, capsys):
    model = tmp_path / "model.pb"
    model.write_bytes(conv_matmul(seed=1).SerializeToString())
    samples = tmp_path / "rows.npz"
    np.savez(samples, x=np.random.default_rng(9).standard_normal([12, 12, 12, 8])
             .astype(np.float32))
    report = tmp_path / "bench.json"
    code = main(["bench", str(model), "--int8", "--runs", "2", "--samples", str(samples),
                 "--report-json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "on every --samples row" in out
    for runtime in ("tensorflow", "onnxruntime", "tflite"):
        assert f"| {runtime}" in out
    sides = {s["runtime"]: s for s in json.loads(report.read_text())["int8"]}
    (static,) = [sides.pop(name) for name in list(sides)      # its target names this machine
                 if name.startswith("onnxruntime static int8 (")]
    openvino = sides.pop("openvino (int8: NNCF static)", None)   # where OpenVINO is installed
    assert set(sides) == {"tensorflow", "onnxruntime", "tflite"}
    if openvino is not None:            # the float IR against its NNCF int8 twin, both at f32
        assert not openvino["skipped"], openvino["skipped"]
        assert set(openvino["timings"]) == {"float", "int8"}
        assert openvino["bytes"]["int8"] < openvino["bytes"]["float"]   # the .xml is a fixed cost
        assert 0 < openvino["max_error"] < STATIC_TOLERANCE
        assert [a["rows"] for a in openvino["agreement"].values()] == [12]
    # static int8 (activations too) against float in onnxruntime, the same float timing
    assert set(static["timings"]) == {"float", "int8"} and not static["skipped"]
    assert static["timings"]["float"] == sides["onnxruntime"]["timings"]["float"]
    assert static["bytes"]["int8"] < 0.5 * static["bytes"]["float"]     # + scales, zero points
    assert 0 < static["max_error"] < STATIC_TOLERANCE
    assert [a["rows"] for a in static["agreement"].values()] == [12]
    for side in sides.values():
        assert not side["skipped"], side["skipped"]
        assert side["bytes"]["int8"] < 0.35 * side["bytes"]["float"]
        assert set(side["timings"]) == {"float", "int8"}
        assert 0 < side["max_error"] < TOLERANCE      # int8 vs float, the same runtime
        assert [a["rows"] for a in side["agreement"].values()] == [12]   # every row


def test_depthwise_multiplier_keeps_its_int8_values_in_onnx(tmp_path):
    """A depthwise kernel [3, 3, 64, 2] is scaled per input channel (its two output channels
    share one scale): the ONNX model's grouped Conv gets the very same int8 values."""
    rng = np.random.default_rng(5)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 64], name="x")
        kernel = tf.constant((rng.standard_normal([3, 3, 64, 2]) *
                              rng.uniform(0.01, 1, [1, 1, 1, 2])).astype(np.float32), name="dw")
        tf.identity(tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME"), name="y")
    original = graph.as_graph_def()
    result = api.optimize(api.Source(original, "dw", inputs=["x:0"], outputs=["y:0"]),
                          weights="int8")
    assert {n.op for n in result.graph_def.node} >= {"Dequantize"}
    stored = oracle.run(result.graph_def, {}, ["dw"])[0]
    value = const_values(original)["dw"]
    peak = np.abs(value).max(axis=(0, 1, 3), keepdims=True)          # per input channel
    assert np.all(np.abs(stored - value) <= peak / 254 * (1 + 1e-5))
    path = tmp_path / "dw.onnx"
    assert result.export_onnx(path).passed
    feeds = oracle.random_feeds(original, ["x"], seed=3, batch=2)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), plain, providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: feeds["x"]})[0]
    assert oracle.relative_error(oracle.run(result.graph_def, feeds, ["y"])[0], actual) < 1e-5
    model = onnx.load(str(path))
    (scale,) = [numpy_helper.to_array(t) for t in model.graph.initializer
                if t.name.endswith("_scale")]
    assert scale.shape == (128,) and np.array_equal(scale[0::2], scale[1::2])
