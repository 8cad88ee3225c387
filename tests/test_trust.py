"""Graphs the world built: inputs users can describe, checks with deadlines, verification that
never passes without comparing real numbers. One small reproduction per real-graph failure."""
import json

import numpy as np
import pytest

from conftest import ops, report_of
from tfsurgery import api
from tfsurgery.verify import check as verify
from tfsurgery.cli import main
import realworld
from tfsurgery.ops import first_line


def write(built, tmp_path, name):
    path = tmp_path / f"{name}.pb"
    path.write_bytes(built.graph_def.SerializeToString())
    return path


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


@pytest.fixture(scope="module")
def graphs():
    return {name: getattr(realworld, name)() for name in (
        "keep_prob_dropout", "assert_guarded_scale", "queue_fed", "endless_loop", "nan_outputs",
        "bottleneck_default", "deep_pooling", "noisy_inference")}


def test_keep_prob_of_unknown_rank_is_a_knob_set_to_keep_everything(graphs, tmp_path, capsys):
    path = write(graphs["keep_prob_dropout"], tmp_path, "dropout")
    out, report = tmp_path / "out.pb", tmp_path / "r.json"
    code, _, err = run_cli(capsys, path, "-o", out, "--report-json", report, "--onnx",
                           tmp_path / "out.onnx")
    assert code == 0, err
    data = json.loads(report.read_text())
    assert data["verification"]["passed"] is True and data["onnx"]["passed"] is True
    assert data["inference_values"] == {"keep_prob": 1.0}
    result = api.optimize(api.load(path), api.choose_transforms())
    assert not {"RandomUniform", "Floor"} & set(ops(result.graph_def))
    assert result.inputs == ["input"]          # the knob is no input any more
    # the reference is "dropout off" built from the original, not by the dropout transform:
    assert "expected or neutral" in result.verification.reference


def test_an_assert_guarded_scalar_needs_a_feed(graphs, tmp_path, capsys):
    path = write(graphs["assert_guarded_scale"], tmp_path, "scale")
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "a.pb")
    assert code == 2 and "does not run" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a.pb").exists()
    for value in ("4", "2"):                 # both branches of the cond, each verified
        code, out, err = run_cli(capsys, path, "-o", tmp_path / f"b{value}.pb", "--feed",
                                 f"scale={value}", "--input-shape", "input=1,8,8,3")
        assert code == 0, err


def test_a_queue_fed_graph_names_its_dequeue_and_can_be_cut_there(graphs, tmp_path, capsys):
    path = write(graphs["queue_fed"], tmp_path, "queue")
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "a.pb", "--verify-timeout", "5")
    assert code == 2 and "'batch'" in err and "--inputs batch" in err
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "b.pb", "--inputs", "batch",
                           "--verify-timeout", "20")
    assert code == 0, err
    result = api.optimize(api.load(path), api.choose_transforms(), inputs=["batch"])
    batch = next(n for n in result.graph_def.node if n.name == "batch")
    # its batch is the dequeue's constant n (QueueDequeueManyV2(queue, n=4)), no --input-shape
    assert batch.op == "Placeholder" and [d.size for d in batch.attr["shape"].shape.dim] == [4, 6]
    assert not {"FIFOQueueV2", "QueueDequeueManyV2"} & set(ops(result.graph_def))


def test_a_loop_that_never_ends_fails_at_its_deadline(graphs, tmp_path, capsys):
    path = write(graphs["endless_loop"], tmp_path, "loop")
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "a.pb", "--verify-timeout", "2")
    assert code == 1 and "did not finish within 2 s" in err and "--feed" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "a.pb").exists()


def test_nan_outputs_are_compared_by_position_and_said(graphs, tmp_path, capsys):
    path = write(graphs["nan_outputs"], tmp_path, "nan")
    code, out, err = run_cli(capsys, path, "-o", tmp_path / "a.pb", "--bn-fold")
    assert code == 0, err
    assert "NaN/Inf" in out and "match by position" in out
    result = api.optimize(api.load(path), api.choose_transforms())
    assert result.verification.nonfinite > 0


def test_outputs_that_are_all_nan_are_refused_not_passed(tmp_path, capsys):
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="input")
        tf.identity(tf.math.log(-tf.abs(x) - 1.0) * 2.0, name="output")
    path = tmp_path / "allnan.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "a.pb")
    assert code == 1 and "NaN" in err and "cannot compare" in err
    assert not (tmp_path / "a.pb").exists()


def test_nan_in_a_new_place_or_everywhere_never_passes():
    reference = np.array([1.0, np.nan, 3.0], np.float32)
    assert verify.output_error("o", reference, reference).max_rel == 0.0
    moved = np.array([np.nan, 2.0, 3.0], np.float32)
    assert verify.output_error("o", reference, moved).max_rel == float("inf")
    inf = np.array([1.0, np.inf, 3.0], np.float32)
    assert verify.output_error("o", reference, inf).max_rel == float("inf")
    assert not verify.Verification([], 1e-4).passed          # nothing compared: no pass


def test_the_noise_floor_excuses_only_a_deterministic_original_and_is_capped():
    check = verify.Verification([verify.OutputError("o", 1.0, 5e-4, (2,))], 1e-4,
                                noise_floor=2e-4, noise_floors={"o": (2e-4,)})
    assert check.passed                                   # 5e-4 <= 4 x 2e-4
    check.deterministic = False
    assert not check.passed
    check.deterministic, check.noise_floors = True, {"o": (1.0,)}   # a huge floor is capped
    assert check.allowed == verify.NOISE_CAP


def test_a_noise_floor_is_never_lent_to_another_output():
    main, aux = verify.OutputError("main", 1.0, 8e-4, (2,)), verify.OutputError("aux", 1.0, 0,
                                                                               (2,))
    check = verify.Verification([main, aux], 1e-4, noise_floor=3e-4,
                                noise_floors={"main": (1e-7,), "aux": (3e-4,)})
    assert not check.passed and "on 'main'" in check.failure()


def test_random_ops_left_on_the_path_get_the_same_seed(graphs, tmp_path, capsys):
    path = write(graphs["noisy_inference"], tmp_path, "noise")
    result = api.optimize(api.load(path), api.choose_transforms(bn_fold=True))
    assert "RandomStandardNormal" in ops(result.graph_def)
    assert result.verification.passed and result.verification.max_error < 1e-5


def test_a_tensor_default_placeholder_becomes_its_default(graphs, tmp_path, capsys):
    path = write(graphs["bottleneck_default"], tmp_path, "poets")
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "a.pb", "--bn-fold", "--onnx",
                           tmp_path / "a.onnx")
    assert code == 0, err
    result = api.optimize(api.load(path), api.choose_transforms())
    assert "PlaceholderWithDefault" not in ops(result.graph_def)
    assert report_of(result, "freeze-placeholder-defaults").rewritten == \
        ["BottleneckInputPlaceholder"]


def test_free_sizes_grow_until_five_poolings_leave_something(graphs, tmp_path, capsys):
    path = write(graphs["deep_pooling"], tmp_path, "pool")
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "a.pb", "--onnx", tmp_path / "a.onnx")
    assert code == 0, err
    result = api.optimize(api.load(path), api.choose_transforms())
    assert result.verification.feeds["input"].shape[1] >= 64     # 16 and 32 pool to nothing
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "b.pb", "--input-shape",
                           "input=1,96,80,3")
    assert code == 0, err


def test_unknown_rank_without_help_asks_for_a_shape(tmp_path, capsys):
    import tensorflow as tf
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, None, name="data")
        tf.identity(x * 2.0, name="output")
    path = tmp_path / "norank.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "a.pb")
    assert code == 2 and "--input-shape data=" in err
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "b.pb", "--input-shape", "data=2,3")
    assert code == 0, err


@pytest.mark.parametrize("argv, message", [
    (["--input-shape", "input"], "expected NAME=D0"),
    (["--input-shape", "input=1,x"], "integers"),
    (["--feed", "input=abc"], "not a number"),
    (["--input-shape", "nope=1,2"], "no node"),
    (["--verify-timeout", "0"], "positive"),
])
def test_bad_interface_options_are_one_line_exit_2(article_pb, tmp_path, capsys, argv, message):
    code, _, err = run_cli(capsys, article_pb, "-o", tmp_path / "x.pb", *argv)
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_the_json_report_has_real_booleans_and_numbers(article_pb, tmp_path, capsys):
    report = tmp_path / "r.json"
    code, _, _ = run_cli(capsys, article_pb, "-o", tmp_path / "x.pb", "--report-json", report,
                         "--onnx", tmp_path / "x.onnx")
    assert code == 0
    data = json.loads(report.read_text())
    schema = {"passed": bool, "max_error": float, "tolerance": float, "noise_floor": float,
              "allowed": float, "deterministic": bool, "nonfinite_outputs": int}
    for section in (data["verification"],):
        for key, kind in schema.items():
            assert type(section[key]) is kind, key
    assert type(data["onnx"]["passed"]) is bool and type(data["onnx"]["max_error"]) is float
    for output in data["verification"]["outputs"]:
        assert type(output["max_rel"]) is float and all(type(d) is int for d in output["shape"])


def test_error_lines_keep_the_failing_node_and_reason():
    message = ("Graph execution error:\n\nDetected at node 'x' defined at:\n" + "  frame\n" * 200
               + "Input to reshape is a tensor with 0 values [[{{node model/Reshape}}]]")
    line = first_line(message)
    assert len(line) <= 300 and "\n" not in line
    assert "tensor with 0 values" in line and "model/Reshape" in line


@pytest.mark.parametrize("name,feeds", [("queue_fed", {}),
                                        ("endless_loop", {"input": np.ones(2, np.float32)})])
def test_the_session_deadline_interrupts_an_empty_queue_and_an_endless_loop(graphs, name, feeds):
    import time
    start = time.monotonic()
    with pytest.raises(verify.GraphTimeout, match="the original did not finish within 1 s"):
        verify.run_graph(graphs[name].graph_def, feeds, ["output"], timeout=1,
                         label="the original")
    assert time.monotonic() - start < 30


def endless_onnx_loop(path):
    """An ONNX Loop whose condition stays true and that has no trip count: it never ends."""
    import onnx
    from onnx import TensorProto, helper
    vector = [helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2])]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])] + vector,
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["go"], value=helper.make_tensor(
            "true", TensorProto.BOOL, [], [True])),
         helper.make_node("Loop", ["", "go", "input:0"], ["output:0"], body=body)], "endless",
        [helper.make_tensor_value_info("input:0", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("output:0", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_the_onnx_deadline_interrupts_an_endless_loop(tmp_path):
    import time
    from tfsurgery.export import onnx as onnx_export
    from tfsurgery.errors import ExportError
    path = endless_onnx_loop(tmp_path / "loop.onnx")
    start = time.monotonic()
    with pytest.raises(ExportError, match="ONNX model did not finish within 1 s"):
        onnx_export.run_onnx(path, {"input:0": np.ones(2, np.float32)}, ["output"], timeout=1)
    assert time.monotonic() - start < 30
