"""Issue 48: every candidate a fusion left alone is said, with its reason, grouped by fusion and
reason ("attention ×1 not fused: ..."), in the default ``--onnx-fusions auto`` too; and a fused
op is spliced only at an opset that defines it. Each written model is run in onnxruntime
against a plain TensorFlow session (tests/oracle.py). The timing of ``auto`` is replaced (no
test may depend on the CPU or on time)."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf

from tests import oracle
from tests.test_fusion_choice import fake_timer
from tests.test_transformer_fusion import assert_matches_tf, ops_of, optimized, token_feeds
from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.export import fusion_choice, onnx as onnx_export, onnx_splice
from tfsurgery.models import transformers
from tfsurgery.models.common import BuiltModel


@pytest.fixture(scope="module")
def head_model():
    """LayerNorm → Dense(GELU) → Dense(tanh) → Dense → Softmax: one LayerNorm and one GELU
    to fuse, a tanh that is no GELU and a classifier's Softmax that is no attention."""
    keras = tf.keras
    x = keras.Input((8, 16), name="x")
    y = keras.layers.LayerNormalization()(x)
    y = keras.layers.Dense(32, activation="gelu")(y)
    y = keras.layers.Dense(16, activation="tanh")(y)
    y = keras.layers.Softmax()(keras.layers.Dense(4)(y))
    model = keras.Model(x, y)
    r = np.random.default_rng(0)
    for v in model.weights:
        v.assign(r.normal(0, 0.3, v.shape).astype("float32"))
    built = transformers.freeze(model)
    graph_def = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs), checks=api.Checks(verify=False)).graph_def
    return BuiltModel(graph_def, built.inputs, built.outputs, None)


def x_feeds(seed=0):
    return {"x": np.random.default_rng(seed).normal(0, 1, (2, 8, 16)).astype(np.float32)}


def run_onnx(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {f"{k}:0": v for k, v in feeds.items()})


def test_the_default_mode_says_every_candidate_left_alone(head_model, tmp_path, monkeypatch,
                                                         capsys):
    """``tfsurgery export`` with no --onnx-fusions: the LayerNorm and GELU fuse, and the tanh and
    the classifier's Softmax are printed grouped with their reasons (and in --report-json)."""
    timer, asked = fake_timer("fuse-gelu", 1.0)
    monkeypatch.setattr(fusion_choice, "time_variants", timer)
    pb, out, report = tmp_path / "m.pb", tmp_path / "m.onnx", tmp_path / "r.json"
    pb.write_bytes(head_model.graph_def.SerializeToString())
    assert main(["export", str(pb), "-o", str(out), "--report-json", str(report)]) == 0
    assert asked, "the default mode is auto: it timed variants"
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if "not fused:" in line]
    assert any("attention ×1 not fused: " in line for line in lines), text
    assert any("GELU ×1 not fused: " in line for line in lines), text
    ops = ops_of(out)
    assert "LayerNormalization" in ops and ops.get("Gelu", 0) + ops.get("BiasGelu", 0) == 1
    assert "Softmax" in ops and "Tanh" in ops
    groups = json.loads(report.read_text())["onnx"]["not_fused_groups"]
    kinds = {(g["kind"], g["count"]) for g in groups}
    assert {("attention", 1), ("GELU", 1)} <= kinds, groups
    assert all(g["why"] and len(g["nodes"]) == g["count"] for g in groups)
    feeds = x_feeds()
    expected = oracle.run(head_model.graph_def, feeds, head_model.outputs)
    assert oracle.relative_error(expected[0], run_onnx(out, feeds)[0]) <= 1e-4


def test_all_says_them_too(head_model, tmp_path):
    feeds = x_feeds(1)
    result = onnx_export.export(head_model.graph_def, head_model.inputs, head_model.outputs,
                                tmp_path / "all.onnx", feeds=feeds, fuse=True)
    assert result.passed and result.fusion_choice is None
    assert any(line.startswith("onnx fusions: attention ×1 not fused: ")
               for line in result.fusion_lines), result.fusion_lines
    expected = oracle.run(head_model.graph_def, feeds, head_model.outputs)
    assert oracle.relative_error(expected[0], run_onnx(tmp_path / "all.onnx", feeds)[0]) <= 1e-4


def test_layer_normalization_below_opset_17_is_left_alone_and_said(head_model, tmp_path):
    """ONNX defines LayerNormalization from opset 17: at --opset 13 the LayerNorm stays in
    standard ops (the report says why), the GELU (com.microsoft) still fuses, and the model
    passes onnx.checker and matches TensorFlow."""
    feeds = x_feeds(2)
    path = tmp_path / "13.onnx"
    result = onnx_export.export(head_model.graph_def, head_model.inputs, head_model.outputs,
                                path, feeds=feeds, fuse=True, opset=13)
    assert result.passed
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {13}
    ops = ops_of(path)
    assert "LayerNormalization" not in ops and "SkipLayerNormalization" not in ops
    assert ops.get("Gelu", 0) + ops.get("BiasGelu", 0) == 1
    assert any("LayerNorm ×1 not fused: " in line and "opset 17" in line and "13" in line
               for line in result.fusion_lines), result.fusion_lines
    expected = oracle.run(head_model.graph_def, feeds, head_model.outputs)
    assert oracle.relative_error(expected[0], run_onnx(path, feeds)[0]) <= 1e-4


def test_every_op_the_splice_emits_is_checked_against_its_domain_and_opset():
    from onnx import helper
    model = onnx.ModelProto()
    model.opset_import.append(helper.make_opsetid("", 12))
    at = {"": 12, onnx_splice.MICROSOFT: 1}
    squeeze = helper.make_node("Squeeze", ["m", "axes"], ["s"])        # axes an input from 13
    assert "Squeeze" in onnx_splice.undefined(squeeze, at)
    assert onnx_splice.undefined(helper.make_node("Squeeze", ["m"], ["s"], axes=[1]), at) is None
    norm = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"])
    assert "opset 17" in onnx_splice.undefined(norm, at)
    assert onnx_splice.undefined(norm, {"": 17}) is None
    for op in ("Attention", "FastGelu", "Gelu", "BiasGelu", "EmbedLayerNormalization",
               "SkipLayerNormalization"):
        assert onnx_splice.undefined(helper.make_node(op, ["x"], ["y"],
                                                      domain=onnx_splice.MICROSOFT), at) is None
    made_up = helper.make_node("NoSuchFusion", ["x"], ["y"], domain=onnx_splice.MICROSOFT)
    assert "onnxruntime" in onnx_splice.undefined(made_up, at)
