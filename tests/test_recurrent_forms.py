"""Recurrent models in every published form (issue 15), through the CLI with --onnx: tf_keras
LSTM/GRU (dropout, recurrent dropout) as .h5 and SavedModel, a TF1 dynamic_rnn graph — ONNX that
onnxruntime runs at two sequence lengths, matching TensorFlow's original, with no dropout left
in any loop body. The TF2-lowered .pb is refused in one line; tf2onnx's own command gets no
runnable model from it either (never worse than tf2onnx). Also: an input that only fed a dead
branch, the frozen form in the report, pruning booked to prune, and `bench` on an LSTM."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tfsurgery import api, verify
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


def random_ops_left(pb_path, onnx_path):
    """Random ops anywhere: top level, TF function bodies, ONNX Loop/Scan/If bodies."""
    import onnx
    import tensorflow as tf
    graph_def = tf.compat.v1.GraphDef.FromString(pb_path.read_bytes())
    tf_ops = [n.op for n in graph_def.node] + [
        n.op for f in graph_def.library.function for n in f.node_def]

    def walk(graph):
        for node in graph.node:
            yield node.op_type
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from walk(sub)
    onnx_ops = list(walk(onnx.load(str(onnx_path)).graph))
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
@pytest.mark.parametrize("form", ["h5", "saved_model"])
def test_tf_keras_recurrent_exports_to_onnx_matching_at_two_lengths(tf_keras_files, kind, form,
                                                                    tmp_path, capsys):
    path = tf_keras_files[kind][form]
    code, data, captured = optimize_with_onnx(path, tmp_path, capsys, "--bn-fold")
    assert code == 0, captured.err
    assert data["verification"]["passed"] and data["onnx"]["passed"]
    assert any("@" in o["name"] for o in data["verification"]["outputs"])    # a second length
    assert any("@" in o["name"] for o in data["onnx"]["outputs"])            # in ONNX's check too
    assert "without lowering" in data["frozen_form"] and "While" in data["frozen_form"]
    assert "frozen form: frozen without lowering" in captured.out
    assert random_ops_left(tmp_path / "m.pb", tmp_path / "m.onnx") == []
    original = api.load(path)
    assert onnx_error_at_lengths(tmp_path / "m.onnx", original.graph_def, original.inputs[0],
                                 original.outputs[0]) < 1e-4


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
    left = sorted({n.op_type for n in onnx.load(str(out)).graph.node
                   if not onnx.defs.has(n.op_type, n.domain)})
    with pytest.raises(Exception):
        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return f"tf2onnx left {', '.join(left)}; onnxruntime cannot load it"


@pytest.mark.parametrize("kind", recurrent.KINDS)
def test_lowered_tf_keras_pb_is_refused_as_tf2onnx_itself_fails(tf_keras_files, kind, tmp_path,
                                                                capsys):
    path = tf_keras_files[kind]["lowered"]
    code, data, captured = optimize_with_onnx(path, tmp_path, capsys)
    assert code == 1
    assert captured.err.count("\n") == 1 and "TensorListReserve (node '" in captured.err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "m.pb").exists()
    assert data["verification"]["passed"] is True and data["onnx"]["passed"] is False
    assert "v1 control flow" in data["frozen_form"]
    why = tf2onnx_command_gets_no_runnable_model(path, "x:0", "Identity:0", tmp_path)
    assert "TensorListReserve" in why or why == "tf2onnx failed"


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
                 "--report-json", str(report)])
    out = capsys.readouterr().out
    assert code == 0
    timings = json.loads(report.read_text())["timings"]
    assert {(t["runtime"], t["variant"]) for t in timings} == {
        (runtime, variant) for runtime in ("tensorflow", "onnxruntime")
        for variant in ("original", "optimized")}
    assert all(t["median_ms"] > 0 for t in timings)
    assert "each runtime in its own process" in out
