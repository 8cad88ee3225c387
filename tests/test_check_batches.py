"""Verification on more than one batch: --check-n seeded batches, the user's own --samples
(every row checked), and top-1 agreement for class-score outputs. Each mutation is confirmed
by the tests' own oracle before the verifier is judged."""
import json

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.contract import TransformReport, transform

import oracle


def abs_graph():
    """y = |x| · w for a single scalar input: a fold that forgets the Abs is right for x ≥ 0."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [1, 1], name="input")
        tf.multiply(tf.abs(tf.identity(x)), 3.0, name="output")
    return graph.as_graph_def()


@transform("forget-abs")
def forget_abs(graph, options):
    report = TransformReport("forget-abs")
    for node in graph.nodes_with_ops({"Abs"}):
        graph.rewire(node.name, graph.inputs(node.name)[0])
        graph.remove([node.name])
        report.rewritten.append(node.name)
    return report


def first_value(seed):
    return np.random.default_rng(seed).standard_normal((1, 1))[0, 0]


def test_a_fold_wrong_only_for_negative_inputs_needs_more_batches():
    graph_def = abs_graph()
    seed = next(s for s in range(50) if first_value(s) > 0 and
                any(first_value(s + k) < 0 for k in range(1, 8)))
    source = api.Source(graph_def, "abs", inputs=["input"], outputs=["output"])
    one = api.optimize(source, [forget_abs], seed=seed, check_n=1)      # misses it
    assert one.verification.passed and one.verification.batches == 1
    with pytest.raises(api.VerificationFailed) as failed:
        api.optimize(source, [forget_abs], seed=seed, check_n=8)
    assert failed.value.verification.batches == 8
    assert "seed" in failed.value.verification.worst_batch
    assert "(on batch" in str(failed.value)
    negative = np.full((1, 1), -1.5, np.float32)
    before = oracle.run(graph_def, {"input": negative}, ["output"])[0]
    after = oracle.run(failed.value.result.graph_def, {"input": negative}, ["output"])[0]
    assert oracle.relative_error(before, after) > 1                 # the oracle agrees


def test_samples_are_each_checked_and_catch_it(tmp_path, capsys):
    graph_def = abs_graph()
    path = tmp_path / "abs.pb"
    path.write_bytes(graph_def.SerializeToString())
    rows = np.linspace(-2, 2, 12, dtype=np.float32).reshape(12, 1, 1)     # whole [1, 1] feeds
    np.savez(tmp_path / "samples.npz", input=rows)
    source = api.Source(graph_def, "abs", inputs=["input"], outputs=["output"])
    with pytest.raises(api.VerificationFailed) as failed:
        api.optimize(source, [forget_abs], samples=tmp_path / "samples.npz")
    assert failed.value.verification.batches == 12
    assert "sample row" in failed.value.verification.worst_batch
    passed = api.optimize(source, samples=tmp_path / "samples.npz")        # ours is right
    assert passed.verification.batches == 12
    np.testing.assert_array_equal(passed.verification.feeds["input"], rows[0])
    code = main([str(path), "-o", str(tmp_path / "lean.pb"), "--samples",
                 str(tmp_path / "samples.npz"), "--report-json", str(tmp_path / "r.json")])
    assert code == 0
    data = json.loads((tmp_path / "r.json").read_text())["verification"]
    assert data["batches"] == 12 and data["passed"] is True


def test_single_samples_share_a_run_where_the_batch_is_free(tmp_path):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="input")
        tf.identity(tf.nn.relu(tf.identity(x)) * 2.0, name="output")
    np.savez(tmp_path / "s.npz", input=np.random.default_rng(1).standard_normal((70, 4)))
    result = api.optimize(api.Source(graph.as_graph_def(), "t", inputs=["input"],
                                     outputs=["output"]), samples=tmp_path / "s.npz")
    assert result.verification.batches == 3                       # 32 + 32 + 6 rows
    assert result.verification.feeds["input"].shape == (32, 4)


@pytest.mark.parametrize("arrays, message", [
    ({"imgs": np.zeros((2, 1, 1))}, "'imgs' is not an input"),
    ({"input": np.zeros((2, 3, 3))}, "a row is shaped [3, 3], the input [1, 1]"),
    ({"input": np.full((2, 1, 1), np.nan)}, "NaN"),
])
def test_malformed_samples_are_one_line(tmp_path, capsys, arrays, message):
    path = tmp_path / "abs.pb"
    path.write_bytes(abs_graph().SerializeToString())
    np.savez(tmp_path / "bad.npz", **arrays)
    code = main([str(path), "-o", str(tmp_path / "x.pb"), "--samples", str(tmp_path / "bad.npz")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "bad.npz" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.pb").exists()


def logits_graph():
    """3-class logits x @ W (W the identity), fed rows of very different magnitudes."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="input")
        tf.identity(tf.matmul(x, tf.eye(3)), name="logits")
    return graph.as_graph_def()


@transform("nudge-class-0")
def nudge_class_0(graph, options):
    """Adds 0.03 to class 0's logit: 3e-5 of the largest score below, but it flips a row."""
    report = TransformReport("nudge-class-0")
    matmul = graph.nodes_with_ops({"MatMul"})[0].name
    bias = graph.add_const("nudge", np.array([0.03, 0.0, 0.0], np.float32))
    added = graph.new_node("AddV2", "nudged", [matmul, bias], {"T": tf.float32})
    graph.rewire(matmul, added.name, keep={added.name})
    report.rewritten.append(matmul)
    return report


def test_a_top1_flip_in_a_small_row_is_caught_although_the_error_is_tiny():
    rows = np.array([[1000.0, 0.0, 0.0], [1.0, 1.02, 0.0]], np.float32)
    source = api.Source(logits_graph(), "logits", inputs=["input"], outputs=["logits"])
    with pytest.raises(api.VerificationFailed) as failed:
        api.optimize(source, [nudge_class_0], feeds={"input": rows})
    v = failed.value.verification
    assert v.max_error < v.allowed                          # relative error alone: a pass
    assert v.agreement["logits"] == {"rows": 2, "agree": 1, "flips": 1}
    assert "top-1 class changed on 1 of 2 rows of 'logits'" in str(failed.value)
    before = oracle.run(logits_graph(), {"input": rows}, ["logits"])[0]
    after = oracle.run(failed.value.result.graph_def, {"input": rows}, ["logits"])[0]
    assert np.argmax(before[1]) != np.argmax(after[1])      # the oracle sees the flip
    fine = api.optimize(source, feeds={"input": rows})
    assert fine.verification.agreement["logits"] == {"rows": 2, "agree": 2, "flips": 0}
