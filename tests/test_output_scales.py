"""Every output judged at its own scale, with its own noise floor (issue 49, items 1 and 3).

- A YOLO-style head — one conv split into xy / wh / objectness+classes, boxes ×640, scores in
  [0, 1], concatenated back into [batch, 4 + 1 + classes, anchors] — with one output channel's
  weights 5% off: the scores move by percent of their own scale and 10⁻⁵ of the boxes'. Judged
  per part of the concat, the check fails (exit 1, nothing written).
- Two outputs, one cancellation-prone (its float32 noise floor near the cap): a 0.08% error on
  the main output is not excused by the other's floor.
- NaN/Inf compared by position in every shape, a scalar too; an output whose dtype changed with
  the same values fails, saying so; an intermediate tensor holding −inf at the same positions in
  both graphs is no error.
The tests' own TF sessions (``oracle``) confirm each change is real; the unmutated twins pass."""
import json

import numpy as np
import pytest
import tensorflow as tf

import tfsurgery
from tfsurgery import api, pipeline
from tfsurgery.cli import main
from tfsurgery.errors import VerificationFailed
from tfsurgery.verify import check as verify
from tfsurgery.verify import scales
from models import tf1

import oracle

TOLERANCE = 1e-4
CLASSES = 3
HEAD = 5 + CLASSES                      # xy, wh, objectness, classes


@pytest.fixture
def users(monkeypatch):
    """A clean registry of users' transforms for each test."""
    monkeypatch.setattr(pipeline, "USER", {})


# ---------------------------------------------------------------- the graphs
def trained_like_bn(r, channels: int) -> dict:
    """Batch-norm statistics as training leaves them: small variances, a wide range of scales
    (so a fold's W·s spans decades and rounds at every weight)."""
    return {"gamma": r.uniform(0.05, 3.0, channels).astype(np.float32),
            "beta": r.normal(0.0, 1.0, channels).astype(np.float32),
            "moving_mean": r.normal(0.0, 2.0, channels).astype(np.float32),
            "moving_variance": (10.0 ** r.uniform(-4, 1, channels)).astype(np.float32)}


def yolo_head(seed: int = 0, trained_like: bool = False):
    """conv → BN → ReLU (×2) → one 1×1 head conv → reshape [N, anchors, 8] → split
    (xy 2, wh 2, objectness + classes 4) → boxes sigmoid ×640, scores sigmoid → concat →
    transpose: output [N, 8, anchors]. Random weights, biases and BN statistics (or
    ``trained_like`` ones)."""
    r = np.random.default_rng(seed)
    with tf1.v1_graph() as graph:
        x = tf1.image_input(None, 8, 3)
        for i in (1, 2):
            with tf.compat.v1.variable_scope(f"conv_{i}"):
                x = tf1.conv(x, r, 8)
            with tf.compat.v1.variable_scope(f"bn_{i}"):
                stats = trained_like_bn(r, 8) if trained_like else tf1.random_bn(r, 8)
                bn = {name: tf1.variable(name, value) for name, value in stats.items()}
                x = tf.nn.relu(tf1.fused_bn(x, bn))
        with tf.compat.v1.variable_scope("head"):
            kernel = tf1.variable("kernel", tf1.random_kernel(r, [1, 1, 8, HEAD], 8))
            y = tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"),
                               tf1.variable("bias", tf1.random_bias(r, [HEAD])))
        y = tf.reshape(y, [-1, 64, HEAD])
        xy, wh, scores = tf.split(y, [2, 2, 1 + CLASSES], axis=-1)
        boxes = [tf.sigmoid(xy) * 640.0, tf.sigmoid(wh) * 640.0]
        out = tf.concat(boxes + [tf.sigmoid(scores)], axis=-1)
        tf.transpose(out, [0, 2, 1], name="output")
    return tf1.freeze(graph, ["output"])


def two_outputs(seed: int = 1):
    """A dense trunk with two outputs: 'main' (a matmul, no bias) and 'aux', the difference of
    two matmuls whose weights differ by 10⁻⁴ — cancellation-prone: a one-ulp move of its
    weights moves it by ~10⁻³ of its own scale."""
    r = np.random.default_rng(seed)
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="input")
        with tf.compat.v1.variable_scope("hidden"):
            h = tf.nn.relu(tf1.dense(x, r, 32))
        main_kernel = tf1.variable("main_kernel", tf1.random_kernel(r, [32, 10], 32))
        tf.linalg.matmul(h, main_kernel, name="main")
        near = tf1.random_kernel(r, [32, 4], 32)
        other = (near * (1 + 1e-4 * r.standard_normal(near.shape))).astype(np.float32)
        a = tf.linalg.matmul(h, tf1.variable("aux_a", near))
        b = tf.linalg.matmul(h, tf1.variable("aux_b", other))
        tf.subtract(a, b, name="aux")
    return tf1.freeze(graph, ["main", "aux"])


def deep_with_log_of_zero(seed: int = 2, layers: int = 18):
    """More weight layers than are probed one by one (so the comparison is widened), and a
    relative-position-bucket-like side path: log(relu(x)) is −inf where relu is 0, scaled by
    a Mul (an intermediate tensor the widened check compares), clipped back to finite."""
    r = np.random.default_rng(seed)
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="input")
        h = x
        for i in range(layers):
            with tf.compat.v1.variable_scope(f"dense_{i}"):
                h = tf.nn.relu(tf1.dense(h, r, 8)) if i < layers - 1 else tf1.dense(h, r, 8)
        buckets = tf.multiply(tf.math.log(tf.nn.relu(x)), 0.5, name="buckets")
        clipped = tf.clip_by_value(buckets, -3.0, 3.0)
        tf.add(h, clipped, name="output")
    return tf1.freeze(graph, ["output"])


@pytest.fixture(scope="module")
def yolo():
    return yolo_head()


@pytest.fixture(scope="module")
def twin_outputs():
    return two_outputs()


# ---------------------------------------------------------------- the user's transforms
def one_channel_off(name: str, channel: int, factor: float = 1.05):
    """A user's transform: output channel ``channel`` of the 1×1 head conv (the Conv2D whose
    kernel has HEAD output channels) times ``factor``."""
    @tfsurgery.transform(name)
    def scale(graph, options):
        report = tfsurgery.TransformReport(name)
        for conv in graph.nodes_with_ops({"Conv2D"}):
            kernel = graph.const_value(graph.inputs(conv.name)[1])
            if kernel is not None and kernel.shape[:2] == (1, 1) and kernel.shape[-1] == HEAD:
                kernel = kernel.copy()
                kernel[..., channel] *= np.float32(factor)
                graph.set_input(conv.name, 1, graph.add_const(conv.name + "/scaled", kernel))
                report.rewritten.append(conv.name)
        return report
    return scale


def scaled_matmul(name: str, output: str, factor: float):
    """A user's transform: the kernel of the MatMul named ``output`` (a graph output, so its
    name is the interface) times ``factor``."""
    @tfsurgery.transform(name)
    def scale(graph, options):
        report = tfsurgery.TransformReport(name)
        kernel = graph.inputs(output)[1]
        graph.set_input(output, 1, graph.add_const(output + "/scaled",
                                                   graph.const_value(kernel) *
                                                   np.float32(factor)))
        report.rewritten.append(output)
        return report
    return scale


PLUGIN = '''
import numpy as np
import tfsurgery


@tfsurgery.transform("objectness-off")
def objectness_off(graph, options):
    """The objectness channel (4) of the 1x1 head conv with {head} output channels, x1.05."""
    report = tfsurgery.TransformReport("objectness-off")
    for conv in graph.nodes_with_ops({{"Conv2D"}}):
        kernel = graph.const_value(graph.inputs(conv.name)[1])
        if kernel is not None and kernel.shape[:2] == (1, 1) and kernel.shape[-1] == {head}:
            kernel = kernel.copy()
            kernel[..., 4] *= np.float32(1.05)
            graph.set_input(conv.name, 1, graph.add_const(conv.name + "/scaled", kernel))
            report.rewritten.append(conv.name)
    return report
'''


# ---------------------------------------------------------------- YOLO-style head
def test_the_yolo_output_is_cut_where_its_concat_joins_boxes_and_scores(yolo):
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(yolo, name="")
        parts = scales.parts_of(graph, "output")
    assert parts is not None and parts.cuts == ((1, (2, 2, 1 + CLASSES)),)   # after transpose


def test_one_head_channel_5_percent_off_fails_though_the_whole_tensor_hides_it(yolo, users):
    source = api.Source(yolo, "yolo", inputs=["input"], outputs=["output"])
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(source, ["default", one_channel_off("objectness-off", 4)])
    v = failed.value.verification
    error = next(o for o in v.outputs if o.name == "output")
    worst = max(error.parts, key=lambda p: p.max_rel)
    assert worst.where == "axis 1 [4:8]" and worst.max_rel > 10 * TOLERANCE
    assert "on 'output'" in v.failure() and "axis 1 [4:8]" in v.failure()
    # the oracle: the scores really moved by percent of their own scale, and by less than the
    # tolerance of the whole tensor (whose scale is the boxes' 640)
    feeds = oracle.random_feeds(yolo, ["input"], seed=0)
    expected = oracle.run(yolo, feeds, ["output"])[0]
    actual = oracle.run(failed.value.result.graph_def, feeds, ["output"])[0]
    assert oracle.relative_error(expected[:, 4:], actual[:, 4:]) > 10 * TOLERANCE
    assert oracle.relative_error(expected, actual) < TOLERANCE
    assert oracle.relative_error(expected[:, :4], actual[:, :4]) < 1e-6     # boxes untouched


def test_one_head_channel_5_percent_off_exits_1_through_the_cli(yolo, users, tmp_path, capsys):
    model, plugin, out = tmp_path / "yolo.pb", tmp_path / "mine.py", tmp_path / "out.pb"
    model.write_bytes(yolo.SerializeToString())
    plugin.write_text(PLUGIN.format(head=HEAD))
    code = main([str(model), "--plugin", str(plugin), "--transforms",
                 "default,objectness-off", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "verification FAILED" in err and "on 'output'" in err, err
    assert not out.exists()


@pytest.mark.parametrize("trained_like", [False, True])
def test_the_unmutated_yolo_head_passes_and_says_at_which_scale(tmp_path, capsys,
                                                                 trained_like):
    """The fold recomputes the convs' weights in float32: round-off, judged per part, passes."""
    yolo = yolo_head(seed=5, trained_like=trained_like)
    model, out, report = tmp_path / "yolo.pb", tmp_path / "out.pb", tmp_path / "r.json"
    model.write_bytes(yolo.SerializeToString())
    code = main([str(model), "--bn-fold", "-o", str(out), "--report-json", str(report)])
    captured = capsys.readouterr()
    assert code == 0 and out.exists(), captured.err
    judged = next(o for o in json.loads(report.read_text())["verification"]["outputs"]
                  if o["name"] == "output")["scale"]
    assert judged["judged"].startswith("each part of") and len(judged["parts"]) == 3
    assert judged["parts"][0]["scale"] > 100 and judged["parts"][2]["scale"] <= 1.0
    assert "output: judged at each part of" in captured.out + captured.err
    result = tf.compat.v1.GraphDef()
    result.ParseFromString(out.read_bytes())
    assert not any(n.op.startswith("FusedBatchNorm") for n in result.node)     # folded
    oracle.assert_same_outputs(yolo, result, ["input"], ["output"], rtol=TOLERANCE)


# ---------------------------------------------------------------- one floor per output
def test_a_cancellation_prone_output_lends_its_noise_floor_to_no_other(twin_outputs, users):
    source = api.Source(twin_outputs, "two", inputs=["input"], outputs=["main", "aux"])
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(source, ["default", scaled_matmul("main-off", "main", 1.0008)])
    v = failed.value.verification
    floors = {name: max(f) for name, f in v.noise_floors.items()}
    assert floors["aux"] > 5e-5 > 100 * floors["main"]    # aux: cancellation-prone
    main_error = next(o.max_rel for o in v.outputs if o.name == "main")
    assert 2 * TOLERANCE < main_error < verify.NOISE_CAP  # within the floor aux would lend
    assert "on 'main'" in v.failure()
    feeds = oracle.random_feeds(twin_outputs, ["input"], seed=0)
    expected = oracle.run(twin_outputs, feeds, ["main"])[0]
    actual = oracle.run(failed.value.result.graph_def, feeds, ["main"])[0]
    assert 5e-4 < oracle.relative_error(expected, actual) < 1e-3


def test_the_unmutated_two_outputs_pass(twin_outputs):
    source = api.Source(twin_outputs, "two", inputs=["input"], outputs=["main", "aux"])
    result = api.optimize(source)
    assert result.verification.passed, result.verification.failure()
    oracle.assert_same_outputs(twin_outputs, result.graph_def, ["input"], ["main", "aux"],
                               rtol=1e-5)


# ---------------------------------------------------------------- NaN/Inf, dtypes
def test_nan_and_inf_are_compared_by_position_in_every_shape():
    nan, inf, one = (np.array(v, np.float32) for v in (np.nan, np.inf, 1.0))
    assert verify.output_error("s", nan, one).max_rel == float("inf")
    assert verify.output_error("s", one, inf).max_rel == float("inf")
    assert verify.output_error("s", inf, -inf).max_rel == float("inf")
    both_nan = verify.Verification([verify.output_error("s", nan, nan)], TOLERANCE)
    assert not both_nan.passed and "cannot compare" in both_nan.failure()   # nothing compared
    shifted = np.array([[1.0, -np.inf], [2.0, 3.0]], np.float32)
    same = verify.output_error("m", shifted, shifted.copy())
    assert same.max_rel == 0.0 and same.nonfinite == 1
    assert verify.output_error("m", shifted, shifted[::-1].copy()).max_rel == float("inf")


def test_a_changed_dtype_with_the_same_values_fails_saying_so():
    for before, after in ((np.arange(4, dtype=np.int64), np.arange(4, dtype=np.float32)),
                          (np.array([True, False]), np.array([1, 0], np.int8))):
        error = scales.judged_error("o", before, after)
        assert error.max_rel == float("inf")
        assert error.reason == f"dtype {before.dtype} became {after.dtype}"
        v = verify.Verification([error], TOLERANCE)
        assert not v.passed and f"dtype {before.dtype} became {after.dtype}" in v.failure()


def argmax_graph():
    r = np.random.default_rng(4)
    with tf1.v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="input")
        with tf.compat.v1.variable_scope("dense"):
            logits = tf1.dense(x, r, 5)
        tf.identity(tf.argmax(logits, axis=1), name="label")        # int64
        tf.identity(logits > 0.0, name="positive")                   # bool
    return tf1.freeze(graph, ["label", "positive"])


def recast(name: str, output: str, dtype):
    """A user's transform: ``output`` (an Identity) becomes a Cast to ``dtype``: same values."""
    @tfsurgery.transform(name)
    def cast(graph, options):
        report = tfsurgery.TransformReport(name)
        source = graph.attr(output, "T")
        node = graph.edit_node(output)
        node.op = "Cast"
        del node.attr["T"]
        node.attr["SrcT"].type = source.as_datatype_enum
        node.attr["DstT"].type = dtype.as_datatype_enum
        node.attr["Truncate"].b = False
        report.rewritten.append(output)
        return report
    return cast


@pytest.mark.parametrize("output,dtype", [("label", tf.float32), ("positive", tf.int8)])
def test_an_output_cast_to_another_dtype_is_refused(users, output, dtype):
    built = argmax_graph()
    source = api.Source(built, "argmax", inputs=["input"], outputs=["label", "positive"])
    with pytest.raises(VerificationFailed) as failed:
        api.optimize(source, ["default", recast(f"recast-{output}", output, dtype)])
    message = failed.value.verification.failure()
    assert f"output '{output}'" in message and f"became {dtype.as_numpy_dtype.__name__}" in \
        message, message
    feeds = oracle.random_feeds(built, ["input"], seed=0)                  # same values
    expected = oracle.run(built, feeds, [output])[0]
    actual = oracle.run(failed.value.result.graph_def, feeds, [output])[0]
    assert actual.dtype == dtype.as_numpy_dtype and np.array_equal(expected, actual)


def test_the_argmax_graph_unchanged_passes():
    built = argmax_graph()
    result = api.optimize(api.Source(built, "argmax", inputs=["input"],
                                     outputs=["label", "positive"]))
    assert result.verification.passed, result.verification.failure()


# ---------------------------------------------------------------- −inf inside
def test_an_intermediate_minus_inf_at_the_same_positions_is_no_error():
    built = deep_with_log_of_zero()
    feeds = oracle.random_feeds(built, ["input"], seed=0)
    assert np.isneginf(oracle.run(built, feeds, ["buckets"])[0]).any()    # −inf inside
    result = api.optimize(api.Source(built, "buckets", inputs=["input"], outputs=["output"]))
    v = result.verification
    assert v.passed, v.failure()
    compared = {e.name: e for e in v.intermediate}
    assert "buckets:0" in compared and compared["buckets:0"].nonfinite > 0
    assert compared["buckets:0"].max_rel == 0.0
    oracle.assert_same_outputs(built, result.graph_def, ["input"], ["output"], rtol=1e-5)


def test_compare_judges_the_outputs_by_their_parts_too(yolo, tmp_path):
    mutated = tf.compat.v1.GraphDef()
    mutated.CopyFrom(yolo)
    kernel = next(n for n in mutated.node if n.name == "head/kernel")
    value = tf.make_ndarray(kernel.attr["value"].tensor).copy()
    value[..., 4] *= np.float32(1.05)
    kernel.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    paths = {}
    for name, graph_def in (("a", yolo), ("b", mutated), ("same", yolo)):
        paths[name] = tmp_path / f"{name}.pb"
        paths[name].write_bytes(graph_def.SerializeToString())
    feeds = oracle.random_feeds(yolo, ["input"], seed=0)
    expected, actual = (oracle.run(g, feeds, ["output"])[0] for g in (yolo, mutated))
    assert oracle.relative_error(expected, actual) < TOLERANCE < \
        oracle.relative_error(expected[:, 4:], actual[:, 4:])
    differs = api.compare(paths["a"], paths["b"], outputs=["output"])
    assert not differs.passed
    output = next(e for e in differs.errors if e.name == "output:0")
    assert output.parts and output.max_rel > 10 * TOLERANCE      # the output itself fails
    assert api.compare(paths["a"], paths["same"], outputs=["output"]).passed


def test_the_onnx_check_judges_each_part_as_the_verification_did(yolo, tmp_path):
    """onnxruntime's scores 1% off their own scale (the reference's values moved, as an ONNX
    converter's slip in one part would move them): refused by parts, unseen as a whole."""
    from tfsurgery.export import onnx as onnx_export
    result = api.optimize(api.Source(yolo, "yolo", inputs=["input"], outputs=["output"]))
    parts = result.verification.parts
    assert set(parts) == {"output"}
    feeds = oracle.random_feeds(yolo, ["input"], seed=0)
    moved = oracle.run(result.graph_def, feeds, ["output"])[0].copy()
    moved[:, 4:] *= np.float32(1.01)
    check = dict(feeds=feeds, expected={"output": moved}, fuse=False)
    whole = onnx_export.export(result.graph_def, ["input"], ["output"], tmp_path / "a.onnx",
                               **check)
    assert whole.passed                                           # 1e-2 of 1 is 1.5e-5 of 640
    judged = onnx_export.export(result.graph_def, ["input"], ["output"], tmp_path / "b.onnx",
                                parts=parts, **check)
    assert not judged.passed and not (tmp_path / "b.onnx").exists()
    assert judged.outputs[0].parts and judged.max_error > 10 * TOLERANCE


def test_levels_of_concatenated_parts_make_a_grid_and_plain_tensors_stay_whole():
    """A YOLOv5-style output: per level concat(xy, wh, scores) along the channels, the levels
    concatenated along the anchors: every (level, quantity) block is a part. A softmax over
    the channels mixes them: judged as a whole."""
    with tf.Graph().as_default() as graph:
        levels = []
        for anchors in (12, 3):
            x = tf.compat.v1.placeholder(tf.float32, [None, anchors, HEAD])
            xy, wh, scores = tf.split(x, [2, 2, 1 + CLASSES], axis=-1)
            levels.append(tf.concat([xy * 640.0, wh * 640.0, tf.sigmoid(scores)], axis=-1))
        grid = tf.concat(levels, axis=1, name="grid")
        tf.nn.softmax(grid, name="mixed")
        tf.identity(levels[0] + 1.0, name="one_level")
        found = scales.parts_of(graph, "grid")
        assert found.cuts == ((1, (12, 3)), (2, (2, 2, 1 + CLASSES)))
        assert len(found.blocks((2, 15, HEAD))) == 6
        assert found.blocks((2, 16, HEAD)) is None          # sizes that do not fit: whole
        assert scales.parts_of(graph, "mixed") is None
        assert scales.parts_of(graph, "one_level").cuts == ((2, (2, 2, 1 + CLASSES)),)
