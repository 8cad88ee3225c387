"""tfsurgery compare A B: two graphs (or a graph and its ONNX / TFLite) on the same inputs,
every common tensor compared, the first and the worst divergence named, exit 0/1."""
import json

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.cli import main

import oracle
from test_localize import five_convs


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_an_optimized_graph_matches_its_original(article_pb, tmp_path, capsys):
    for fold in ([], ["--bn-fold"]):
        lean = tmp_path / f"lean{len(fold)}.pb"
        assert main([str(article_pb), *fold, "-o", str(lean)]) == 0
        code, out, err = run_cli(capsys, "compare", article_pb, lean, "--report-json",
                                 tmp_path / "c.json")
        assert code == 0, err
        assert "same numbers" in out
        data = json.loads((tmp_path / "c.json").read_text())
        assert data["passed"] is True and len(data["tensors"]) >= 4
    assert "differ only inside a rewrite" in out        # the folded convs' raw outputs


def test_a_wrong_graph_is_named_at_its_first_divergence(tmp_path, capsys):
    original = five_convs()
    broken = tf.compat.v1.GraphDef()
    broken.CopyFrom(original)
    kernel = next(n for n in broken.node if n.name == "kernel_3")
    value = tf.make_ndarray(kernel.attr["value"].tensor) * 1.05
    kernel.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    (tmp_path / "a.pb").write_bytes(original.SerializeToString())
    (tmp_path / "b.pb").write_bytes(broken.SerializeToString())
    code, out, err = run_cli(capsys, "compare", tmp_path / "a.pb", tmp_path / "b.pb")
    assert code == 1 and "first divergence conv_3:0" in err and len(err.splitlines()) == 1
    assert "first divergence: conv_3:0 (Conv2D)" in out
    feeds = oracle.random_feeds(original, ["input"], seed=0)
    assert oracle.relative_error(*(oracle.run(g, feeds, ["conv_3"])[0]
                                   for g in (original, broken))) > 1e-3


def test_against_an_onnx_export(article, tmp_path):
    source = api.Source(article.graph_def, "a", inputs=article.inputs, outputs=article.outputs,
                        training_flags=["training"])
    result = api.optimize(source, api.choose_transforms(bn_fold=True))
    result.export_onnx(tmp_path / "a.onnx")
    (tmp_path / "a.pb").write_bytes(article.graph_def.SerializeToString())
    compared = api.compare(tmp_path / "a.pb", tmp_path / "a.onnx")
    assert compared.passed and compared.what == "the outputs" and len(compared.errors) == 1


def test_the_reference_must_be_tensorflow(tmp_path, capsys):
    (tmp_path / "x.onnx").write_bytes(b"")
    code, _, err = run_cli(capsys, "compare", tmp_path / "x.onnx", tmp_path / "y.pb")
    assert code == 2 and "must be a TensorFlow graph" in err


def test_against_a_tflite_export(article, tmp_path, capsys):
    path = tmp_path / "a.pb"
    path.write_bytes(article.graph_def.SerializeToString())
    assert main([str(path), "--bn-fold", "-o", str(tmp_path / "lean.pb"), "--tflite",
                 str(tmp_path / "lean.tflite")]) == 0
    code, out, err = run_cli(capsys, "compare", path, tmp_path / "lean.tflite")
    assert code == 0, err
    assert "the outputs" in out and "same numbers" in out
