"""ONNX export is never worse than tf2onnx on the graph before our transforms: merge-duplicates
keeps each loop's own TensorList (three alike GRU loops convert), and when tf2onnx refuses the
optimized graph the transform that made it unconvertible is found, left out of that export (the
graph without it verified like any result) and named in the report."""
import numpy as np
import onnxruntime as ort
import pytest

from tfsurgery import api
from tfsurgery.models.recurrent import write_tf_keras_gru_branches


@pytest.fixture(scope="module")
def gru_branches(tmp_path_factory):
    """The Keras 2.2-style classifier (three GRU(go_backwards, reset_after=False) branches over
    Conv1D/SpatialDropout1D, batch-normalized inputs) as .h5, and the Keras model itself."""
    path = tmp_path_factory.mktemp("gru") / "gru.h5"
    return path, write_tf_keras_gru_branches(path, seed=3)


def onnx_outputs(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def test_three_alike_gru_loops_export_with_merge_duplicates_on(gru_branches, tmp_path):
    path, model = gru_branches
    result = api.optimize(path)
    merged = next(r for r in result.reports if r.name == "merge-duplicates")
    assert merged.rewritten                      # it ran and merged the loops' equal constants
    reserves = [n for n in result.graph_def.node if n.op == "TensorListReserve"]
    assert len(reserves) == 3                    # ... but each loop keeps its own buffer
    exported = result.export_onnx(tmp_path / "gru.onnx")
    assert exported.passed and exported.op_histogram.get("Loop") == 3
    x = np.random.default_rng(7).normal(size=(5, 8, 4)).astype(np.float32)
    expected = model(x, training=False).numpy()          # the Keras model is the oracle
    (actual,) = onnx_outputs(tmp_path / "gru.onnx", x)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(expected - expected.mean(0)).max() > 1e-3     # rows differ: a real check
