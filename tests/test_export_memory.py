"""tf2onnx's optimizer loop deep-copies the whole graph before each of its optimizers; the copies
it drops are reference cycles that only Python's rare full collections free, so a Keras ResNet50
at 224 piled up 8.8 GB of them in one export (3.4 GB collected; docs/int8.md, Memory). The export
makes each optimizer after a collection (``_compat.tf2onnx_collecting``): with automatic
collection off, as it effectively is for a large graph, no more than a few of tf2onnx's graphs
are left when the conversion ends (without it, one per optimizer run). Counted, never timed;
the ONNX model's numbers checked against the TensorFlow graph by the tests' own oracle."""
import gc

import numpy as np
import onnxruntime as ort
import tensorflow as tf

from tfsurgery.export import onnx as onnx_export

import oracle

UNITS = 384


def dense_graph(seed=0):
    """Three dense layers of random weights (about 1.7 MB of float32)."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, UNITS], name="input")
        for i in range(3):
            w = tf.constant(r.standard_normal((UNITS, UNITS)).astype(np.float32) / 20, name=f"w{i}")
            b = tf.constant(r.standard_normal(UNITS).astype(np.float32), name=f"b{i}")
            x = tf.nn.relu(tf.matmul(x, w) + b, name=f"dense{i}")
        tf.identity(x, name="output")
    return graph.as_graph_def()


def test_the_conversion_leaves_no_pile_of_graph_copies(monkeypatch):
    from tf2onnx.graph import Graph
    graph_def = dense_graph()
    monkeypatch.setattr(onnx_export, "COLLECT_ABOVE_BYTES", graph_def.ByteSize() - 1)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()             # as good as off for a large graph: full collections are rare
    try:
        model, _ = onnx_export.convert(graph_def, ["input"], ["output"],
                                       opset=onnx_export.DEFAULT_OPSET)
        copies = sum(isinstance(o, Graph) for o in gc.get_objects())
    finally:
        if enabled:
            gc.enable()
    assert copies <= 3, f"{copies} tf2onnx graphs left"
    feeds = np.random.default_rng(1).standard_normal((4, UNITS)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: feeds})[0]
    expected = oracle.run(graph_def, {"input": feeds}, ["output"])[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_small_graph_is_converted_without_collections(monkeypatch):
    """Collections cost seconds with TensorFlow loaded: below the size where the copies matter,
    the conversion makes none (counted)."""
    graph_def = dense_graph(1)
    assert graph_def.ByteSize() < onnx_export.COLLECT_ABOVE_BYTES
    calls = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a, **k: calls.append(1) or collect(*a, **k))
    onnx_export.convert(graph_def, ["input"], ["output"], opset=onnx_export.DEFAULT_OPSET)
    assert calls == []
