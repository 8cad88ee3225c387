"""add-preprocessing: uint8 / channel reversal / mean / scale baked into the graph, folded where exact,
verified against the original fed the verifier's own NumPy preprocessing."""
import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.preprocessing import Requested
from tfsurgery.contract import Preprocessing
from tfsurgery.preprocessing import model_values

import oracle

RNG = np.random.default_rng(7)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def build(kind: str):
    """A small TF1 graph: input 'x' → first layer → ... → 'out'."""
    v1 = tf.compat.v1
    with tf.Graph().as_default() as g:
        if kind == "matmul":
            x = v1.placeholder(tf.float32, [None, 6], name="x")
            y = tf.nn.bias_add(tf.matmul(x, _r(6, 4)), _r(4))
        else:
            nchw = kind.startswith("nchw")
            shape = [None, 3, 8, 8] if nchw else [None, 8, 8, 3]
            fmt = "NCHW" if nchw else "NHWC"
            x = v1.placeholder(tf.float32, shape, name="x")
            padding = "VALID" if kind.endswith("valid") else "SAME"
            if kind.startswith("depthwise"):
                y = tf.nn.depthwise_conv2d(x, _r(3, 3, 3, 2), [1, 1, 1, 1], padding)
                y = tf.nn.bias_add(y, _r(6))
            else:
                y = tf.nn.conv2d(x, _r(3, 3, 3, 5), 1, padding, data_format=fmt)
                y = tf.nn.bias_add(y, _r(5), data_format=fmt)
            if kind.endswith("branches"):     # a second head reads the input elsewhere
                y = tf.reduce_mean(tf.nn.relu(y)) + tf.reduce_mean(x * 0.5)
            y = tf.reshape(tf.nn.relu(y), [-1]) if not kind.endswith("branches") else y
        tf.identity(y, name="out")
    return api.Source(g.as_graph_def(), label=kind, inputs=["x"], outputs=["out"])


IMAGE = dict(dtype="uint8", reverse=True, mean=(123.675, 116.28, 103.53),
             scale=(58.395, 57.12, 57.375))


def requested(dtype=None, reverse=False, mean=None, scale=None, name=None):
    return Requested(dtype and (name, dtype), (name, True) if reverse else None,
                     mean and (name, tuple(mean)), scale and (name, tuple(scale)))


def run(source, **kwargs):
    result = api.optimize(source, api.choose_transforms(), preprocess=requested(**kwargs))
    assert result.verification is not None and result.verification.passed, \
        result.verification_error or result.verification.failure()
    if kwargs.get("name") is None:
        assert_preprocessing_oracle(source, result, **kwargs)
    return result


def assert_preprocessing_oracle(source, result, dtype=None, reverse=False, mean=None,
                                scale=None, name=None):
    """The tests' own oracle: raw values into the result; into the original, the same values
    preprocessed here in NumPy — m = (reverse(x) − mean) / scale along the channel axis, which
    the test knows from how it built the graph (NCHW: 1, else last)."""
    placeholder = next(n for n in source.graph_def.node if n.name == "x")
    dims = [d.size if d.size > 0 else 2 for d in placeholder.attr["shape"].shape.dim]
    rng = np.random.default_rng(9)
    raw = (rng.integers(0, 256, dims).astype(dtype) if dtype and "int" in dtype
           else rng.standard_normal(dims).astype(np.float32))
    axis = 1 if source.label.startswith("nchw") else len(dims) - 1
    model = raw.astype(np.float64)
    if reverse:
        model = np.flip(model, axis=axis)
    per_channel = [1] * len(dims)
    per_channel[axis] = -1
    if mean:
        model = model - np.reshape(mean, per_channel if len(mean) > 1 else [1])
    if scale:
        model = model / np.reshape(scale, per_channel if len(scale) > 1 else [1])
    expected = oracle.run(source.graph_def, {"x": model.astype(np.float32)}, ["out"])[0]
    actual = oracle.run(result.graph_def, {"x": raw}, ["out"])[0]
    assert oracle.relative_error(expected, actual) <= 1e-4


def ops(graph_def):
    return [n.op for n in graph_def.node if n.op != "Const"]


@pytest.mark.parametrize("kind", ["nhwc_valid", "nchw_valid", "nhwc_same"])
def test_image_preprocessing_folds_into_first_conv(kind):
    source = build(kind)
    result = run(source, **IMAGE)
    placeholder = next(n for n in result.graph_def.node if n.name == "x")
    assert tf.dtypes.as_dtype(placeholder.attr["dtype"].type) == tf.uint8
    left = ops(result.graph_def)
    assert "Mul" not in left and "RealDiv" not in left and "ReverseV2" not in left
    extra = len(left) - len(ops(source.graph_def))
    if kind.endswith("valid"):              # the mean folds into the bias: only the Cast
        assert "Sub" not in left and extra == 1
    else:                                   # SAME padding: one Sub stays before the conv
        assert left.count("Sub") == 1 and extra == 2
    feeds = result.verification.feeds["x"]
    assert feeds.dtype == np.uint8 and feeds.min() == 0 and feeds.max() == 255


def test_numbers_match_numpy_reference_independently():
    """The verifier's NumPy preprocessing, checked by hand against the formula."""
    source = build("nhwc_valid")
    result = run(source, **IMAGE)
    raw = RNG.integers(0, 256, size=(2, 8, 8, 3)).astype(np.uint8)
    model = ((raw[..., ::-1].astype(np.float64) - np.array(IMAGE["mean"]))
             / np.array(IMAGE["scale"])).astype(np.float32)
    from tfsurgery.verify.check import run_graph
    expected = run_graph(source.graph_def, {"x": model}, ["out"])[0]
    actual = run_graph(result.graph_def, {"x": raw}, ["out"])[0]
    assert np.max(np.abs(expected - actual)) <= 1e-4 * np.max(np.abs(expected))


def test_depthwise_first_layer_scale_and_mean_fold_reversal_stays():
    source = build("depthwise_valid")
    result = run(source, **IMAGE)
    left = ops(result.graph_def)
    assert "Mul" not in left              # the scale folds per input channel
    assert "Sub" not in left              # the mean (after the reversal) folds into the bias
    assert "ReverseV2" in left            # it would permute the depthwise outputs too
    assert len(left) - len(ops(source.graph_def)) == 2          # Cast + ReverseV2
    assert any("depthwise" in r for rep in result.reports for _, r in rep.skipped)


def test_matmul_first_layer_mean_and_scale_fold():
    result = run(build("matmul"), dtype="float16", mean=(1, 2, 3, 4, 5, 6), scale=(2,))
    left = ops(result.graph_def)
    assert left.count("Cast") == 1 and "Sub" not in left and "Mul" not in left


def test_input_read_by_two_branches_keeps_its_meaning():
    result = run(build("nhwc_valid_branches"), **IMAGE)
    assert "ReverseV2" in ops(result.graph_def)   # the second head still reads m


@pytest.mark.parametrize("args, message", [
    (["--mean-values", "1,2"], "2 values"),
    (["--scale-values", "0"], "scale of 0"),
    (["--mean-values", "nope=1"], "not an input"),
    (["--reverse-input-channels"], "not an image"),
])
def test_bad_preprocessing_options_exit_2(tmp_path, capsys, args, message):
    path = tmp_path / "m.pb"
    model = build("matmul") if "--reverse-input-channels" in args else build("nhwc_valid")
    path.write_bytes(model.graph_def.SerializeToString())
    out = tmp_path / "o.pb"
    code = main([str(path), "-o", str(out), "--inputs", "x", "--outputs", "out"] + args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_integer_model_input_refused(tmp_path, capsys):
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.int32, [None, 4], name="x")
        tf.identity(tf.cast(x, tf.float32) * 2.0, name="out")
    path = tmp_path / "m.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    code = main([str(path), "-o", str(tmp_path / "o.pb"), "--input-dtype", "uint8"])
    err = capsys.readouterr().err
    assert code == 2 and "not float" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["m.pb"]


def test_cli_uint8_onnx_matches(tmp_path):
    source = build("nhwc_same")
    path = tmp_path / "m.pb"
    path.write_bytes(source.graph_def.SerializeToString())
    onnx_path = tmp_path / "m.onnx"
    code = main([str(path), "-o", str(tmp_path / "o.pb"), "--onnx", str(onnx_path), "-q",
                 "--inputs", "x", "--outputs", "out", "--input-dtype", "uint8",
                 "--reverse-input-channels", "--mean-values", "127.5", "--scale-values", "127.5"])
    assert code == 0
    import onnx
    model = onnx.load(str(onnx_path))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8


def test_model_values_order():
    spec = Preprocessing(reverse=True, mean=(1.0, 2.0, 3.0), scale=(1.0, 2.0, 4.0), channel_axis=1)
    raw = np.array([[10.0, 20.0, 30.0]])
    assert np.allclose(model_values(raw, spec, np.float32), [[29.0, 9.0, 1.75]])


APPLICATION_CASES = {
    "MobileNetV2": dict(mean=(127.5,), scale=(127.5,)),
    "ResNet50": dict(mean=(123.675, 116.28, 103.53), scale=(58.395, 57.12, 57.375)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(APPLICATION_CASES))
def test_keras_application_uint8_bgr_costs_at_most_two_nodes(name, tmp_path):
    """Issue 14's Done-when: ≤ 2 more non-Const nodes than plain --bn-fold, uint8 ONNX matches."""
    from tfsurgery.models import keras_models
    built = keras_models.keras_application(name, seed=3, input_size=96)
    source = api.Source(built.graph_def, label=name, inputs=built.inputs, outputs=built.outputs)
    transforms = api.choose_transforms(bn_fold=True)
    plain = api.optimize(source, transforms, verify=False)
    result = api.optimize(source, transforms, preprocess=requested(
        dtype="uint8", reverse=True, **APPLICATION_CASES[name]))
    assert result.verification.passed and result.verification.max_error <= 1e-4
    left, before = ops(result.graph_def), ops(plain.graph_def)
    print(f"{name}: plain --bn-fold {len(before)} non-Const, with preprocessing {len(left)}; "
          f"max error {result.verification.max_error:.3g}")
    assert len(left) - len(before) <= 2
    for op in ("Mul", "RealDiv", "ReverseV2", "GatherV2"):
        assert left.count(op) == before.count(op), op
    exported = api.export_onnx(result, tmp_path / "m.onnx")
    import onnx
    model = onnx.load(str(tmp_path / "m.onnx"))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    print(f"{name}: ONNX {exported}")


def test_scalar_mean_with_same_padding_folds_through_a_padv2():
    result = run(build("nhwc_same"), dtype="uint8", reverse=True, mean=(127.5,), scale=(127.5,))
    left = ops(result.graph_def)
    assert not {"Sub", "Mul", "ReverseV2"} & set(left) and left.count("PadV2") == 1


# ---------------------------------------------------------------- exports (issue 14 item 5)
PIXELS = dict(dtype="uint8", reverse=True, mean=(127.5,), scale=(60.0,))
CLI_PIXELS = ["--input-dtype", "uint8", "--reverse-input-channels", "--mean-values", "127.5",
              "--scale-values", "60"]


@pytest.fixture(scope="module")
def preprocessed_exports(tmp_path_factory):
    """nhwc_same through the CLI with uint8 BGR preprocessing, to every format."""
    import json
    folder = tmp_path_factory.mktemp("pp_exports")
    source = build("nhwc_same")
    (folder / "m.pb").write_bytes(source.graph_def.SerializeToString())
    code = main([str(folder / "m.pb"), "-q", "--inputs", "x", "--outputs", "out", *CLI_PIXELS,
                 "-o", str(folder / "o.pb"), "--onnx", str(folder / "o.onnx"),
                 "--saved-model", str(folder / "sm"), "--tflite", str(folder / "o.tflite"),
                 "--report-json", str(folder / "r.json")])
    assert code == 0
    report = json.loads((folder / "r.json").read_text())
    return source, folder, {a["format"]: a for a in report["artefacts"]}


def test_every_export_takes_uint8_and_matches_the_original_on_numpy_preprocessing(
        preprocessed_exports):
    """Each artefact, run independently here on raw uint8 over 0-255, against the ORIGINAL graph
    fed (reverse(x) - 127.5) / 60 computed in this test."""
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter
    from tfsurgery.verify.check import run_graph
    source, folder, written = preprocessed_exports
    assert set(written) == {"pb", "onnx", "saved_model", "tflite"}
    for entry in written.values():
        assert entry["passed"] and entry["written"] and entry["max_error"] <= 1e-4
        assert entry["reference"].startswith("the original graph fed the verifier's NumPy")
    raw = RNG.integers(0, 256, size=(2, 8, 8, 3)).astype(np.uint8)
    raw.flat[:2] = 0, 255
    model = ((raw[..., ::-1].astype(np.float64) - 127.5) / 60).astype(np.float32)
    expected = run_graph(source.graph_def, {"x": model}, ["out"])[0]
    session = ort.InferenceSession(str(folder / "o.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(uint8)"
    signature = tf.saved_model.load(str(folder / "sm")).signatures["serving_default"]
    assert signature.structured_input_signature[1]["x"].dtype == tf.uint8
    runner = Interpreter(model_path=str(folder / "o.tflite")).get_signature_runner()
    assert runner.get_input_details()["x"]["dtype"] == np.uint8
    got = {"pb": run_graph(tf.compat.v1.GraphDef.FromString((folder / "o.pb").read_bytes()),
                           {"x": raw}, ["out"])[0],
           "onnx": session.run(None, {session.get_inputs()[0].name: raw})[0],
           "saved_model": signature(x=tf.constant(raw))["out"].numpy(),
           "tflite": runner(x=raw)["out"]}
    scale = np.abs(expected).max()
    for name, value in got.items():
        assert np.abs(value - expected).max() <= 1e-4 * scale, name


def _tampered(result):
    """The optimized graph with its first conv's weights off by 1 %: the exports of it agree
    with it, but not with the original."""
    from tfsurgery.graph import Graph
    graph = Graph(result.graph_def)
    conv = next(n for n in graph if n.op == "Conv2D")
    weight = conv.input[1].split(":")[0]
    value = graph.const_value(weight) * np.float32(1.01)
    graph.remove([weight])
    graph.add_const(weight, value)
    return graph.to_graph_def()


def test_exports_with_preprocessing_are_checked_against_the_original_not_the_graph(tmp_path):
    """Were an export compared with the optimized graph (the thing under test), a wrong
    optimized graph would pass here; compared with the original on the verifier's own NumPy
    preprocessing, each of ONNX, SavedModel and TFLite refuses and writes nothing."""
    source = build("nhwc_valid")
    result = run(source, **PIXELS)
    result.graph_def = _tampered(result)
    with pytest.raises(api.OnnxCheckFailed) as refused:      # the Python path fails closed
        api.export_onnx(result, tmp_path / "m.onnx")
    onnx = refused.value.export
    saved = api.export_saved_model(source, result, tmp_path / "sm")
    lite = api.export_tflite(source, result, tmp_path / "m.tflite")
    for checked in (onnx, saved, lite):
        assert not checked.passed and 1e-3 < checked.max_error < 0.1, checked
        assert checked.reference.startswith("the original graph")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- bad input, several inputs
def _graph_file(tmp_path, name, build_graph):
    with tf.Graph().as_default() as g:
        build_graph()
    path = tmp_path / f"{name}.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    return path


def _no_channel_axis():
    """A rank-4 input that no NHWC/NCHW op reads: its channel axis cannot be known."""
    x = tf.compat.v1.placeholder(tf.float32, [None, 4, 4, 3], name="x")
    tf.identity(tf.reduce_sum(x * _r(3), axis=[1, 2]), name="out")


def _two_images():
    r = [tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name=n) for n in "ab"]
    tf.identity(tf.nn.conv2d(r[0], _r(3, 3, 3, 4), 1, "VALID")
                + tf.nn.conv2d(r[1], _r(3, 3, 3, 4), 1, "VALID"), name="out")


@pytest.mark.parametrize("graph, args, message", [
    ("no_axis", ["--reverse-input-channels"], "channel axis cannot be known"),
    ("no_axis", ["--mean-values", "1,2,3"], "channel axis cannot be known"),
    ("two", ["--mean-values", "1"], "several inputs, name one with NAME=... (a, b)"),
    ("two", ["--input-dtype", "string"], "not an integer or float dtype"),
])
def test_more_bad_preprocessing_options_exit_2(tmp_path, capsys, graph, args, message):
    path = _graph_file(tmp_path, graph, _no_channel_axis if graph == "no_axis" else _two_images)
    before = path.read_bytes()
    code = main([str(path), "-o", str(tmp_path / "o.pb"), "--onnx", str(tmp_path / "o.onnx"),
                 "--saved-model", str(tmp_path / "sm")] + args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name] and path.read_bytes() == before


def test_name_picks_each_input(tmp_path):
    path = _graph_file(tmp_path, "two", _two_images)
    result = api.optimize(api.load(path), api.choose_transforms(), preprocess=Requested(
        ("b", "uint8"), ("b", True), ("a", (1.0, 2.0, 3.0)), ("b", (50.0,))))
    assert result.verification.passed, result.verification.failure()
    dtypes = {n.name: tf.dtypes.as_dtype(n.attr["dtype"].type) for n in result.graph_def.node
              if n.op == "Placeholder"}
    assert dtypes == {"a": tf.float32, "b": tf.uint8}
    feeds = result.verification.feeds
    assert feeds["b"].min() == 0 and feeds["b"].max() == 255 and feeds["a"].dtype == np.float32


def test_bad_option_is_one_line_on_the_real_stderr(tmp_path):
    """Parsing these options imports TensorFlow; its start-up chatter must not reach stderr
    before the one-line error (checked on the process's real stderr, not a capture)."""
    import subprocess
    import sys
    from pathlib import Path
    path = tmp_path / "m.pb"
    path.write_bytes(build("nhwc_valid").graph_def.SerializeToString())
    done = subprocess.run([sys.executable, "-m", "tfsurgery.cli", str(path), "-o",
                           str(tmp_path / "o.pb"), "--scale-values", "1,abc"],
                          capture_output=True, text=True, timeout=300,
                          cwd=str(Path(__file__).resolve().parent.parent))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--scale-values" in done.stderr and "with numbers" in done.stderr
    assert not (tmp_path / "o.pb").exists()


def test_report_says_what_folded_what_stays_and_why():
    result = run(build("nhwc_same"), **IMAGE)
    notes = next(r for r in result.reports if r.name == "add-preprocessing").notes
    assert "new input signature x: uint8" in notes[0] and "m = (reverse(x) - mean) / scale" in notes[0]
    outcome = notes[1]
    assert "folded x/preprocess/reverse_channels → Conv2D" in outcome
    assert "x/preprocess/scale (Mul) → Conv2D" in outcome
    assert ("stays x/preprocess/cast (the new input dtype); "
            "x/preprocess/sub_mean (Conv2D: a per-channel shift before zero padding") in outcome
    assert "NumPy preprocessing" in result.verification.reference
    from tfsurgery.report import transform_lines
    assert "added       7 nodes" in transform_lines(result.reports)[0]


def test_bench_feeds_the_original_its_preprocessed_values(tmp_path, capsys):
    """bench: the optimized graph takes raw uint8, the original (in TF and in onnxruntime) the
    preprocessed float values — it used to feed uint8 to both and crash in onnxruntime."""
    path = tmp_path / "m.pb"
    path.write_bytes(build("nhwc_valid").graph_def.SerializeToString())
    code = main(["bench", str(path), "--runs", "1", "--inputs", "x", "--outputs", "out",
                 *CLI_PIXELS, "--report-json", str(tmp_path / "t.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "onnxruntime" in out and "tensorflow" in out


@pytest.mark.parametrize("mean", [(127.5,), (123.675, 116.28, 103.53)])
def test_depthwise_same_first_layer_keeps_its_numbers(mean):
    """SAME depthwise after the reversal: a scalar mean becomes a PadV2 border, a per-channel
    one stays as one Sub; either way the verifier's NumPy reference agrees."""
    source = build("depthwise_same")
    result = run(source, dtype="uint8", reverse=True, mean=mean, scale=(58.0,))
    left = ops(result.graph_def)
    assert "Mul" not in left and left.count("ReverseV2") == 1
    assert left.count("Sub") == (0 if len(mean) == 1 else 1)
    assert len(left) - len(ops(source.graph_def)) <= 3


# ---------------------------------------------------------------- issue 49: pairings kept
@pytest.fixture(scope="module")
def mobilenet_v2_small():
    from tfsurgery.models import keras_models
    built = keras_models.keras_application("MobileNetV2", seed=3, input_size=96, alpha=0.35)
    return api.Source(built.graph_def, label="MobileNetV2", inputs=built.inputs,
                      outputs=built.outputs)


def _scale_one_kernel(layer_index: int):
    import tfsurgery

    @tfsurgery.transform(f"scale-kernel-{layer_index}")
    def scale(graph, options):
        """A user's wrong transform: one conv's weights 5% off."""
        layer = sorted(n.name for n in graph if n.op == "Conv2D")[layer_index]
        kernel = graph.inputs(layer)[1]
        graph.set_input(layer, 1, graph.add_const(layer + "/scaled",
                                                  graph.const_value(kernel) * 1.05))
        return tfsurgery.TransformReport(f"scale-kernel-{layer_index}")
    return scale


def test_preprocessing_keeps_the_widened_pairings(mobilenet_v2_small):
    """With uint8 BGR preprocessing folded in, the widened check compares the same intermediate
    tensors as without (issue 49: it compared none, and MobileNetV2 1.0/224 ended in "cannot
    verify"): the original is fed the NumPy-preprocessed rows, the result their raw values."""
    source, transforms = mobilenet_v2_small, api.choose_transforms(bn_fold=True)
    plain = api.optimize(source, transforms)
    result = api.optimize(source, transforms, preprocess=requested(**IMAGE))
    assert result.verification.passed and not result.verification.blind
    compared = {e.name for e in result.verification.intermediate}
    assert len(compared) >= 100
    assert compared == {e.name for e in plain.verification.intermediate}
    raw = np.random.default_rng(4).integers(0, 256, (2, 96, 96, 3)).astype(np.uint8)
    model_input = (raw[..., ::-1].astype(np.float64) - IMAGE["mean"]) / IMAGE["scale"]
    expected = oracle.run(source.graph_def, {source.inputs[0]: model_input.astype(np.float32)},
                          source.outputs)[0]
    actual = oracle.run(result.graph_def, {source.inputs[0]: raw}, source.outputs)[0]
    assert oracle.relative_error(expected, actual) <= 1e-4


def test_preprocessing_with_one_kernel_5_percent_off_fails(mobilenet_v2_small):
    from tfsurgery.errors import VerificationFailed
    source = mobilenet_v2_small
    chosen = api.choose_transforms(bn_fold=True) + [_scale_one_kernel(20)]
    with pytest.raises(VerificationFailed):
        api.optimize(source, chosen, preprocess=requested(**IMAGE))
    wrong = api.optimize(source, chosen, preprocess=requested(**IMAGE), verify=False)
    raw = np.random.default_rng(5).integers(0, 256, (2, 96, 96, 3)).astype(np.uint8)
    model_input = (raw[..., ::-1].astype(np.float64) - IMAGE["mean"]) / IMAGE["scale"]
    expected = oracle.run(source.graph_def, {source.inputs[0]: model_input.astype(np.float32)},
                          source.outputs)[0]
    actual = oracle.run(wrong.graph_def, {source.inputs[0]: raw}, source.outputs)[0]
    assert oracle.relative_error(expected, actual) > 0, "the mutation is real in TensorFlow"
