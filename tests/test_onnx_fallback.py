"""ONNX export is never worse than tf2onnx on the graph before our transforms: merge-duplicates
keeps each loop's own TensorList (three alike GRU loops convert), and when tf2onnx refuses the
optimized graph the transform that made it unconvertible is found, left out of that export (the
graph without it verified like any result) and named in the report."""
import numpy as np
import onnxruntime as ort
import pytest

from tfsurgery import api
from tfsurgery.models.recurrent import write_tf_keras_gru_branches


@pytest.fixture(scope="module")
def gru_branches(tmp_path_factory):
    """The Keras 2.2-style classifier (three GRU(go_backwards, reset_after=False) branches over
    Conv1D/SpatialDropout1D, batch-normalized inputs) as .h5, and the Keras model itself."""
    path = tmp_path_factory.mktemp("gru") / "gru.h5"
    return path, write_tf_keras_gru_branches(path, seed=3)


def onnx_outputs(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def test_three_alike_gru_loops_export_with_merge_duplicates_on(gru_branches, tmp_path):
    path, model = gru_branches
    result = api.optimize(path)
    merged = next(r for r in result.reports if r.name == "merge-duplicates")
    assert merged.rewritten                      # it ran and merged the loops' equal constants
    reserves = [n for n in result.graph_def.node if n.op == "TensorListReserve"]
    assert len(reserves) == 3                    # ... but each loop keeps its own buffer
    exported = result.export_onnx(tmp_path / "gru.onnx")
    assert exported.passed and exported.op_histogram.get("Loop") == 3
    assert exported.left_out == []               # the graph itself converted
    x = np.random.default_rng(7).normal(size=(5, 8, 4)).astype(np.float32)
    expected = model(x, training=False).numpy()          # the Keras model is the oracle
    (actual,) = onnx_outputs(tmp_path / "gru.onnx", x)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(expected - expected.mean(0)).max() > 1e-3     # rows differ: a real check


UNCONVERTIBLE = '''
import tfsurgery

@tfsurgery.transform("make-unconvertible")
def make_unconvertible(graph, options):
    """Puts a DeepCopy after the first Relu: the same values in TensorFlow, but an op tf2onnx
    has no conversion for."""
    report = tfsurgery.TransformReport("make-unconvertible")
    relu = graph.nodes_with_ops({"Relu"})[0].name
    copy = graph.new_node("DeepCopy", relu + "/copy", [relu],
                          {"T": graph.node(relu).attr["T"]})
    graph.rewire(relu, copy.name, keep={copy.name})
    report.rewritten.append(relu)
    return report
'''


@pytest.fixture
def users(monkeypatch):
    from tfsurgery import pipeline
    monkeypatch.setattr(pipeline, "USER", {})


def test_the_transform_that_breaks_conversion_is_left_out_of_the_onnx_and_named(
        users, article, tmp_path, capsys):
    """--plugin adds a transform after which tf2onnx refuses the graph: the .pb keeps it (it
    verified), the ONNX is made from the graph without it — verified too — and the output and
    the report say which transform was left out and why."""
    import json
    import oracle
    from tfsurgery.cli import main
    (tmp_path / "article.pb").write_bytes(article.graph_def.SerializeToString())
    (tmp_path / "mine.py").write_text(UNCONVERTIBLE)
    code = main([str(tmp_path / "article.pb"), "--plugin", str(tmp_path / "mine.py"),
                 "--transforms", "default,make-unconvertible", "-o", str(tmp_path / "x.pb"),
                 "--onnx", str(tmp_path / "x.onnx"), "--report-json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "ONNX made without make-unconvertible" in out + err and "DeepCopy" in out + err
    left_out = json.loads((tmp_path / "r.json").read_text())["onnx"]["left_out"]
    assert [e["transform"] for e in left_out] == ["make-unconvertible"]
    assert "DeepCopy" in left_out[0]["why"] and "max error" in left_out[0]["verification"]
    import tensorflow as tf
    lean = tf.compat.v1.GraphDef.FromString((tmp_path / "x.pb").read_bytes())
    assert "DeepCopy" in {n.op for n in lean.node}          # the .pb is the whole pipeline
    # the ONNX computes what the original computes (plain TensorFlow, training off)
    feeds = oracle.random_feeds(article.graph_def, article.inputs, seed=5)
    expected = oracle.run(article.graph_def, {**feeds, "training": False}, article.outputs)[0]
    (actual,) = onnx_outputs(tmp_path / "x.onnx", feeds[article.inputs[0]])
    assert oracle.relative_error(expected, actual) < 1e-4
    assert "If" not in {n.op_type for n in __import__("onnx").load(
        str(tmp_path / "x.onnx")).graph.node}        # the rest of the pipeline still applied


def test_no_fallback_when_tf2onnx_refuses_the_original_too(users, tmp_path):
    """An op tf2onnx cannot convert in the original itself: the refusal stands (nothing to
    leave out), and nothing is written."""
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="input")
        tf.identity(tf.math.expm1(x * 0.5), name="output")
    result = api.optimize(api.Source(graph.as_graph_def(), "expm1", inputs=["input"],
                                     outputs=["output"]))
    with pytest.raises(api.ExportError, match="Expm1.*refuses the original graph too"):
        result.export_onnx(tmp_path / "x.onnx")
    assert list(tmp_path.iterdir()) == []
