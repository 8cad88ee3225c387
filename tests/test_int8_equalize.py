"""Cross-layer equalization (transforms/equalize_cross_layer.py) and the int8 choices around it
(calibration method, --int8-equalize). The oracle: the original and the result run in plain
TensorFlow sessions (tests/oracle.py) on random inputs; weights random with per-channel ranges
spanning orders of magnitude (the depthwise-network failure equalization exists for)."""
import json

import numpy as np
import pytest
import tensorflow as tf

import oracle
from tfsurgery import pipeline
from tfsurgery.contract import Options, with_params
from tfsurgery.transforms.equalize_cross_layer import equalize_cross_layer

NAME = "equalize-cross-layer"


def ranged(rng, shape, axis):
    """Normal weights whose slices along ``axis`` span 1e-3 … 1e2 in magnitude."""
    w = rng.standard_normal(shape)
    spread = 10.0 ** rng.uniform(-3, 2, shape[axis])
    view = [1] * len(shape)
    view[axis] = -1
    return (w * spread.reshape(view)).astype(np.float32)


def build(kind1="Conv2D", kind2="Conv2D", act="Relu", bias="BiasAdd", nchw=False, seed=0,
          extra_reader=False, variable_weights=False, channels=6):
    """input → conv1 → bias → act → conv2 → output (and a depthwise/MatMul variant)."""
    rng = np.random.default_rng(seed)
    fmt = "NCHW" if nchw else "NHWC"
    with tf.Graph().as_default() as graph:
        if kind1 == "MatMul":
            x = tf.compat.v1.placeholder(tf.float32, [None, 5], name="input")
            w1 = tf.constant(ranged(rng, (5, channels), 1), name="w1")
            y = tf.matmul(x, w1, name="conv1")
        else:
            shape = [None, 3, 7, 7] if nchw else [None, 7, 7, 3]
            x = tf.compat.v1.placeholder(tf.float32, shape, name="input")
            if kind1 == "DepthwiseConv2dNative":
                w1 = tf.constant(ranged(rng, (3, 3, 3, 2), 2), name="w1")   # 3 × 2 = 6 channels
                y = tf.nn.depthwise_conv2d(x, w1, [1, 1, 1, 1], "SAME", data_format=fmt,
                                           name="conv1")
                channels = 6
            else:
                value = ranged(rng, (3, 3, 3, channels), 3)
                w1 = tf.compat.v1.placeholder_with_default(value, value.shape, name="w1") \
                    if variable_weights else tf.constant(value, name="w1")
                y = tf.nn.conv2d(x, w1, [1, 1, 1, 1], "SAME", data_format=fmt, name="conv1")
        b = rng.standard_normal(channels).astype(np.float32)
        if bias == "BiasAdd":
            y = tf.nn.bias_add(y, b, data_format=fmt if kind1 != "MatMul" else "NHWC",
                               name="bias")
        elif bias == "Add":
            b = b.reshape((channels, 1, 1) if nchw and kind1 != "MatMul" else (channels,))
            y = tf.add(y, tf.constant(b), name="bias")
        if act == "Relu":
            y = tf.nn.relu(y, name="act")
        elif act == "Relu6":
            y = tf.nn.relu6(y, name="act")
        elif act == "Identity":
            y = tf.identity(y, name="act")
        if extra_reader:
            tf.identity(y * 2.0, name="other")
        if kind2 == "MatMul":
            w2 = tf.constant(ranged(rng, (channels, 4), 0), name="w2")
            out = tf.matmul(y, w2, name="conv2")
        elif kind2 == "DepthwiseConv2dNative":
            w2 = tf.constant(ranged(rng, (3, 3, channels, 1), 2), name="w2")
            out = tf.nn.depthwise_conv2d(y, w2, [1, 1, 1, 1], "SAME", data_format=fmt,
                                         name="conv2")
        else:
            w2 = tf.constant(ranged(rng, (1, 1, channels, 5), 2), name="w2")
            out = tf.nn.conv2d(y, w2, [1, 1, 1, 1], "SAME", data_format=fmt, name="conv2")
        tf.identity(out, name="output")
    return graph.as_graph_def()


def equalize(graph_def, outputs=("output",), **params):
    options = Options(inputs=["input"], outputs=list(outputs),
                      params={NAME: with_params(equalize_cross_layer, params)})
    after, reports = pipeline.run(graph_def, [NAME], options)
    return after, reports[0]


def weights(graph_def, conv):
    nodes = {n.name: n for n in graph_def.node}
    name = nodes[conv].input[1].split(":")[0]
    while nodes[name].op == "Identity":
        name = nodes[name].input[0]
    return tf.make_ndarray(nodes[name].attr["value"].tensor)


def same_outputs(before, after, outputs=("output",), seed=1, scale=1.0):
    nodes = {n.name: n for n in before.node}
    feeds = oracle.random_feeds(before, ["input"], seed, batch=3)
    feeds = {k: v * scale for k, v in feeds.items()}
    expected = oracle.run(before, feeds, list(outputs))
    actual = oracle.run(after, feeds, list(outputs))
    for e, a in zip(expected, actual):
        assert oracle.relative_error(e, a) < 1e-5
    return nodes


PAIRS = [("Conv2D", "Conv2D", "Relu", "BiasAdd"), ("Conv2D", "Conv2D", "Identity", "Add"),
         ("Conv2D", "Conv2D", None, None), ("DepthwiseConv2dNative", "Conv2D", "Relu", "BiasAdd"),
         ("Conv2D", "DepthwiseConv2dNative", "Relu", "Add"), ("MatMul", "MatMul", "Relu", "Add"),
         ("Conv2D", "Conv2D", "LeakyRelu", "BiasAdd")]


# Every pair in both layouts, except MatMul pairs, which have no data format (NHWC only).
LAYOUT_CASES = [pytest.param(*pair, nchw,
                             id=f"{'-'.join(map(str, pair))}-{'NCHW' if nchw else 'NHWC'}")
                for pair in PAIRS for nchw in (False, True)
                if not (nchw and "MatMul" in pair[:2])]


@pytest.mark.parametrize("kind1,kind2,act,bias,nchw", LAYOUT_CASES)
def test_equalization_is_exact_in_float_and_balances_the_ranges(kind1, kind2, act, bias, nchw):
    before = build(kind1, kind2, act if act != "LeakyRelu" else None, bias, nchw)
    if act == "LeakyRelu":                       # built by hand: tf.nn.leaky_relu's name
        before = build(kind1, kind2, "Relu", bias, nchw)
        for node in before.node:
            if node.name == "act":
                node.op = "LeakyRelu"
                node.attr["alpha"].f = 0.1
    after, report = equalize(before)
    assert report.matched == 1 and len(report.rewritten) == 1, report.as_dict()
    same_outputs(before, after)
    same_outputs(before, after, seed=2, scale=10.0)
    in_axis = 0 if kind2 == "MatMul" else 2

    def ranges(graph_def):
        w1, w2 = weights(graph_def, "conv1"), weights(graph_def, "conv2")
        return (np.max(np.abs(w1.reshape(-1, 6)), axis=0),          # conv1's output channels
                np.max(np.abs(np.moveaxis(w2, in_axis, -1).reshape(-1, 6)), axis=0))

    (r1, r2), (q1, q2) = ranges(before), ranges(after)
    np.testing.assert_allclose(q1, q2, rtol=1e-5)          # balanced: one range per channel
    np.testing.assert_allclose(q1, np.sqrt(r1 * r2), rtol=1e-5)     # Nagel's geometric mean
    assert np.ptp(np.log10(r1 / r2)) > 2                   # they really were unbalanced


def test_a_chain_is_swept_until_every_pair_is_balanced():
    """depthwise → pointwise → depthwise: the middle conv belongs to two pairs."""
    rng = np.random.default_rng(3)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 4], name="input")
        y = tf.nn.relu(tf.nn.depthwise_conv2d(x, ranged(rng, (3, 3, 4, 1), 2), [1] * 4, "SAME",
                                              name="dw1"))
        y = tf.nn.relu(tf.nn.conv2d(y, ranged(rng, (1, 1, 4, 8), 3), [1] * 4, "SAME", name="pw"))
        y = tf.nn.depthwise_conv2d(y, ranged(rng, (3, 3, 8, 1), 2), [1] * 4, "SAME", name="dw2")
        tf.identity(y, name="output")
    before = graph.as_graph_def()
    after, report = equalize(before)
    assert len(report.rewritten) == 2
    same_outputs(before, after)
    pw, dw1, dw2 = weights(after, "pw"), weights(after, "dw1"), weights(after, "dw2")
    np.testing.assert_allclose(np.abs(dw1).max(axis=(0, 1, 3)), np.abs(pw).max(axis=(0, 1, 3)),
                               rtol=1e-3)
    np.testing.assert_allclose(np.abs(pw).max(axis=(0, 1, 2)), np.abs(dw2).max(axis=(0, 1, 3)),
                               rtol=1e-3)


def test_relu6_is_refused_without_ranges_and_untouched():
    before = build(act="Relu6")
    after, report = equalize(before)
    assert not report.rewritten and "ReLU6" in report.skipped[0][1]
    assert after.SerializeToString() == before.SerializeToString() or \
        np.array_equal(weights(after, "conv1"), weights(before, "conv1"))


def test_relu6_channels_proven_below_the_clip_scale_exactly_for_any_input():
    """conv1 reads a ReLU6 output (values in [0, 6]): a channel with b + 6·Σw⁺ < 6 can never
    clip, so it scales (and only such channels do) — exact even on inputs that saturate
    everything upstream."""
    rng = np.random.default_rng(7)
    w1 = ranged(rng, (1, 1, 4, 6), 3) * 0.05                    # some channels tiny
    w2 = ranged(rng, (1, 1, 6, 3), 2)
    b1 = np.full(6, -0.1, np.float32)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 5, 5, 4], name="input")
        y = tf.nn.relu6(x * 3.0)
        y = tf.nn.relu6(tf.nn.bias_add(tf.nn.conv2d(y, w1, [1] * 4, "SAME", name="conv1"), b1,
                                       name="bias"), name="act")
        tf.identity(tf.nn.conv2d(y, w2, [1] * 4, "SAME", name="conv2"), name="output")
    before = graph.as_graph_def()
    after, report = equalize(before)
    assert len(report.rewritten) == 1, report.as_dict()
    for scale in (1.0, 100.0):
        same_outputs(before, after, scale=scale)
    bound = b1 + 6 * np.clip(w1, 0, None).sum(axis=(0, 1, 2))
    s = np.abs(w1).max(axis=(0, 1, 2)) / np.abs(weights(after, "conv1")).max(axis=(0, 1, 2))
    assert np.any(bound < 6) and np.any(bound >= 6)            # both kinds are present
    np.testing.assert_allclose(s[bound >= 6], 1, rtol=1e-6)     # unproven: untouched
    assert np.all(bound[bound < 6] / s[bound < 6] <= 6 * (1 + 1e-5))
    assert not np.allclose(s[bound < 6], 1)


def relu6_maxima(graph_def, feeds):
    pre = oracle.run(graph_def, feeds, ["bias"])[0]
    return tuple(float(v) for v in pre.reshape(-1, pre.shape[-1]).max(axis=0))


def test_relu6_with_measured_ranges_scales_only_channels_that_never_clip():
    before = build(act="Relu6", seed=4)
    feeds = oracle.random_feeds(before, ["input"], 5, batch=4)
    feeds = {k: v * 0.05 for k, v in feeds.items()}           # small inputs: few channels clip
    maxima = relu6_maxima(before, feeds)
    after, report = equalize(before, activation_max={"act": maxima})
    assert len(report.rewritten) == 1, report.as_dict()
    expected = oracle.run(before, feeds, ["output"])[0]
    actual = oracle.run(after, feeds, ["output"])[0]
    assert oracle.relative_error(expected, actual) < 1e-5       # exact where no clip is reached
    s = np.abs(weights(before, "conv1")).max(axis=(0, 1, 2)) / \
        np.abs(weights(after, "conv1")).max(axis=(0, 1, 2))
    clipping = np.asarray(maxima) * 1.25 >= 6
    np.testing.assert_allclose(s[clipping], 1, rtol=1e-6)       # clipped channels: untouched
    assert np.all(np.asarray(maxima)[~clipping] / s[~clipping] * 1.25 <= 6 + 1e-6)


def test_relu6_refused_when_every_channel_reaches_the_clip():
    before = build(act="Relu6")
    after, report = equalize(before, activation_max={"act": (50.0,) * 6})
    assert not report.rewritten and "every channel reaches the clip" in report.skipped[0][1]
    assert np.array_equal(weights(after, "conv1"), weights(before, "conv1"))


def test_a_second_reader_of_conv1_is_refused():
    before = build(extra_reader=True)
    after, report = equalize(before, outputs=("output", "other"))
    assert not report.rewritten and "read by 2" in report.skipped[0][1]
    same_outputs(before, after, outputs=("output", "other"))
    assert np.array_equal(weights(after, "conv1"), weights(before, "conv1"))


def test_weights_that_are_not_constants_are_refused():
    before = build(variable_weights=True)
    after, report = equalize(before)
    assert not report.rewritten and "not a constant" in report.skipped[0][1]
    assert np.array_equal(weights(after, "conv2"), weights(before, "conv2"))


# ---------------------------------------------------------------- int8 on real digits
@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    from int8_digits import CALIBRATE, TRAIN, digits_on_disk
    folder = tmp_path_factory.mktemp("digits_eq")
    pb, images, labels, graph_def = digits_on_disk(folder)
    unseen = images[TRAIN + CALIBRATE:]
    np.savez(folder / "check.npz", input=unseen[:100])
    return dict(pb=pb, folder=folder, graph_def=graph_def, check=unseen[:100],
                other=unseen[100:], labels=labels[TRAIN + CALIBRATE + 100:])


def ort_scores(path, images):
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: image[None]})[0] for image in images])


def int8_run(model, tmp_path, *extra):
    from tfsurgery.cli import main
    out, report = tmp_path / "int8.onnx", tmp_path / "report.json"
    code = main(["export", str(model["pb"]), "-o", str(out), "--quantize", "int8",
                 "--int8-min-speedup", "0", "--samples",
                 str(model["folder"] / "calibration.npz"), "--check-samples",
                 str(model["folder"] / "check.npz"), "--report-json", str(report), "-q",
                 "--int8-min-agreement", "0.95", "--int8-mode", "static", *extra])
    return code, out, json.loads(report.read_text())["int8"]


def test_digits_int8_with_equalization_and_auto_calibration(digits_model, tmp_path):
    code, out, int8 = int8_run(digits_model, tmp_path, "--int8-equalize", "on",
                               "--int8-calibration", "auto", "--int8-bias-correction", "off")
    assert code == 0 and int8["passed"] and int8["model"] == "equalized"
    assert int8["calibration_method"] in ("MinMax", "Percentile")
    assert {(a["model"], a["method"]) for a in int8["tried"]} == \
        {("equalized", "MinMax"), ("equalized", "Percentile")}
    assert int8["equalization"]["pairs"] == 1               # conv → ReLU → conv
    assert int8["equalization"]["verification"]["passed"]
    # the test's own oracle: unseen digits, labels, TensorFlow for float, onnxruntime for int8
    reference = oracle.run(digits_model["graph_def"], {"input": digits_model["other"]},
                           ["Identity"])[0]
    got = ort_scores(out, digits_model["other"])
    labels = digits_model["labels"]
    assert np.mean(reference.argmax(-1) == labels) > 0.9
    assert np.mean(got.argmax(-1) == labels) >= np.mean(reference.argmax(-1) == labels) - 0.01


def test_auto_keeps_the_best_attempt_on_the_selection_rows(digits_model, tmp_path):
    code, out, int8 = int8_run(digits_model, tmp_path)          # defaults: auto and auto
    assert code == 0
    guided = [a for a in int8["tried"] if not a["weights"]]     # the target's weights
    tried = {(a["model"], a["method"]): a for a in guided if not a["bias_corrected"]}
    assert set(tried) == {(m, c) for m in ("plain", "equalized")
                          for c in ("MinMax", "Percentile")}
    corrected = {(a["model"], a["method"]): a for a in guided if a["bias_corrected"]}
    assert set(corrected) == set(tried)        # every attempt also with its biases corrected
    # and the best of those with onnxruntime's default weights where the target's differ
    assert any(a["weights"] == "8-bit per-tensor" for a in int8["tried"])
    [kept] = [a for a in int8["tried"] if (a["model"], a["method"], a["bias_corrected"],
                                           a["weights"]) == (
        int8["model"], int8["calibration_method"], int8["bias_corrected"], int8["weights"])]
    # best agreement on the selection rows first, then the least relative error
    best = min(int8["tried"], key=lambda a: (-a["outputs"][0]["value"],
                                             a["outputs"][0]["relative_error"]))
    assert (kept["outputs"][0]["value"], kept["score"]) == \
        (best["outputs"][0]["value"], best["score"])
    assert kept["outputs"] == int8["selection_outputs"]       # nothing kept float here
    # the written model is the kept attempt: recompute its gate measures on the check rows
    reference = oracle.run(digits_model["graph_def"], {"input": digits_model["check"]},
                           ["Identity"])[0].astype(np.float64)
    got = ort_scores(out, digits_model["check"]).astype(np.float64)
    agreement = np.mean(reference.argmax(-1) == got.argmax(-1))
    relative = np.linalg.norm(got - reference) / np.linalg.norm(reference)
    measured = int8["outputs"][0]
    assert measured["value"] == pytest.approx(agreement)
    assert measured["relative_error"] == pytest.approx(relative, rel=1e-3)


def test_one_calibration_method_and_no_equalization(digits_model, tmp_path):
    code, out, int8 = int8_run(digits_model, tmp_path, "--int8-calibration", "percentile",
                               "--int8-equalize", "off", "--int8-bias-correction", "off")
    assert code == 0 and int8["calibration_method"] == "Percentile" and int8["model"] == "plain"
    assert [(a["model"], a["method"]) for a in int8["tried"] if not a["weights"]] == \
        [("plain", "Percentile")]
    assert int8["equalization"] == {"asked": "off"}


def test_bias_correction_removes_the_mean_shift_of_the_outputs(digits_model, tmp_path):
    """Bias correction (each layer's bias minus its weight rounding's expected shift): on the
    calibration rows, the int8 logits' mean error per class (against TensorFlow's float logits,
    the test's own oracle) shrinks by more than half."""
    from int8_digits import CALIBRATE, TRAIN, digits
    rows = digits()[0][TRAIN:TRAIN + CALIBRATE]
    reference = oracle.run(digits_model["graph_def"], {"input": rows}, ["Identity"])[0]
    shifts = {}
    for choice in ("off", "on"):
        folder = tmp_path / choice
        folder.mkdir()
        code, out, int8 = int8_run(digits_model, folder, "--int8-bias-correction", choice,
                                   "--int8-equalize", "off", "--int8-calibration", "minmax")
        assert code == 0 and int8["bias_corrected"] == (choice == "on")
        shifts[choice] = np.abs((ort_scores(out, rows) - reference).mean(axis=0)).max()
    assert shifts["on"] < shifts["off"] / 2, shifts


def test_tflite_full_integer_of_the_equalized_graph(digits_model, tmp_path):
    from test_int8 import tflite_accuracy
    from tfsurgery.cli import main
    out, report = tmp_path / "digits.tflite", tmp_path / "report.json"
    code = main(["optimize", str(digits_model["pb"]), "-o", str(tmp_path / "d.pb"), "--tflite",
                 str(out), "--quantize", "int8", "--int8-equalize", "on",
                 "--int8-min-speedup", "0", "--int8-mode", "static",
                 "--int8-min-agreement", "0.95", "--samples",
                 str(digits_model["folder"] / "calibration.npz"), "--check-samples",
                 str(digits_model["folder"] / "check.npz"), "--report-json", str(report), "-q"])
    assert code == 0
    int8 = json.loads(report.read_text())["tflite_int8"]
    assert int8["model"] == "equalized" and [a["model"] for a in int8["tried"]] == ["equalized"]
    assert int8["equalization"]["pairs"] == 1
    reference = oracle.run(digits_model["graph_def"], {"input": digits_model["other"]},
                           ["Identity"])[0]
    float_accuracy = np.mean(reference.argmax(-1) == digits_model["labels"])
    accuracy, _ = tflite_accuracy(out, digits_model["other"], digits_model["labels"])
    assert accuracy >= float_accuracy - 0.01


def test_equalize_on_with_nothing_to_equalize_fails_in_one_line(digits_model, tmp_path, capsys):
    """Up to the first ReLU there is one conv and no pair: `on` cannot be honoured — exit 1,
    one line saying why, nothing written (`auto` would go on with the plain model)."""
    from tfsurgery.cli import main
    first_relu = [n.name for n in digits_model["graph_def"].node if n.op == "Relu"][0]
    out = tmp_path / "first.onnx"
    args = ["export", str(digits_model["pb"]), "-o", str(out), "--quantize", "int8",
            "--int8-min-speedup", "0",
            "--samples", str(digits_model["folder"] / "calibration.npz"), "--outputs",
            first_relu, "--int8-min-sqnr", "10", "-q"]
    assert main(args + ["--int8-equalize", "on"]) == 1 and not out.exists()
    err = [line for line in capsys.readouterr().err.splitlines() if "tfsurgery:" in line]
    assert len(err) == 1 and "--int8-equalize on: no layer pair could be equalized" in err[0]
    assert main(args + ["--int8-equalize", "auto"]) == 0 and out.exists()
