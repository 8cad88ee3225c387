"""One export protocol (issue 42): every format is an exporter the writer loops over, int8 a mode
of each; a new format needs only its exporter — registered, it is written with the others,
checked, and published all or nothing."""
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format

import oracle
from tfsurgery import api
from tfsurgery.errors import WriteFailed
from tfsurgery.export import artefacts, exporters
from tfsurgery.result import feeds_for_checks


class PbtxtExporter(exporters.Exporter):
    """A format of a test's own: the graph as protobuf text, read back and run on the
    verification inputs against the optimized graph; ``scale`` spoils one weight (a failed check)."""

    name, stage = "pbtxt", "protobuf text"

    def __init__(self, scale=1.0):
        self.scale = scale

    def export(self, job, path, int8):
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(job.result.graph_def)
        if self.scale != 1.0:
            spoil_one_weight(graph_def, self.scale)
        text = text_format.MessageToString(graph_def)
        feeds = feeds_for_checks(job.result)
        outputs = [f"{name}:0" for name in job.result.outputs]
        back = text_format.Parse(text, tf.compat.v1.GraphDef())
        got = oracle.run(back, feeds, outputs)
        want = oracle.run(job.result.graph_def, feeds, outputs)
        error = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
        artefact = artefacts.Artefact("pbtxt", path, len(text), error, job.result.tolerance,
                                      error <= job.result.tolerance, "TensorFlow, read back",
                                      weights=job.result.weights)
        if not artefact.passed:
            raise WriteFailed("protobuf text check", f"max error {error:.3g}", job.written)
        artefacts.publish(lambda: Path(path).write_text(text), job.batch)
        return artefact


def spoil_one_weight(graph_def, scale):
    for node in graph_def.node:
        if node.op == "Const" and node.attr["dtype"].type == tf.float32.as_datatype_enum:
            value = tf.make_ndarray(node.attr["value"].tensor)
            if value.size > 8:
                node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value * scale))
                return
    raise AssertionError("no weight to spoil")


@pytest.fixture
def optimized(article):
    return api.optimize(article.graph_def, api.choose_transforms(bn_fold=True))


def test_a_new_format_needs_only_its_exporter(article, optimized, tmp_path, monkeypatch):
    monkeypatch.setitem(exporters.EXPORTERS, "pbtxt", PbtxtExporter())
    written = api.write(article.graph_def, optimized,
                        api.Targets(pb=tmp_path / "m.pb", more={"pbtxt": tmp_path / "m.pbtxt"}))
    assert [a.format for a in written.artefacts] == ["pb", "pbtxt"]
    assert written.published and all(a.written for a in written.artefacts)
    # the test's own oracle: the text graph computes what the original computes
    graph = text_format.Parse((tmp_path / "m.pbtxt").read_text(), tf.compat.v1.GraphDef())
    x = np.random.default_rng(5).standard_normal((2, 16, 16, 3)).astype(np.float32)
    feeds, out = {f"{article.inputs[0]}:0": x}, [f"{article.outputs[0]}:0"]
    np.testing.assert_allclose(oracle.run(graph, feeds, out)[0],
                               oracle.run(article.graph_def, feeds, out)[0], rtol=1e-4, atol=1e-4)


def test_a_new_format_failing_its_check_writes_nothing(article, optimized, tmp_path,
                                                       monkeypatch):
    monkeypatch.setitem(exporters.EXPORTERS, "pbtxt", PbtxtExporter(scale=1.05))
    with pytest.raises(WriteFailed) as failed:
        api.write(article.graph_def, optimized,
                  api.Targets(pb=tmp_path / "m.pb", onnx=tmp_path / "m.onnx",
                              more={"pbtxt": tmp_path / "m.pbtxt"}))
    assert failed.value.stage == "protobuf text check"
    assert sorted(p.name for p in tmp_path.iterdir()) == []     # not the .pb, not the ONNX


def test_every_built_in_format_is_an_exporter_and_unknown_ones_are_refused(article, optimized,
                                                                            tmp_path):
    assert list(exporters.EXPORTERS)[:4] == ["onnx", "saved_model", "tflite", "openvino"]
    assert {name for name, e in exporters.EXPORTERS.items() if e.has_int8} >= {
        "onnx", "tflite", "openvino"}
    with pytest.raises(ValueError, match="no exporter named nope"):
        api.write(article.graph_def, optimized, api.Targets(more={"nope": tmp_path / "x"}))
    assert list(tmp_path.iterdir()) == []
