"""Issue 35, Keras files: stored Python code (a Lambda's) is refused before either loader runs,
``--trust-model`` loads it; custom layers load when the user names their module (``--import``),
and fail with one line naming the class and the flag without it. The oracle: the Keras model's
own ``predict`` in this process, against the optimized graph run in a plain TF session."""
import importlib.util
import json
import sys

import numpy as np
import tensorflow as tf
import pytest
from tensorflow.core.framework import graph_pb2

import oracle
from tfsurgery import UnsafeModel, api
from tfsurgery.cli import main

# Keras' registries, restored after each test: a class registered while a model is built (or by
# an --import) must not stay registered for the next test's "without --import" case.
from keras.src.saving import object_registration as keras3_registry
from tf_keras.src.saving import object_registration as tf_keras_registry

REGISTRIES = (keras3_registry.GLOBAL_CUSTOM_OBJECTS, keras3_registry.GLOBAL_CUSTOM_NAMES,
              tf_keras_registry._GLOBAL_CUSTOM_OBJECTS, tf_keras_registry._GLOBAL_CUSTOM_NAMES)

KERAS3_LAYERS = '''
import keras

@keras.saving.register_keras_serializable(package="Mine")
class Scale(keras.layers.Layer):
    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="random_normal")

    def call(self, x):
        return x * self.scale
'''

KERAS2_LAYERS = '''
import tf_keras

@tf_keras.utils.register_keras_serializable(package="Mine2")
class Scale(tf_keras.layers.Layer):
    def build(self, shape):
        self.scale = self.add_weight("scale", shape=(shape[-1],), initializer="random_normal")

    def call(self, x):
        return x * self.scale


class FixedDropout(tf_keras.layers.Dropout):     # unregistered, as EfficientNet's
    pass
'''


@pytest.fixture(autouse=True)
def clean_registries():
    saved = [dict(registry) for registry in REGISTRIES]
    modules = set(sys.modules)
    yield
    for registry, before in zip(REGISTRIES, saved):
        registry.clear()
        registry.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith(("my_layers", "old_layers")):
            del sys.modules[name]


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def module_from(path, name):
    """The test's own import of the layer module (to build the model), forgotten afterwards."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def random_weights(model, seed):
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])


def assert_graph_matches(pb, x, expected):
    """The optimized frozen graph (its interface from the run's report beside it), run in a
    plain TF session, gives the Keras model's output."""
    report = json.loads(pb.with_suffix(".json").read_text())
    graph_def = graph_pb2.GraphDef.FromString(pb.read_bytes())
    (actual,) = oracle.run(graph_def, {report["inputs"][0]: x}, report["outputs"])
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def optimize_cli(capsys, path, out, *flags):
    """``tfsurgery optimize path -o out`` with its report beside ``out`` (out.json)."""
    return run_cli(capsys, "optimize", path, "-o", out, "--report-json", out.with_suffix(".json"),
                   *flags)


@pytest.fixture()
def writing_lambda_h5(tmp_path):
    """A tf_keras .h5 whose Lambda writes a file when it runs; its predictions on x."""
    import tf_keras
    marker = tmp_path / "marker.txt"
    inputs = tf_keras.Input((4,))
    hidden = tf_keras.layers.Dense(3)(inputs)
    evil = tf_keras.layers.Lambda(
        lambda t, path=str(marker): (open(path, "w").write("ran"), t * 2.0 + 1.0)[1],
        name="evil")(hidden)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(evil))
    random_weights(model, 1)
    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    path = tmp_path / "m.h5"
    model.save(path)
    marker.unlink()                       # written while building and predicting
    return path, marker, x, expected


def test_a_file_writing_lambda_is_refused_unrun_and_loads_with_trust(writing_lambda_h5,
                                                                      tmp_path, capsys):
    path, marker, x, expected = writing_lambda_h5
    out = tmp_path / "out.pb"
    code, _, err = run_cli(capsys, "optimize", path, "-o", out)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "layer 'evil' (Lambda)" in err and "--trust-model" in err
    assert not marker.exists() and not out.exists()
    with pytest.raises(UnsafeModel) as raised:
        api.load(path)
    assert raised.value.findings and not marker.exists()
    code, _, err = run_cli(capsys, "inspect", path)         # every command loading a model
    assert code == 2 and "evil" in err and not marker.exists()

    code, out_text, err = optimize_cli(capsys, path, out, "--trust-model")
    assert code == 0, err
    assert marker.exists()                 # trusted: its code ran, as the user allowed
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["verification"]["passed"] is True
    assert any("--trust-model" in note and "evil" in note for note in data["trust"])
    assert "trusted: --trust-model" in out_text
    assert_graph_matches(out, x, expected)
    marker.unlink()
    code, _, err = run_cli(capsys, "compare", path, out)      # compare loads the same way
    assert code == 2 and "evil" in err and not marker.exists()
    code, _, err = run_cli(capsys, "compare", path, out, "--trust-model")
    assert code == 0, err


def test_optimize_given_a_path_follows_the_same_rules(writing_lambda_h5):
    """``tfsurgery.optimize(path)`` loads as ``api.load`` does: refused, nothing run; with
    ``RunOptions(trust_model=True)`` it loads, verifies and matches the model's predictions."""
    import tfsurgery
    path, marker, x, expected = writing_lambda_h5
    with pytest.raises(UnsafeModel):
        tfsurgery.optimize(path)
    assert not marker.exists()
    result = tfsurgery.optimize(path, options=api.RunOptions(trust_model=True))
    assert result.verified and marker.exists()
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(result.graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            got = session.run(f"{result.outputs[0].split(':')[0]}:0",
                              {f"{result.inputs[0].split(':')[0]}:0": x})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_keras3_lambda_is_refused_in_one_line_and_loads_with_trust(tmp_path, capsys):
    import keras
    inputs = keras.Input((4,))
    hidden = keras.layers.Lambda(lambda t: t * 3.0 - 1.0, name="shift")(
        keras.layers.Dense(5)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    random_weights(model, 3)
    x = np.random.default_rng(4).normal(size=(2, 4)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    path = tmp_path / "m.keras"
    model.save(path)
    out = tmp_path / "out.pb"
    code, _, err = run_cli(capsys, "optimize", path, "-o", out)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "layer 'shift' (Lambda) holds Python code" in err and not out.exists()
    source = api.load(path, trust=True)
    assert any("shift" in note for note in source.trust_notes)
    result = api.optimize(source)
    assert result.trust_notes == source.trust_notes and result.verified
    (actual,) = oracle.run(result.graph_def, {result.inputs[0]: x}, result.outputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_a_keras3_registered_layer_needs_its_module(tmp_path, capsys, monkeypatch):
    import keras
    (tmp_path / "my_layers.py").write_text(KERAS3_LAYERS)
    mine = module_from(tmp_path / "my_layers.py", "my_layers")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, mine.Scale(name="scaled")(keras.layers.Dense(3)(inputs)))
    random_weights(model, 5)
    x = np.random.default_rng(6).normal(size=(2, 4)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    path = tmp_path / "m.keras"
    model.save(path)
    for registry in REGISTRIES:           # as in a new process: nothing registered
        for name in [k for k in registry if "Mine" in str(k) or "Mine" in str(registry[k])]:
            del registry[name]
    del sys.modules["my_layers"]

    out = tmp_path / "out.pb"
    code, _, err = run_cli(capsys, "optimize", path, "-o", out)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "layer 'scaled' (Scale) needs the class 'Scale'" in err and "--import" in err
    assert not out.exists()
    monkeypatch.chdir(tmp_path)
    code, out_text, err = optimize_cli(capsys, path, out, "--import", "my_layers")
    assert code == 0, err
    assert "trusted: imported my_layers" in out_text
    assert_graph_matches(out, x, expected)


@pytest.fixture()
def keras2_files(tmp_path):
    """Keras 2 .h5 files: one with a registered custom layer, one with an unregistered
    FixedDropout (a loader needs it as a custom object), and their predictions."""
    import tf_keras
    (tmp_path / "old_layers.py").write_text(KERAS2_LAYERS)
    mine = module_from(tmp_path / "old_layers.py", "old_layers")
    x = np.random.default_rng(7).normal(size=(3, 4)).astype(np.float32)
    files = {}
    for kind, layer in (("registered", mine.Scale(name="scaled")),
                        ("fixed_dropout", mine.FixedDropout(0.3, name="fd"))):
        inputs = tf_keras.Input((4,))
        model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(layer(
            tf_keras.layers.Dense(3)(inputs))))
        random_weights(model, 8)
        files[kind] = (tmp_path / f"{kind}.h5", model.predict(x, verbose=0))
        model.save(files[kind][0])
    for registry in REGISTRIES:
        for name in [k for k in registry if "Mine2" in str(k) or "Mine2" in str(registry[k])]:
            del registry[name]
    del sys.modules["old_layers"]
    return files, x


def test_keras2_custom_layers_load_with_import_and_name_the_class_without(
        keras2_files, tmp_path, capsys, monkeypatch):
    files, x = keras2_files
    for kind, needed in (("registered", "Mine2>Scale"), ("fixed_dropout", "FixedDropout")):
        path, _ = files[kind]
        out = tmp_path / f"{kind}.pb"
        code, _, err = run_cli(capsys, "optimize", path, "-o", out)
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"needs the class '{needed}'" in err and "--import MODULE" in err
        assert not out.exists()
    module_path = tmp_path / "old_layers.py"
    for kind, (path, expected) in files.items():     # a .py path
        out = tmp_path / f"{kind}.pb"
        code, _, err = optimize_cli(capsys, path, out, "--import", module_path)
        assert code == 0, err
        assert_graph_matches(out, x, expected)
    monkeypatch.chdir(tmp_path)                       # a module name, from the current directory
    source = api.load(files["fixed_dropout"][0], imports=["old_layers"])
    assert any("imported old_layers" in note for note in source.trust_notes)


def test_a_module_that_cannot_be_imported_is_one_line(keras2_files, tmp_path, capsys):
    files, _ = keras2_files
    path, _ = files["registered"]
    code, _, err = run_cli(capsys, "optimize", path, "--import", "no_such_module_here")
    assert code == 2 and err.count("\n") == 0 and "--import no_such_module_here" in err
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    code, _, err = run_cli(capsys, "optimize", path, "--import", broken)
    assert code == 2 and err.count("\n") == 0 and "boom" in err


@pytest.mark.parametrize("command", ["optimize", "export", "inspect", "bench"])
def test_every_command_loading_a_model_takes_the_flags(command):
    from tfsurgery.cli import parse_args
    args = parse_args([command, "m.h5", "--trust-model", "--import", "a", "--import", "b.py"])
    assert args.trust_model and args.imports == ["a", "b.py"]
    assert not parse_args([command, "m.h5"]).trust_model


def test_batch_hands_the_flags_to_each_model(tmp_path):
    """batch runs ``tfsurgery optimize`` per model with the optimize words it was given."""
    from tfsurgery.cli import parse_args
    args = parse_args(["batch", str(tmp_path), "-o", str(tmp_path / "out"), "--trust-model",
                       "--import", "my_layers", "--import", "more.py"])
    assert args.optimize.trust_model and args.optimize.imports == ["my_layers", "more.py"]
    assert args.optimize_argv == ["--trust-model", "--import", "my_layers", "--import",
                                  "more.py"]


def test_a_module_the_file_names_is_never_imported(tmp_path, capsys, monkeypatch):
    """Keras 3's safe mode imports a config's classes from Keras' packages only; tf_keras, the
    fallback, imports whatever module a config names. A tf_keras .keras naming a module that
    exists where the user runs (its import writes a file) is refused before either loader."""
    import zipfile
    import tf_keras
    marker = tmp_path / "imported.txt"
    (tmp_path / "side_effects.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))        # as `python -m` puts the cwd there
    inputs = tf_keras.Input((3,))
    tf_keras.Model(inputs, tf_keras.layers.Dense(2, name="d")(inputs)).save(tmp_path / "t.keras")
    with zipfile.ZipFile(tmp_path / "t.keras") as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(files["config.json"])
    config.update(module="side_effects", registered_name=None)    # the model's own class
    files["config.json"] = json.dumps(config).encode()
    path = tmp_path / "named.keras"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    code, _, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "out.pb")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "(Functional) needs the class 'Functional'" in err and "--import" in err
    assert not marker.exists() and "side_effects" not in sys.modules
