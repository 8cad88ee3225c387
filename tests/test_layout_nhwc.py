"""layout-nhwc (--layout NHWC): NCHW graphs computed channels-last, the same numbers.

The reference is never the code under test: every NCHW network here is built a second time in
NHWC by TensorFlow's own ops, with the same random weights, and the result must compute what that
twin computes. The result is also run in a fresh process with TF_ENABLE_ONEDNN_OPTS=0 (where
TensorFlow refuses NCHW convolutions and pooling), and through the CLI there."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.errors import InputError

import oracle

ROOT = Path(__file__).resolve().parent.parent
CHANNELS_FIRST_REFUSED = ("Conv2D", "DepthwiseConv2dNative", "MaxPool", "AvgPool")


# ---------------------------------------------------------------- the networks, in both layouts
def block_net(fmt: str, seed: int = 0, *, shuffle: bool = False, onnx_style: bool = False):
    """Pad → strided conv + BiasAdd → FusedBatchNormV3 → Relu → MaxPool → two convs (one
    dilated) → concat [→ channel shuffle: Reshape/Transpose/Reshape] → depthwise + BiasAdd →
    residual Add → per-channel Mul/Add → Relu6 → squeeze-excite (Mean keep_dims → 1x1 conv →
    Sigmoid → Mul) → AvgPool → outputs ``feature`` (4-D) and ``output`` (global Mean, [N, C]).
    ``fmt`` NCHW or NHWC: the same weights, the same numbers. ``onnx_style`` (NCHW only): the
    input is NHWC and transposed to NCHW, and ``feature`` is transposed back to NHWC, as a graph
    converted from ONNX reads."""
    r = np.random.default_rng(seed)
    nchw = fmt == "NCHW"
    channel, spatial = (1, [2, 3]) if nchw else (3, [1, 2])

    def weights(*shape, fan):
        return tf.constant((r.standard_normal(shape) * np.sqrt(2.0 / fan)).astype(np.float32))

    def vector(n, low=-0.5, high=0.5):
        """Per-channel constants as each layout broadcasts them: [C, 1, 1] or [C]."""
        values = r.uniform(low, high, n).astype(np.float32)
        return tf.constant(values.reshape(-1, 1, 1) if nchw else values)

    def conv(x, cin, cout, k, **kw):
        return tf.nn.conv2d(x, weights(k, k, cin, cout, fan=k * k * cin), data_format=fmt, **kw)

    with tf.Graph().as_default() as graph:
        if onnx_style:
            x = tf.compat.v1.placeholder(tf.float32, [None, 9, 9, 3], name="input")
            x = tf.transpose(x, [0, 3, 1, 2]) if nchw else x
        else:
            x = tf.compat.v1.placeholder(tf.float32, [None, 3, 9, 9] if nchw else [None, 9, 9, 3],
                                         name="input")
        pads = [[0, 0], [0, 0], [1, 1], [1, 1]] if nchw else [[0, 0], [1, 1], [1, 1], [0, 0]]
        y = tf.pad(x, pads)
        y = conv(y, 3, 8, 3, strides=2, padding="VALID")
        y = tf.nn.bias_add(y, tf.constant(r.normal(0, 0.5, 8).astype(np.float32)),
                           data_format=fmt)
        y = tf.raw_ops.FusedBatchNormV3(
            x=y, scale=tf.constant(r.uniform(0.5, 1.5, 8).astype(np.float32)),
            offset=tf.constant(r.normal(0, 0.5, 8).astype(np.float32)),
            mean=tf.constant(r.normal(0, 0.5, 8).astype(np.float32)),
            variance=tf.constant(r.uniform(0.5, 2, 8).astype(np.float32)), epsilon=1e-3,
            data_format=fmt, is_training=False)[0]
        y = tf.nn.relu(y)
        m = tf.nn.max_pool2d(y, 2, 1, "SAME", data_format=fmt)
        a = conv(m, 8, 4, 1, strides=1, padding="SAME")
        b = conv(m, 8, 4, 3, strides=1, padding="SAME", dilations=2)
        y = tf.concat([a, b], channel)
        if shuffle:
            if nchw:
                y = tf.reshape(y, [-1, 2, 4, 5, 5])
                y = tf.reshape(tf.transpose(y, [0, 2, 1, 3, 4]), [-1, 8, 5, 5])
            else:
                y = tf.reshape(y, [-1, 5, 5, 2, 4])
                y = tf.reshape(tf.transpose(y, [0, 1, 2, 4, 3]), [-1, 5, 5, 8])
        y = tf.nn.depthwise_conv2d(y, weights(3, 3, 8, 1, fan=9), [1, 1, 1, 1], "SAME",
                                   data_format=fmt)
        y = tf.nn.bias_add(y, tf.constant(r.normal(0, 0.5, 8).astype(np.float32)),
                           data_format=fmt)
        y = y + m                                                      # residual
        y = y * vector(8, 0.5, 1.5) + vector(8)                        # per-channel constants
        y = tf.nn.relu6(y)
        excite = tf.reduce_mean(y, spatial, keepdims=True)
        excite = tf.sigmoid(conv(excite, 8, 8, 1, strides=1, padding="VALID"))
        y = y * excite
        y = tf.nn.avg_pool2d(y, 2, 2, "VALID", data_format=fmt)
        feature = tf.transpose(y, [0, 2, 3, 1]) if onnx_style and nchw else y
        tf.identity(feature, name="feature")
        tf.identity(tf.reduce_mean(y, spatial), name="output")
    return graph.as_graph_def()


INPUTS, OUTPUTS = ["input"], ["output", "feature"]
VARIANTS = {"plain": {}, "shuffle": {"shuffle": True}, "onnx": {"onnx_style": True}}


def twin_feature(variant: str, value):
    """The NHWC twin's ``feature`` in the NCHW graph's layout (an ONNX-style graph's is NHWC)."""
    return value if variant == "onnx" else np.transpose(value, [0, 3, 1, 2])


def feeds_for(variant: str, seed: int = 3):
    """The same input values for both layouts: (NCHW graph's feeds, NHWC twin's feeds)."""
    value = np.random.default_rng(seed).standard_normal([2, 9, 9, 3]).astype(np.float32)
    if variant == "onnx":
        return {"input": value}, {"input": value}
    return {"input": np.ascontiguousarray(np.transpose(value, [0, 3, 1, 2]))}, {"input": value}


def reference(variant: str):
    """What the NCHW graph computes, from its NHWC twin (plain TensorFlow, any CPU)."""
    _, twin_feeds = feeds_for(variant)
    output, feature = oracle.run(block_net("NHWC", **VARIANTS[variant]), twin_feeds, OUTPUTS)
    return output, twin_feature(variant, feature)


@pytest.fixture(scope="module")
def results():
    """variant → (original GraphDef, api Result) of the transform alone."""
    done = {}
    for variant, kwargs in VARIANTS.items():
        original = block_net("NCHW", **kwargs)
        done[variant] = original, api.optimize(original, ["layout-nhwc"], inputs=INPUTS,
                                               outputs=OUTPUTS)
    return done


def transposes_4d(graph_def):
    return [n.name for n in graph_def.node if n.op == "Transpose" and
            len(tf.make_ndarray(next(m for m in graph_def.node if m.name ==
                                     n.input[1].split(":")[0]).attr["value"].tensor)) == 4]


def channels_first(graph_def):
    return [n.name for n in graph_def.node
            if "data_format" in n.attr and n.attr["data_format"].s.startswith(b"NC")]


# ---------------------------------------------------------------- the oracle itself
def test_the_twins_compute_the_same():
    """The reference is sound: the NCHW original (run by the oracle, oneDNN or its own
    transposes) and its NHWC twin agree."""
    for variant, kwargs in VARIANTS.items():
        feeds, _ = feeds_for(variant)
        got = oracle.run(block_net("NCHW", **kwargs), feeds, OUTPUTS)
        for want, have in zip(reference(variant), got):
            assert oracle.relative_error(want, have) < 1e-5, variant


# ---------------------------------------------------------------- the transform
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_result_is_nhwc_and_computes_the_twins_numbers(results, variant):
    original, result = results[variant]
    graph_def = result.graph_def
    assert result.verification.passed
    assert channels_first(graph_def) == []
    feeds, _ = feeds_for(variant)
    got = oracle._run(graph_def, feeds, OUTPUTS)          # as written: no NCHW fallback needed
    for want, have in zip(reference(variant), got):
        assert oracle.relative_error(want, have) < 1e-5
    report = next(r for r in result.reports if r.name == "layout-nhwc")
    converted = {line.split(":")[0] for line in report.rewritten}
    assert {"Pad", "concat", "add", "mul", "add_1", "Relu6", "Mean", "Sigmoid",
            "mul_1", "Mean_1"} <= converted, converted
    # the 4-D output: NHWC inside, its name the transpose back (ONNX-style: its own transpose
    # back, converted, is now by the identity)
    assert ("transpose_1" if variant == "onnx" else "feature") in converted


def test_one_transpose_per_4d_input_and_output(results):
    _, result = results["plain"]
    assert sorted(transposes_4d(result.graph_def)) == ["feature", "input/to_nhwc"]
    assert not next(r for r in result.reports if r.name == "layout-nhwc").skipped


def test_onnx_style_transposes_cancel(results):
    """The NHWC→NCHW input transpose and the NCHW→NHWC output transpose of an ONNX-style graph
    meet the inserted ones and cancel: no transpose is left; the output keeps its name."""
    original, result = results["onnx"]
    assert len(transposes_4d(original)) == 2
    assert transposes_4d(result.graph_def) == []
    assert {n.name: n.op for n in result.graph_def.node}["feature"] == "Identity"


def test_an_op_without_nhwc_rule_stays_behind_a_transpose_pair_and_is_reported(results):
    original, result = results["shuffle"]
    report = next(r for r in result.reports if r.name == "layout-nhwc")
    skipped = dict(report.skipped)
    assert list(skipped) == ["Reshape"], report.skipped       # the shuffle's first Reshape
    assert "Reshape" in skipped["Reshape"] and "NCHW" in skipped["Reshape"]
    ops = {n.name: n.op for n in result.graph_def.node}
    assert ops["Reshape"] == ops["Reshape_1"] == "Reshape"
    # interface (input, feature) + the pair around the shuffle; the shuffle's 5-D one is its own
    assert len(transposes_4d(result.graph_def)) == 4


RUN_IN_A_FRESH_PROCESS = (
    "import sys, numpy as np, tensorflow as tf\n"
    "cfg = tf.compat.v1.ConfigProto()\n"
    "cfg.graph_options.rewrite_options.disable_meta_optimizer = True\n"
    "for name in sys.argv[1:]:\n"
    "    g = tf.compat.v1.GraphDef.FromString(open(name + '.pb', 'rb').read())\n"
    "    feeds = dict(np.load(name + '.in.npz'))\n"
    "    with tf.Graph().as_default() as graph:\n"
    "        tf.compat.v1.import_graph_def(g, name='')\n"
    "        with tf.compat.v1.Session(graph=graph, config=cfg) as s:\n"
    "            try:\n"
    "                out = s.run(['output:0', 'feature:0'], {k + ':0': v for k, v in "
    "feeds.items()})\n"
    "            except tf.errors.OpError as error:\n"
    "                print('REFUSED', name, ' '.join(str(error).split())[:200])\n"
    "                continue\n"
    "    np.savez(name + '.out.npz', output=out[0], feature=out[1])\n")


def run_in_a_fresh_process(graphs, folder: Path, onednn: bool):
    """{variant: (output, feature), or None where TensorFlow refused to run it}, each graph
    (variant → GraphDef) run as written in a new process with oneDNN on or off."""
    for variant, graph_def in graphs.items():
        (folder / f"{variant}.pb").write_bytes(graph_def.SerializeToString())
        np.savez(folder / f"{variant}.in.npz", **feeds_for(variant)[0])
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1" if onednn else "0",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", RUN_IN_A_FRESH_PROCESS,
                           *(str(folder / variant) for variant in graphs)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = {}
    for variant in graphs:
        path = folder / f"{variant}.out.npz"
        found[variant] = (np.load(path)["output"], np.load(path)["feature"]) \
            if path.exists() else None
    return found, done.stdout


def test_result_runs_without_onednn_in_a_fresh_process(results, tmp_path):
    """TF_ENABLE_ONEDNN_OPTS=0: TensorFlow's default kernels, which refuse NCHW conv/pool, run
    every result as written, with the twins' numbers."""
    got, said = run_in_a_fresh_process({v: r.graph_def for v, (_, r) in results.items()},
                                       tmp_path, onednn=False)
    for variant, outputs in got.items():
        assert outputs is not None, said
        for want, have in zip(reference(variant), outputs):
            assert oracle.relative_error(want, have) < 1e-5


def test_original_with_onednn_agrees_with_the_twin(results, tmp_path):
    """The originals as written, in a process with oneDNN on (whatever this one has), compute
    the twins' numbers — where the CPU's oneDNN runs NCHW at all; the refusal without oneDNN is
    asserted too (it is why the transform exists)."""
    graphs = {v: original for v, (original, _) in results.items()}
    with_onednn, said = run_in_a_fresh_process(graphs, tmp_path, onednn=True)
    for variant, outputs in with_onednn.items():
        if outputs is None:             # a CPU where oneDNN is not used: the twin stands alone
            assert "NHWC" in said or "data_format" in said, said
            continue
        for want, have in zip(reference(variant), outputs):
            assert oracle.relative_error(want, have) < 1e-5
    (tmp_path / "off").mkdir()
    without, said = run_in_a_fresh_process({"plain": graphs["plain"]}, tmp_path / "off",
                                           onednn=False)
    assert without["plain"] is None and "NHWC" in said, said


def test_cli_layout_nhwc_verifies_and_writes_without_onednn(tmp_path):
    source = tmp_path / "x.pb"
    source.write_bytes(block_net("NCHW", seed=7).SerializeToString())
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONPATH": str(ROOT),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "tfsurgery.cli", "optimize", str(source),
                           "--layout", "NHWC", "--outputs", "output,feature", "-o",
                           str(tmp_path / "lean.pb"), "--report-json", str(tmp_path / "r.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verification"]["passed"] is True
    assert "layout-nhwc" in [t["name"] for t in report["transforms"]]
    lean = tf.compat.v1.GraphDef.FromString((tmp_path / "lean.pb").read_bytes())
    assert channels_first(lean) == []
    assert len(transposes_4d(lean)) <= 2
    value = np.random.default_rng(1).standard_normal([3, 9, 9, 3]).astype(np.float32)
    want = oracle.run(block_net("NHWC", seed=7), {"input": value}, OUTPUTS)
    got = oracle._run(lean, {"input": np.transpose(value, [0, 3, 1, 2])}, OUTPUTS)
    assert oracle.relative_error(want[0], got[0]) < 1e-4
    assert oracle.relative_error(np.transpose(want[1], [0, 3, 1, 2]), got[1]) < 1e-4


def test_api_layout_option():
    original = block_net("NCHW", seed=2)
    result = api.optimize(original, layout="NHWC", inputs=INPUTS, outputs=OUTPUTS)
    assert "layout-nhwc" in [r.name for r in result.reports]
    assert channels_first(result.graph_def) == []
    plain = api.optimize(original, inputs=INPUTS, outputs=OUTPUTS)
    assert "layout-nhwc" not in [r.name for r in plain.reports]    # off by default
    assert channels_first(plain.graph_def)
    with pytest.raises(InputError, match="NHWC"):
        api.optimize(original, layout="NCWH", inputs=INPUTS, outputs=OUTPUTS)


# ---------------------------------------------------------------- refusals, each with its reason
def small_net(tail):
    """input NCHW [N, 4, 6, 6] → conv 3x3 → ``tail(y, graph)`` → output."""
    r = np.random.default_rng(5)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4, 6, 6], name="input")
        y = tf.nn.conv2d(x, r.standard_normal([3, 3, 4, 4]).astype(np.float32), 1, "SAME",
                         data_format="NCHW")
        tf.identity(tail(y, r), name="output")
    return graph.as_graph_def()


def _transformed(graph_def, inputs=("input",), outputs=("output",)):
    result = api.optimize(graph_def, ["layout-nhwc"], inputs=list(inputs), outputs=list(outputs))
    oracle.assert_same_outputs(graph_def, result.graph_def, list(inputs), list(outputs), seed=4)
    return result, dict(next(r for r in result.reports if r.name == "layout-nhwc").skipped)


def test_a_computed_operand_that_broadcasts_by_layout_is_refused():
    """``y + b`` with a computed [C, 1, 1] ``b``: its broadcast is tied to NCHW."""
    def tail(y, r):
        bias = tf.compat.v1.placeholder(tf.float32, [4, 1, 1], name="bias")
        return tf.nn.relu(y + bias)
    graph_def = small_net(tail)
    result, skipped = _transformed(graph_def, inputs=("input", "bias"))
    assert "rank 3" in skipped["add"] and "layout" in skipped["add"]
    assert channels_first(result.graph_def) == []


def test_a_reduction_that_would_reorder_kept_axes_is_refused():
    """Mean over W without keep_dims keeps (N, C, H), which NHWC holds as (N, H, C)."""
    graph_def = small_net(lambda y, r: tf.reduce_mean(y, [3]) * 2.0)
    result, skipped = _transformed(graph_def)
    assert "NHWC orders" in skipped["Mean"]


def test_a_global_pool_without_keep_dims_is_converted():
    graph_def = small_net(lambda y, r: tf.reduce_max(tf.nn.relu(y), [2, 3]))
    result, skipped = _transformed(graph_def)
    assert skipped == {}
    assert transposes_4d(result.graph_def) == ["input/to_nhwc"]


def test_an_output_batch_norm_stays_nchw_and_is_reported():
    """A FusedBatchNorm named as an output: its other outputs would lose their names."""
    r = np.random.default_rng(0)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4, 6, 6], name="input")
        y = tf.nn.conv2d(x, r.standard_normal([1, 1, 4, 4]).astype(np.float32), 1, "SAME",
                         data_format="NCHW")
        c = tf.constant(r.uniform(0.5, 1.5, 4).astype(np.float32))
        tf.raw_ops.FusedBatchNormV3(x=y, scale=c, offset=c, mean=c, variance=c,
                                    data_format="NCHW", is_training=False, name="bn")
    result, skipped = _transformed(graph.as_graph_def(), outputs=("bn",))
    assert "several outputs" in skipped["bn"]
    assert channels_first(result.graph_def) == ["bn"]      # FusedBatchNorm runs NCHW on any CPU


def test_nhwc_graphs_are_left_alone():
    graph_def = block_net("NHWC")
    result = api.optimize(graph_def, ["layout-nhwc"], inputs=INPUTS, outputs=OUTPUTS)
    report = next(r for r in result.reports if r.name == "layout-nhwc")
    assert report.matched == 0 and not report.rewritten
    assert list(result.graph_def.node) == list(graph_def.node)


def test_a_graph_with_while_loops_is_refused():
    def tail(y, r):
        return tf.compat.v1.while_loop(lambda i, t: i < 2, lambda i, t: (i + 1, t * 0.5),
                                       [tf.constant(0), y])[1]
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    try:
        graph_def = small_net(tail)
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()
    result, skipped = _transformed(graph_def)
    assert "while loops" in skipped["Conv2D"]
    assert channels_first(result.graph_def) == ["Conv2D"]


# ---------------------------------------------------------------- more ops: a decoder
def decoder_net(fmt: str, seed: int = 1):
    """conv → Split on channels → Relu·Sigmoid (gated) → transposed conv (stride 2) →
    DepthToSpace → MaxPoolV2 → SplitV on channels, concat swapped → an NHWC-only op between
    two transposes, as ONNX→TF writes Resize → ClipByValue → AddN → output. The NHWC twin has
    no transposes around the resize."""
    r = np.random.default_rng(seed)
    nchw = fmt == "NCHW"
    channel = 1 if nchw else 3

    def per_axis(h, w):
        return [1, 1, h, w] if nchw else [1, h, w, 1]

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4, 6, 6] if nchw else [None, 6, 6, 4],
                                     name="input")
        y = tf.nn.conv2d(x, r.standard_normal([3, 3, 4, 8]).astype(np.float32) / 6, 1, "SAME",
                         data_format=fmt)
        a, b = tf.split(y, 2, axis=channel)
        y = tf.nn.relu(a) * tf.sigmoid(b)
        kernel = r.standard_normal([3, 3, 8, 4]).astype(np.float32) / 6   # [h, w, out, in]
        y = tf.nn.conv2d_transpose(y, kernel, [2, 8, 12, 12] if nchw else [2, 12, 12, 8], 2,
                                   "SAME", data_format=fmt)
        y = tf.nn.depth_to_space(y, 2, data_format=fmt)                    # [2, 2, 24, 24]
        y = tf.raw_ops.MaxPoolV2(input=y, ksize=per_axis(2, 2), strides=per_axis(2, 2),
                                 padding="VALID", data_format=fmt)          # [2, 2, 12, 12]
        first, second = tf.split(y, [1, 1], axis=channel)                   # SplitV
        y = tf.concat([second, first], channel)
        resize_in = tf.transpose(y, [0, 2, 3, 1]) if nchw else y
        resized = tf.compat.v1.image.resize_bilinear(resize_in, [16, 16])
        z = tf.transpose(resized, [0, 3, 1, 2]) if nchw else resized
        z = tf.clip_by_value(z, -0.5, 0.5)
        tf.identity(tf.math.add_n([z, tf.nn.relu(z)]), name="output")
    return graph.as_graph_def()


def test_decoder_ops_convert_and_transposes_cancel_around_an_nhwc_only_op():
    original = decoder_net("NCHW")
    result = api.optimize(original, ["layout-nhwc"], inputs=["input"], outputs=["output"])
    assert result.verification.passed
    assert channels_first(result.graph_def) == []
    report = next(r for r in result.reports if r.name == "layout-nhwc")
    assert not report.skipped, report.skipped
    converted = {line.split(":")[0] for line in report.rewritten}
    assert {"split", "split_1", "conv2d_transpose", "DepthToSpace", "MaxPoolV2", "concat",
            "clip_by_value", "AddN"} <= converted, converted
    # only the interface's two remain: the resize's pair met the inserted ones and cancelled
    assert sorted(transposes_4d(result.graph_def)) == ["input/to_nhwc", "output"]
    value = np.random.default_rng(8).standard_normal([2, 6, 6, 4]).astype(np.float32)
    want = oracle.run(decoder_net("NHWC"), {"input": value}, ["output"])[0]
    got = oracle._run(result.graph_def, {"input": np.transpose(value, [0, 3, 1, 2])},
                      ["output"])[0]
    assert oracle.relative_error(np.transpose(want, [0, 3, 1, 2]), got) < 1e-5


def onnx_tf_net(seed: int = 2):
    """What onnx-tf writes: an NCHW interface, each conv and pool NHWC inside its own transpose
    pair, the element-wise ops between them in NCHW (per-channel constants [C, 1, 1])."""
    r = np.random.default_rng(seed)

    def wrapped(x, op):
        return tf.transpose(op(tf.transpose(x, [0, 2, 3, 1])), [0, 3, 1, 2])

    def conv(cin, cout):
        kernel = (r.standard_normal([3, 3, cin, cout]) / np.sqrt(9 * cin)).astype(np.float32)
        return lambda x: tf.nn.conv2d(x, kernel, 1, "SAME")

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3, 8, 8], name="input")
        y = tf.nn.relu(wrapped(x, conv(3, 6)) + r.normal(0, 0.5, [6, 1, 1]).astype(np.float32))
        skip = wrapped(y, lambda t: tf.nn.max_pool2d(t, 2, 2, "VALID"))
        y = tf.nn.relu(wrapped(skip, conv(6, 6)))
        y = wrapped(y, conv(6, 6)) * r.uniform(0.5, 1.5, [6, 1, 1]).astype(np.float32) + skip
        tf.identity(tf.nn.relu(y), name="output")
    return graph.as_graph_def()


def test_onnx_tf_transpose_pairs_between_nhwc_ops_cancel():
    """No NCHW op at all, 8 transposes: the ones between the ops meet and cancel, the element-wise
    ops between them compute NHWC, and the interface's two remain."""
    original = onnx_tf_net()
    assert len(transposes_4d(original)) == 8
    result, skipped = _transformed(original)            # the oracle: the original, as written
    assert skipped == {}
    assert len(transposes_4d(result.graph_def)) == 2
    assert channels_first(result.graph_def) == []


def test_asymmetric_strides_dilations_windows_and_explicit_paddings():
    """Every per-axis attribute different on H and W, so a wrong permutation shows: explicit
    paddings, strides, dilations, pooling windows (TF's CPU depthwise kernel takes equal strides
    only), a depthwise multiplier of 2."""
    r = np.random.default_rng(11)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3, 11, 9], name="input")
        y = tf.nn.conv2d(x, r.standard_normal([3, 2, 3, 4]).astype(np.float32),
                         [1, 1, 1, 2], [[0, 0], [0, 0], [2, 1], [0, 1]], data_format="NCHW")
        y = tf.nn.conv2d(y, r.standard_normal([2, 3, 4, 4]).astype(np.float32), 1, "SAME",
                         dilations=[1, 1, 2, 1], data_format="NCHW")
        y = tf.nn.max_pool2d(y, [3, 2], [2, 1], "SAME", data_format="NCHW")
        y = tf.nn.depthwise_conv2d(y, r.standard_normal([2, 3, 4, 2]).astype(np.float32),
                                   [1, 1, 2, 2], "VALID", data_format="NCHW")
        y = tf.nn.avg_pool2d(y, [2, 1], [1, 2], "VALID", data_format="NCHW")
        tf.identity(y, name="output")
    graph_def = graph.as_graph_def()
    result, skipped = _transformed(graph_def)            # the oracle runs the original itself
    assert skipped == {}
    assert channels_first(result.graph_def) == []
    assert sorted(transposes_4d(result.graph_def)) == ["input/to_nhwc", "output"]



def test_comparisons_and_selects_convert_with_their_bool_tensors():
    """Comparisons make bool tensors, SelectV2 reads one: the transposes each needs carry the
    right dtype (a bool 4-D input is transposed as bool)."""
    def tail(y, r):
        mask = tf.compat.v1.placeholder(tf.bool, [None, 4, 6, 6], name="mask")
        keep = tf.logical_and(tf.greater(y, 0.1), tf.logical_not(mask))
        z = tf.where(keep, y, y * r.uniform(0.5, 1.5, [4, 1, 1]).astype(np.float32))
        return tf.nn.max_pool2d(z, 2, 2, "VALID", data_format="NCHW")
    graph_def = small_net(tail)
    result, skipped = _transformed(graph_def, inputs=("input", "mask"))
    assert skipped == {}
    assert sorted(transposes_4d(result.graph_def)) == ["input/to_nhwc", "mask/to_nhwc", "output"]
    types = {n.name: n.attr["T"].type for n in result.graph_def.node if n.op == "Transpose"}
    assert types["mask/to_nhwc"] == tf.bool.as_datatype_enum


def test_int64_permutations_compose():
    """An ONNX-style graph whose transposes take int64 permutations (Tperm int64): composed with
    the inserted int32 ones, each keeps a permutation of its own Tperm."""
    r = np.random.default_rng(3)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 4], name="input")
        y = tf.transpose(x, tf.constant([0, 3, 1, 2], tf.int64))
        y = tf.nn.conv2d(y, r.standard_normal([3, 3, 4, 4]).astype(np.float32), 1, "SAME",
                         data_format="NCHW")
        y = tf.transpose(tf.nn.relu(y), tf.constant([0, 2, 1, 3], tf.int64))   # NCHW → NHCW
        tf.identity(y, name="output")
    result, skipped = _transformed(graph.as_graph_def())
    assert skipped == {}
    nodes = {n.name: n for n in result.graph_def.node}
    assert [n.op for n in nodes.values() if n.op == "Transpose"] == ["Transpose"]
    left = next(n for n in nodes.values() if n.op == "Transpose")
    assert left.attr["Tperm"].type == tf.int64.as_datatype_enum
    assert nodes[left.input[1]].attr["dtype"].type == tf.int64.as_datatype_enum


def test_an_int64_transpose_composed_onto_keeps_its_permutation_type():
    """NHWC input → Transpose to NCHW → Transpose swapping H and W → NCHW conv, both original
    transposes int64 and listed in reverse order in the GraphDef (TensorFlow allows any order):
    the second is composed onto the first, and its new permutation is int64 like its Tperm."""
    r = np.random.default_rng(4)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 7, 4], name="input")
        y = tf.transpose(x, tf.constant([0, 3, 1, 2], tf.int64), name="to_nchw")
        y = tf.transpose(y, tf.constant([0, 1, 3, 2], tf.int64), name="swap_hw")
        tf.identity(y, name="side")                       # swap_hw stays: it is read here
        y = tf.nn.conv2d(y, r.standard_normal([3, 2, 4, 4]).astype(np.float32), 1, "SAME",
                         data_format="NCHW")
        tf.identity(y, name="output")
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    first, second = (next(i for i, n in enumerate(nodes) if n.name == name)
                     for name in ("to_nchw", "swap_hw"))
    nodes[first], nodes[second] = nodes[second], nodes[first]
    del graph_def.node[:]
    graph_def.node.extend(nodes)
    result, skipped = _transformed(graph_def, outputs=("output", "side"))
    assert skipped == {}
    assert {n.name: n.input[:1] for n in result.graph_def.node}["swap_hw"] == ["input"]
    for node in result.graph_def.node:
        if node.op == "Transpose":
            perm = next(n for n in result.graph_def.node if n.name == node.input[1])
            assert perm.attr["dtype"].type == node.attr["Tperm"].type, node.name

# ---------------------------------------------------------------- property: random graphs
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from conftest import optimize, property_examples  # noqa: E402
from strategies import build, graph_specs  # noqa: E402
from test_properties import oracle_error  # noqa: E402
from tfsurgery.verify import check as verify  # noqa: E402
from tfsurgery.errors import VerificationFailed  # noqa: E402

ILL_CONDITIONED = []


def four_d(graph_def, names):
    nodes = {n.name: n for n in graph_def.node}
    count = 0
    for name in names:
        node = nodes[name.split(":")[0]]
        shape = node.attr["shape"].shape if node.op == "Placeholder" else None
        count += shape is None or len(shape.dim) == 4       # an output: counted as 4-D
    return count


@settings(max_examples=max(30, property_examples() // 4), database=None, derandomize=True,
          deadline=None, print_blob=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(graph_specs(), st.booleans())
def _random_graphs_go_nhwc(spec, bn_fold):
    built = build(spec)
    model = built.model
    try:
        result = optimize(model, bn_fold=bn_fold, layout="NHWC")
    except VerificationFailed as failed:
        if failed.result is not None and oracle_error(built, failed.result)[1] > 1e-3:
            ILL_CONDITIONED.append(failed.max_error)
            return
        raise
    error, floor = oracle_error(built, result)       # the original, run by the oracle
    if floor > 1e-3:
        ILL_CONDITIONED.append(floor)
        return
    assert error <= max(1e-4, verify.NOISE_FACTOR * floor), (error, floor)
    graph_def = result.graph_def
    assert channels_first(graph_def) == []
    report = next(r for r in result.reports if r.name == "layout-nhwc")
    bound = four_d(graph_def, result.inputs) + four_d(graph_def, result.outputs) + \
        2 * len(report.skipped)
    assert len(transposes_4d(graph_def)) <= bound, (transposes_4d(graph_def), report.skipped)
    again = api.optimize(graph_def, ["layout-nhwc"], inputs=result.inputs,
                         outputs=result.outputs, verify=False)
    assert list(again.graph_def.node) == list(graph_def.node), "not a fixed point"


def test_random_graphs_go_nhwc_with_their_numbers():
    """The property strategies' graphs (convs, depthwise, concat, BN in every form, residuals,
    dense heads; NCHW and NHWC), through the default pipeline with --layout NHWC: the oracle's
    numbers, no NCHW op, transposes only at the interface and around reported ops, and a second
    run changes nothing."""
    ILL_CONDITIONED.clear()
    _random_graphs_go_nhwc()
    assert len(ILL_CONDITIONED) <= 3, ILL_CONDITIONED
