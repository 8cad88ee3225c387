"""LayerNorm, GELU and the embedding fused on transformers as their real libraries write them
(issue 48): Hugging Face ``transformers`` 4.46 TF classes, keras-hub, a tf_keras
``MultiHeadAttention`` encoder and hand-written TF, built from configs (tests/producers.py),
saved with ``tf.saved_model.save`` and loaded by tfsurgery as a user would. Each: every
LayerNorm and GELU fused (the embedding's where onnxruntime has the kernel), onnxruntime on
the written file matching a plain TF session of the original within 1e-4, and at least as many
of these fused ops as onnxruntime's transformer optimizer finds on the unfused export."""
import math

import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf

from tests import oracle, producers
from tfsurgery import api
from tfsurgery.export import onnx as onnx_export
from tfsurgery.graph import Graph
from tfsurgery.transforms import fuse_gelu
from tfsurgery.transforms.fusion_match import const_and_other, constant_first

LAYER_NORMS = {"LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization"}
GELUS = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu"}
# model → (LayerNorms, of them fused with the embedding, GELUs, onnxruntime optimizer's type)
EXPECTED = {
    "hf_bert": (5, 1, 2, "bert"), "hf_gpt2": (5, 0, 2, "gpt2"), "hf_vit": (5, 0, 2, "vit"),
    "tf_keras_mha": (5, 0, 2, "bert"), "hand_tf": (4, 0, 2, "bert"),
    "keras_hub_bert": (5, 1, 2, "bert"), "keras_hub_gpt2": (5, 0, 2, "gpt2"),
    "keras_hub_vit": (5, 0, 2, "vit"),
}
FAMILY = {model: family for family, models in producers.FAMILIES.items() for model in models}


@pytest.fixture(scope="session")
def saved_models(tmp_path_factory):
    """Each library family built once, in its own process, on first use."""
    built = {}

    def get(model):
        family = FAMILY[model]
        if family not in built:
            built[family] = producers.build(family, tmp_path_factory.mktemp(family))
        return built[family][model]
    return get


def feeds_for(inputs, batch=2):
    """Token ids within the vocabulary, segment ids 0/1, a padding mask whose second row is
    padded after 11 tokens, images."""
    r = np.random.default_rng(0)
    feeds = {}
    for name in inputs:
        if "mask" in name:
            feeds[name] = (np.arange(producers.SEQ)[None] <
                           np.array([[producers.SEQ], [11]])).astype(np.int32)
        elif "segment" in name or "token_type" in name:
            feeds[name] = r.integers(0, 2, (batch, producers.SEQ)).astype(np.int32)
        elif "pixel" in name:
            feeds[name] = r.standard_normal((batch, 3, producers.IMAGE,
                                             producers.IMAGE)).astype(np.float32)
        elif "images" in name:
            feeds[name] = r.standard_normal((batch, producers.IMAGE, producers.IMAGE,
                                             3)).astype(np.float32)
        else:
            feeds[name] = r.integers(0, producers.VOCAB, (batch, producers.SEQ)).astype(np.int32)
    return feeds


def ops_of(path):
    return onnx_export.op_histogram(path)


def kinds(counts, names):
    return sum(counts.get(name, 0) for name in names)


def onnxruntime_optimizer(path, model_type):
    """What onnxruntime's transformer optimizer fuses on the model at ``path`` (the recipe a
    user would try on our unfused export); its python fusions alone where its default level
    wants torch (as benchmarks/transformers.py runs it). None where it fails."""
    from onnxruntime.transformers.optimizer import optimize_model
    sizes = dict(model_type=model_type, num_heads=producers.HEADS, hidden_size=producers.HIDDEN)
    try:
        try:
            optimized = optimize_model(str(path), **sizes)
        except ImportError:
            optimized = optimize_model(str(path), **sizes, opt_level=0)
    except TypeError:
        # onnxruntime 1.32's FusionSimplifiedLayerNormalization indexes a NodeProto on the
        # hand-written LayerNorm (fusion_simplified_layernorm.py:117): the recipe stops there
        return None
    counts = {}
    for node in optimized.model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("model", [
    "hf_bert", "hf_gpt2", "hf_vit", "tf_keras_mha", "hand_tf", "keras_hub_bert",
    pytest.param("keras_hub_gpt2", marks=pytest.mark.slow),
    pytest.param("keras_hub_vit", marks=pytest.mark.slow)])
def test_every_layer_norm_and_gelu_fused_and_matching_tensorflow(model, saved_models, tmp_path):
    norms, embedded, gelus, model_type = EXPECTED[model]
    source = api.load(str(saved_models(model)))
    feeds = feeds_for(source.inputs)
    result = api.optimize(source, interface=api.Interface(feeds=feeds))
    paths = {fuse: tmp_path / f"{fuse}.onnx" for fuse in (True, False)}
    for fuse, path in paths.items():
        exported = onnx_export.export(result.graph_def, source.inputs, source.outputs, path,
                                      feeds=feeds, fuse=fuse)
        assert exported.passed, exported.max_error
    ours = ops_of(paths[True])
    assert kinds(ours, LAYER_NORMS) == norms, ours
    assert ours.get("EmbedLayerNormalization", 0) == embedded, ours
    assert kinds(ours, GELUS) == gelus, ours

    # the test's own oracle: onnxruntime on the written file vs the original in plain TF
    session = ort.InferenceSession(str(paths[True]), providers=["CPUExecutionProvider"])
    actual = session.run([o.name for o in session.get_outputs()],
                         {f"{k}:0": v for k, v in feeds.items()})
    expected = oracle.run(source.graph_def, feeds, source.outputs)
    for want, got in zip(expected, actual):
        assert oracle.relative_error(want, got) <= 1e-4

    peer = onnxruntime_optimizer(paths[False], model_type)
    if peer is None:                    # the peer's recipe fails: it gives the user nothing
        assert model == "hand_tf"
        peer = {}
    assert kinds(ours, LAYER_NORMS) >= kinds(peer, LAYER_NORMS), (ours, peer)
    assert kinds(ours, GELUS) >= kinds(peer, GELUS), (ours, peer)


# ------------------------------------------------------------------ matchers read the side
def _graph(build):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        build(x)
    return Graph(graph.as_graph_def(), check_inputs=False)


def test_a_constant_divided_by_x_is_not_x_divided_by_the_constant():
    """``c / x`` is no ``x / c`` (nor ``c - x`` an ``x - c``, ``c ** x`` an ``x ** c``): the
    constant's side counts for non-commutative ops, either side for commutative ones."""
    graph = _graph(lambda x: [tf.math.truediv(2.0, x, name="c_over_x"),
                              tf.math.truediv(x, 2.0, name="x_over_c"),
                              tf.math.pow(3.0, x, name="c_pow_x"),
                              tf.math.pow(x, 3.0, name="x_pow_c"),
                              tf.math.subtract(1.0, x, name="c_minus_x"),
                              tf.math.multiply(2.0, x, name="c_times_x")])
    x = graph.inputs("x_over_c")[0]
    for name in ("c_over_x", "c_pow_x", "c_minus_x"):
        assert const_and_other(graph, name) is None
    for name in ("x_over_c", "x_pow_c", "c_times_x"):
        assert const_and_other(graph, name)[1] == x
    assert constant_first(graph, "c_minus_x")[1] == x
    assert constant_first(graph, "x_over_c") is None


def _gelu_graph(erf_argument, cube):
    def build(x):
        inner = x + 0.044715 * cube(x)
        tf.multiply(0.5 * x, 1 + tf.math.erf(erf_argument(x)), name="exact")
        tf.multiply(0.5 * x, 1 + tf.tanh(math.sqrt(2 / math.pi) * inner), name="tanh")
    return _graph(build)


def test_gelu_with_the_constant_on_the_wrong_side_is_not_fused():
    """``erf(√2 / x)`` is not ``erf(x / √2)`` and ``3 ** x`` no cube: left alone, said why;
    the same graphs spelled right are both fused."""
    right = _gelu_graph(lambda x: x / math.sqrt(2), lambda x: tf.pow(x, 3.0))
    wrong = _gelu_graph(lambda x: math.sqrt(2) / x, lambda x: tf.pow(3.0, x))
    assert len(fuse_gelu.find(right)[0]) == 2
    found, skipped = fuse_gelu.find(wrong)
    assert found == []
    assert sorted(why for _, why in skipped) == [
        "not tanh(c · (x + 0.044715 x³))", "the Erf argument is not a product with a constant"]


# ------------------------------------------------------------------ the canonical forms
def _spellings():
    """One graph holding each spelling the rules rewrite, over x [batch, 16, 8] (rank known)."""
    r = np.random.default_rng(3)
    gamma, beta = (r.normal(1, 0.3, 8).astype(np.float32), r.normal(0, 0.3, 8).astype(np.float32))
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 16, 8], name="x")
        # tf_keras LayerNormalization, epsilon >= 1.001e-5: the FusedBatchNorm form
        rows = tf.reshape(x, [1, -1, 8, 1])
        ones, zeros = tf.ones(tf.shape(rows)[1:2]), tf.zeros(tf.shape(rows)[1:2])
        normed, _, _ = tf.compat.v1.nn.fused_batch_norm(rows, ones, zeros, epsilon=1e-3,
                                                       data_format="NCHW")
        tf.add(tf.reshape(normed, tf.shape(x)) * gamma, beta, name="fused_batch_norm")
        # hand-written: moments over axis 2, (x - mean) / sqrt(var + eps)
        mean, variance = tf.nn.moments(x, axes=[2], keepdims=True)
        tf.add((x - mean) / tf.sqrt(variance + 1e-6) * gamma, beta, name="centered")
        # tf.nn.batch_normalization over axis 2 (Hugging Face's form)
        tf.identity(tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-12),
                    name="hugging_face")
        # the tanh GELU with its cube written out
        tf.multiply(0.5 * x, 1 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)),
                    name="gelu")
    return graph.as_graph_def()


def test_each_canonical_form_computes_what_it_replaced_and_the_matchers_then_see_it():
    """The rules rewrite a private copy of the graph an export converts (the default
    pipeline's, given stays as it was); in TensorFlow the copy computes every output as the
    original does; the LayerNorm and GELU matchers then find each one."""
    from tfsurgery.export.onnx_fusion import static_shapes
    from tfsurgery.transforms import CANONICAL_RULES, canonical_forms, fuse_layer_norm
    outputs = ["fused_batch_norm", "centered", "hugging_face", "gelu"]
    original = api.optimize(_spellings(), interface=api.Interface(
        inputs=["x"], outputs=outputs)).graph_def
    before = original.SerializeToString(deterministic=True)
    graph, rewrites = canonical_forms.canonical(original, static_shapes(original),
                                                CANONICAL_RULES)
    assert original.SerializeToString(deterministic=True) == before
    done = canonical_forms.summary(rewrites)
    assert done["FusedBatchNorm over rows → LayerNorm (canonical)"] == 1
    assert done["(x - mean) · Rsqrt(var + eps) → LayerNorm (canonical)"] == 1
    assert done["c·x·x·x → c·Pow(x, 3)"] == 1
    assert done["Mean axes [2] → [-1]"] >= 2
    feeds = {"x": np.random.default_rng(4).normal(0, 2, (3, 16, 8)).astype(np.float32)}
    for want, got in zip(oracle.run(original, feeds, outputs),
                         oracle.run(graph.to_graph_def(), feeds, outputs)):
        assert oracle.relative_error(want, got) <= 1e-5
    norms = {norm.out for norm in fuse_layer_norm.layer_norms(graph)[0]}
    assert norms >= {"fused_batch_norm", "centered"} and len(norms) == 3
    assert [fused.output for fused in fuse_gelu.find(graph)[0]] == ["gelu:0"]
