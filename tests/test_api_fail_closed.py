"""The Python API fails closed, like the CLI: a failed or impossible check raises
VerificationFailed, and nothing unverified is saved or exported unless the caller says so. The
README's Python example runs here as written."""

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.transforms import fold_batch_norm

import oracle
from docs_examples import marked_example

def readme_example(marker: str = "<!-- python-example:") -> str:
    """The README's example (or a docs page's: docs_examples finds the marker on any page)."""
    return marked_example(marker)[0]


@pytest.fixture
def broken_fold(monkeypatch):
    """fold-batch-norm with its scale shifted by 0.1: the folded weights are wrong."""
    real = fold_batch_norm.batch_norm_step

    def off_by_a_tenth(graph, name, lin):
        step = real(graph, name, lin)
        return step if isinstance(step, str) else (step[0] + 0.1, step[1])
    monkeypatch.setattr(fold_batch_norm, "batch_norm_step", off_by_a_tenth)


def test_readme_example_runs_and_saves_a_checked_graph(article, tmp_path, monkeypatch):
    (tmp_path / "frozen.pb").write_bytes(article.graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_example(), "README.md", "exec"), {})
    lean = tf.compat.v1.GraphDef.FromString((tmp_path / "lean.pb").read_bytes())
    assert "FusedBatchNormV3" not in {n.op for n in lean.node}
    oracle.assert_same_outputs(article.graph_def, lean, article.inputs, article.outputs,
                               original_feeds={"training": False})


def test_readme_grouped_example_runs_as_written(article, tmp_path, monkeypatch):
    (tmp_path / "frozen.pb").write_bytes(article.graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_example("<!-- python-example-grouped:"), "README.md", "exec"), {})
    lean = tf.compat.v1.GraphDef.FromString((tmp_path / "lean.pb").read_bytes())
    oracle.assert_same_outputs(article.graph_def, lean, article.inputs, article.outputs,
                               original_feeds={"training": False})
    import onnxruntime as ort
    feeds = oracle.random_feeds(article.graph_def, article.inputs, seed=2)
    expected = oracle.run(article.graph_def, {**feeds, "training": False}, article.outputs)[0]
    session = ort.InferenceSession(str(tmp_path / "lean.onnx"),
                                   providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: feeds["input"]})[0]
    assert oracle.relative_error(expected, actual) < 1e-4


def test_readme_example_refuses_a_broken_fold(article, tmp_path, monkeypatch, broken_fold):
    (tmp_path / "frozen.pb").write_bytes(article.graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="not saved: max error"):
        exec(compile(readme_example(), "README.md", "exec"), {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frozen.pb"]


def test_a_failed_check_raises_with_the_numbers(article, broken_fold, tmp_path):
    source = api.Source(article.graph_def, "article", inputs=article.inputs,
                        outputs=article.outputs, training_flags=["training"])
    with pytest.raises(api.VerificationFailed) as failed:
        api.optimize(source, api.choose_transforms(bn_fold=True))
    assert failed.value.max_error > failed.value.allowed > 0
    assert failed.value.verification is not None and not failed.value.verification.passed
    # The oracle agrees that the result really differs from the original.
    feeds = oracle.random_feeds(article.graph_def, article.inputs, seed=3)
    expected = oracle.run(article.graph_def, {**feeds, "training": False}, article.outputs)[0]
    actual = oracle.run(failed.value.result.graph_def, feeds, article.outputs)[0]
    assert oracle.relative_error(expected, actual) > 1e-3
    # The failed result is there to look at, never to write.
    for allow in (False, True):
        with pytest.raises(api.Unverified, match="failed verification"):
            api.save(failed.value.result, tmp_path / "x.pb", allow_unverified=allow)
        with pytest.raises(api.Unverified):
            api.export_onnx(failed.value.result, tmp_path / "x.onnx", allow_unverified=allow)
    assert list(tmp_path.iterdir()) == []


def test_nothing_to_compare_raises_too():
    """Every output value NaN in the original: nothing real can be compared — not a pass."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="input")
        tf.math.sqrt(-tf.math.square(tf.identity(x)) - 1.0, name="output")
    source = api.Source(graph.as_graph_def(), "nan", inputs=["input"], outputs=["output"])
    with pytest.raises(api.VerificationFailed, match="NaN/Inf") as failed:
        api.optimize(source, api.choose_transforms())
    assert failed.value.verification.uncomparable == ["output"]


def test_skipping_the_check_is_explicit_and_visible(article, tmp_path):
    source = api.Source(article.graph_def, "article", inputs=article.inputs,
                        outputs=article.outputs, training_flags=["training"])
    result = api.optimize(source, api.choose_transforms(bn_fold=True), verify=False)
    assert result.verification is None and result.verify_skipped and not result.verified
    assert result.as_report()["verification_skipped"] is True
    with pytest.raises(api.Unverified, match="not verified"):
        api.save(result, tmp_path / "x.pb")
    assert not (tmp_path / "x.pb").exists()
    api.save(result, tmp_path / "x.pb", allow_unverified=True)
    written = tf.compat.v1.GraphDef.FromString((tmp_path / "x.pb").read_bytes())
    oracle.assert_same_outputs(article.graph_def, written, article.inputs, article.outputs,
                               original_feeds={"training": False})


def test_save_takes_a_result_not_a_bare_graph(article, tmp_path):
    with pytest.raises(TypeError, match="Result"):
        api.save(article.graph_def, tmp_path / "x.pb")
    assert np.size(list(tmp_path.iterdir())) == 0


def test_one_rule_for_what_was_compared():
    """Verification, ONNX and the other artefacts share one rule: nothing compared, or an output
    NaN/Inf everywhere in the reference, is never a pass (review H5)."""
    from tfsurgery.export import artefacts
    from tfsurgery.verify import check as verify
    assert not verify.compared_real_numbers([])
    assert verify.worst_error([]) == float("inf")
    _, worst, compared = artefacts.compare({}, {})
    assert not compared and worst == float("inf")
    all_nan = verify.output_error("y", np.full(3, np.nan), np.full(3, np.nan))
    some_nan = verify.output_error("y", np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert not verify.compared_real_numbers([all_nan])
    assert verify.compared_real_numbers([some_nan])
    assert not verify.Verification([], 1e-4).passed


def test_readme_grouped_example_refuses_an_onnx_that_differs(article, tmp_path, monkeypatch):
    """onnxruntime's outputs off by 1.5x (a conversion bug): the example stops with the
    numbers, and no .onnx is written."""
    from tfsurgery.export import onnx as onnx_export
    real = onnx_export.run_onnx
    monkeypatch.setattr(onnx_export, "run_onnx", lambda *a, **k: [x * 1.5 for x in real(*a, **k)])
    (tmp_path / "frozen.pb").write_bytes(article.graph_def.SerializeToString())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"no ONNX: 'output\S*' off by 0\.5"):
        exec(compile(readme_example("<!-- python-example-grouped:"), "README.md", "exec"), {})
    assert not (tmp_path / "lean.onnx").exists()


@pytest.mark.parametrize("call", ["method", "api"])
def test_export_onnx_raises_with_the_numbers_where_write_refuses(article, tmp_path, monkeypatch,
                                                                call):
    """The ONNX check misses: export_onnx raises OnnxCheckFailed (an ExportError) with max
    error, tolerance and the output attached, writes nothing — and api.write refuses the same
    model at the same stage with the same words."""
    import onnxruntime as ort
    import tfsurgery
    from tfsurgery.export import onnx as onnx_export
    result = api.optimize(api.Source(article.graph_def, "article", inputs=article.inputs,
                                     outputs=article.outputs, training_flags=["training"]))
    # the unbroken export first: onnxruntime on it agrees with plain TensorFlow (the oracle)
    good = result.export_onnx(tmp_path / "good.onnx")
    feeds = oracle.random_feeds(article.graph_def, article.inputs, seed=4)
    expected = oracle.run(article.graph_def, {**feeds, "training": False}, article.outputs)[0]
    session = ort.InferenceSession(str(tmp_path / "good.onnx"),
                                   providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: feeds["input"]})[0]
    assert good.passed and oracle.relative_error(expected, actual) < 1e-4
    # then onnxruntime's outputs off by 1.5x
    real = onnx_export.run_onnx
    monkeypatch.setattr(onnx_export, "run_onnx", lambda *a, **k: [x * 1.5 for x in real(*a, **k)])
    export = result.export_onnx if call == "method" else \
        (lambda path: api.export_onnx(result, path))
    with pytest.raises(tfsurgery.OnnxCheckFailed) as failed:
        export(tmp_path / "bad.onnx")
    error = failed.value
    assert isinstance(error, api.ExportError)
    assert error.max_error == pytest.approx(0.5, rel=1e-3) and error.tolerance == 1e-4
    assert error.output == article.outputs[0] or error.output.startswith(article.outputs[0])
    assert not error.export.passed and error.export.max_error == error.max_error
    assert f"{error.max_error:.3g}" in str(error) and "tolerance 0.0001" in str(error)
    with pytest.raises(api.WriteFailed) as refused:
        api.write(api.Source(article.graph_def, "article"), result,
                  api.Targets(onnx=tmp_path / "w.onnx"))
    assert refused.value.stage == "ONNX check" and str(refused.value) == str(error)
    assert refused.value.written.onnx.max_error == error.max_error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.onnx"]
