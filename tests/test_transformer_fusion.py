"""Transformer fusions in the ONNX export (issue 40 item 2): LayerNorm, GELU and Keras
self-attention become onnxruntime's fused kernels, checked in onnxruntime against a plain
TensorFlow session (tests/oracle.py) on inputs a transformer takes (ids within the table, a
padding mask with padded rows). Tiny models: 2 layers, hidden 32, seq 16."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf

from tests import oracle
from tfsurgery import api
from tfsurgery.export import onnx as onnx_export
from tfsurgery.models import transformers
from tfsurgery.models.common import BuiltModel

SEQ, VOCAB, LAYERS = 16, 100, 2


def token_feeds(built, seed=0, batch=2, seq=SEQ):
    """Token ids within the vocabulary, segment ids 0/1, a padding mask whose second row is
    padded after 11 tokens (every row keeps valid keys)."""
    r = np.random.default_rng(seed)
    feeds = {}
    for name in built.inputs:
        if "mask" in name:
            feeds[name] = (np.arange(seq)[None] < np.array([[seq], [11]][:batch])).astype(np.int32)
        elif "segment" in name:
            feeds[name] = r.integers(0, 2, (batch, seq)).astype(np.int32)
        elif "image" in name:
            feeds[name] = r.standard_normal((batch, 16, 16, 3)).astype(np.float32)
        else:
            feeds[name] = r.integers(0, VOCAB, (batch, seq)).astype(np.int32)
    return feeds


def export(built, tmp_path, seq=SEQ, **options):
    """Every fusion found applied (``fuse=True``) unless the test says otherwise: which of them
    pay on this CPU (the default, "auto") is tests/test_fusion_choice.py's subject."""
    options.setdefault("fuse", True)
    feeds = token_feeds(built, seq=seq)
    path = tmp_path / "model.onnx"
    result = onnx_export.export(built.graph_def, built.inputs, built.outputs, path, feeds=feeds,
                                **options)
    return result, path, feeds


def assert_matches_tf(built, path, feeds, tolerance=1e-4):
    """onnxruntime on the written file vs a plain TF session: relative error per output."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    actual = session.run(names, {f"{k}:0": v for k, v in feeds.items()})
    expected = oracle.run(built.graph_def, feeds, built.outputs)
    for want, got in zip(expected, actual):
        assert oracle.relative_error(want, got) <= tolerance
    return expected, actual


def ops_of(path):
    model = onnx.load(str(path))
    counts = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def optimized(style, seq=SEQ):
    """The model as ``tfsurgery export`` converts it: frozen, then through the default
    pipeline (its verification on the same token inputs)."""
    sizes = dict(layers=LAYERS, hidden=32, heads=2, seq=seq)
    built = transformers.frozen(style, **sizes, **({} if style == "vit" else {"vocab": VOCAB}))
    result = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs, feeds=token_feeds(built, seq=seq)))
    return BuiltModel(result.graph_def, built.inputs, built.outputs, None)


@pytest.fixture(scope="module")
def bert():
    return optimized("bert")


def test_bert_gets_one_fused_op_per_layer_norm_attention_and_gelu(bert, tmp_path):
    result, path, feeds = export(bert, tmp_path)
    assert result.passed, result
    counts = ops_of(path)
    # the embedding (token + segment + position rows, LayerNorm) is one EmbedLayerNormalization;
    # two post-LN per layer; one attention and one GELU per layer
    assert counts.get("EmbedLayerNormalization") == 1 and "Gather" not in counts
    assert result.tidied["embedding + LayerNorm → EmbedLayerNormalization"] == 1
    assert counts.get("LayerNormalization", 0) + counts.get("SkipLayerNormalization", 0) \
        == 2 * LAYERS
    assert counts.get("SkipLayerNormalization", 0) == 2 * LAYERS     # each after a residual Add
    assert counts.get("Attention") == LAYERS
    assert counts.get("FastGelu", 0) + counts.get("BiasGelu", 0) == LAYERS
    assert result.tidied["GELU (tanh) → FastGelu (bias taken in: FastGelu)"] == LAYERS
    for unfused in ("Softmax", "ReduceMean", "Pow", "Erf", "Sqrt", "Einsum"):   # (Tanh: pooler)
        assert unfused not in counts, unfused
    assert result.tidied["attention → Attention"] == LAYERS
    expected, actual = assert_matches_tf(bert, path, feeds)
    # the padded row really was masked: its output differs from the same ids unpadded
    assert not np.allclose(expected[0][0], expected[0][1])
    # Keras wraps negative ids (-1 is the last row); the fused embedding reads the wrapped ids
    wrapped = dict(feeds, token_ids=feeds["token_ids"] - VOCAB * (feeds["token_ids"] % 2))
    assert (wrapped["token_ids"] < 0).any()
    assert_matches_tf(bert, path, wrapped)


@pytest.mark.parametrize("off", [{"fuse": False}, {"ort_optimize": False}],
                         ids=["fuse=False", "raw-onnx"])
def test_fusion_off_leaves_standard_onnx_that_matches_too(bert, tmp_path, off):
    result, path, feeds = export(bert, tmp_path, **off)
    assert result.passed
    assert {"Attention", "LayerNormalization", "FastGelu",
            "EmbedLayerNormalization"}.isdisjoint(ops_of(path))
    assert_matches_tf(bert, path, feeds)


def unidirectional(path):
    return [onnx.helper.get_attribute_value(a) for n in onnx.load(str(path)).graph.node
            if n.op_type == "Attention" for a in n.attribute if a.name == "unidirectional"]


@pytest.mark.parametrize("seq", [SEQ, 32])
def test_gpt2_causal_attention_becomes_unidirectional_attention(tmp_path, seq):
    """Keras' causal mask ANDed with the padding mask: Attention with both as one [batch, seq,
    seq] mask (unidirectional=0: with the 2-D mask and unidirectional=1 onnxruntime adds the
    filler twice where a padded key is in the future, and a left-padded row's first queries,
    with no valid key, then differ from Keras'); pre-LN blocks. At 16 the triangle is a folded constant; at 32 fold-constants
    leaves Keras' Cumsum/GreaterEqual (its value outweighs its ops): proven by evaluating it."""
    gpt2 = optimized("gpt2", seq)
    folded = "Cumsum" not in {n.op for n in gpt2.graph_def.node}
    assert folded == (seq == SEQ)
    result, path, feeds = export(gpt2, tmp_path, seq=seq)
    assert result.passed
    counts = ops_of(path)
    assert counts.get("Attention") == LAYERS and "Softmax" not in counts
    assert unidirectional(path) == [0] * LAYERS
    assert counts.get("FastGelu", 0) + counts.get("BiasGelu", 0) == LAYERS
    assert counts.get("LayerNormalization", 0) + counts.get("SkipLayerNormalization", 0) == \
        2 * LAYERS + 1
    # pre-LN: the embedding sum is also the residual stream, so its LayerNorm stays plain
    assert "EmbedLayerNormalization" not in counts
    assert any("pre-LN residual" in line for line in result.not_fused), result.not_fused
    assert_matches_tf(gpt2, path, feeds)
    left = dict(feeds, padding_mask=feeds["padding_mask"][:, ::-1].copy())     # left-padded
    assert not left["padding_mask"][1, 0]
    assert_matches_tf(gpt2, path, left)


class _ConstantMask(tf.keras.layers.Layer):
    """Self-attention under a fixed [1, seq, seq] mask (no causal flag)."""

    def __init__(self, mask, **kwargs):
        super().__init__(**kwargs)
        self.mask, self.attention = mask, tf.keras.layers.MultiHeadAttention(2, 8)

    def call(self, x):
        return self.attention(x, x, attention_mask=tf.constant(self.mask))


def causal_only_model(seq=24, mask=None, dynamic=False):
    """Keras MultiHeadAttention with use_causal_mask=True and no padding mask (a decoder fed
    whole sequences) — or under a constant ``mask`` — random weights."""
    keras = tf.keras
    x = keras.Input((None if dynamic else seq, 16), name="x")
    y = keras.layers.MultiHeadAttention(2, 8)(x, x, use_causal_mask=True) if mask is None \
        else _ConstantMask(mask)(x)
    model = keras.Model(x, y)
    r = np.random.default_rng(3)
    for v in model.weights:
        v.assign(r.normal(0, 0.3, v.shape).astype("float32"))
    return model


@pytest.mark.parametrize("mask, dynamic", [(None, False), (None, True),
                                           (np.tril(np.ones((1, 24, 24), bool)), False),
                                           (np.triu(np.ones((1, 24, 24), bool)), False)],
                         ids=["causal", "causal-dynamic-length", "constant-lower-triangle",
                              "upper-triangle"])
def test_causal_mask_alone_becomes_unidirectional_attention_without_mask(tmp_path, mask,
                                                                          dynamic):
    """Proven by value: Keras' causal flag and a constant lower triangle fuse; an upper
    triangle (same ops, other value) stays, and every export matches TF. At a dynamic length
    Keras' form is the proof."""
    built = transformers.freeze(causal_only_model(mask=mask, dynamic=dynamic))
    graph_def = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs), checks=api.Checks(verify=False)).graph_def
    feeds = {"x": np.random.default_rng(0).normal(0, 1, (2, 24, 16)).astype(np.float32)}
    path = tmp_path / "causal.onnx"
    result = onnx_export.export(graph_def, built.inputs, built.outputs, path, feeds=feeds,
                                fuse=True)
    assert result.passed
    lower = mask is None or mask[0, -1, 0]
    assert ("Softmax" not in ops_of(path)) == lower
    assert unidirectional(path) == ([1] if lower else [])
    attention = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Attention"]
    assert all(len(a.input) == 3 for a in attention)    # x, weights, bias: no mask_index
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actual = session.run(None, {"x:0": feeds["x"]})[0]
    expected = oracle.run(graph_def, feeds, built.outputs)[0]
    assert oracle.relative_error(expected, actual) <= 1e-4
    # the triangle matters: the first position sees itself only, so it differs from full attention
    assert not np.allclose(expected[:, 0], expected[:, -1])


def test_a_run_time_upper_band_is_left_alone(tmp_path):
    """The dynamic causal-only form with the band turned around (MatrixBandPart(ones, 0, -1):
    j >= i) is the same ops with another mask: not fused, and the export matches TF."""
    from tensorflow.core.framework import node_def_pb2
    built = transformers.freeze(causal_only_model(dynamic=True))
    graph_def = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs), checks=api.Checks(verify=False)).graph_def
    band = next(n for n in graph_def.node if n.op == "MatrixBandPart")
    for index, (name, value) in enumerate((("upper/lower", 0), ("upper/upper", -1)), 1):
        const = node_def_pb2.NodeDef(name=name, op="Const")
        const.attr["dtype"].type = tf.int32.as_datatype_enum
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.int32(value)))
        graph_def.node.append(const)
        band.input[index] = name
    feeds = {"x": np.random.default_rng(0).normal(0, 1, (2, 24, 16)).astype(np.float32)}
    path = tmp_path / "upper.onnx"
    result = onnx_export.export(graph_def, built.inputs, built.outputs, path, feeds=feeds,
                                fuse=True)
    assert result.passed and "Attention" not in ops_of(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actual = session.run(None, {"x:0": feeds["x"]})[0]
    assert oracle.relative_error(oracle.run(graph_def, feeds, built.outputs)[0], actual) <= 1e-4


def dynamic_optimized(style):
    """A one-layer ``style`` model with [None, None] inputs through the default pipeline."""
    built = transformers.frozen(style, dynamic=True, layers=1, hidden=32, heads=2, seq=SEQ,
                                vocab=VOCAB)
    graph_def = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs, feeds=token_feeds(built))).graph_def
    return BuiltModel(graph_def, built.inputs, built.outputs, None)


@pytest.fixture(scope="module")
def dynamic_gpt2():
    """GPT-2 with [None, None] inputs: Keras builds the causal mask from Shape(x)[1]."""
    return dynamic_optimized("gpt2")


def test_dynamic_length_causal_mask_is_proven_by_its_form(dynamic_gpt2, tmp_path):
    """At a run-time length there is no value to evaluate: Keras' form (Cumsum of ones over
    rows >= over columns, n = Shape(x)[1]) is the lower triangle at every n, so attention
    fuses (the triangle built at the run-time length and ANDed with the padding mask,
    unidirectional=0) — and matches TF at two lengths, right- and left-padded."""
    result, path, feeds = export(dynamic_gpt2, tmp_path)
    assert result.passed and "Softmax" not in ops_of(path)
    assert unidirectional(path) == [0] and "Range" in ops_of(path)
    assert_matches_tf(dynamic_gpt2, path, feeds)
    shorter = token_feeds(dynamic_gpt2, seed=4, seq=9)
    assert_matches_tf(dynamic_gpt2, path, shorter)
    assert_matches_tf(dynamic_gpt2, path, dict(
        shorter, padding_mask=shorter["padding_mask"][:, ::-1].copy()))


def test_a_run_time_mask_in_another_form_is_left_alone_saying_why(dynamic_gpt2, tmp_path):
    """One Cumsum made exclusive: i >= j + 1, a strictly lower triangle (the same ops, another
    mask) — not fused, said, and the export still matches TF."""
    graph_def = type(dynamic_gpt2.graph_def)()
    graph_def.CopyFrom(dynamic_gpt2.graph_def)
    rows = next(n for n in graph_def.node if n.op == "Cumsum" and
                any(n.input[1] == c.name and c.attr["value"].tensor.int_val == [-2]
                    for c in graph_def.node))
    rows.attr["exclusive"].b = True
    shifted = BuiltModel(graph_def, dynamic_gpt2.inputs, dynamic_gpt2.outputs, None)
    result, path, feeds = export(shifted, tmp_path)
    assert result.passed and "Attention" not in ops_of(path)
    assert any("other than Keras'" in line for line in result.not_fused), result.not_fused
    assert_matches_tf(shifted, path, feeds)


def test_a_full_attention_mask_is_left_alone_saying_why(tmp_path):
    """A [batch, queries, keys] mask that is no causal triangle is not a padding mask."""
    keras = tf.keras
    x = keras.Input((8, 16), name="x")
    mask = keras.Input((8, 8), dtype="bool", name="mask")
    y = keras.layers.MultiHeadAttention(2, 8)(x, x, attention_mask=mask)
    model = keras.Model([x, mask], y)
    r = np.random.default_rng(0)
    for v in model.weights:
        v.assign(r.normal(0, 0.3, v.shape).astype("float32"))
    built = transformers.freeze(model)
    graph_def = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs), checks=api.Checks(verify=False)).graph_def
    feeds = {"x": r.normal(0, 1, (2, 8, 16)).astype(np.float32),
             "mask": r.random((2, 8, 8)) < 0.7}
    feeds["mask"][:, :, 0] = True                   # every query sees a key
    path = tmp_path / "full_mask.onnx"
    result = onnx_export.export(graph_def, built.inputs, built.outputs, path, feeds=feeds,
                                fuse=True)
    assert result.passed and "Attention" not in ops_of(path)
    assert any("Softmax" in line and "not a key-padding mask" in line
               for line in result.not_fused), result.not_fused


@pytest.mark.parametrize("style", ["distilbert", "vit"])
def test_exact_gelu_models_fuse_erfc_gelu_and_attention(style, tmp_path):
    """TF 2.21's Erfc GELU (DistilBERT, ViT): the export converts it as 1 - Erf, the fusion
    proves it on the Erfc form and writes BiasGelu; ViT's unmasked attention fuses too."""
    built = optimized(style)
    result, path, feeds = export(built, tmp_path)
    assert result.passed
    counts = ops_of(path)
    assert counts.get("BiasGelu", 0) + counts.get("Gelu", 0) == LAYERS
    assert counts.get("Attention") == LAYERS and "Erf" not in counts and "Softmax" not in counts
    assert_matches_tf(built, path, feeds)


def exact_gelu_graph(seed=0):
    """Dense → 0.5·x·(1 + erf(x/√2)) → Dense, as TF code written by hand (the Erf form)."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        h = tf.matmul(x, r.normal(0, 0.5, (8, 16)).astype(np.float32)) + \
            r.normal(0, 0.1, 16).astype(np.float32)
        g = 0.5 * h * (1.0 + tf.math.erf(h / np.float32(np.sqrt(2.0))))
        tf.identity(tf.matmul(g, r.normal(0, 0.5, (16, 4)).astype(np.float32)), name="y")
    return graph.as_graph_def()


def test_exact_gelu_becomes_gelu(tmp_path):
    graph_def = exact_gelu_graph()
    feeds = {"x": np.random.default_rng(1).normal(0, 2, (3, 8)).astype(np.float32)}
    path = tmp_path / "gelu.onnx"
    result = onnx_export.export(graph_def, ["x"], ["y"], path, feeds=feeds, fuse=True)
    assert result.passed
    counts = ops_of(path)
    assert counts.get("Gelu", 0) + counts.get("BiasGelu", 0) == 1 and "Erf" not in counts
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actual = session.run(None, {"x:0": feeds["x"]})[0]
    assert oracle.relative_error(oracle.run(graph_def, feeds, ["y"])[0], actual) <= 1e-4


def test_a_wrong_constant_is_not_fused(tmp_path):
    """Value-based: the same ops with 0.6 instead of 0.5 are not a GELU, and stay."""
    r = np.random.default_rng(0)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        tf.identity(0.6 * x * (1.0 + tf.math.erf(x / np.float32(np.sqrt(2.0)))), name="y")
    feeds = {"x": r.normal(0, 2, (3, 8)).astype(np.float32)}
    path = tmp_path / "not_gelu.onnx"
    result = onnx_export.export(graph.as_graph_def(), ["x"], ["y"], path, feeds=feeds,
                                fuse=True)
    assert result.passed and "Gelu" not in ops_of(path) and "Erf" in ops_of(path)
    assert any("not 0.5" in line for line in result.not_fused), result.not_fused


def test_fused_model_takes_onnxruntime_dynamic_int8_as_qattention(bert, tmp_path):
    """Fusion enables int8 attention: quantize_dynamic (no extra options: our com.microsoft
    outputs carry their type) makes QAttention, which still tracks TF."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    result, path, feeds = export(bert, tmp_path)
    quantized = tmp_path / "int8.onnx"
    quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8)
    assert ops_of(quantized).get("QAttention") == LAYERS
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    actual = session.run(None, {f"{k}:0": v for k, v in feeds.items()})
    expected = oracle.run(bert.graph_def, feeds, bert.outputs)
    assert 0 < oracle.relative_error(expected[0], actual[0]) < 0.1


def test_dynamic_length_embedding_fuses_with_the_whole_position_table(tmp_path):
    """[None, None] inputs: the position rows are table[None, :n] with n = Shape(sum)[1], the
    run-time length — the kernel's default positions 0..n-1 of the whole table; matches TF at
    two lengths."""
    dynamic = dynamic_optimized("bert")
    result, path, feeds = export(dynamic, tmp_path)
    assert result.passed and ops_of(path).get("EmbedLayerNormalization") == 1
    model = onnx.load(str(path))
    tables = {t.name for t in model.graph.initializer if len(t.dims) == 2}
    assert not [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in tables]
    assert_matches_tf(dynamic, path, feeds)
    assert_matches_tf(dynamic, path, token_feeds(dynamic, seed=4, seq=9))


def shifted_positions_graph(shift, seed=0):
    """ids [None, None]; Gather(words, ids) + table[None, shift:n + shift], then LayerNorm:
    shift 0 is positions 0..n-1, shift 1 positions 1..n (another sum)."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="ids")
        words = tf.gather(r.normal(0, 1, (50, 16)).astype(np.float32), ids)
        n = tf.shape(words)[1]
        table = tf.constant(r.normal(0, 1, (32, 16)).astype(np.float32))
        x = words + table[None, shift:n + shift]
        mean, variance = tf.nn.moments(x, [-1], keepdims=True)
        tf.identity(tf.nn.batch_normalization(
            x, mean, variance, r.normal(0, 0.1, 16).astype(np.float32),
            r.uniform(0.5, 1.5, 16).astype(np.float32), 1e-6), name="y")
    return graph.as_graph_def()


@pytest.mark.parametrize("shift", [0, 1])
def test_run_time_positions_fuse_only_from_row_zero(tmp_path, shift):
    graph_def = shifted_positions_graph(shift)
    feeds = {"ids": np.random.default_rng(1).integers(0, 50, (2, 7)).astype(np.int32)}
    graph_def = api.optimize(graph_def, interface=api.Interface(
        inputs=["ids"], outputs=["y"], feeds=feeds)).graph_def
    path = tmp_path / "positions.onnx"
    result = onnx_export.export(graph_def, ["ids"], ["y"], path, feeds=feeds, fuse=True)
    assert result.passed
    assert ("EmbedLayerNormalization" in ops_of(path)) == (shift == 0)
    if shift:
        assert any("first rows of a constant table" in line for line in result.not_fused), \
            result.not_fused
    for length in (7, 3):
        more = {"ids": np.random.default_rng(length).integers(0, 50, (2, length)).astype(np.int32)}
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        actual = session.run(None, {"ids:0": more["ids"]})[0]
        assert oracle.relative_error(oracle.run(graph_def, more, ["y"])[0], actual) <= 1e-4


def embedding_graph(ids_dtype=tf.int32, positions=(1, 8, 16), seed=0, segment_shape=(None, 8)):
    """Gather(words, ids) + Gather(segments, segment_ids) + a constant block, then LayerNorm
    (tf.nn.moments + batch_normalization, by hand)."""
    r = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph:
        ids = tf.compat.v1.placeholder(ids_dtype, [None, 8], name="ids")
        segments = tf.compat.v1.placeholder(tf.int32, segment_shape, name="segments")
        x = tf.gather(r.normal(0, 1, (50, 16)).astype(np.float32), ids) + \
            tf.gather(r.normal(0, 1, (2, 16)).astype(np.float32), segments) + \
            r.normal(0, 1, positions).astype(np.float32)
        mean, variance = tf.nn.moments(x, [-1], keepdims=True)
        y = tf.nn.batch_normalization(x, mean, variance, r.normal(0, 0.1, 16).astype(np.float32),
                                      r.uniform(0.5, 1.5, 16).astype(np.float32), 1e-12)
        tf.identity(y, name="y")
    return graph.as_graph_def()


@pytest.mark.parametrize("case", ["fused", "int64 ids", "one position for all",
                                  "one segment per row"])
def test_embedding_layer_norm_only_where_the_kernel_computes_the_same(tmp_path, case):
    """Proven by value: int32 ids and a [1, seq, hidden] block fuse; int64 ids (the kernel
    takes int32), a [1, 1, hidden] block (one row for every position) and segment ids [batch,
    1] broadcast over the sequence (the kernel wants them shaped as the ids) stay, saying why.
    onnxruntime matches a plain TF session either way."""
    ids_dtype = tf.int64 if case == "int64 ids" else tf.int32
    segment_shape = (None, 1) if case == "one segment per row" else (None, 8)
    graph_def = embedding_graph(ids_dtype, (1, 1, 16) if case == "one position for all"
                                else (1, 8, 16), segment_shape=segment_shape)
    r = np.random.default_rng(1)
    feeds = {"ids": r.integers(0, 50, (3, 8)).astype(ids_dtype.as_numpy_dtype),
             "segments": r.integers(0, 2, (3, segment_shape[1])).astype(np.int32)}
    graph_def = api.optimize(graph_def, interface=api.Interface(   # (StopGradient goes)
        inputs=["ids", "segments"], outputs=["y"], feeds=feeds)).graph_def
    path = tmp_path / "embedding.onnx"
    result = onnx_export.export(graph_def, ["ids", "segments"], ["y"], path, feeds=feeds,
                                fuse=True)
    assert result.passed
    fused = "EmbedLayerNormalization" in ops_of(path)
    assert fused == (case == "fused")
    if not fused:
        why = {"int64 ids": "int32", "one position for all": "position block",
               "one segment per row": "not [batch, seq] alike"}[case]
        assert any(why in line for line in result.not_fused), result.not_fused
        assert {"LayerNormalization", "SkipLayerNormalization"} & set(ops_of(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actual = session.run(None, {f"{k}:0": v for k, v in feeds.items()})[0]
    assert oracle.relative_error(oracle.run(graph_def, feeds, ["y"])[0], actual) <= 1e-4


class _HubPositions(tf.keras.layers.Layer):
    """keras-hub's PositionEmbedding.call (a sequence shorter than its table): the table's first
    rows broadcast to the input's shape."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=(64, input_shape[-1]), name="embeddings")

    def call(self, x):
        ops, shape = tf.keras.ops, tf.keras.ops.shape(x)
        rows = ops.slice(ops.convert_to_tensor(self.table), (0, 0), (shape[-2], shape[-1]))
        return ops.broadcast_to(rows, shape)


def test_keras_hub_position_embedding_fuses_too(tmp_path):
    """keras-hub adds BroadcastTo(rows, Shape(token embedding)) — after the pipeline
    BroadcastTo(constant, [Shape(gathered)[0], seq, hidden]), the same sum: fused, and
    onnxruntime matches a plain TF session."""
    keras, layers = tf.keras, tf.keras.layers
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    segments = keras.Input((SEQ,), dtype="int32", name="segment_ids")
    tokens = layers.Embedding(VOCAB, 32)(ids)
    x = layers.Add()((tokens, _HubPositions()(tokens), layers.Embedding(2, 32)(segments)))
    model = keras.Model([ids, segments], layers.LayerNormalization(epsilon=1e-12)(x))
    r = np.random.default_rng(0)
    for v in model.weights:
        v.assign(r.normal(0, 1, v.shape).astype("float32"))
    built = transformers.freeze(model)
    graph_def = api.optimize(built.graph_def, interface=api.Interface(
        inputs=built.inputs, outputs=built.outputs, feeds=token_feeds(built))).graph_def
    assert "BroadcastTo" in {n.op for n in graph_def.node}
    hub = BuiltModel(graph_def, built.inputs, built.outputs, None)
    result, path, feeds = export(hub, tmp_path)
    assert result.passed and ops_of(path).get("EmbedLayerNormalization") == 1
    assert "Gather" not in ops_of(path)
    assert_matches_tf(hub, path, feeds)


@pytest.mark.slow
def test_the_issue_size_bert_fuses_every_occurrence_and_matches_tf(tmp_path):
    """Issue 40's done-when model: a BERT-style encoder of 4 layers, hidden 256, seq 128 from
    Keras layers, through the default pipeline with no --samples (its token inputs read from
    the graph), exported with every fusion: one fused op per LayerNorm, attention and GELU,
    onnxruntime within 1e-4 of a plain TF session with a padded row. -m slow: the default run
    proves the same at 2 layers, hidden 32 (test_bert_gets_one_fused_op_per_...), and
    benchmarks/transformers.py exports this size with every fusion, checked."""
    layers, seq = 4, 128
    built = transformers.frozen("bert", layers=layers, hidden=256, heads=4, seq=seq,
                                vocab=VOCAB)
    result = api.optimize(built.graph_def, interface=api.Interface(inputs=built.inputs,
                                                                   outputs=built.outputs))
    bert_full = BuiltModel(result.graph_def, built.inputs, built.outputs, None)
    exported, path, feeds = export(bert_full, tmp_path, seq=seq)
    assert exported.passed
    counts = ops_of(path)
    assert counts.get("EmbedLayerNormalization") == 1
    assert counts.get("SkipLayerNormalization", 0) == 2 * layers
    assert counts.get("Attention") == layers
    assert counts.get("FastGelu", 0) + counts.get("BiasGelu", 0) == layers
    assert {"Softmax", "ReduceMean", "Einsum"}.isdisjoint(counts)
    assert_matches_tf(built, path, feeds)         # against the original, not our graph
