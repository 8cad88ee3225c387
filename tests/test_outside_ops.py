"""Issue 35: a model that would act outside its graph (read or write files, call Python) is
refused before anything of it runs — through the CLI and the API — unless the user allows its ops
by name; transforms never evaluate such ops, allowed or not. Oracles: the files on disk, the
graphs' own ops and constants, plain TensorFlow sessions."""
import json

import numpy as np
import pytest
import tensorflow as tf

import tfsurgery
from tfsurgery import api
from tfsurgery.trust import outside
from tfsurgery.verify import check as verify
from tfsurgery.cli import main
from tfsurgery.tfsession import run_nodes

v1 = tf.compat.v1
SECRET = b"SECRET-BYTES-of-the-user-4711"


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def session_run(graph_def, fetches, feeds):
    """The oracle: a plain TF1 session."""
    with tf.Graph().as_default() as graph:
        v1.import_graph_def(graph_def, name="")
        with v1.Session(graph=graph) as session:
            return session.run(fetches, feeds)


def leaking_graph(secret_path, leak_path, seed=0):
    """The issue's graph: ``y = x @ w * 2`` with a control dependency on
    ``WriteFile(leak, ReadFile(secret))``; random weights."""
    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.constant(rng.normal(size=(4, 3)).astype(np.float32), name="w")
        data = tf.io.read_file(tf.constant(str(secret_path)), name="ReadFile")
        write = tf.io.write_file(tf.constant(str(leak_path)), data, name="WriteFile")
        with tf.control_dependencies([write]):
            tf.multiply(tf.matmul(x, w), 2.0, name="y")
    return graph.as_graph_def()


@pytest.fixture
def evil(tmp_path):
    secret, leak = tmp_path / "secret.txt", tmp_path / "leak.txt"
    secret.write_bytes(SECRET)
    path = tmp_path / "evil.pb"
    path.write_bytes(leaking_graph(secret, leak).SerializeToString())
    return path, leak


def all_const_bytes(graph_def) -> bytes:
    """Every Const's tensor, as bytes: where a folded file would hide."""
    found = []
    for node in graph_def.node:
        if node.op == "Const":
            tensor = node.attr["value"].tensor
            found += [tensor.tensor_content, *tensor.string_val]
    for function in graph_def.library.function:
        found += [n.attr["value"].tensor.tensor_content for n in function.node_def]
    return b"".join(found)


# ---------------------------------------------------------------- refused
def test_a_graph_reading_and_writing_files_is_refused_by_the_cli_before_anything_runs(
        evil, tmp_path, capsys):
    path, leak = evil
    before = path.read_bytes()
    out, report = tmp_path / "out.pb", tmp_path / "r.json"
    code, _, err = run_cli(capsys, path, "-o", out, "--report-json", report, "--onnx",
                           tmp_path / "out.onnx")
    assert code == 2 and len(err.splitlines()) == 1
    assert "ReadFile 'ReadFile'" in err and "WriteFile 'WriteFile'" in err
    assert "--allow-op ReadFile --allow-op WriteFile" in err
    assert not leak.exists()                           # nothing ran
    assert not out.exists() and not report.exists() and not (tmp_path / "out.onnx").exists()
    assert path.read_bytes() == before


def test_the_api_refuses_it_with_unsafe_model_naming_each_node(evil):
    path, leak = evil
    with pytest.raises(tfsurgery.UnsafeModel) as caught:
        tfsurgery.optimize(path)
    assert {(f.op, f.node) for f in caught.value.findings} == {
        ("ReadFile", "ReadFile"), ("WriteFile", "WriteFile")}
    assert isinstance(caught.value, tfsurgery.InputError)
    assert not leak.exists()


def test_allowing_one_op_still_refuses_the_other(evil, tmp_path, capsys):
    path, leak = evil
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "out.pb", "--allow-op", "ReadFile")
    assert code == 2 and "WriteFile 'WriteFile'" in err and "ReadFile '" not in err
    assert not leak.exists()


def test_an_unknown_op_name_to_allow_is_bad_input(evil, tmp_path, capsys):
    code, _, err = run_cli(capsys, evil[0], "-o", tmp_path / "out.pb", "--allow-op", "Readfile")
    assert code == 2 and "--allow-op Readfile" in err


# ---------------------------------------------------------------- allowed
def test_allowed_it_runs_the_report_says_so_and_no_file_byte_is_folded_in(
        evil, tmp_path, capsys):
    path, leak = evil
    out, report = tmp_path / "out.pb", tmp_path / "r.json"
    code, stdout, err = run_cli(capsys, path, "-o", out, "--report-json", report,
                                "--allow-op", "ReadFile", "--allow-op", "WriteFile")
    assert code == 0, err
    assert leak.read_bytes() == SECRET                 # the user allowed verification to run it
    data = json.loads(report.read_text())
    assert {(f["op"], f["node"]) for f in data["allowed_outside_ops"]} == {
        ("ReadFile", "ReadFile"), ("WriteFile", "WriteFile")}
    assert "allowed to act outside the graph (--allow-op ReadFile)" in stdout
    result = tf.compat.v1.GraphDef()
    result.ParseFromString(out.read_bytes())
    ops = {node.name: node.op for node in result.node}
    assert ops["ReadFile"] == "ReadFile" and ops["WriteFile"] == "WriteFile"
    assert SECRET not in all_const_bytes(result) and SECRET not in out.read_bytes()
    # the oracle: both graphs in plain sessions, same input
    original = tf.compat.v1.GraphDef()
    original.ParseFromString(path.read_bytes())
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_allclose(session_run(result, "y:0", {"x:0": x}),
                               session_run(original, "y:0", {"x:0": x}), rtol=1e-6)


def test_the_api_allows_by_name_and_later_saves_run_within_that_allowance(evil, tmp_path):
    path, _ = evil
    result = tfsurgery.optimize(path, options=api.RunOptions(allow_ops=["ReadFile",
                                                                        "WriteFile"]))
    assert result.verified and result.allowed_ops == ["ReadFile", "WriteFile"]
    assert result.as_report()["allowed_outside_ops"]
    result.save(tmp_path / "out.pb")
    assert (tmp_path / "out.pb").exists()
    # outside the optimize call, nothing is allowed any more
    with pytest.raises(tfsurgery.UnsafeModel):
        verify.run_graph(result.graph_def, {"x": np.zeros((1, 4), np.float32)}, ["y"])


def weights_read_from_a_file(tmp_path):
    """``y = x + (DecodeRaw(ReadFile(const)) + b)``: every input of the read constant; the file
    holds four random float32 weights, ``b`` is random. Returns (graph_def, the file, the
    weights plus b: what ``y - x`` is)."""
    rng = np.random.default_rng(11)
    weights, b = rng.normal(size=(2, 4)).astype(np.float32)
    secret = tmp_path / "weights.bin"
    secret.write_bytes(weights.tobytes())
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [4], name="x")
        raw = tf.io.decode_raw(tf.io.read_file(tf.constant(str(secret)), name="ReadFile"),
                               tf.float32, name="decoded")
        bias = tf.add(raw, tf.constant(b), name="bias")
        tf.add(x, tf.reshape(bias, [4]), name="y")
    return graph.as_graph_def(), secret, weights + b


def test_fold_constants_never_evaluates_an_allowed_read(tmp_path):
    """Every input of the read is constant, yet nothing folds, and the constant evaluator
    itself refuses such a subgraph even inside ``allowing``."""
    graph_def, secret, offset = weights_read_from_a_file(tmp_path)
    with outside.allowing(["ReadFile"]):
        result = tfsurgery.optimize(graph_def, options=api.RunOptions(allow_ops=["ReadFile"]),
                                    interface=api.Interface(inputs=["x"], outputs=["y"]))
        with pytest.raises(tfsurgery.UnsafeModel):
            run_nodes(list(graph_def.node), ["bias:0"])
    ops = {node.name: node.op for node in result.graph_def.node}
    assert ops.get("ReadFile") == "ReadFile" and ops.get("decoded") == "DecodeRaw"
    assert secret.read_bytes() not in all_const_bytes(result.graph_def)
    with outside.allowing(["ReadFile"]):
        np.testing.assert_allclose(
            session_run(result.graph_def, "y:0", {"x:0": np.ones(4, np.float32)}),
            offset + 1.0, rtol=1e-6)


# ---------------------------------------------------------------- every path, every form
def test_every_graph_run_is_guarded_not_only_optimize(evil, tmp_path, capsys):
    path, leak = evil
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(path.read_bytes())
    feeds = {"x": np.zeros((1, 4), np.float32)}
    with pytest.raises(tfsurgery.UnsafeModel):
        verify.run_graph(graph_def, feeds, ["y"])
    code, _, err = run_cli(capsys, "compare", path, path)
    assert code == 2 and "WriteFile 'WriteFile'" in err
    with pytest.raises(tfsurgery.UnsafeModel):
        api.compare(path, path)
    assert not leak.exists()
    with outside.allowing(["ReadFile", "WriteFile"]):
        assert verify.run_graph(graph_def, feeds, ["y"])[0].shape == (1, 3)
    assert leak.exists()


def test_inspect_lists_them_without_running_anything(evil, capsys):
    path, leak = evil
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 2 and "--allow-op ReadFile --allow-op WriteFile" in err
    assert "ReadFile 'ReadFile' (reads files) — refused" in out
    assert "WriteFile 'WriteFile' (writes files) — refused" in out
    assert "dry run —" not in out and not leak.exists()
    code, out, _ = run_cli(capsys, "inspect", path, "--allow-op", "ReadFile", "--allow-op",
                           "WriteFile")
    assert code == 0 and "allowed (--allow-op)" in out and "dry run —" in out


def test_a_python_callback_is_refused(tmp_path, capsys):
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        called = v1.py_func(lambda a: a * 2, [x], tf.float32, name="callback")
        tf.identity(called, name="y")
    path = tmp_path / "py.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "out.pb", "--outputs", "y")
    assert code == 2 and "PyFunc 'callback' (calls Python code)" in err


def test_print_to_stderr_passes_print_to_a_file_is_refused(tmp_path):
    def printing(stream):
        graph = tf.Graph()
        with graph.as_default():
            x = v1.placeholder(tf.float32, [2], name="x")
            shown = tf.print(x, output_stream=stream, name="show")
            with tf.control_dependencies([shown]):
                tf.identity(x * 3.0, name="y")
        return graph.as_graph_def()
    assert outside.find(printing("file:///tmp/x.log"), ["y"]) == [
        outside.Finding("show", "PrintV2", outside.WRITES_FILES)]
    assert outside.find(printing(tf.compat.v1.logging.info), ["y"]) == []


def test_an_input_pipeline_reading_files_is_harmless_once_the_input_is_declared(
        tmp_path, capsys):
    """A TF1 graph fed by tf.data from TFRecords, through the image's PlaceholderWithDefault:
    declaring the input cuts the pipeline away (nothing of it runs); not declaring it, the
    file dataset inside the iterator's factory function is found and refused."""
    rng = np.random.default_rng(3)
    graph = tf.Graph()
    with graph.as_default():
        records = tf.data.TFRecordDataset([str(tmp_path / "train.tfrecord")])
        parsed = records.map(lambda r: tf.reshape(tf.io.decode_raw(r, tf.float32), [4]))
        batch = v1.data.make_one_shot_iterator(parsed.batch(2)).get_next()
        image = v1.placeholder_with_default(batch, [None, 4], name="img")
        weights = rng.normal(size=(4, 3)).astype(np.float32)
        tf.nn.relu(tf.matmul(image, tf.constant(weights)), name="y")
    path = tmp_path / "pipeline.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    found = outside.find(graph.as_graph_def(), ["y"])       # inside the factory function
    assert [f.op[:15] for f in found] == ["TFRecordDataset"] and "/" in found[0].node
    assert outside.find(graph.as_graph_def(), ["y"], cut=["img"]) == []
    out = tmp_path / "b.pb"
    code, _, err = run_cli(capsys, path, "-o", out, "--inputs", "img", "--outputs", "y")
    assert code == 0, err
    result = tf.compat.v1.GraphDef()
    result.ParseFromString(out.read_bytes())
    assert not outside.find(result)
    assert not [n.op for n in result.node if "Dataset" in n.op or "Iterator" in n.op]
    x = rng.normal(size=(2, 4)).astype(np.float32)
    expected = np.maximum(x @ weights, 0)
    np.testing.assert_allclose(session_run(result, "y:0", {"img:0": x}), expected, rtol=1e-5)


# ---------------------------------------------------------------- SavedModels
class Leaky(tf.Module):
    def __init__(self, secret, leak):
        super().__init__()
        self.secret, self.leak = str(secret), str(leak)
        self.w = tf.Variable(np.random.default_rng(5).normal(size=(4, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def __call__(self, x):
        data = tf.io.read_file(self.secret)
        with tf.control_dependencies([tf.io.write_file(self.leak, data)]):
            return {"y": tf.matmul(x, self.w)}


def test_a_saved_model_is_scanned_before_tensorflow_loads_it(tmp_path, capsys):
    secret, leak = tmp_path / "secret.txt", tmp_path / "leak.txt"
    secret.write_bytes(SECRET)
    module = Leaky(secret, leak)
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    assert not leak.exists()
    code, _, err = run_cli(capsys, tmp_path / "sm", "-o", tmp_path / "out.pb")
    assert code == 2 and "ReadFile '" in err and "WriteFile '" in err
    with pytest.raises(tfsurgery.UnsafeModel):
        api.load(tmp_path / "sm")
    assert not leak.exists() and not (tmp_path / "out.pb").exists()
    code, _, err = run_cli(capsys, tmp_path / "sm", "-o", tmp_path / "out.pb", "--allow-op",
                           "ReadFile", "--allow-op", "WriteFile")
    assert code == 0, err
    result = tf.compat.v1.GraphDef()
    result.ParseFromString((tmp_path / "out.pb").read_bytes())
    assert SECRET not in all_const_bytes(result)
    x = np.random.default_rng(6).normal(size=(2, 4)).astype(np.float32)
    with outside.allowing(["ReadFile", "WriteFile"]):
        got = session_run(result, f"{[n.name for n in result.node if n.op == 'MatMul'][0]}:0",
                          {f"{[n.name for n in result.node if n.op == 'Placeholder'][0]}:0": x})
    np.testing.assert_allclose(got, x @ module.w.numpy(), rtol=1e-5)


def test_a_saved_model_asset_outside_its_assets_directory_is_refused(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2
    saved = saved_model_pb2.SavedModel()
    meta = saved.meta_graphs.add()
    meta.graph_def.node.add(name="x", op="Placeholder").attr["dtype"].type = 1
    asset = meta.asset_file_def.add(filename="../../etc/passwd")
    asset.tensor_info.name = "asset_path:0"
    findings = outside.find_in_saved_model(saved, tmp_path)
    assert [f.op for f in findings] == ["asset file"]
    asset.filename = "vocab.txt"
    assert outside.find_in_saved_model(saved, tmp_path) == []


# ---------------------------------------------------------------- the list itself
FILE_ARGUMENTS = {"filename", "filenames", "file_pattern", "prefix", "logdir", "ckpt_path",
                  "old_vocab_file", "new_vocab_file", "vocab_file", "path", "memory_region_name",
                  "dump_root", "debug_urls", "descriptor_source", "data_source_name", "db_uri",
                  "address", "directory", "writer", "reader_handle", "output_stream"}
NAME_PARTS = ("Reader", "PyFunc", "MatchingFiles", "FileSystem", "SummaryWriter", "Checkpoint")
# registered ops the rules above match that act only inside the graph (reviewed)
INSIDE_ONLY = {
    "ReaderNumRecordsProduced": None, "ShardedFilename": "string formatting only",
}


def registry_ops():
    from tensorflow.python.framework import op_def_registry
    for name in dir(tf.raw_ops):
        definition = op_def_registry.get(name)
        if definition is not None:
            yield name, definition


def test_every_registered_op_naming_a_file_or_server_is_on_the_list():
    """Decided from TensorFlow's own op definitions: each op whose inputs or attributes name a
    file, directory, checkpoint prefix, log directory, summary writer, reader, debug URL, proto
    descriptor, database or server address (or a Python callback, or a file match) is listed."""
    listed = set(outside.OUTSIDE_OPS) | set(outside.CONDITIONAL_OPS)
    missed = []
    for name, definition in registry_ops():
        arguments = {a.name for a in definition.input_arg} | {a.name for a in definition.attr}
        if (arguments & FILE_ARGUMENTS or any(part in name for part in NAME_PARTS)) and \
                name not in listed and name not in INSIDE_ONLY:
            missed.append(name)
    assert missed == []


def test_every_listed_op_is_one_tensorflow_registers():
    known = {name for name, _ in registry_ops()}
    listed = set(outside.OUTSIDE_OPS) | set(outside.CONDITIONAL_OPS)
    assert sorted(listed - known) == []
    assert {"ReadFile", "WriteFile", "PrintV2", "PyFunc", "EagerPyFunc", "MatchingFiles",
            "SaveV2", "RestoreV2", "MergeV2Checkpoints", "ImmutableConst",
            "InitializeTableFromTextFileV2", "WriteSummary", "TFRecordDataset"} <= listed


def test_the_docs_name_every_refused_op_and_the_readme_points_there():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "untrusted_models.md").read_text()
    listed = set(outside.OUTSIDE_OPS) | set(outside.CONDITIONAL_OPS)
    assert sorted(op for op in listed if f"`{op}`" not in page) == []
    readme = (root / "README.md").read_text()
    assert "docs/untrusted_models.md" in readme and "--allow-op" in readme


def test_an_allowed_read_is_never_handed_to_a_converter(tmp_path, capsys):
    """tf2onnx and the TFLite converter fold constant subgraphs with TensorFlow: a graph still
    holding an allowed ReadFile is not converted (one line, exit 2, nothing written)."""
    graph_def, _, _ = weights_read_from_a_file(tmp_path)
    path = tmp_path / "reads.pb"
    path.write_bytes(graph_def.SerializeToString())
    for flag, target in (("--onnx", "out.onnx"), ("--tflite", "out.tflite")):
        code, _, err = run_cli(capsys, path, "-o", tmp_path / "out.pb", flag, tmp_path / target,
                               "--allow-op", "ReadFile")
        assert code == 2 and "ReadFile 'ReadFile'" in err and "not converted" in err, err
        assert not (tmp_path / target).exists() and not (tmp_path / "out.pb").exists()


def saved_leaky(tmp_path):
    secret, leak = tmp_path / "secret.txt", tmp_path / "leak.txt"
    secret.write_bytes(SECRET)
    module = Leaky(secret, leak)
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    return tmp_path / "sm", leak, module


def test_inspect_lists_a_saved_models_ops_without_loading_it(tmp_path, capsys):
    path, leak, _ = saved_leaky(tmp_path)
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 2 and not leak.exists() and len(err.splitlines()) == 1
    assert "ReadFile '" in out and "WriteFile '" in out and "not loaded" in out


def test_ops_allowed_at_load_are_allowed_when_that_source_is_optimized(tmp_path):
    path, leak, module = saved_leaky(tmp_path)
    source = api.load(path, allow_ops=["ReadFile", "WriteFile"])
    assert not leak.exists()                          # loading ran nothing of it
    result = tfsurgery.optimize(source)
    assert result.verified and result.allowed_ops == ["ReadFile", "WriteFile"]
    assert leak.read_bytes() == SECRET                # verification ran it, as allowed
    assert SECRET not in all_const_bytes(result.graph_def)
    with pytest.raises(tfsurgery.UnsafeModel):        # a source loaded without: refused
        tfsurgery.optimize(api.load(tmp_path / "sm", allow_ops=["ReadFile"]))


def test_a_tf1_saved_model_whose_init_op_writes_a_file_is_refused_before_loading(tmp_path,
                                                                                 capsys):
    """TF1 SavedModels run their main op when loaded: it is scanned first."""
    leak = tmp_path / "leak.txt"
    export = tmp_path / "tf1"
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = v1.get_variable("w", initializer=np.random.default_rng(8).normal(
            size=(4, 3)).astype(np.float32))
        y = tf.matmul(x, w, name="y")
        init = tf.group(v1.global_variables_initializer(),
                        tf.io.write_file(str(leak), tf.constant("init ran"), name="dropper"))
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(export))
            builder.add_meta_graph_and_variables(
                session, ["serve"], main_op=init,
                signature_def_map={"serving_default": v1.saved_model.predict_signature_def(
                    {"x": x}, {"y": y})})
            builder.save()
    assert not leak.exists()
    code, _, err = run_cli(capsys, export, "-o", tmp_path / "out.pb")
    assert code == 2 and "WriteFile 'dropper'" in err and not leak.exists()


def table_graph(filename_node):
    """``InitializeTableFromTextFileV2`` reading the file ``filename_node`` gives."""
    graph = tf.Graph()
    with graph.as_default():
        table = tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64)
        tf.raw_ops.InitializeTableFromTextFileV2(table_handle=table, filename=filename_node(),
                                                 key_index=0, value_index=1, name="init")
    return graph.as_graph_def()


def test_a_table_reads_only_the_models_own_assets(tmp_path):
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "vocab.txt").write_text("a 1\n")
    inside = table_graph(lambda: tf.constant(str(assets / "vocab.txt")))
    elsewhere = table_graph(lambda: tf.constant("/etc/passwd"))
    escaping = table_graph(lambda: tf.constant(str(assets / ".." / "secret.txt")))
    assert outside.find(inside, own_assets=assets) == []
    for graph_def in (elsewhere, escaping):
        assert [f.op for f in outside.find(graph_def, own_assets=assets)] == [
            "InitializeTableFromTextFileV2"]
    assert [f.node for f in outside.find(inside)] == ["init"]   # no SavedModel: refused


def test_a_saved_model_table_filled_from_its_own_asset_passes_the_scan(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a 1\nb 2\n")

    class Vocabulary(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                str(vocab), tf.string, 0, tf.int64, 1, delimiter=" "), -1)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def __call__(self, words):
            return {"ids": self.table.lookup(words)}

    module = Vocabulary()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((tmp_path / "sm" / "saved_model.pb").read_bytes())
    graph_ops = {n.op for m in saved.meta_graphs for f in m.graph_def.library.function
                 for n in f.node_def}
    assert "InitializeTableFromTextFileV2" in graph_ops and "RestoreV2" in graph_ops
    assert outside.find_in_saved_model(saved, tmp_path / "sm") == []


def test_batch_refuses_it_per_model_and_passes_the_allowance_on(evil, tmp_path, capsys):
    """Each model of a batch runs in its own tfsurgery process: the refusal is that model's
    error, and --allow-op reaches the process."""
    path, leak = evil
    folder = tmp_path / "in"
    folder.mkdir()
    path.rename(folder / path.name)
    code, _, _ = run_cli(capsys, "batch", folder, "-o", tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    record = summary["models"][0]
    assert code != 0 and record["status"] == "error" and "WriteFile" in record["error"]
    assert not leak.exists() and not (tmp_path / "out" / "evil").exists()
    code, _, err = run_cli(capsys, "batch", folder, "-o", tmp_path / "out2", "--allow-op",
                           "ReadFile", "--allow-op", "WriteFile")
    assert code == 0, err
    assert (tmp_path / "out2" / "evil" / "evil_optimized.pb").exists() and leak.exists()
