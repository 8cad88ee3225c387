"""ONNX export: lean article model, checker + onnxruntime vs TensorFlow, NCHW inputs, external
data, and the CLI's --onnx / export, including failures (exit 1) and bad input (exit 2)."""
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import optimize
from tfsurgery import io
from tfsurgery.export import onnx as onnx_export
from tfsurgery.verify import check as verify
from tfsurgery.cli import main
from tfsurgery.errors import InputError

LEAN_OPS = {"Conv", "Relu", "MaxPool", "Transpose", "Reshape", "Gemm", "Softmax"}


@pytest.fixture(scope="module")
def lean(article):
    """The article model optimized with --bn-fold (verified in TF)."""
    result = optimize(article)
    assert result.verification.passed
    return result


@pytest.fixture
def pb(tmp_path, article):
    """A private copy of the article model: CLI outputs land next to it, in tmp_path."""
    path = tmp_path / "article.pb"
    path.write_bytes(article.graph_def.SerializeToString())
    return path


def ort_vs_tf(path, graph_def, inputs, outputs, nchw=()):
    """An independent check of a written model: onnxruntime on it vs TensorFlow."""
    feeds = verify.make_feeds(graph_def, inputs)
    expected = verify.run_graph(graph_def, feeds, outputs)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actual = session.run([o + ":0" for o in outputs],
                         {k + ":0": np.transpose(v, (0, 3, 1, 2)) if k in nchw else v
                          for k, v in feeds.items()})
    return max(verify.output_error(o, e, a).max_rel
               for o, e, a in zip(outputs, expected, actual))


def leftovers(directory):
    """Staging directories an export left behind (there should be none)."""
    return [p.name for p in directory.iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------- the API
def test_optimized_article_exports_lean_checked_and_equal(lean, tmp_path):
    out = tmp_path / "lean.onnx"
    result = onnx_export.export(lean.graph_def, lean.inputs, lean.outputs, out)
    assert result.passed and result.max_error < 1e-5
    assert result.opset == onnx_export.DEFAULT_OPSET and not result.external_data
    assert "If" not in result.op_histogram and result.node_count <= 14
    assert set(result.op_histogram) <= LEAN_OPS
    assert result.converted_node_count == result.node_count + 1     # MatMul+Add -> Gemm
    onnx.checker.check_model(str(out))
    model = onnx.load(str(out))
    assert len(model.graph.node) == result.node_count
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx.ml"}
    assert ort_vs_tf(out, lean.graph_def, lean.inputs, lean.outputs) < 1e-5
    assert leftovers(tmp_path) == []


def test_unoptimized_article_keeps_every_cond_as_if(article, tmp_path):
    result = onnx_export.export(article.graph_def, article.inputs, article.outputs,
                                tmp_path / "raw.onnx", ort_optimize=False)
    assert result.passed
    assert result.op_histogram["If"] == 6 and result.node_count == 24


def test_raw_tf2onnx_output_is_kept_on_request(lean, tmp_path):
    result = onnx_export.export(lean.graph_def, lean.inputs, lean.outputs,
                                tmp_path / "raw.onnx", ort_optimize=False)
    assert result.passed and result.node_count == result.converted_node_count
    assert {"MatMul", "Add"} <= set(result.op_histogram) and "Gemm" not in result.op_histogram


def test_inputs_as_nchw_on_a_conv_model(tmp_path):
    from tfsurgery.models.tf1 import conv_bn
    built = conv_bn()                                   # input [2, 6, 6, 3] NHWC
    nhwc = onnx_export.export(built.graph_def, built.inputs, built.outputs, tmp_path / "a.onnx")
    out = tmp_path / "nchw.onnx"
    nchw = onnx_export.export(built.graph_def, built.inputs, built.outputs, out,
                              inputs_as_nchw=["input"])
    assert nhwc.passed and nchw.passed and nchw.max_error < 1e-5
    dims = [d.dim_value for d in onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 3, 6, 6]
    assert nchw.op_histogram.get("Transpose", 0) == nhwc.op_histogram["Transpose"] - 1
    assert ort_vs_tf(out, built.graph_def, built.inputs, built.outputs, nchw=("input",)) < 1e-5


@pytest.mark.parametrize("ort_optimize", [True, False])
def test_large_model_path_writes_external_data(tmp_path, monkeypatch, ort_optimize):
    from tfsurgery.models.tf1 import conv_bn
    built = conv_bn(cin=8, cout=16)                     # a 3x3x8x16 kernel: over 1024 elements
    monkeypatch.setattr(onnx_export, "LARGE_MODEL_BYTES", 0)
    out = tmp_path / "big.onnx"
    result = onnx_export.export(built.graph_def, built.inputs, built.outputs, out,
                                ort_optimize=ort_optimize)
    assert result.passed and result.external_data
    data = tmp_path / "big.onnx.data"
    assert data.stat().st_size >= 3 * 3 * 8 * 16 * 4
    model = onnx.load(str(out), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    onnx.checker.check_model(str(out))
    assert ort_vs_tf(out, built.graph_def, built.inputs, built.outputs) < 1e-5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx.data"]
    # tf2onnx's large-model path needed np.product (gone in numpy 2): lent to tf2onnx alone
    assert np.lib.NumpyVersion(np.__version__) < "2.0.0" or not hasattr(np, "product")


def test_mismatch_is_reported_and_nothing_written(lean, tmp_path, monkeypatch):
    real = onnx_export.run_onnx
    monkeypatch.setattr(onnx_export, "run_onnx",
                        lambda *a, **k: [x + 0.1 for x in real(*a, **k)])   # a conversion bug
    out = tmp_path / "bad.onnx"
    result = onnx_export.export(lean.graph_def, lean.inputs, lean.outputs, out)
    assert not result.passed and result.max_error > 0.01
    assert list(tmp_path.iterdir()) == []


def test_graph_over_the_protobuf_limit_is_bad_input(lean, tmp_path, monkeypatch):
    monkeypatch.setattr(io, "PROTOBUF_LIMIT", 1000)
    with pytest.raises(InputError, match="SavedModel"):
        onnx_export.export(lean.graph_def, lean.inputs, lean.outputs, tmp_path / "x.onnx")


# ---------------------------------------------------------------- the CLI
def test_optimize_with_onnx_writes_both_and_reports(pb, tmp_path, capsys):
    out, model = tmp_path / "lean.pb", tmp_path / "lean.onnx"
    code = main(["optimize", str(pb), "--bn-fold", "-o", str(out), "--onnx", str(model),
                 "--report-json", str(tmp_path / "r.json")])
    assert code == 0 and out.exists() and model.exists()
    text = capsys.readouterr().out
    assert "TF after" in text and "Gemm" in text and "ONNX check: max error" in text
    report = json.loads((tmp_path / "r.json").read_text())["onnx"]
    assert report["passed"] and report["node_count"] <= 14 and "If" not in report["op_histogram"]
    assert report["path"] == str(model) and report["opset"] == 18


def test_export_subcommand_writes_stem_onnx_next_to_the_input(pb, tmp_path):
    assert main(["export", str(pb), "--bn-fold", "-q", "--opset", "15",
                 "--inputs-as-nchw", "input"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["article.onnx", "article.pb"]
    model = onnx.load(str(tmp_path / "article.onnx"))
    assert model.opset_import[0].version == 15 and len(model.graph.node) <= 13


def test_export_of_the_demo_lands_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--bn-fold", "-q"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["article_cnn.onnx"]


def test_onnx_mismatch_exits_1_with_the_error_and_writes_nothing(pb, tmp_path, monkeypatch,
                                                                 capsys):
    real = onnx_export.run_onnx
    monkeypatch.setattr(onnx_export, "run_onnx", lambda *a, **k: [x * 1.5 for x in real(*a, **k)])
    code = main([str(pb), "--bn-fold", "--onnx", str(tmp_path / "m.onnx"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "ONNX check FAILED" in err and "tolerance 0.0001" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["article.pb"]     # not even the .pb


def test_unconvertible_op_exits_1_with_one_line(tmp_path, capsys):
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        tf.raw_ops.Betainc(a=x * x + 1, b=x * x + 2, x=tf.sigmoid(x), name="output")
    src = tmp_path / "betainc.pb"
    src.write_bytes(graph.as_graph_def().SerializeToString())
    assert main(["export", str(src)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot convert op(s) Betainc" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["betainc.pb"]


@pytest.mark.parametrize("args, message", [
    (["--opset", "99"], "supports opsets"),
    (["--inputs-as-nchw", "nope"], "not one of the graph's inputs"),
    (["-o", "{pb}"], "overwrite the input"),
])
def test_bad_onnx_options_exit_2(pb, capsys, args, message):
    code = main(["export", str(pb)] + [a.format(pb=pb) for a in args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err
    assert sorted(p.name for p in pb.parent.iterdir()) == ["article.pb"]


def test_pb_over_the_protobuf_limit_exits_2_pointing_to_savedmodel(pb, monkeypatch, capsys):
    monkeypatch.setattr(io, "PROTOBUF_LIMIT", 1000)
    assert main(["export", str(pb)]) == 2
    assert "SavedModel" in capsys.readouterr().err


# ---------------------------------------------------------------- onnx_tidy: identity Reshapes
def squeeze_excite_graph():
    """conv → swish → squeeze-and-excite (Mean keep_dims, two 1x1 convs on [N,1,1,C]) → conv:
    tf2onnx's layout handling leaves a Reshape [N,C,1,1] → [-1,C,1,1] before each 1x1 conv."""
    import tensorflow as tf
    rng = np.random.default_rng(3)
    weight = lambda *shape: tf.constant(rng.normal(0, 0.5, shape).astype(np.float32))  # noqa: E731
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 4], name="x")
        h = tf.nn.bias_add(tf.nn.conv2d(x, weight(3, 3, 4, 6), 1, "SAME"), weight(6))
        h = h * tf.sigmoid(h)
        s = tf.reduce_mean(h, [1, 2], keepdims=True)
        s = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(s, weight(1, 1, 6, 3), 1, "VALID"), weight(3)))
        s = tf.sigmoid(tf.nn.bias_add(tf.nn.conv2d(s, weight(1, 1, 3, 6), 1, "VALID"), weight(6)))
        tf.identity(tf.nn.conv2d(h * s, weight(1, 1, 6, 5), 1, "VALID"), name="y")
    return graph.as_graph_def()


def identity_reshapes(model, batches=(1, 3)):
    """Reshapes that returned their input's shape in onnxruntime at every batch size tried."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    reshapes = [n for n in probe.graph.node if n.op_type == "Reshape"]
    watched = {name for n in reshapes for name in (n.input[0], n.output[0])}
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in sorted(watched - known))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    same = {n.name for n in reshapes}
    for batch in batches:
        feed = {i.name: np.random.rand(batch, *i.shape[1:]).astype(np.float32)
                for i in session.get_inputs()}
        values = dict(zip(names, session.run(None, feed)))
        same &= {n.name for n in reshapes if values[n.input[0]].shape == values[n.output[0]].shape}
    return sorted(same)


def test_identity_reshapes_from_tf2onnx_are_removed(tmp_path):
    from tfsurgery.export import onnx_tidy
    graph_def = squeeze_excite_graph()
    # tf2onnx's layout pass depends on iteration orders (and, seen once in a full suite run, on
    # what converted before in the process): 2 Reshapes, or 3 and two more Transposes; one or
    # both before the 1x1 convs are identities. Whatever the count, tidy removes exactly those.
    model, _ = onnx_export.convert(graph_def, ["x"], ["y"], opset=18)
    reshapes = lambda: sum(n.op_type == "Reshape" for n in model.graph.node)   # noqa: E731
    before, identities = reshapes(), len(identity_reshapes(model))
    assert identities >= 1
    assert onnx_tidy.tidy(model) == {"identity Reshape removed": identities}
    assert reshapes() == before - identities and identity_reshapes(model) == []
    # A second conversion may lay out differently (and ORT may remove one first): whatever
    # the count, no Reshape left in the written model may return its input unchanged.
    lean = onnx_export.export(graph_def, ["x"], ["y"], tmp_path / "lean.onnx")
    assert lean.passed and lean.tidied.get("identity Reshape removed", 0) >= 1
    assert identity_reshapes(onnx.load(str(tmp_path / "lean.onnx"))) == []
    assert ort_vs_tf(tmp_path / "lean.onnx", graph_def, ["x"], ["y"]) < 1e-5
    # the removed Reshapes' target shapes went with them
    graph = onnx.load(str(tmp_path / "lean.onnx")).graph
    read = {name for node in graph.node for name in node.input}
    assert [t.name for t in graph.initializer if t.name not in read] == []
    raw = onnx_export.export(graph_def, ["x"], ["y"], tmp_path / "raw.onnx", ort_optimize=False)
    assert raw.passed and raw.tidied == {} and raw.op_histogram["Reshape"] >= 2


def reshape_model(input_shape, target, *, allowzero=0, output_is_reshape=False):
    """x → Reshape(target) → (Relu →) y, as an ONNX model."""
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Reshape", ["x", "target"], ["r"], allowzero=allowzero)]
    if not output_is_reshape:
        nodes.append(helper.make_node("Relu", ["r"], ["y"]))
    out = "r" if output_is_reshape else "y"
    graph = helper.make_graph(
        nodes, "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, input_shape)],
        [numpy_helper.from_array(np.asarray(target, np.int64), "target")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize("input_shape, target, allowzero, removed", [
    (["N", 32, 1, 1], [-1, 32, 1, 1], 0, True),      # tf2onnx's: the batch is the -1
    (["N", 3], [0, 3], 0, True),                      # 0 copies the batch
    (["N", "M"], [0, -1], 0, True),                   # copied, and the one size left
    ([2, 3], [2, 3], 0, True),
    (["N", 6], [-1, 3], 0, False),                    # a real reshape: 2N x 3
    (["N", 3], [2, 3], 0, False),                     # N might not be 2
    (["N", "M"], [-1, -1], 0, False),                 # invalid anyway: left to onnxruntime
    ([2, 3], [0, 3], 1, False),                       # allowzero: 0 means size 0
    ([0, 3], [0, -1], 0, False),                      # -1 undetermined next to a 0
])
def test_identity_reshape_rule(input_shape, target, allowzero, removed):
    from tfsurgery.export import onnx_tidy
    model = reshape_model(input_shape, target, allowzero=allowzero)
    tidied = onnx_tidy.tidy(model)
    assert (tidied == {"identity Reshape removed": 1}) is removed
    assert [n.op_type for n in model.graph.node] == (["Relu"] if removed else ["Reshape", "Relu"])
    if removed:     # same numbers as the untouched model
        onnx.checker.check_model(model)
        shape = [2 if isinstance(d, str) else d for d in input_shape]
        x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
        before = reshape_model(input_shape, target, allowzero=allowzero)
        run = lambda m: ort.InferenceSession(m.SerializeToString(),   # noqa: E731
                                             providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_array_equal(run(model)[0], run(before)[0])
        assert not model.graph.initializer


def test_identity_reshape_producing_a_graph_output_stays():
    from tfsurgery.export import onnx_tidy
    model = reshape_model(["N", 3], [-1, 3], output_is_reshape=True)
    assert onnx_tidy.tidy(model) == {}
    assert [n.op_type for n in model.graph.node] == ["Reshape"]


def test_identity_reshape_not_trusted_to_a_wrong_declared_shape():
    """A converter's declared shape that contradicts the ops (Relu of [N,6] declared [N,3]) is
    no proof: strict shape inference refuses it and every Reshape stays."""
    from onnx import TensorProto, helper, numpy_helper
    from tfsurgery.export import onnx_tidy
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]),
         helper.make_node("Reshape", ["a", "target"], ["r"]),
         helper.make_node("Relu", ["r"], ["y"])], "wrong",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray([-1, 3], np.int64), "target")],
        value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    assert onnx_tidy.tidy(model) == {}
    assert [n.op_type for n in model.graph.node] == ["Relu", "Reshape", "Relu"]


def test_one_export_touches_the_disk_once(lean, tmp_path, monkeypatch):
    """Conversion, tidying, onnxruntime's rewrites, the checker and the run all happen in
    memory: the only write is the atomic publish of the finished model (one temporary file
    renamed onto the target), and no staging directory or temporary file is left or made."""
    import builtins
    import os
    import tempfile
    import oracle
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))     # any temporary file lands here
    writes = []
    real_open, real_replace, real_mkstemp = builtins.open, os.replace, tempfile.mkstemp
    real_save = onnx.save_model

    def counting_open(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax+"):
            writes.append(("open", str(file)))
        return real_open(file, mode, *args, **kwargs)

    def counting_replace(source, target, *args, **kwargs):
        writes.append(("replace", str(target)))
        return real_replace(source, target, *args, **kwargs)

    def counting_mkstemp(*args, **kwargs):
        made = real_mkstemp(*args, **kwargs)
        writes.append(("mkstemp", made[1]))
        return made

    def counting_save(model, target, *args, **kwargs):
        writes.append(("onnx.save_model", str(target)))
        return real_save(model, target, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(os, "replace", counting_replace)
    monkeypatch.setattr(tempfile, "mkstemp", counting_mkstemp)
    monkeypatch.setattr(onnx, "save_model", counting_save)
    monkeypatch.setattr(onnx, "save", counting_save)
    out = tmp_path / "once.onnx"
    exported = onnx_export.export(lean.graph_def, lean.inputs, lean.outputs, out,
                                  float16_min_elements=1, tolerance=1e-2)   # weights stored too
    monkeypatch.undo()
    assert exported.passed and not exported.external_data
    assert [kind for kind, _ in writes] == ["mkstemp", "replace"]     # io.write_atomically
    assert writes[1][1] == str(out) and Path(writes[0][1]).parent == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["once.onnx", "tmp"]
    assert list(scratch.iterdir()) == []
    # the published model is the checked one: onnxruntime on the file against plain TensorFlow
    feeds = oracle.random_feeds(lean.graph_def, lean.inputs, seed=3)
    expected = oracle.run(lean.graph_def, feeds, lean.outputs)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    actual = session.run([oracle.tensor(o) for o in lean.outputs],
                         {oracle.tensor(k): v for k, v in feeds.items()})
    assert "Cast" in {n.op_type for n in onnx.load(str(out)).graph.node}   # float16 storage
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=2e-2, atol=2e-2 * np.abs(e).max())
