"""Deployment formats (issue 11): a SavedModel back out, float16 weights, TensorFlow Lite — each
loaded back, run on the verification inputs and compared, each bad request one line with the
right exit status and nothing half-written. Small randomised models only."""
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.models import keras_models, tf1
from tfsurgery.verify.check import run_graph

DEMO_INPUT = np.random.default_rng(7).standard_normal((3, 16, 16, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The article's CNN (small, and a wider one whose weights dominate the file), a graph with
    no float32 weights, one with an op TFLite has no builtin for, and a Keras 3 model."""
    folder = tmp_path_factory.mktemp("deploy")
    paths = {}
    for name, built in [("cnn", tf1.article_cnn(seed=3)),
                        ("wide", tf1.article_cnn(seed=4, channels=(16, 32, 32)))]:
        paths[name] = folder / f"{name}.pb"
        paths[name].write_bytes(built.graph_def.SerializeToString())
    with tf1.v1_graph() as graph:                      # only scalar constants
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="input")
        tf.identity(x * 2.0 + 1.0, name="output")
    paths["scalars"] = folder / "scalars.pb"
    paths["scalars"].write_bytes(graph.as_graph_def().SerializeToString())
    r = np.random.default_rng(5)
    with tf1.v1_graph() as graph:                      # Igamma: no TFLite builtin
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="input")
        a = tf.constant(r.uniform(0.5, 2.0, (4,)).astype(np.float32))
        tf.identity(tf.math.igamma(a, tf.abs(x) + 0.1), name="output")
    paths["igamma"] = folder / "igamma.pb"
    paths["igamma"].write_bytes(graph.as_graph_def().SerializeToString())
    return paths


@pytest.fixture(scope="module")
def signature_model(tmp_path_factory):
    """A SavedModel whose signature is not serving_default and whose names are not node names:
    key 'classify', input 'pixels', outputs 'scores' and 'embedding' (random weights)."""
    folder = tmp_path_factory.mktemp("signature") / "sm"
    r = np.random.default_rng(11)

    class Classifier(tf.Module):
        def __init__(self):
            self.w = tf.Variable(r.normal(0, 0.5, (12, 6)).astype(np.float32))
            self.b = tf.Variable(r.normal(0, 0.5, (6,)).astype(np.float32))
            self.head = tf.Variable(r.normal(0, 0.5, (6, 3)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 12], tf.float32, name="pixels")])
        def classify(self, pixels):
            embedding = tf.nn.relu(tf.matmul(pixels, self.w) + self.b)
            return {"scores": tf.nn.softmax(tf.matmul(embedding, self.head)),
                    "embedding": embedding}

    module = Classifier()
    tf.saved_model.save(module, str(folder), signatures={"classify": module.classify})
    return folder, module


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    import keras
    inp = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(16, 3, name="conv")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
    model = keras.Model(inp, keras.layers.Dense(10, name="head")(x))
    r = np.random.default_rng(21)
    for w in model.weights:                 # nothing at its fresh value: biases, BN statistics
        w.assign(r.uniform(0.5, 1.5, w.shape).astype(np.float32))
    path = tmp_path_factory.mktemp("keras") / "small.keras"
    model.save(path)
    return path, model


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def artefacts(report):
    return {a["format"]: a for a in json.loads(report.read_text())["artefacts"]}


def original_output(path, feed):
    graph_def = tf.compat.v1.GraphDef.FromString(path.read_bytes())
    return run_graph(graph_def, {"input": feed}, ["output"])[0]


# ---------------------------------------------------------------- SavedModel out
def test_frozen_graph_to_saved_model_runs_with_serving_default(files, tmp_path, capsys):
    out = tmp_path / "lean"
    code, stdout, err = run_cli(capsys, files["cnn"], "--bn-fold", "-o", f"{out}/",
                                "--report-json", tmp_path / "r.json")
    assert code == 0, err
    assert (out / "saved_model.pb").exists() and not list(tmp_path.glob("*.pb"))
    signature = tf.saved_model.load(str(out)).signatures["serving_default"]
    spec = signature.structured_input_signature[1]["input"]
    assert spec.dtype == tf.float32 and spec.shape.as_list() == [None, 16, 16, 3]
    got = signature(input=tf.constant(DEMO_INPUT))["output"].numpy()
    np.testing.assert_allclose(got, original_output(files["cnn"], DEMO_INPUT), rtol=1e-4,
                               atol=1e-6)
    saved = artefacts(tmp_path / "r.json")["saved_model"]
    assert saved["passed"] and saved["checked_by"].startswith("tf.saved_model.load")
    assert saved["bytes"] > 1000 and saved["max_error"] <= saved["tolerance"]
    assert "SavedModel" in stdout and "max error" in stdout


def test_saved_model_cli_lists_the_signature(files, tmp_path, capsys):
    out = tmp_path / "sm"
    assert run_cli(capsys, files["cnn"], "--saved-model", out, "-o", tmp_path / "x.pb")[0] == 0
    shown = subprocess.run([sys.executable, "-m", "tensorflow.python.tools.saved_model_cli",
                            "show", "--dir", str(out), "--all"], capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert "signature_def['serving_default']" in shown.stdout
    assert "inputs['input']" in shown.stdout and "outputs['output']" in shown.stdout
    assert (tmp_path / "x.pb").exists()            # --saved-model is besides the .pb


def test_saved_model_input_keeps_its_signature_key_and_names(signature_model, tmp_path, capsys):
    folder, module = signature_model
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, folder, "--signature", "classify", "-o", f"{out}/")
    assert code == 0, err
    signature = tf.saved_model.load(str(out)).signatures["classify"]
    inputs = signature.structured_input_signature[1]
    assert list(inputs) == ["pixels"] and inputs["pixels"].dtype == tf.float32
    assert set(signature.structured_outputs) == {"scores", "embedding"}
    x = np.random.default_rng(1).standard_normal((4, 12)).astype(np.float32)
    got = signature(pixels=tf.constant(x))
    expected = module.classify(tf.constant(x))
    for key in ("scores", "embedding"):
        np.testing.assert_allclose(got[key].numpy(), expected[key].numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_unknown_signature_is_one_line_exit_2(signature_model, tmp_path, capsys):
    code, _, err = run_cli(capsys, signature_model[0], "--signature", "nope",
                           "-o", f"{tmp_path / 'out'}/")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no signature 'nope'" in err and "classify" in err
    assert not (tmp_path / "out").exists()


def test_existing_directory_refused_unless_force(files, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(capsys, files["cnn"], "-o", f"{out}/")
    assert code == 2 and "not empty" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1 and (out / "keep.txt").read_text() == "mine"
    code, _, err = run_cli(capsys, files["cnn"], "-o", f"{out}/", "--force")
    assert code == 0, err
    assert not (out / "keep.txt").exists() and (out / "saved_model.pb").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]       # no staging left behind


def test_output_directory_that_is_a_file_is_refused(files, tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("not a directory")
    for argv in (["-o", f"{target}/"], ["--saved-model", target, "-o", tmp_path / "x.pb"]):
        code, _, err = run_cli(capsys, files["cnn"], *argv)
        assert code == 2 and "not a directory" in err and len(err.strip().splitlines()) == 1
    assert target.read_text() == "not a directory" and not (tmp_path / "x.pb").exists()


# ---------------------------------------------------------------- float16 weights
def test_float16_weights_halve_the_pb_and_report_the_error(files, tmp_path, capsys):
    sizes = {}
    for weights in ("float32", "float16"):
        out = tmp_path / f"{weights}.pb"
        code, _, err = run_cli(capsys, files["wide"], "--bn-fold", "--store-weights", weights,
                               "-o", out, "--report-json", tmp_path / f"{weights}.json")
        assert code == 0, err
        sizes[weights] = out.stat().st_size
    assert sizes["float16"] < 0.6 * sizes["float32"]
    report = json.loads((tmp_path / "float16.json").read_text())
    verification = report["verification"]
    assert verification["tolerance"] == api.FLOAT16_TOLERANCE
    assert 0 < verification["max_error"] <= api.FLOAT16_TOLERANCE     # real rounding, measured
    graph_def = tf.compat.v1.GraphDef.FromString((tmp_path / "float16.pb").read_bytes())
    halves = [n for n in graph_def.node if n.op == "Const" and n.attr["dtype"].type == tf.half]
    assert halves and all(n.name.endswith("/float16") for n in halves)
    got = run_graph(graph_def, {"input": DEMO_INPUT}, ["output"])[0]
    expected = original_output(files["wide"], DEMO_INPUT)
    assert 0 < np.abs(got - expected).max() <= api.FLOAT16_TOLERANCE * np.abs(expected).max()
    pb = artefacts(tmp_path / "float16.json")["pb"]
    assert pb["weights"] == "float16" and pb["bytes"] == sizes["float16"] and pb["passed"]


def test_float16_onnx_and_saved_model(files, tmp_path, capsys):
    import onnx
    code, _, err = run_cli(capsys, files["wide"], "--bn-fold", "--store-weights", "float16",
                           "--onnx", tmp_path / "m.onnx", "-o", f"{tmp_path / 'sm'}/",
                           "--report-json", tmp_path / "r.json")
    assert code == 0, err
    model = onnx.load(str(tmp_path / "m.onnx"))
    halves = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert halves and len(casts) >= len(halves)
    written = artefacts(tmp_path / "r.json")
    assert written["onnx"]["passed"] and written["onnx"]["weights"] == "float16"
    assert written["saved_model"]["passed"] and written["saved_model"]["weights"] == "float16"
    signature = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    got = signature(input=tf.constant(DEMO_INPUT))["output"].numpy()
    expected = original_output(files["wide"], DEMO_INPUT)
    assert np.abs(got - expected).max() <= api.FLOAT16_TOLERANCE * np.abs(expected).max()


def test_float16_without_float32_weights_is_one_line_exit_2(files, tmp_path, capsys):
    code, _, err = run_cli(capsys, files["scalars"], "--store-weights", "float16",
                           "-o", tmp_path / "x.pb", "--tflite", tmp_path / "x.tflite")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no float32 constant" in err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- TensorFlow Lite
def run_tflite(path, feed):
    from ai_edge_litert.interpreter import Interpreter
    runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
    return runner(input=feed)["output"]


def test_tflite_matches_the_original_in_float32_and_float16(files, tmp_path, capsys):
    sizes = {}
    for weights in ("float32", "float16"):
        out = tmp_path / f"{weights}.tflite"
        code, _, err = run_cli(capsys, "export", files["wide"], "--bn-fold", "--store-weights", weights,
                               "-o", tmp_path / f"{weights}.onnx", "--tflite", out,
                               "--report-json", tmp_path / f"{weights}.json")
        assert code == 0, err
        sizes[weights] = out.stat().st_size
        written = artefacts(tmp_path / f"{weights}.json")["tflite"]
        assert written["passed"] and written["checked_by"] == "LiteRT interpreter"
        assert written["bytes"] == sizes[weights] and written["weights"] == weights
        expected = original_output(files["wide"], DEMO_INPUT)
        error = np.abs(run_tflite(out, DEMO_INPUT) - expected).max() / np.abs(expected).max()
        assert error <= (1e-4 if weights == "float32" else api.FLOAT16_TOLERANCE)
    assert sizes["float16"] < 0.6 * sizes["float32"]


def test_tflite_refusal_is_one_line_exit_1_nothing_written(files, tmp_path, capsys):
    code, _, err = run_cli(capsys, files["igamma"], "-o", tmp_path / "x.pb",
                           "--tflite", tmp_path / "x.tflite")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "TFLite converter refuses" in err and "Igamma" in err
    assert list(tmp_path.iterdir()) == []


def test_uint8_input_flows_into_saved_model_and_tflite(files, tmp_path, capsys):
    code, _, err = run_cli(capsys, files["cnn"], "--input-dtype", "uint8", "--mean-values", "127",
                           "--scale-values", "64", "-o", f"{tmp_path / 'sm'}/",
                           "--tflite", tmp_path / "m.tflite")
    assert code == 0, err
    signature = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    assert signature.structured_input_signature[1]["input"].dtype == tf.uint8
    raw = np.random.default_rng(2).integers(0, 256, (2, 16, 16, 3)).astype(np.uint8)
    expected = original_output(files["cnn"], (raw.astype(np.float32) - 127) / 64)
    np.testing.assert_allclose(signature(input=tf.constant(raw))["output"].numpy(), expected,
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(run_tflite(tmp_path / "m.tflite", raw), expected, rtol=1e-4,
                               atol=1e-5)


def test_keras3_model_to_every_format_with_float16(keras_file, tmp_path, capsys):
    path, model = keras_file
    report = tmp_path / "r.json"
    code, _, err = run_cli(capsys, path, "--bn-fold", "--store-weights", "float16",
                           "-o", tmp_path / "m.pb", "--saved-model", tmp_path / "sm",
                           "--onnx", tmp_path / "m.onnx", "--tflite", tmp_path / "m.tflite",
                           "--report-json", report)
    assert code == 0, err
    written = artefacts(report)
    assert set(written) == {"pb", "saved_model", "onnx", "tflite"}
    assert all(a["passed"] and a["bytes"] > 0 and a["weights"] == "float16"
               for a in written.values())
    x = np.random.default_rng(3).standard_normal((2, 8, 8, 3)).astype(np.float32)
    expected = model(x, training=False).numpy()
    signature = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    (got,) = signature(image=tf.constant(x)).values()
    scale = np.abs(expected).max()
    assert np.abs(got.numpy() - expected).max() <= api.FLOAT16_TOLERANCE * scale


@pytest.mark.parametrize("size", [8, 9])      # the pad is SAME padding at 8, not at 9
def test_mobilenet_block_saved_model_runs_under_grappler(tmp_path, size):
    """ZeroPadding → strided DepthwiseConv2D → BN → ReLU6 (MobileNetV2's pattern): the exported
    SavedModel is called with Grappler on (its remapper once aborted TF on a depthwise conv with
    EXPLICIT padding); in a child process, so an abort fails this test, not the whole run."""
    import keras
    inp = keras.Input((size, size, 4), name="image")
    x = keras.layers.ZeroPadding2D(((0, 1), (0, 1)))(inp)
    x = keras.layers.DepthwiseConv2D(3, strides=2, use_bias=False, name="dw")(x)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization(name="bn")(x))
    model = keras.Model(inp, x)
    r = np.random.default_rng(8)
    for w in model.weights:
        w.assign(r.uniform(0.5, 1.5, w.shape).astype(np.float32))
    model.save(tmp_path / "block.keras")
    done = subprocess.run([sys.executable, "-m", "tfsurgery.cli", str(tmp_path / "block.keras"),
                           "--bn-fold", "-o", f"{tmp_path / 'sm'}/", "-q"],
                          capture_output=True, text=True, timeout=600,
                          cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "sm" / "saved_model.pb").exists()


def test_runtimes_that_cannot_be_interrupted_still_have_a_deadline():
    import time
    from tfsurgery.export.artefacts import with_deadline
    from tfsurgery.errors import ExportError
    with pytest.raises(ExportError, match="did not finish within 0.2 s"):
        with_deadline(lambda: time.sleep(5), 0.2, "the TFLite model")
    assert with_deadline(lambda: 42, 5, "a quick call") == 42
    with pytest.raises(ZeroDivisionError):                     # errors reach the caller
        with_deadline(lambda: 1 / 0, 5, "a failing call")


# ---------------------------------------------------------------- all or nothing, the report
def test_a_later_export_failing_leaves_no_earlier_artefact(files, tmp_path, capsys):
    """The SavedModel checks out, then the TFLite converter refuses: exit 1, one line, and
    neither the SavedModel nor the .pb is written; an existing SavedModel replaced with
    --force stays as it was."""
    keep = tmp_path / "sm"
    keep.mkdir()
    (keep / "mine.txt").write_text("mine")
    report = tmp_path / "r.json"
    code, _, err = run_cli(capsys, files["igamma"], "-o", tmp_path / "x.pb", "--saved-model",
                           keep, "--force", "--tflite", tmp_path / "x.tflite",
                           "--report-json", report)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "TFLite converter" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "sm"]
    assert [p.name for p in keep.iterdir()] == ["mine.txt"]
    written = artefacts(report)
    assert written["saved_model"]["passed"] and not written["saved_model"]["written"]
    assert not written["tflite"]["passed"] and not written["tflite"]["written"]


def test_report_lists_every_artefact_with_its_size_and_check(files, tmp_path, capsys):
    report = tmp_path / "r.json"
    code, stdout, err = run_cli(capsys, files["cnn"], "--bn-fold", "-o", tmp_path / "m.pb",
                                "--onnx", tmp_path / "m.onnx", "--saved-model", tmp_path / "sm",
                                "--tflite", tmp_path / "m.tflite", "--report-json", report)
    assert code == 0, err
    written = artefacts(report)
    on_disk = {"pb": (tmp_path / "m.pb").stat().st_size,
               "onnx": (tmp_path / "m.onnx").stat().st_size,
               "saved_model": sum(f.stat().st_size for f in (tmp_path / "sm").rglob("*")
                                  if f.is_file()),
               "tflite": (tmp_path / "m.tflite").stat().st_size}
    lines = [line for line in stdout.splitlines() if line.startswith("wrote ")]
    assert len(lines) == 4
    for fmt, size in on_disk.items():
        entry = written[fmt]
        assert entry["bytes"] == size and entry["written"] and entry["passed"]
        assert 0 <= entry["max_error"] <= entry["tolerance"] and entry["checked_by"]
        line = next(line for line in lines if line.startswith(f"wrote {entry['path']} "))
        assert "KiB" in line and f"max error {entry['max_error']:.3g}" in line
    assert written["pb"]["reference"] == "the original graph"
    assert written["onnx"]["reference"] == "the optimized graph in TensorFlow"


def test_saved_model_input_keeps_its_key_when_outputs_are_narrowed(signature_model, tmp_path,
                                                                    capsys):
    """--outputs picks one of the signature's outputs: the key and the names stay the input
    signature's (not serving_default with graph node names)."""
    folder, module = signature_model
    scores = api.load(folder, "classify").signature["outputs"]["scores"]
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, folder, "--signature", "classify", "--outputs",
                           scores.split(":")[0], "-o", f"{out}/")
    assert code == 0, err
    loaded = tf.saved_model.load(str(out))
    assert list(loaded.signatures) == ["classify"]
    signature = loaded.signatures["classify"]
    assert list(signature.structured_input_signature[1]) == ["pixels"]
    assert list(signature.structured_outputs) == ["scores"]
    x = np.random.default_rng(4).standard_normal((3, 12)).astype(np.float32)
    np.testing.assert_allclose(signature(pixels=tf.constant(x))["scores"].numpy(),
                               module.classify(tf.constant(x))["scores"].numpy(), rtol=1e-5,
                               atol=1e-6)


def test_bench_of_a_graph_onnx_cannot_convert_is_one_line_exit_1(files, capsys):
    code, _, err = run_cli(capsys, "bench", files["igamma"], "--runs", "1")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Igamma" in err


def test_output_format_names_the_saved_model_without_the_trailing_slash(files, tmp_path, capsys):
    """Issue 42: an explicit output format beside the trailing-slash rule."""
    out = tmp_path / "lean"
    code, _, err = run_cli(capsys, files["cnn"], "-o", out, "--output-format", "saved-model")
    assert code == 0, err
    assert (out / "saved_model.pb").exists() and not list(tmp_path.glob("*.pb"))
    signature = tf.saved_model.load(str(out)).signatures["serving_default"]
    got = signature(input=tf.constant(DEMO_INPUT))["output"].numpy()
    np.testing.assert_allclose(got, original_output(files["cnn"], DEMO_INPUT), rtol=1e-4,
                               atol=1e-6)
    code, _, err = run_cli(capsys, files["cnn"], "-o", f"{tmp_path / 'dir'}/",
                           "--output-format", "pb")
    assert code == 2 and "--output-format pb writes a file" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "dir").exists()


def test_store_weights_is_the_name_and_weights_still_works_with_a_warning(files, tmp_path,
                                                                        capsys):
    """Issue 42: ``--weights int8`` stores weights (float compute); its name now says so."""
    sizes = {}
    for option in ("--store-weights", "--weights"):
        out = tmp_path / f"{option.strip('-')}.pb"
        code, _, err = run_cli(capsys, files["cnn"], "-o", out, option, "float16")
        assert code == 0, err
        assert ("--weights is now --store-weights" in err) == (option == "--weights")
        graph = tf.compat.v1.GraphDef.FromString(out.read_bytes())
        assert any(n.op == "Const" and n.attr["dtype"].type == tf.float16.as_datatype_enum
                   for n in graph.node)
        got = run_graph(graph, {"input": DEMO_INPUT}, ["output"])[0]
        np.testing.assert_allclose(got, original_output(files["cnn"], DEMO_INPUT), rtol=2e-2,
                                   atol=2e-2)
        sizes[option] = out.stat().st_size
    assert sizes["--store-weights"] == sizes["--weights"]
