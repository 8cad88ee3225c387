"""NCHW graphs optimize, verify, export and bench on every CPU — with TensorFlow's oneDNN kernels
on or off. The CLI runs in a subprocess with TF_ENABLE_ONEDNN_OPTS=0, so this file proves the
no-oneDNN case on every machine (a CI machine with AVX-512, where oneDNN is on by default,
included); the numbers are checked by the tests' own oracle (tests/oracle.py), not the tool's."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import cpu_layout
from tfsurgery.models import tf1
from tfsurgery.models.common import rng

import oracle

ROOT = Path(__file__).resolve().parent.parent


def nchw_net(seed: int = 4):
    """input NCHW → Conv2D + BiasAdd → FusedBatchNormV3 → Relu → depthwise + bias →
    FusedBatchNorm → Relu → MaxPool → AvgPool → output, all NCHW, randomised."""
    r = rng(seed)
    with tf1.v1_graph() as graph:
        x = tf1.image_input(None, 8, 3, "NCHW")
        with tf.compat.v1.variable_scope("conv"):
            x = tf1.conv(x, r, 6, data_format="NCHW")
        with tf.compat.v1.variable_scope("bn"):
            x = tf1.fused_bn(x, tf1.bn_variables(r, 6), data_format="NCHW")
        x = tf.nn.relu(x)
        with tf.compat.v1.variable_scope("depthwise"):
            kernel = tf1.variable("kernel", tf1.random_kernel(r, [3, 3, 6, 2], 9))
            x = tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME", data_format="NCHW")
            x = tf1.add_bias(x, r, 12, "biasadd", "NCHW")
        with tf.compat.v1.variable_scope("bn2"):
            x = tf1.fused_bn(x, tf1.bn_variables(r, 12), version="V1", data_format="NCHW")
        x = tf.nn.relu(x)
        x = tf.nn.max_pool2d(x, 2, 2, "VALID", data_format="NCHW")
        x = tf.nn.avg_pool2d(x, 2, 1, "SAME", data_format="NCHW")
        tf.identity(x, name="output")
    return tf1._built(graph)


@pytest.fixture(scope="module")
def net():
    return nchw_net()


def cli_without_onednn(*args, cwd):
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONPATH": str(ROOT),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "tfsurgery.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def test_run_form_computes_the_same_numbers(net):
    """Every NCHW op wrapped in transposes gives bit-identical outputs and intermediate tensors
    (under the same names), whatever the CPU: the oracle runs both its own way."""
    rewritten = cpu_layout.rewritten(net.graph_def)
    wrapped = [n.name for n in rewritten.node if n.name.endswith("/_channels_last")]
    assert len(wrapped) == 4                       # conv, depthwise, max pool, avg pool
    assert all(n.attr["data_format"].s == b"NHWC" for n in rewritten.node
               if n.name in wrapped)
    fetches = ["output", "conv/Conv2D", "depthwise/depthwise"]
    feeds = oracle.random_feeds(net.graph_def, net.inputs, seed=2)
    for before, after in zip(oracle.run(net.graph_def, feeds, fetches),
                             oracle.run(rewritten, feeds, fetches)):
        np.testing.assert_array_equal(before, after)


def test_cli_optimizes_verifies_and_exports_nchw_without_onednn(net, tmp_path):
    source = tmp_path / "nchw.pb"
    source.write_bytes(net.graph_def.SerializeToString())
    done = cli_without_onednn("optimize", source, "--bn-fold", "-o", tmp_path / "lean.pb",
                              "--onnx", tmp_path / "lean.onnx", "--saved-model",
                              tmp_path / "lean_sm", "--report-json", tmp_path / "r.json", "-v",
                              cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "through transposes" in done.stderr          # -v says which way was taken
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verification"]["passed"] is True
    lean = tf.compat.v1.GraphDef.FromString((tmp_path / "lean.pb").read_bytes())
    ops = [n.op for n in lean.node]
    assert "FusedBatchNorm" not in ops and "FusedBatchNormV3" not in ops
    # The written graph keeps the user's layout.
    assert all(n.attr["data_format"].s == b"NCHW" for n in lean.node
               if n.op in ("Conv2D", "DepthwiseConv2dNative", "MaxPool", "AvgPool"))
    oracle.assert_same_outputs(net.graph_def, lean, net.inputs, net.outputs, seed=5)
    assert (tmp_path / "lean_sm" / "saved_model.pb").exists()
    import onnxruntime as ort
    feeds = oracle.random_feeds(net.graph_def, net.inputs, seed=6)
    expected = oracle.run(net.graph_def, feeds, net.outputs)[0]
    session = ort.InferenceSession(str(tmp_path / "lean.onnx"), providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: feeds["input"]})[0]
    assert oracle.relative_error(expected, actual) < 1e-4


def test_bench_times_nchw_without_onednn(net, tmp_path):
    source = tmp_path / "nchw.pb"
    source.write_bytes(net.graph_def.SerializeToString())
    done = cli_without_onednn("bench", source, "--bn-fold", "--runs", "2", "--no-onnx",
                              cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tensorflow" in done.stdout.lower()


def test_a_broken_fold_still_fails_without_onednn(net, tmp_path):
    """The run form does not blur a real difference: a wrong result fails verification there."""
    broken = tf.compat.v1.GraphDef()
    broken.CopyFrom(net.graph_def)
    kernel = next(n for n in broken.node if n.name == "conv/kernel")
    value = tf.make_ndarray(kernel.attr["value"].tensor).copy()
    value.flat[0] += 1e-2 * np.abs(value).max()
    kernel.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    script = (
        "import sys, tensorflow as tf\n"
        "from tfsurgery.verify import check as verify\n"
        "a = tf.compat.v1.GraphDef.FromString(open(sys.argv[1], 'rb').read())\n"
        "b = tf.compat.v1.GraphDef.FromString(open(sys.argv[2], 'rb').read())\n"
        "v = verify.verify(a, b, ['input'], ['output'])\n"
        "print('PASSED' if v.passed else 'FAILED', v.max_error)\n")
    (tmp_path / "a.pb").write_bytes(net.graph_def.SerializeToString())
    (tmp_path / "b.pb").write_bytes(broken.SerializeToString())
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, tmp_path / "a.pb", tmp_path / "b.pb"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("FAILED"), done.stdout
    feeds = oracle.random_feeds(net.graph_def, net.inputs, seed=0)
    a, b = (oracle.run(g, feeds, ["output"])[0] for g in (net.graph_def, broken))
    assert oracle.relative_error(a, b) > 1e-4          # the oracle agrees it really differs
