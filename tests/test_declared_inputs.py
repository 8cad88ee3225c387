"""Declared inputs are what the user feeds, and a SavedModel's inputs are its signature's.

A graph built like a published TF1 face-box regressor: its image input ``img`` is a
``PlaceholderWithDefault`` over a tf.data iterator (IteratorGetNext ← IteratorFromStringHandle ←
a string handle), its ``training`` flag a ``PlaceholderWithDefault`` that defaults to True, a cond
batch norm and a cond dropout. With ``--inputs img`` it becomes a plain Placeholder, the iterator
goes, and the result verifies and exports to ONNX. A TF2 SavedModel whose serving function captures
constant tensors loads with its signature's one input. Every number is checked by the test's own
oracle (plain TF sessions, eager TF, onnxruntime); random weights and BN statistics throughout."""
import json

import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf

import tfsurgery
from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.errors import InputError
from tfsurgery.interface import with_declared_inputs
from tfsurgery.models.common import rng
from tfsurgery.models.tf1 import (bn_under_cond, bn_variables, conv, dense, dropout_under_cond,
                                  freeze, random_kernel, v1_graph, variable)

import oracle

SIZE = 8
ITERATOR_OPS = {"IteratorGetNext", "IteratorFromStringHandleV2", "IteratorFromStringHandle"}


def face_boxes(seed: int = 0, image_shape=(None, SIZE, SIZE, 3)):
    """img = PlaceholderWithDefault(iterator images), training = PlaceholderWithDefault(True);
    conv → cond batch norm → ReLU → cond dropout → dense box regression (4 numbers)."""
    r = rng(seed)
    with v1_graph() as graph:
        handle = tf.compat.v1.placeholder(tf.string, [], name="handle")
        iterator = tf.compat.v1.data.Iterator.from_string_handle(
            handle, (tf.float32, tf.float32), ([None, SIZE, SIZE, 3], [None, 4]))
        images, _ = iterator.get_next()
        img = tf.compat.v1.placeholder_with_default(images, image_shape, name="img")
        training = tf.compat.v1.placeholder_with_default(True, [], name="training")
        with tf.compat.v1.variable_scope("conv_1"):       # the kernel's shape given: img may
            kernel = variable("kernel", random_kernel(r, [3, 3, 3, 6], 27))   # have no rank
            x = conv(img, r, 6, kernel=kernel)
        with tf.compat.v1.variable_scope("bn_1"):
            x = bn_under_cond(x, training, bn_variables(r, 6))
        x = tf.nn.relu(x)
        with tf.compat.v1.variable_scope("dropout"):
            x = dropout_under_cond(x, training)
        x = tf.reshape(x, [-1, SIZE * SIZE * 6])
        with tf.compat.v1.variable_scope("boxes"):
            y = dense(x, r, 4)
        tf.identity(y, name="output")
    return freeze(graph, ["output"])


@pytest.fixture(scope="module")
def face_pb(tmp_path_factory):
    graph_def = face_boxes()
    path = tmp_path_factory.mktemp("faces") / "faces.pb"
    path.write_bytes(graph_def.SerializeToString())
    return path, graph_def


def images(seed: int, batch: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (batch, SIZE, SIZE, 3)).astype(np.float32)


def assert_same_boxes(original, lean, onnx_path=None):
    """The original fed img and training=False, against the result in TF (and in onnxruntime)."""
    for seed in (1, 2):
        x = images(seed)
        expected = oracle.run(original, {"img": x, "training": False}, ["output"])[0]
        actual = oracle.run(lean, {"img": x}, ["output"])[0]
        assert oracle.relative_error(expected, actual) < 1e-5
        if onnx_path is not None:
            session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
            name = session.get_inputs()[0].name
            assert name.split(":")[0] == "img"
            exported = session.run(None, {name: x})[0]
            assert oracle.relative_error(expected, exported) < 1e-4
    # the oracle can tell: unfed, the original trains (batch statistics, dropout) and differs
    x = images(3)
    as_published = oracle.run(original, {"img": x}, ["output"])[0]
    assert oracle.relative_error(as_published, oracle.run(lean, {"img": x}, ["output"])[0]) > 1e-3


def assert_fed_input(lean):
    nodes = {n.name: n for n in lean.node}
    assert nodes["img"].op == "Placeholder"
    assert nodes["img"].attr["dtype"].type == tf.float32.as_datatype_enum
    assert [d.size for d in nodes["img"].attr["shape"].shape.dim] == [-1, SIZE, SIZE, 3]
    left = {n.op for n in lean.node}
    assert not (ITERATOR_OPS | {"PlaceholderWithDefault", "Switch", "Merge"}) & left
    assert "handle" not in nodes


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_the_message_names_the_placeholder_that_wraps_the_iterator(face_pb, tmp_path, capsys):
    path, _ = face_pb
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "x.pb")
    assert code == 2 and "Traceback" not in err
    assert "--inputs img" in err and "--inputs IteratorGetNext" not in err
    assert not (tmp_path / "x.pb").exists()
    with pytest.raises(InputError, match="--inputs img"):
        tfsurgery.optimize(str(path))


def test_cli_feeds_img_verifies_and_exports_onnx(face_pb, tmp_path, capsys):
    path, original = face_pb
    before = path.read_bytes()
    out, onnx_path, report = tmp_path / "lean.pb", tmp_path / "lean.onnx", tmp_path / "r.json"
    code, _, err = run_cli(capsys, path, "--inputs", "img", "-o", out, "--onnx", onnx_path,
                           "--report-json", report)
    assert code == 0, err
    assert path.read_bytes() == before
    data = json.loads(report.read_text())
    assert data["verification"]["passed"] is True
    [declared] = data["declared_inputs"]
    assert "'img' (a PlaceholderWithDefault) is now a Placeholder (float32 [?, 8, 8, 3])" in \
        declared and "3 node(s)" in declared and "IteratorGetNext" in declared
    flags = next(t for t in data["transforms"] if t["name"] == "freeze-training-flags")
    assert any("training = False" in n and "overrides its default True" in n
               for n in flags["notes"])
    lean = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert_fed_input(lean)
    assert_same_boxes(original, lean, onnx_path)


def test_api_feeds_img_verifies_and_exports_onnx(face_pb, tmp_path):
    path, original = face_pb
    result = tfsurgery.optimize(str(path), interface=tfsurgery.Interface(inputs=["img"]))
    assert result.verified and result.inputs == ["img"]
    assert result.original_extra_feeds["training"] is False
    assert_fed_input(result.graph_def)
    exported = result.export_onnx(tmp_path / "api.onnx")
    assert exported.passed
    assert_same_boxes(original, result.graph_def, tmp_path / "api.onnx")


def test_a_default_without_a_declared_shape_takes_its_producers():
    """PlaceholderWithDefault(shape=None): the Placeholder gets the iterator's [?, 8, 8, 3];
    ``--input-shape`` still decides where given."""
    graph_def = face_boxes(image_shape=None)
    declared = with_declared_inputs(graph_def, ["img"], {})
    img = next(n for n in declared.node if n.name == "img")
    assert img.op == "Placeholder"
    assert [d.size for d in img.attr["shape"].shape.dim] == [-1, SIZE, SIZE, 3]
    assert not ITERATOR_OPS & {n.op for n in declared.node}
    shaped = with_declared_inputs(graph_def, ["img"], {"img": [2, SIZE, SIZE, 3]})
    img = next(n for n in shaped.node if n.name == "img")
    assert [d.size for d in img.attr["shape"].shape.dim] == [2, SIZE, SIZE, 3]
    x = images(4, batch=2)
    expected = oracle.run(graph_def, {"img": x, "training": False}, ["output"])[0]
    assert oracle.relative_error(expected, oracle.run(
        shaped, {"img": x, "training": False}, ["output"])[0]) == 0


def test_a_shared_default_producer_stays():
    """What the default reads is removed only where nothing else reads it."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        features = tf.nn.relu(x * 2.0, name="features")
        wrapped = tf.compat.v1.placeholder_with_default(features, [None, 3], name="wrapped")
        tf.add(wrapped, features, name="output")
    declared = with_declared_inputs(graph.as_graph_def(), ["wrapped"], {})
    nodes = {n.name: n.op for n in declared.node}
    assert nodes["wrapped"] == "Placeholder" and nodes["features"] == "Relu"
    a = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    b = np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)
    expected = oracle.run(graph.as_graph_def(), {"x": a, "wrapped": b}, ["output"])[0]
    assert np.array_equal(expected, oracle.run(declared, {"x": a, "wrapped": b}, ["output"])[0])


# ---------------------------------------------------------------- SavedModel captures

SAMPLES = 64


@pytest.fixture(scope="module")
def capturing_model(tmp_path_factory):
    """A constant-Q-like front end: audio → frames → MirrorPad → Conv2D (a variable kernel) →
    |x| + a captured constant floor → Log → batch norm with constant statistics; three named
    outputs. The floor and the BN statistics are plain tf.constant tensors the function
    captures, not variables."""
    r = np.random.default_rng(17)

    class FrontEnd(tf.Module):
        def __init__(self):
            self.kernel = tf.Variable(r.normal(0, 0.5, (3, 3, 1, 4)).astype(np.float32))
            self.floor = tf.constant(r.uniform(0.5, 1.0, 4).astype(np.float32))
            self.mean = tf.constant(r.normal(0, 0.5, 4).astype(np.float32))
            self.variance = tf.constant(r.uniform(0.5, 2.0, 4).astype(np.float32))
            self.gamma = tf.constant(r.uniform(0.5, 1.5, 4).astype(np.float32))
            self.beta = tf.constant(r.normal(0, 0.5, 4).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, SAMPLES], tf.float32, name="audio")])
        def serve(self, audio):
            frames = tf.reshape(audio, [-1, 8, SAMPLES // 8, 1])
            padded = tf.pad(frames, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="REFLECT")
            spectrum = tf.nn.conv2d(padded, self.kernel, 1, "VALID")
            log_power = tf.math.log(tf.abs(spectrum) + self.floor)
            normalized = tf.nn.batch_normalization(log_power, self.mean, self.variance,
                                                   self.beta, self.gamma, 1e-3)
            return {"cqt": normalized, "energy": tf.reduce_mean(normalized, axis=[1, 2]),
                    "peak": tf.reduce_max(log_power, axis=[1, 2, 3])}

    module = FrontEnd()
    folder = tmp_path_factory.mktemp("captures") / "front_end"
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})
    return folder


def test_a_signature_that_captures_constants_has_only_its_own_inputs(capturing_model, tmp_path,
                                                                     capsys):
    source = api.load(capturing_model)
    assert source.inputs == ["audio"]                 # not the captured constants too
    assert source.signature["inputs"] == {"audio": "audio"}
    names = source.signature["outputs"]              # signature name → graph tensor
    assert sorted(names) == ["cqt", "energy", "peak"]
    result = tfsurgery.optimize(source)
    assert result.verified and result.inputs == ["audio"]
    served = tf.saved_model.load(str(capturing_model)).signatures["serving_default"]
    for seed in (1, 2):
        audio = np.random.default_rng(seed).standard_normal((3, SAMPLES)).astype(np.float32)
        expected = {k: v.numpy() for k, v in served(audio=tf.constant(audio)).items()}
        actual = oracle.run(result.graph_def, {"audio": audio}, list(names.values()))
        for key, value in zip(names, actual):
            assert oracle.relative_error(expected[key], value) < 1e-5, key
    code, _, err = run_cli(capsys, capturing_model, "-o", tmp_path / "front.pb", "--onnx",
                           tmp_path / "front.onnx")
    assert code == 0, err
    session = ort.InferenceSession(str(tmp_path / "front.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert len(session.get_inputs()) == 1
    audio = np.random.default_rng(3).standard_normal((2, SAMPLES)).astype(np.float32)
    expected = served(audio=tf.constant(audio))
    exported = dict(zip([o.name.split(":")[0] for o in session.get_outputs()],
                        session.run(None, {session.get_inputs()[0].name: audio})))
    for key, tensor in names.items():
        assert oracle.relative_error(expected[key].numpy(), exported[tensor]) < 1e-4, key


def test_another_declared_input_behind_the_default_stays():
    """``inputs=[x, wrapped]`` where x only fed wrapped's default: x is not removed with the
    default; nothing reads it any more, so the optimized interface drops it (said)."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        wrapped = tf.compat.v1.placeholder_with_default(tf.nn.relu(x * 2.0), [None, 3],
                                                        name="wrapped")
        tf.multiply(wrapped, 3.0, name="output")
    graph_def = graph.as_graph_def()
    declared = with_declared_inputs(graph_def, ["x", "wrapped"], {})
    nodes = {n.name: n.op for n in declared.node}
    assert nodes["x"] == "Placeholder" and nodes["wrapped"] == "Placeholder"
    assert "Relu" not in nodes.values()
    result = tfsurgery.optimize(graph_def, interface=tfsurgery.Interface(
        inputs=["x", "wrapped"], outputs=["output"]))
    assert result.inputs == ["wrapped"] and list(result.unused_inputs) == ["x"]
    b = np.random.default_rng(7).standard_normal((2, 3)).astype(np.float32)
    expected = oracle.run(graph_def, {"wrapped": b}, ["output"])[0]
    assert oracle.relative_error(expected, oracle.run(result.graph_def, {"wrapped": b},
                                                      ["output"])[0]) < 1e-6
