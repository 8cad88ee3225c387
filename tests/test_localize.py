"""When a check fails the tool says where: the first transform after which it fails, and the
first tensor that transform changed — through the API, the report JSON and one stderr line."""
import json

import numpy as np
import pytest
import tensorflow as tf

from tfsurgery import api
from tfsurgery.cli import main
from tfsurgery.contract import TransformReport, transform
from tfsurgery.transforms import fold_batch_norm

import oracle


def five_convs(seed: int = 0):
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="input")
        channels = 3
        for i in range(1, 6):
            kernel = tf.constant(r.standard_normal((3, 3, channels, 4)) / 3, tf.float32,
                                 name=f"kernel_{i}")
            x = tf.nn.conv2d(tf.identity(x), kernel, 1, "SAME", name=f"conv_{i}")
            x = tf.nn.relu(x, name=f"relu_{i}")
            channels = 4
        tf.identity(x, name="output")
    return graph.as_graph_def()


@transform("break-conv-3")
def break_conv_3(graph, options):
    """Replaces conv_3 by a new conv whose kernel is 5% off: the user's bug."""
    report = TransformReport("break-conv-3")
    conv = graph.node("conv_3")
    data, kernel = graph.inputs("conv_3")
    wrong = graph.add_const("kernel_3_wrong", graph.const_value(kernel) * 1.05)
    broken = graph.new_node("Conv2D", "conv_3_rewritten", [data, wrong],
                            {key: conv.attr[key] for key in conv.attr})
    graph.rewire("conv_3", broken.name)
    graph.remove(["conv_3"])
    report.rewritten.append("conv_3")
    return report


def test_a_broken_plugin_is_named_with_the_node_right_after_its_conv(tmp_path):
    graph_def = five_convs()
    source = api.Source(graph_def, "five", inputs=["input"], outputs=["output"])
    with pytest.raises(api.VerificationFailed) as failed:
        api.optimize(source, ["default", break_conv_3])
    divergence = failed.value.result.divergence
    assert divergence.transform == "break-conv-3"
    assert (divergence.node, divergence.op) == ("relu_3", "Relu")
    assert divergence.error > 1e-3 and divergence.compared >= 5
    assert "first diverging transform 'break-conv-3'" in str(failed.value)
    assert "'relu_3' (Relu)" in str(failed.value)
    feeds = oracle.random_feeds(graph_def, ["input"], seed=0)
    before = oracle.run(graph_def, feeds, ["relu_2", "relu_3"])
    after = oracle.run(failed.value.result.graph_def, feeds, ["relu_2", "relu_3"])
    assert oracle.relative_error(before[0], after[0]) == 0          # before it: the same
    assert oracle.relative_error(before[1], after[1]) > 1e-3        # from it on: not


def test_the_cli_says_where_in_one_line_and_in_the_json(article_pb, tmp_path, capsys,
                                                        monkeypatch):
    real = fold_batch_norm.batch_norm_step

    def off_by_a_tenth(graph, name, lin):
        step = real(graph, name, lin)
        return step if isinstance(step, str) else (step[0] + 0.1, step[1])
    monkeypatch.setattr(fold_batch_norm, "batch_norm_step", off_by_a_tenth)
    code = main([str(article_pb), "--bn-fold", "-o", str(tmp_path / "x.pb"), "--report-json",
                 str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert "first diverging transform 'fold-batch-norm'" in err and "nothing written" in err
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["divergence"]["transform"] == "fold-batch-norm" and data["divergence"]["node"]
    assert not (tmp_path / "x.pb").exists()


def test_a_passing_run_does_not_localize(article):
    source = api.Source(article.graph_def, "a", inputs=article.inputs, outputs=article.outputs,
                        training_flags=["training"])
    assert api.optimize(source, api.choose_transforms(bn_fold=True)).divergence is None


def test_an_onnx_export_made_wrong_names_its_node(tmp_path, monkeypatch, capsys):
    """A conversion bug (conv_2's ONNX weights scaled by 1.1 after tf2onnx): the check fails
    and names the first ONNX node whose output parts from the TensorFlow tensor it came from."""
    import onnx
    from onnx import numpy_helper
    from tfsurgery.export import onnx_tidy
    real = onnx_tidy.tidy

    def scale_conv_2(model):
        done = real(model)
        conv = next(n for n in model.graph.node if n.op_type == "Conv" and "conv_2" in n.name)
        weight = next(i for i in model.graph.initializer if i.name == conv.input[1])
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.1,
                                                weight.name))
        return done
    monkeypatch.setattr(onnx_tidy, "tidy", scale_conv_2)
    path = tmp_path / "five.pb"
    path.write_bytes(five_convs().SerializeToString())
    code = main([str(path), "-o", str(tmp_path / "x.pb"), "--onnx", str(tmp_path / "x.onnx")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert "ONNX check FAILED" in err and "first diverging ONNX node" in err
    named = err.split("output '")[1].split("'")[0]
    assert named.split(":")[0] in ("conv_2", "relu_2"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["five.pb"]
