"""Recurrent models in every published form (issue 15), through the CLI with --onnx: tf_keras
LSTM/GRU (dropout, recurrent dropout) as .h5, SavedModel and a .pb TF2 froze with lowering, a TF1
dynamic_rnn graph — ONNX that onnxruntime runs at two sequence lengths, matching TensorFlow's
original, with no dropout left in any loop body. On the lowered .pb tf2onnx's own command gets
no runnable model (we do better); a loop no converter takes is refused in one line, as tf2onnx
fails on it too. Also: an input that only fed a dead branch, the frozen form in the report,
pruning booked to prune, and `bench` on an LSTM."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tfsurgery import api
from tfsurgery.verify import check as verify
from tfsurgery.cli import main
from tfsurgery.models import recurrent
from tfsurgery.ops import tensor_name

RANDOM_OPS = ("RandomUniform", "RandomStandardNormal", "StatelessRandomUniformV2",
              "StatelessRandomUniform", "RandomUniformLike", "RandomNormalLike")
LENGTHS = (3, 7)


@pytest.fixture(scope="module")
def tf_keras_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tf_keras_recurrent")
    return {kind: recurrent.write_tf_keras_recurrent(kind, folder, seed=i)
            for i, kind in enumerate(recurrent.KINDS)}


@pytest.fixture(scope="module")
def tf1_rnn_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tf1_rnn")
    paths = {}
    for i, kind in enumerate(recurrent.KINDS):
        paths[kind] = folder / f"tf1_{kind}.pb"
        paths[kind].write_bytes(recurrent.tf1_dynamic_rnn(kind, seed=i).graph_def
                                .SerializeToString())
    return paths


def optimize_with_onnx(path, tmp_path, capsys, *extra):
    report = tmp_path / "r.json"
    code = main([str(path), "-o", str(tmp_path / "m.pb"), "--onnx", str(tmp_path / "m.onnx"),
                 "--report-json", str(report), *extra])
    captured = capsys.readouterr()
    data = json.loads(report.read_text()) if report.exists() else {}
    return code, data, captured


def onnx_nodes(graph):
    """Every ONNX node, Loop/Scan/If bodies included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from onnx_nodes(sub)


def random_ops_left(pb_path, onnx_path):
    """Random ops anywhere: top level, TF function bodies, ONNX Loop/Scan/If bodies."""
    import onnx
    import tensorflow as tf
    graph_def = tf.compat.v1.GraphDef.FromString(pb_path.read_bytes())
    tf_ops = [n.op for n in graph_def.node] + [
        n.op for f in graph_def.library.function for n in f.node_def]
    onnx_ops = [n.op_type for n in onnx_nodes(onnx.load(str(onnx_path)).graph)]
    return [op for op in tf_ops + onnx_ops if op in RANDOM_OPS]


def onnx_error_at_lengths(onnx_path, original_def, input_name, output, settings=None):
    """max |onnxruntime - TF original| / max |TF original| over two sequence lengths."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [tensor_name(input_name)]
    rng = np.random.default_rng(11)
    errors = []
    for length in LENGTHS:
        x = rng.standard_normal((2, length, 2)).astype(np.float32)
        expected, = verify.run_graph(original_def, {input_name: x, **(settings or {})},
                                     [output])
        actual, = session.run(None, {tensor_name(input_name): x})
        assert actual.shape == expected.shape
        errors.append(np.abs(actual - expected).max() / np.abs(expected).max())
    return max(errors)


@pytest.mark.parametrize("kind", recurrent.KINDS)
@pytest.mark.parametrize("form", ["h5", "saved_model", "lowered"])
def test_tf_keras_recurrent_exports_to_onnx_matching_at_two_lengths(tf_keras_files, kind, form,
                                                                    tmp_path, capsys):
    path = tf_keras_files[kind][form]
    code, data, captured = optimize_with_onnx(path, tmp_path, capsys, "--bn-fold")
    assert code == 0, captured.err
    assert data["verification"]["passed"] and data["onnx"]["passed"]
    assert any("@" in o["name"] for o in data["verification"]["outputs"])    # a second length
    assert any("@" in o["name"] for o in data["onnx"]["outputs"])            # in ONNX's check too
    if form == "lowered":        # Enter/Exit around TensorLists, converted as TensorArrays
        assert "as given" in data["frozen_form"] and "v1 control flow" in data["frozen_form"]
    else:
        assert "without lowering" in data["frozen_form"] and "While" in data["frozen_form"]
        assert "frozen form: frozen without lowering" in captured.out
    assert random_ops_left(tmp_path / "m.pb", tmp_path / "m.onnx") == []
    original = api.load(path).graph_def          # the interface keeps the original's names
    assert onnx_error_at_lengths(tmp_path / "m.onnx", original, data["inputs"][0],
                                 data["outputs"][0]) < 1e-4


def tf2onnx_command_gets_no_runnable_model(pb_path, inputs, outputs, tmp_path) -> str:
    """Run ``python -m tf2onnx.convert`` on the original; why it yields nothing runnable."""
    import onnx
    import onnxruntime as ort
    out = tmp_path / "tf2onnx.onnx"
    done = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--input", str(pb_path),
                           "--inputs", inputs, "--outputs", outputs, "--opset", "18",
                           "--output", str(out)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not out.exists():
        return "tf2onnx failed"
    left = sorted({n.op_type for n in onnx_nodes(onnx.load(str(out)).graph)
                   if not onnx.defs.has(n.op_type, n.domain)})
    with pytest.raises(Exception):
        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return f"tf2onnx left {', '.join(left)}; onnxruntime cannot load it"


def test_tf2onnx_alone_gets_no_runnable_model_from_the_lowered_lstm(tf_keras_files, tmp_path):
    """What the lowered test above converts, tf2onnx's own command does not (exit 0, but TF ops
    left in a model onnxruntime refuses): --onnx is better than tf2onnx alone here."""
    why = tf2onnx_command_gets_no_runnable_model(tf_keras_files["LSTM"]["lowered"], "x:0",
                                                 "Identity:0", tmp_path)
    assert "TensorListReserve" in why or why == "tf2onnx failed"


def test_lowered_loop_writing_one_index_per_step_converts(tmp_path):
    """The TensorArray form of a list written at the step index (not one overwritten slot):
    same numbers in TensorFlow, and through tf2onnx into a Loop onnxruntime runs."""
    from tfsurgery.export import onnx as onnx_export
    from tfsurgery.export.tensor_list_loops import as_tensor_arrays
    built = recurrent.lowered_array_loop(seed=4)
    arrays = as_tensor_arrays(built.graph_def)
    assert {n.op for n in arrays.node if n.op.startswith("TensorList")} == set()
    assert "TensorArrayWriteV3" in {n.op for n in arrays.node}
    exported = onnx_export.export(built.graph_def, built.inputs, built.outputs,
                                  tmp_path / "m.onnx", more_feeds={"@7": {
                                      "x": np.ones((2, 7, 2), np.float32)}})
    assert exported.passed and [o.name for o in exported.outputs][1].endswith("@7")
    for length in LENGTHS:
        x = np.random.default_rng(length).standard_normal((2, length, 2)).astype(np.float32)
        expected, = verify.run_graph(built.graph_def, {"x": x}, built.outputs)
        actual, = verify.run_graph(arrays, {"x": x}, built.outputs)
        assert expected.shape == (length, 2, 2)
        np.testing.assert_array_equal(actual, expected)


@pytest.fixture(scope="module")
def list_length_loop(tmp_path_factory):
    built = recurrent.lowered_array_loop(ask_length=True)
    path = tmp_path_factory.mktemp("list_length") / "loop.pb"
    path.write_bytes(built.graph_def.SerializeToString())
    return path, built


def test_loop_no_converter_takes_is_refused_in_one_line_as_by_tf2onnx(list_length_loop,
                                                                      tmp_path, capsys):
    from tfsurgery.export.tensor_list_loops import as_tensor_arrays
    path, built = list_length_loop
    assert as_tensor_arrays(built.graph_def) is built.graph_def     # no twin: left as it was
    code, data, captured = optimize_with_onnx(path, tmp_path, capsys)
    assert code == 1
    assert captured.err.count("\n") == 1
    assert "TensorListLength (node 'while/" in captured.err          # the op and a body node
    assert "nothing written" in captured.err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "m.pb").exists()
    assert data["verification"]["passed"] is True and data["onnx"]["passed"] is False
    why = tf2onnx_command_gets_no_runnable_model(path, "x:0", f"{built.outputs[0]}:0", tmp_path)
    assert "TensorListLength" in why or why == "tf2onnx failed"


@pytest.mark.parametrize("kind", recurrent.KINDS)
def test_tf1_dynamic_rnn_exports_without_dropout_in_its_loop(tf1_rnn_files, kind, tmp_path,
                                                            capsys):
    code, data, captured = optimize_with_onnx(tf1_rnn_files[kind], tmp_path, capsys)
    assert code == 0, captured.err
    assert data["verification"]["passed"] and data["onnx"]["passed"]
    assert any("@" in o["name"] for o in data["verification"]["outputs"])
    assert any("@" in o["name"] for o in data["onnx"]["outputs"])
    remove_dropout = next(t for t in data["transforms"] if t["name"] == "remove-dropout")
    assert any("rnn/while/" in name for name in remove_dropout["rewritten"])   # in the loop
    assert random_ops_left(tmp_path / "m.pb", tmp_path / "m.onnx") == []
    original = api.load(tf1_rnn_files[kind]).graph_def
    assert onnx_error_at_lengths(tmp_path / "m.onnx", original, "input", "output",
                                 {"is_train": False, "dropout": 0.4}) < 1e-4
    assert "v1 control flow" in data["frozen_form"] and "as given" in data["frozen_form"]


def test_input_that_only_feeds_a_dead_branch_no_longer_matters(tf1_rnn_files, tmp_path, capsys):
    """The `dropout` rate (unknown rank) feeds only the is_train side: verification feeds the
    original a stand-in, and the input leaves the optimized interface (README: dropped)."""
    import tensorflow as tf
    code, data, captured = optimize_with_onnx(tf1_rnn_files["LSTM"], tmp_path, capsys)
    assert code == 0, captured.err
    assert "unknown rank" not in captured.err
    assert data["inputs"] == ["input"] and data["unused_inputs"] == ["dropout"]
    assert "input 'dropout' no longer matters" in captured.out
    assert "dropout" not in data["inference_values"]
    optimized = tf.compat.v1.GraphDef.FromString((tmp_path / "m.pb").read_bytes())
    assert "dropout" not in {n.name for n in optimized.node}


def test_nodes_pruned_before_fold_batch_norm_are_booked_to_prune(tf1_rnn_files):
    """No batch norm here: fold-batch-norm removes nothing of its own; what its pre-prune
    removes (the dead dropout's random machinery) is pruning's."""
    source = api.load(tf1_rnn_files["GRU"])
    result = api.optimize(source, api.choose_transforms(bn_fold=True), verify=False)
    reports = {r.name: r for r in result.reports}
    fold, prune = reports["fold-batch-norm"], reports["prune"]
    assert fold.rewritten == [] and fold.removed_nodes == 0
    assert any("before fold-batch-norm ran" in note for note in prune.notes)
    total = len(source.graph_def.node) - len(result.graph_def.node)
    assert sum(r.removed_nodes for r in result.reports) == total - len(result.unused_inputs)


def test_bench_on_an_lstm_times_tensorflow_and_onnxruntime(tf_keras_files, tmp_path, capsys):
    report = tmp_path / "bench.json"
    code = main(["bench", str(tf_keras_files["LSTM"]["h5"]), "--runs", "3",
                 "--runtimes", "tensorflow,onnxruntime", "--report-json", str(report)])
    out = capsys.readouterr().out
    assert code == 0
    timings = json.loads(report.read_text())["timings"]
    assert {(t["runtime"], t["variant"]) for t in timings} == {
        (runtime, variant) for runtime in ("tensorflow", "onnxruntime")
        for variant in ("original", "optimized")}
    assert all(t["median_ms"] > 0 for t in timings)
    assert "each runtime in its own process" in out


def test_tf1_tensor_array_concat_is_refused_naming_the_op(tmp_path, capsys):
    """tf2onnx dies on TensorArrayConcatV3 with a message naming no op; the one-line error
    names it, and tf2onnx's own command fails on the original too."""
    built = recurrent.tf1_array_concat_loop()
    path = tmp_path / "concat.pb"
    path.write_bytes(built.graph_def.SerializeToString())
    code, data, captured = optimize_with_onnx(path, tmp_path, capsys)
    assert code == 1 and captured.err.count("\n") == 1
    assert "TensorArrayConcatV3 (node '" in captured.err and "nothing written" in captured.err
    assert data["verification"]["passed"] is True and not (tmp_path / "m.onnx").exists()
    assert tf2onnx_command_gets_no_runnable_model(path, "input:0", "output:0", tmp_path) in (
        "tf2onnx failed", "tf2onnx left TensorArrayConcatV3; onnxruntime cannot load it")
