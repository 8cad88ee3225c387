"""Issue 39: what a model may run is an allowlist (stateless ops, reviewed stateful ops), not a
denylist. Hostile files of each class the denylist missed — an op on a SavedModel's restore path,
a graph embedded in a constant (``DatasetFromGraph``), a function named inside a function
attribute, a constant table path handed through a nested call, TF2 initializer and restore
functions that write a file — are refused before anything runs, by every command and the API.
Oracles: plain TensorFlow (it runs each attack: the sentinel file appears), the files on disk,
plain sessions for the legitimate twins' numbers."""
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.core.protobuf import saved_model_pb2

import tfsurgery
from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.trust import outside, stateful_ops
from tfsurgery.verify import check as verify

from oracle import session_config

v1 = tf.compat.v1


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def plain_run(graph_def, fetch, feeds):
    """The oracle: a plain TF1 session, Grappler and the graph optimizer's constant folding
    off (either would evaluate DatasetFromGraph at graph-building time, itself)."""
    config = session_config()
    config.graph_options.optimizer_options.opt_level = v1.OptimizerOptions.L0
    with tf.Graph().as_default() as graph:
        v1.import_graph_def(graph_def, name="")
        with v1.Session(graph=graph, config=config) as session:
            return session.run(fetch, feeds)


def read_saved(path):
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    return saved


def write_saved(path, saved):
    (path / "saved_model.pb").write_bytes(saved.SerializeToString())


def node(text: str):
    return text_format.Parse(text, node_def_pb2.NodeDef())


def string_const(name: str, value: str, function: bool = False):
    return node(f'name: "{name}" op: "Const" attr {{ key: "dtype" value {{ type: DT_STRING }} }} '
                f'attr {{ key: "value" value {{ tensor {{ dtype: DT_STRING tensor_shape {{}} '
                f'string_val: "{value}" }} }} }}')


# ---------------------------------------------------------------- hostile files, one per class
def tf1_saved_model(export, seed=8):
    """A TF1 SavedModel with a random variable: ``y = x @ w``; returns w."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = v1.get_variable("w", initializer=np.random.default_rng(seed).normal(
            size=(4, 3)).astype(np.float32))
        y = tf.matmul(x, w, name="y")
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(export))
            builder.add_meta_graph_and_variables(
                session, ["serve"], signature_def_map={
                    "serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": y})})
            builder.save()
            return session.run(w)


def restore_path_op(tmp_path, sentinel):
    """A TF1 SavedModel whose restore op waits for a WriteFile (a control input)."""
    export = tmp_path / "restore_path"
    tf1_saved_model(export)
    saved = read_saved(export)
    meta = saved.meta_graphs[0]
    meta.graph_def.node.extend([string_const("dropper/path", str(sentinel)),
                                node('name: "dropper" op: "WriteFile" input: "dropper/path" '
                                     'input: "dropper/path"')])
    restore = [n for n in meta.graph_def.node if n.name == meta.saver_def.restore_op_name][0]
    restore.input.append("^dropper")
    write_saved(export, saved)
    return export


def embedded_graph(tmp_path, sentinel):
    """A frozen graph whose DatasetFromGraph runs a serialized graph held in a constant; the
    embedded graph's map function writes a file."""
    dataset = tf.data.Dataset.range(1).map(
        lambda i: (tf.io.write_file(str(sentinel), "ran"), i)[1])
    serialized = dataset._as_serialized_graph().numpy()
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.constant(np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32))
        variant = tf.raw_ops.DatasetFromGraph(graph_def=tf.constant(serialized), name="embedded")
        element = tf.raw_ops.DatasetToSingleElement(dataset=variant, output_types=[tf.int64],
                                                    output_shapes=[[]])
        with tf.control_dependencies(element):
            tf.matmul(x, w, name="y")
    path = tmp_path / "embedded.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


NESTED = '''
node { name: "x" op: "Placeholder" attr { key: "dtype" value { type: DT_FLOAT } } }
node { name: "y" op: "PartitionedCall" input: "x"
  attr { key: "Tin" value { list { type: DT_FLOAT } } }
  attr { key: "Tout" value { list { type: DT_FLOAT } } }
  attr { key: "f" value { func { name: "Outer"
         attr { key: "inner" value { func { name: "Dropper" } } } } } } }
library {
  function {
    signature { name: "Outer" input_arg { name: "x" type: DT_FLOAT }
                output_arg { name: "y" type: DT_FLOAT } attr { name: "inner" type: "func" } }
    node_def { name: "call" op: "PartitionedCall" input: "x"
      attr { key: "Tin" value { list { type: DT_FLOAT } } }
      attr { key: "Tout" value { list { type: DT_FLOAT } } }
      attr { key: "f" value { placeholder: "inner" } } }
    ret { key: "y" value: "call:output:0" }
  }
  function {
    signature { name: "Dropper" input_arg { name: "x" type: DT_FLOAT }
                output_arg { name: "y" type: DT_FLOAT } is_stateful: true }
    node_def { name: "path" op: "Const" attr { key: "dtype" value { type: DT_STRING } }
      attr { key: "value" value { tensor { dtype: DT_STRING tensor_shape {}
                                           string_val: "SENTINEL" } } } }
    node_def { name: "write" op: "WriteFile" input: "path:output:0" input: "path:output:0" }
    node_def { name: "id" op: "Identity" input: "x" input: "^write"
               attr { key: "T" value { type: DT_FLOAT } } }
    ret { key: "y" value: "id:output:0" }
  }
}
'''


def nested_function_attribute(tmp_path, sentinel):
    """A call whose function attribute names, in its own attributes, the function its body
    calls (a ``placeholder`` attribute): that function writes a file."""
    path = tmp_path / "nested.pb"
    path.write_bytes(text_format.Parse(NESTED.replace("SENTINEL", str(sentinel)),
                                       graph_pb2.GraphDef()).SerializeToString())
    return path


class Vocabulary(tf.Module):
    """A table filled from its own asset; ``ids = table[words]``, ``y = x @ w``."""

    def __init__(self, vocab, seed=4):
        super().__init__()
        self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            str(vocab), tf.string, 0, tf.int64, 1, delimiter=" "), -1)
        self.w = tf.Variable(np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([None, 4], tf.float32)])
    def __call__(self, words, x):
        return {"ids": self.table.lookup(words), "y": tf.matmul(x, self.w)}


def vocabulary_saved_model(tmp_path, name="vocab_sm"):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a 11\nb 22\n")
    module = Vocabulary(vocab)
    tf.saved_model.save(module, str(tmp_path / name), signatures=module.__call__)
    return tmp_path / name, module


def constant_asset_through_nested_call(tmp_path, sentinel):
    """The twin above, its initializer rewritten: the table's file name is a constant path
    (a file of the user's) handed to a nested function that fills the table from it."""
    sentinel.write_text("a 4711\n")
    export, _ = vocabulary_saved_model(tmp_path, "nested_asset")
    saved = read_saved(export)
    library = saved.meta_graphs[0].graph_def.library
    initializer = [f for f in library.function
                   if any(n.op == "InitializeTableFromTextFileV2" for n in f.node_def)][0]
    inner = library.function.add()
    inner.CopyFrom(initializer)                      # takes (path, table), as the initializer
    inner.signature.name = "Inner"
    fill = [n for n in initializer.node_def if n.op == "InitializeTableFromTextFileV2"][0]
    fill.CopyFrom(node(
        f'name: "{fill.name}" op: "StatefulPartitionedCall" input: "secret:output:0" '
        f'input: "{fill.input[0]}" attr {{ key: "Tin" value {{ list {{ type: DT_STRING '
        'type: DT_RESOURCE } } } attr { key: "Tout" value { list { type: DT_INT32 } } } '
        'attr { key: "f" value { func { name: "Inner" } } }'))
    initializer.node_def.append(string_const("secret", str(sentinel)))
    write_saved(export, saved)
    return export


class InitializerWrites(tf.saved_model.experimental.TrackableResource):
    """A table whose initializer function (called by the TF2 loader) writes a file."""

    def __init__(self, sentinel):
        self.sentinel = str(sentinel)
        super().__init__()

    def _create_resource(self):
        return tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64)

    def _initialize(self):
        with tf.control_dependencies([tf.io.write_file(self.sentinel, "initialized")]):
            return tf.raw_ops.InitializeTableV2(table_handle=self.resource_handle,
                                                keys=tf.constant(["a"]),
                                                values=tf.constant([1], tf.int64))


class Linear(tf.Module):
    def __init__(self, seed=1, table=None):
        super().__init__()
        self.table = table
        self.w = tf.Variable(np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def __call__(self, x):
        return {"y": tf.matmul(x, self.w)}


def tf2_initializer_writes(tmp_path, sentinel):
    module = Linear(table=InitializerWrites(sentinel))
    tf.saved_model.save(module, str(tmp_path / "tf2_init"), signatures=module.__call__)
    sentinel.unlink(missing_ok=True)                 # saving ran it once
    return tmp_path / "tf2_init"


def tf2_restore_function_writes(tmp_path, sentinel):
    """A TF2 SavedModel whose saver's restore function also writes a file (TF's v1 loader,
    as TF Serving's, runs it to restore the variables)."""
    module = Linear()
    export = tmp_path / "tf2_restore"
    tf.saved_model.save(module, str(export), signatures=module.__call__)
    saved = read_saved(export)
    meta = saved.meta_graphs[0]
    call = [n for n in meta.graph_def.node if n.name == meta.saver_def.restore_op_name][0]
    restore = [f for f in meta.graph_def.library.function
               if f.signature.name == call.attr["f"].func.name][0]
    restore.node_def.extend([string_const("dropper_path", str(sentinel)),
                             node('name: "dropper" op: "WriteFile" '
                                  'input: "dropper_path:output:0" input: "dropper_path:output:0"')])
    returned = {value.split(":")[0] for value in restore.ret.values()}
    [n for n in restore.node_def if n.name in returned][0].input.append("^dropper")
    write_saved(export, saved)
    return export


HOSTILE = {"restore path op": restore_path_op, "embedded graph": embedded_graph,
           "nested function attribute": nested_function_attribute,
           "constant asset through a nested call": constant_asset_through_nested_call,
           "TF2 initializer writes": tf2_initializer_writes,
           "TF2 restore function writes": tf2_restore_function_writes}
READS_THE_SENTINEL = {"constant asset through a nested call"}


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request, tmp_path):
    sentinel = tmp_path / "sentinel.txt"
    path = HOSTILE[request.param](tmp_path, sentinel)
    before = sentinel.read_bytes() if sentinel.exists() else None
    return request.param, path, sentinel, before


def assert_untouched(hostile_case):
    name, _, sentinel, before = hostile_case
    if name in READS_THE_SENTINEL:
        assert sentinel.read_bytes() == before
    else:
        assert not sentinel.exists(), name


def test_every_hostile_file_is_refused_by_every_command_before_anything_runs(hostile, tmp_path,
                                                                            capsys):
    name, path, _, _ = hostile
    out = tmp_path / "out"
    out.mkdir()
    runs = [("inspect", path), ("inspect", path, "--load"),
            ("optimize", path, "-o", out / "o.pb", "--report-json", out / "r.json"),
            ("export", path, "-o", out / "o.onnx"), ("compare", path, path),
            ("bench", path, "--runs", "2")]
    for argv in runs:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and len(err.splitlines()) == 1, (name, argv, err)
        assert "refused" in err and "nothing was run or written" in err, (name, argv, err)
        assert_untouched(hostile)
    assert list(out.iterdir()) == []
    with pytest.raises(tfsurgery.UnsafeModel):
        tfsurgery.optimize(path)
    with pytest.raises(tfsurgery.UnsafeModel):
        api.compare(path, path)
    assert_untouched(hostile)


def test_batch_refuses_each_hostile_file_in_its_own_process(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    sentinels = []
    for i, name in enumerate(("restore path op", "embedded graph", "TF2 initializer writes")):
        work = tmp_path / f"w{i}"
        work.mkdir()
        sentinel = tmp_path / f"sentinel{i}.txt"
        built = HOSTILE[name](work, sentinel)
        shutil.move(str(built), str(folder / f"m{i}{built.suffix}"))
        sentinels.append(sentinel)
    code, _, _ = run_cli(capsys, "batch", folder, "-o", tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code != 0 and len(summary["models"]) == 3
    for record in summary["models"]:
        assert record["status"] == "error" and "refused" in record["error"], record
    assert not any(s.exists() for s in sentinels)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["logs", "summary.json"]


def test_plain_tensorflow_runs_each_attack(tmp_path):
    """The oracle that these files are hostile: TensorFlow's own loaders and sessions run them
    and the sentinel appears (tfsurgery refuses each, above)."""
    sentinel = tmp_path / "s.txt"
    for build in (embedded_graph, nested_function_attribute):
        graph_def = graph_pb2.GraphDef()
        graph_def.ParseFromString(build(tmp_path, sentinel).read_bytes())
        plain_run(graph_def, "y:0", {"x:0": np.ones((1, 4) if build is embedded_graph else 2,
                                                     np.float32)})
        assert sentinel.exists(), build.__name__
        sentinel.unlink()
    for build in (restore_path_op, tf2_initializer_writes):
        tf.saved_model.load(str(build(tmp_path, sentinel)))
        assert sentinel.exists(), build.__name__
        sentinel.unlink()
    export = tf2_restore_function_writes(tmp_path, sentinel)
    with tf.Graph().as_default(), v1.Session() as session:
        v1.saved_model.loader.load(session, ["serve"], str(export))
    assert sentinel.exists()
    sentinel.unlink()
    loaded = tf.saved_model.load(str(constant_asset_through_nested_call(tmp_path, sentinel)))
    ids = loaded.signatures["serving_default"](words=tf.constant(["a"]), x=tf.ones((1, 4)))
    assert ids["ids"].numpy().tolist() == [4711]       # the user's file, read into the table


def test_old_exceptions_are_gone_the_findings_name_the_op_inside(tmp_path):
    """The findings point at the hostile node itself, wherever it hides."""
    sentinel = tmp_path / "s.txt"
    found = outside.find_in_saved_model(read_saved(restore_path_op(tmp_path, sentinel)),
                                        tmp_path / "restore_path")
    assert [(f.node, f.op) for f in found] == [("dropper", "WriteFile")]
    assert api.scan(tmp_path / "restore_path").findings == found      # read, not loaded
    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(embedded_graph(tmp_path, sentinel).read_bytes())
    found = outside.find(graph_def, ["y"])
    assert [f.op for f in found] == ["WriteFile"] and found[0].node.startswith("embedded/")
    graph_def.ParseFromString(nested_function_attribute(tmp_path, sentinel).read_bytes())
    assert [(f.node, f.op) for f in outside.find(graph_def, ["y"])] == [
        ("Dropper/write", "WriteFile")]
    export = constant_asset_through_nested_call(tmp_path, sentinel)
    found = outside.find_in_saved_model(read_saved(export), export)
    assert [f.op for f in found] == ["InitializeTableFromTextFileV2"]
    assert found[0].node.startswith("Inner/")


# ---------------------------------------------------------------- legitimate twins
def test_a_tf1_saved_model_with_variables_still_loads_and_optimizes(tmp_path, capsys):
    export = tmp_path / "tf1"
    w = tf1_saved_model(export)
    assert outside.find_in_saved_model(read_saved(export), export) == []
    code, out, err = run_cli(capsys, "inspect", export)              # protos only
    assert code == 0 and "not loaded" in out and "signature serving_default: x → y" in out
    assert "dry run —" not in out, err
    code, out, err = run_cli(capsys, "inspect", export, "--load")
    assert code == 0 and "dry run —" in out, err
    out = tmp_path / "out.pb"
    code, _, err = run_cli(capsys, export, "-o", out)
    assert code == 0, err
    result = graph_pb2.GraphDef()
    result.ParseFromString(out.read_bytes())
    x = np.random.default_rng(9).normal(size=(3, 4)).astype(np.float32)
    inputs = [n.name for n in result.node if n.op == "Placeholder"]
    got = plain_run(result, f"{[n.name for n in result.node if n.op == 'MatMul'][0]}:0",
                    {f"{inputs[0]}:0": x})
    np.testing.assert_allclose(got, x @ w, rtol=1e-5)


def test_a_tf2_saved_model_with_a_table_from_its_own_asset_still_loads(tmp_path):
    export, module = vocabulary_saved_model(tmp_path)
    assert outside.find_in_saved_model(read_saved(export), export) == []
    source = api.load(export)
    assert source.graph_def.node
    reloaded = tf.saved_model.load(str(export))          # the oracle: TF's own loader
    got = reloaded.signatures["serving_default"](words=tf.constant(["b", "a", "z"]),
                                                  x=tf.ones((1, 4)))
    assert got["ids"].numpy().tolist() == [22, 11, -1]


def test_a_tf_data_pipeline_over_in_memory_data_still_runs(tmp_path):
    rng = np.random.default_rng(11)
    offsets = rng.normal(size=(2, 3)).astype(np.float32)
    weights = rng.normal(size=(4, 3)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        dataset = tf.data.Dataset.from_tensor_slices(offsets).batch(2).repeat()
        offset = v1.data.make_one_shot_iterator(dataset).get_next()
        tf.add(tf.matmul(x, tf.constant(weights)), offset, name="y")
    graph_def = graph.as_graph_def()
    assert outside.find(graph_def, ["y"]) == []
    path = tmp_path / "pipeline.pb"
    path.write_bytes(graph_def.SerializeToString())
    source = api.load(path)                           # loads; tfsurgery's guarded run runs it
    feed = rng.normal(size=(2, 4)).astype(np.float32)
    got = verify.run_graph(source.graph_def, {"x": feed}, ["y"])[0]
    np.testing.assert_allclose(got, feed @ weights + offsets, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(plain_run(graph_def, "y:0", {"x:0": feed}), got, rtol=1e-6)


def test_a_harmless_embedded_graph_passes_and_an_unscannable_one_is_refused():
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(3, dtype=np.int64)).map(
        lambda i: i * 2)
    serialized = dataset._as_serialized_graph().numpy()
    graph = tf.Graph()
    with graph.as_default():
        fed = v1.placeholder(tf.string, [], name="fed")
        for name, graph_def in (("constant", tf.constant(serialized)), ("fed", fed)):
            variant = tf.raw_ops.DatasetFromGraph(graph_def=graph_def, name=f"{name}_graph")
            tf.raw_ops.DatasetToSingleElement(dataset=variant, output_types=[tf.int64],
                                              output_shapes=[[3]], name=f"{name}_out")
    found = outside.find(graph.as_graph_def(), ["constant_out", "fed_out"])
    assert [(f.node, f.op, f.reaches) for f in found] == [
        ("fed_graph", "DatasetFromGraph", outside.UNSCANNABLE)]


# ---------------------------------------------------------------- the allowlist itself
def registry():
    from tensorflow.python.client import pywrap_tf_session
    from tensorflow.core.framework import op_def_pb2
    ops = op_def_pb2.OpList()
    ops.ParseFromString(pywrap_tf_session.TF_GetBuffer(pywrap_tf_session.TF_GetAllOpList()))
    return {op.name: op for op in ops.op}


def test_every_stateful_op_in_the_registry_is_reviewed_or_refused():
    """Walks TensorFlow's registry: a stateful op runs only when reviewed; every other one is
    refused (so an op a newer TensorFlow adds is refused until someone reviews it)."""
    ops = registry()
    stateful = {name for name, op in ops.items() if op.is_stateful}
    assert len(stateful) > 300
    for name in stateful:
        verdict = outside.reaches_outside(node_def_pb2.NodeDef(name="n", op=name))
        if name in stateful_ops.REVIEWED and name not in outside.OUTSIDE_OPS:
            assert verdict is None, name
        else:
            assert verdict is not None, name
    assert outside.reaches_outside(node_def_pb2.NodeDef(name="n", op="SleepOp")) == \
        outside.NOT_REVIEWED
    assert outside.reaches_outside(node_def_pb2.NodeDef(name="n", op="XlaCallModule")) == \
        outside.NOT_REVIEWED                       # runs a serialized StableHLO module
    assert outside.reaches_outside(node_def_pb2.NodeDef(name="n", op="Conv2D")) is None


def test_every_reviewed_entry_is_a_registered_stateful_op_with_a_reason():
    ops = registry()
    for name, reason in stateful_ops.REVIEWED.items():
        assert name in ops and ops[name].is_stateful, name
        assert reason and "\n" not in reason, name


def test_the_docs_name_every_reviewed_op():
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "docs" / "untrusted_models.md").read_text()
    assert sorted(op for op in stateful_ops.REVIEWED if f"`{op}`" not in page) == []
    assert "## What is not covered" in page and "--load" in page


def test_every_stateless_op_taking_a_graph_from_a_tensor_is_scanned_or_refused():
    """Stateless ops with a string input named for a graph or a function: only
    DatasetFromGraph runs one, and its graph is decoded and scanned."""
    suspects = {name for name, op in registry().items() if not op.is_stateful and any(
        arg.type == tf.string.as_datatype_enum and ("graph" in arg.name or "func" in arg.name)
        for arg in op.input_arg)}
    assert suspects == set(outside.EMBEDDED_GRAPH_OPS)


def test_a_custom_op_is_refused_in_one_line_and_allow_op_takes_only_refusable_ops(
        tmp_path, capsys):
    graph = text_format.Parse(
        'node { name: "x" op: "Placeholder" attr { key: "dtype" value { type: DT_FLOAT } } }'
        'node { name: "y" op: "MyCustomOp" input: "x" }', graph_pb2.GraphDef())
    path = tmp_path / "custom.pbtxt"
    path.write_text(text_format.MessageToString(graph))
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "o.pb", "--no-verify")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "MyCustomOp 'y'" in err and "does not register" in err
    assert not (tmp_path / "o.pb").exists()
    for name in ("Conv2D", "MatMulTypo"):             # stateless or unknown: nothing to allow
        code, _, err = run_cli(capsys, path, "--allow-op", name)
        assert code == 2 and f"--allow-op {name}" in err
    code, _, err = run_cli(capsys, "inspect", path, "--allow-op", "SleepOp")
    assert code == 2 and "MyCustomOp" in err          # allowable, yet this graph's op is not


def test_keras_falls_back_to_tf_keras_only_for_a_legacy_file(tmp_path):
    from tfsurgery.trust import keras as keras_trust
    archive = tmp_path / "m.keras"
    import zipfile
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("config.json", "{}")
    with pytest.raises(tfsurgery.UnsafeModel, match="safe mode"):
        keras_trust.refuse_fallback(tmp_path / "m.h5", ValueError(
            "Requested the deserialization of a Lambda layer ... pass `safe_mode=False`"))
    with pytest.raises(api.InputError, match="cannot load"):
        keras_trust.refuse_fallback(archive, ValueError("Could not locate class 'Thing'"))
    legacy = tmp_path / "old.h5"
    legacy.write_bytes(b"\x89HDF\r\n\x1a\n")
    keras_trust.refuse_fallback(legacy, ValueError("Could not locate class 'Thing'"))
