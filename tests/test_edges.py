"""Edges of the sequence (issue 15) and real-world-pattern (issue 9) work, each with randomised
weights and numbers compared:
- a lowered one-slot TensorList loop run zero times (sequence length 0) gives TensorFlow's value;
- a Keras 3 LSTM/GRU with dropout frozen with lowering: converts when repaired as tf2onnx's
  loader repairs it, is refused in one line when not (tf2onnx's command fails on it too);
- `bench` on a TF1 graph whose dead-branch-only input left the optimized interface;
- batch norm after concat → BatchToSpaceND, or after a concat nested in a concat, folds into the
  convs (left alone, with the reason, when the inner concat is read elsewhere);
- `Dequantize` of uint8 weights is folded only when that saves bytes."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches, ops, optimize, report_of
from test_recurrent_forms import (onnx_error_at_lengths, optimize_with_onnx, random_ops_left,
                                  tf2onnx_command_gets_no_runnable_model)
from tfsurgery.export import onnx as onnx_export
from tfsurgery.verify import check as verify
from tfsurgery.cli import main
from tfsurgery.models import recurrent
from tfsurgery.models.common import BuiltModel
from tfsurgery.models.tf1 import v1_graph

R = np.random.default_rng(23)


def const(shape, low=-1.0, high=1.0):
    return tf.constant(R.uniform(low, high, shape).astype(np.float32))


# ---------------------------------------------------------------- issue 15
@pytest.fixture(scope="module")
def fixed_batch_lstm():
    built, _ = recurrent.keras3_lowered("LSTM", seed=8, batch=2, dropout=0.0)
    return built


def sequences(length):
    return {"x": R.standard_normal((2, length, 2)).astype(np.float32)}


def test_zero_step_loop_gives_tensorflows_zeros_in_onnx(fixed_batch_lstm, tmp_path):
    """A Keras layer without return_sequences keeps its last output in a one-slot list; run
    zero times, TensorFlow stacks the unset slot as zeros (fixed batch: the element shape is
    known), so the output is the head's bias. The TensorArray form and ONNX give the same."""
    built = fixed_batch_lstm
    exported = onnx_export.export(built.graph_def, built.inputs, built.outputs,
                                  tmp_path / "m.onnx", feeds=sequences(3),
                                  more_feeds={"@0": sequences(0), "@5": sequences(5)})
    assert exported.passed, exported.outputs
    assert {o.name.split("@")[-1] for o in exported.outputs} >= {"0", "5"}
    zero_steps, = verify.run_graph(built.graph_def, sequences(0), built.outputs)
    assert np.ptp(zero_steps, axis=0).max() == 0 and np.abs(zero_steps).max() > 0   # the bias
    import onnxruntime as ort
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x:0": sequences(0)["x"]})[0], zero_steps,
                               rtol=1e-6)


def test_zero_step_loop_with_free_batch_is_refused_by_tensorflow_and_onnxruntime(tmp_path):
    """With a free batch size TensorFlow cannot stack the unset slot ([?, units]) and refuses
    length 0; the ONNX model refuses it too — it never invents a value."""
    import onnxruntime as ort
    built, _ = recurrent.keras3_lowered("GRU", seed=9, dropout=0.0)
    exported = onnx_export.export(built.graph_def, built.inputs, built.outputs,
                                  tmp_path / "m.onnx", feeds=sequences(3),
                                  more_feeds={"@6": sequences(6)})
    assert exported.passed
    with pytest.raises(verify.VerificationError, match="non-fully-defined element_shape"):
        verify.run_graph(built.graph_def, sequences(0), built.outputs)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception):
        session.run(None, {"x:0": sequences(0)["x"]})


@pytest.fixture(scope="module")
def keras3_dropout_pbs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keras3_lowered")
    paths = {}
    for i, kind in enumerate(recurrent.KINDS):
        for repaired in (True, False):
            built, function = recurrent.keras3_lowered(kind, seed=i, repaired=repaired)
            paths[kind, repaired] = folder / f"{kind}_{'repaired' if repaired else 'raw'}.pb"
            paths[kind, repaired].write_bytes(built.graph_def.SerializeToString())
    return paths, function


def test_tfs_own_freezer_refuses_a_keras3_lstm_with_dropout(keras3_dropout_pbs):
    from tensorflow.python.framework.convert_to_constants import \
        convert_variables_to_constants_v2
    with pytest.raises(ValueError, match="incompatible with expected resource"):
        convert_variables_to_constants_v2(keras3_dropout_pbs[1])


@pytest.mark.parametrize("kind", recurrent.KINDS)
def test_keras3_dropout_lowered_and_repaired_converts_at_two_lengths(keras3_dropout_pbs, kind,
                                                                     tmp_path, capsys):
    path = keras3_dropout_pbs[0][kind, True]
    code, data, captured = optimize_with_onnx(path, tmp_path, capsys, "--outputs", "Identity")
    assert code == 0, captured.err
    assert data["verification"]["passed"] and data["onnx"]["passed"]
    assert any("@" in o["name"] for o in data["verification"]["outputs"])
    assert any("@" in o["name"] for o in data["onnx"]["outputs"])
    assert "v1 control flow" in data["frozen_form"]
    original = tf.compat.v1.GraphDef.FromString(path.read_bytes())
    assert {"StatelessRandomUniformV2"} & {n.op for n in original.node}    # dropout was there
    assert random_ops_left(tmp_path / "m.pb", tmp_path / "m.onnx") == []
    assert onnx_error_at_lengths(tmp_path / "m.onnx", original, "x", "Identity") < 1e-4


def test_keras3_dropout_lowered_unrepaired_is_refused_in_one_line_as_by_tf2onnx(
        keras3_dropout_pbs, tmp_path, capsys):
    path = keras3_dropout_pbs[0]["LSTM", False]
    code, _, captured = optimize_with_onnx(path, tmp_path, capsys, "--outputs", "Identity")
    assert code == 2 and captured.err.count("\n") == 1
    assert "AssignVariableOp" in captured.err and "fix_freezing_errors" in captured.err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "m.pb").exists()
    assert tf2onnx_command_gets_no_runnable_model(path, "x:0", "Identity:0", tmp_path) == \
        "tf2onnx failed"


def test_bench_feeds_the_original_a_stand_in_for_a_dropped_input(tmp_path, capsys):
    """The `dropout` rate only fed the is_train side: the optimized graph has no such input, the
    original is fed a stand-in; tf2onnx cannot convert the original (its training cond), so
    onnxruntime times the optimized graph and says why not the original."""
    import json
    path = tmp_path / "rnn.pb"
    path.write_bytes(recurrent.tf1_dynamic_rnn("GRU", seed=3).graph_def.SerializeToString())
    report = tmp_path / "bench.json"
    code = main(["bench", str(path), "--runs", "2", "--runtimes", "tensorflow,onnxruntime",
                 "--report-json", str(report)])
    out = capsys.readouterr().out
    assert code == 0
    assert "dropout=" in out                           # the stand-in the original was fed
    timings = {(t["runtime"], t["variant"]): t for t in json.loads(report.read_text())["timings"]}
    for key in [("tensorflow", "original"), ("tensorflow", "optimized"),
                ("onnxruntime", "optimized")]:
        assert timings[key]["median_ms"] > 0 and not timings[key]["skipped"]
    skipped = timings["onnxruntime", "original"]
    assert skipped["median_ms"] is None and "Merge" in skipped["skipped"]
    assert "not convertible" in out and "original graph not timed" in out


# ---------------------------------------------------------------- issue 9
def concat_graph(case):
    """Three convs, concatenated in two levels (``nested``; ``nested_read_twice``: the inner
    concat is an output too) or two convs, concatenated, then a BatchToSpaceND with crops
    (``batch_to_space``), then a FusedBatchNormV3 → ``output``."""
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [4, 6, 6, 2], name="input")
        a = tf.nn.conv2d(x, const([2, 2, 2, 3]), [1, 1, 1, 1], "SAME")
        b = tf.nn.bias_add(tf.nn.conv2d(x, const([1, 1, 2, 2]), [1, 1, 1, 1], "SAME"),
                           const([2]))
        if case.startswith("nested"):
            c = tf.nn.conv2d(x, const([3, 3, 2, 4]), [1, 1, 1, 1], "SAME")
            y = tf.concat([tf.concat([a, b], 3, name="inner"), c], 3, name="concat")
        else:
            y = tf.raw_ops.BatchToSpaceND(input=tf.concat([a, b], 3, name="concat"),
                                          block_shape=[2, 2], crops=[[0, 1], [1, 0]])
        channels = y.shape[3]
        y = tf.raw_ops.FusedBatchNormV3(
            x=y, scale=const([channels], 0.5, 1.5), offset=const([channels]),
            mean=const([channels]), variance=const([channels], 0.5, 2.0), epsilon=1e-3,
            is_training=False)[0]
        tf.nn.relu(y, name="output")
    outputs = ["output", "inner"] if case == "nested_read_twice" else ["output"]
    return BuiltModel(graph.as_graph_def(), ["input"], outputs)


@pytest.mark.parametrize("case,convs,kept", [
    # BatchToSpaceND moves whole pixels: the per-channel map commutes with it and is split by
    # the concat into both convs; the BatchToSpaceND takes the batch norm's name
    ("batch_to_space", 2, ("BatchToSpaceND", 1)),
    # concat(concat(a, b), c) along the channels is concat(a, b, c): each conv takes its slice;
    # then remove-noop-shape-ops splices the inner concat in: one concat, under the batch
    # norm's name
    ("nested", 3, ("ConcatV2", 1))])
def test_batch_norm_after_concat_folds_into_every_conv(case, convs, kept):
    result = optimize(concat_graph(case))
    left = ops(result.graph_def)
    assert "FusedBatchNormV3" not in left and "Mul" not in left
    assert left.count("BiasAdd") == convs and left.count(kept[0]) == kept[1]
    assert any("split by concat" in line
               for line in report_of(result, "fold-batch-norm").rewritten)
    assert_matches(result, 1e-4)


def test_batch_norm_after_nested_concat_read_elsewhere_stays_with_the_reason():
    """The inner concat is an output too: its values must stay unnormalized, no fold."""
    result = optimize(concat_graph("nested_read_twice"))
    report = report_of(result, "fold-batch-norm")
    assert [r for n, r in report.skipped
            if n == "concat" and "inner is itself a concat" in r], report.skipped
    assert not [line for line in report.rewritten if "split by" in line]
    assert "Mul" in ops(result.graph_def)             # the BN as Mul + BiasAdd after the concat
    assert_matches(result, 1e-4)


@pytest.mark.parametrize("shape, folds", [((64, 32), False), ((2, 1), True)])
def test_dequantize_of_uint8_weights_folds_only_when_it_saves_bytes(shape, folds):
    """uint8 weights → Dequantize → MatMul: float32 takes 4x the bytes, so a real weight keeps its
    Dequantize (what a deployment reads); a tiny one, smaller than the op, folds."""
    values = R.integers(0, 256, shape).astype(np.uint8)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [3, shape[0]], name="input")
        weights = tf.constant(tf.make_tensor_proto(values, dtype=tf.quint8), tf.quint8)
        w = tf.raw_ops.Dequantize(input=weights, min_range=tf.constant(-0.7),
                                  max_range=tf.constant(0.9), name="dequantize")
        tf.identity(tf.matmul(x, w), name="output")
    result = optimize(BuiltModel(graph.as_graph_def(), ["input"], ["output"]), bn_fold=False)
    report = report_of(result, "fold-constants")
    assert ("Dequantize" not in ops(result.graph_def)) == folds
    assert ("dequantize" in report.rewritten) == folds
    if not folds:
        assert [r for n, r in report.skipped if n == "dequantize" and "grow" in r]
        assert result.graph_def.ByteSize() < values.nbytes * 4
    assert_matches(result, 1e-6)
