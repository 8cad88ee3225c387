"""Attention from the real producers (issue 48): keras-hub's own ``BertBackbone`` (built from its
config, exported as keras-hub exports it: a SavedModel, loaded by tfsurgery as a user would)
reaches TensorFlow as ``Transpose → BatchMatMulV2 → Transpose`` with the query pre-scaled and
Keras' mask selects around the Softmax — canonical forms (transforms/canonical_attention.py)
turn that into the one form ``fuse_attention`` reads. Hugging Face's TFBertModel (tf_keras, saved with ``tf.saved_model.save``)
writes ``BatchMatMulV2(q, k, adj_y)`` / √d + (1 - m)·(-1e4) between Tensordot Dense layers and
head Reshapes; its TFViTModel the same without a mask. tf_keras' ``MultiHeadAttention`` (Model
Garden / TF Hub encoders) pre-scales the query, writes ``aecd,abcd->acbe`` and adds
``(1 - m)·(-1e9)``. Hand-written TF: ``tf.matmul`` projections, heads by reshape/transpose. Each model: one ``Attention`` per layer,
onnxruntime against a plain TF session on right- AND left-padded masks within 1e-4, at least as
many fused attentions as onnxruntime's own transformer optimizer finds on the unfused export.
Small: 2 layers, hidden 64, 4 heads, seq 16, random weights.
GPT-2 (built by tests/producers.py: 2 heads): keras-hub's GPT2Backbone (Minimum-merged int masks)
and Hugging Face's TFGPT2Model with its causal mask alone (packed q/k/v + Split) fuse one
causal Attention per layer, also at seq 32 where the triangle is computed from Range; HF GPT-2
with its padding mask too is left alone, saying why (left-padded rows cannot be exact)."""
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
import tensorflow as tf

from tests import oracle
from tfsurgery import api
from tfsurgery.export import onnx as onnx_export

SEQ, VOCAB, LAYERS = 16, 100, 2

KERAS_HUB_BERT = """
import keras, keras_hub
keras.utils.set_random_seed(0)
model = keras_hub.models.BertBackbone(vocabulary_size=100, num_layers=2, num_heads=4,
                                      hidden_dim=64, intermediate_dim=128,
                                      max_sequence_length=16)
model.export(PATH, format="tf_saved_model")
"""

HF_BERT = """
import tensorflow as tf
import transformers
tf.random.set_seed(0)
model = transformers.TFBertModel(transformers.BertConfig(
    vocab_size=100, max_position_embeddings=32, num_hidden_layers=2, hidden_size=64,
    num_attention_heads=4, intermediate_size=128))
serve = tf.function(lambda ids, mask: model(input_ids=ids, attention_mask=mask)
                    .last_hidden_state, input_signature=[
    tf.TensorSpec([None, 16], tf.int32, "input_ids"),
    tf.TensorSpec([None, 16], tf.int32, "attention_mask")])
tf.saved_model.save(model, PATH, signatures=serve.get_concrete_function())
"""
HF_VIT = """
import tensorflow as tf
import transformers
tf.random.set_seed(0)
model = transformers.TFViTModel(transformers.ViTConfig(
    image_size=16, patch_size=4, num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
    intermediate_size=128))
serve = tf.function(lambda pixels: model(pixel_values=pixels).last_hidden_state,
                    input_signature=[tf.TensorSpec([None, 3, 16, 16], tf.float32, "pixels")])
tf.saved_model.save(model, PATH, signatures=serve.get_concrete_function())
"""
TF_KERAS_ENCODER = """
import tensorflow as tf
import tf_keras as keras
tf.random.set_seed(0)
ids = keras.Input((16,), dtype="int32", name="token_ids")
mask = keras.Input((16,), dtype="int32", name="padding_mask")
x = keras.layers.Embedding(100, 64)(ids)
for _ in range(2):
    attended = keras.layers.MultiHeadAttention(4, 16)(
        x, x, attention_mask=tf.cast(mask[:, None, :], bool))
    x = keras.layers.LayerNormalization()(x + attended)
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(64)(
        keras.layers.Dense(128, activation="gelu")(x)))
tf.saved_model.save(keras.Model([ids, mask], x), PATH)
"""
HAND_WRITTEN = """
import numpy as np
import tensorflow as tf
r = np.random.default_rng(0)
H, N, h, S = 64, 4, 16, 16
W = {k: tf.constant(r.standard_normal((H, H)).astype(np.float32) * 0.1) for k in "qkvo"}
B = {k: tf.constant(r.standard_normal((H,)).astype(np.float32) * 0.1) for k in "qkvo"}
table = tf.constant(r.standard_normal((100, H)).astype(np.float32))
class Encoder(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, S], tf.int32, "token_ids"),
                                  tf.TensorSpec([None, S], tf.int32, "padding_mask")])
    def serve(self, ids, mask):
        x = tf.gather(table, ids)
        for _ in range(2):
            def heads(t):
                return tf.transpose(tf.reshape(t, [-1, S, N, h]), [0, 2, 1, 3])
            q, k, v = (heads(tf.matmul(x, W[c]) + B[c]) for c in "qkv")
            scores = tf.matmul(q, k, transpose_b=True) / tf.sqrt(float(h))
            scores += (1.0 - tf.cast(mask[:, None, None, :], tf.float32)) * -1e9
            c = tf.matmul(tf.nn.softmax(scores), v)
            c = tf.reshape(tf.transpose(c, [0, 2, 1, 3]), [-1, S, H])
            x = x + tf.matmul(c, W["o"]) + B["o"]
        return x
encoder = Encoder()
tf.saved_model.save(encoder, PATH, signatures=encoder.serve.get_concrete_function())
"""
PRODUCERS = {"keras-hub BertBackbone": KERAS_HUB_BERT, "HF TFBertModel": HF_BERT,
             "HF TFViTModel": HF_VIT, "tf_keras MultiHeadAttention": TF_KERAS_ENCODER,
             "hand-written tf.matmul": HAND_WRITTEN}


@pytest.fixture(scope="session")
def saved_models(tmp_path_factory):
    """Every producer's model built and saved by its own library, all in one process (tf_keras
    for Hugging Face by TF_USE_LEGACY_KERAS; keras-hub imports Keras 3 itself)."""
    root = tmp_path_factory.mktemp("producers")
    paths = {name: root / str(index) for index, name in enumerate(sorted(PRODUCERS))}
    code = 'import os\nos.environ["TF_USE_LEGACY_KERAS"] = "1"\n' + "".join(
        f"PATH = {str(paths[name])!r}\n" + textwrap.dedent(PRODUCERS[name]) for name in paths)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    return paths


@pytest.fixture(scope="session", params=sorted(PRODUCERS))
def producer(request, saved_models):
    """(name, the optimized Result) of a model its library built and saved."""
    return request.param, api.optimize(api.load(saved_models[request.param]))


def masks(batch=4):
    """Row 0 full, then right-padded, left-padded, and padded on both sides."""
    mask = np.ones((batch, SEQ), np.int32)
    mask[1, 11:] = 0
    mask[2, :5] = 0
    mask[3, :3] = 0
    mask[3, 12:] = 0
    return mask


def feeds_for(result, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in result.inputs:
        if "mask" in name:
            feeds[name] = masks()
        elif "pixel" in name:
            feeds[name] = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        elif "segment" in name:
            feeds[name] = rng.integers(0, 2, (4, SEQ)).astype(np.int32)
        else:
            feeds[name] = rng.integers(0, VOCAB, (4, SEQ)).astype(np.int32)
    return feeds


def ops_of(path):
    return onnx_export.op_histogram(path)


def onnxruntime_optimizer_attentions(path, tmp_path):
    """What onnxruntime's own transformer optimizer fuses on our unfused export."""
    from onnxruntime.transformers.optimizer import optimize_model
    optimized = optimize_model(str(path), model_type="bert", num_heads=4, hidden_size=64,
                               opt_level=0)
    return optimized.get_fused_operator_statistics().get("Attention", 0)


def assert_matches_tf(result, path, feeds, tolerance=1e-4):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    given = {i.name: feeds[i.name.split(":")[0]] for i in session.get_inputs()}
    actual = session.run(names, given)
    expected = oracle.run(result.original, feeds, result.outputs)
    worst = max(oracle.relative_error(e, a) for e, a in zip(expected, actual))
    assert worst <= tolerance, worst
    return worst


def test_one_fused_attention_per_layer_matching_tensorflow(producer, tmp_path):
    name, result = producer
    fused = result.export_onnx(tmp_path / "fused.onnx", fusions=True)
    assert fused.passed
    counts = ops_of(tmp_path / "fused.onnx")
    assert counts.get("Attention") == LAYERS and "Softmax" not in counts
    assert fused.tidied["attention → Attention"] == LAYERS
    assert not [line for line in fused.not_fused if "Softmax" in line]
    feeds = feeds_for(result)
    worst = assert_matches_tf(result, tmp_path / "fused.onnx", feeds)
    print(f"{name}: max relative error {worst:.2e}")
    # the padded rows were masked: the same ids unpadded give another output
    for mask in [k for k in feeds if "mask" in k]:
        unpadded = dict(feeds, **{mask: np.ones_like(feeds[mask])})
        assert not np.allclose(oracle.run(result.original, feeds, result.outputs)[-1],
                               oracle.run(result.original, unpadded, result.outputs)[-1])
    # the oracle sees a wrong fused attention: its packed q/k/v weights 5% off
    model = onnx.load(str(tmp_path / "fused.onnx"))
    packed = next(t for t in model.graph.initializer if t.name.endswith("/qkv_weight"))
    packed.CopyFrom(onnx.numpy_helper.from_array(
        onnx.numpy_helper.to_array(packed) * np.float32(1.05), packed.name))
    onnx.save(model, str(tmp_path / "mutated.onnx"))
    with pytest.raises(AssertionError):
        assert_matches_tf(result, tmp_path / "mutated.onnx", feeds)
    plain = result.export_onnx(tmp_path / "plain.onnx", fusions=False)
    assert plain.passed
    theirs = onnxruntime_optimizer_attentions(tmp_path / "plain.onnx", tmp_path)
    print(f"{name}: Attention ours {counts['Attention']}, onnxruntime optimizer {theirs}")
    assert counts["Attention"] >= theirs




# ------------------------------------------------------------------ GPT-2 (tests/producers.py)
# keras-hub's GPT2Backbone merges its padding mask with a constant causal triangle by Minimum of
# int masks (canonical_masks); Hugging Face's TFGPT2Model packs q, k, v in one Conv1D and Splits
# (canonical_attention) and writes its causal band as s·b - 1e4·(1 - b). Built by the shared
# builders (2 heads, hidden 64), only the GPT-2s saved.
GPT2_MODELS = {"keras_hub_gpt2": "keras_hub", "hf_gpt2_causal": "legacy", "hf_gpt2": "legacy"}


@pytest.fixture(scope="session")
def gpt2_saved(tmp_path_factory):
    from tests import producers
    built = {}
    for family in sorted(set(GPT2_MODELS.values())):
        wanted = [m for m, f in GPT2_MODELS.items() if f == family]
        built.update(producers.build(family, tmp_path_factory.mktemp(family), only=wanted))
    return built


@pytest.fixture(scope="session", params=["keras_hub_gpt2", "hf_gpt2_causal"])
def gpt2(request, gpt2_saved):
    return request.param, api.optimize(api.load(gpt2_saved[request.param]))


def test_gpt2_one_causal_attention_per_layer_matching_tensorflow(gpt2, tmp_path):
    from onnxruntime.transformers.optimizer import optimize_model
    from tests import producers
    name, result = gpt2
    fused = result.export_onnx(tmp_path / "fused.onnx", fusions=True)
    assert fused.passed
    counts = ops_of(tmp_path / "fused.onnx")
    assert counts.get("Attention") == producers.LAYERS and "Softmax" not in counts, counts
    assert not [line for line in fused.not_fused if "Softmax" in line]
    # the test's own oracle on a full, a right-, a left- and a both-sides-padded row (for the
    # causal-only model: the ids alone); a left-padded row's first queries have no valid key
    feeds = feeds_for(result)
    worst = assert_matches_tf(result, tmp_path / "fused.onnx", feeds)
    print(f"{name}: max relative error {worst:.2e}")
    model = onnx.load(str(tmp_path / "fused.onnx"))
    packed = next(t for t in model.graph.initializer if t.name.endswith("/qkv_weight"))
    packed.CopyFrom(onnx.numpy_helper.from_array(
        onnx.numpy_helper.to_array(packed) * np.float32(1.05), packed.name))
    onnx.save(model, str(tmp_path / "mutated.onnx"))
    with pytest.raises(AssertionError):
        assert_matches_tf(result, tmp_path / "mutated.onnx", feeds)
    assert result.export_onnx(tmp_path / "plain.onnx", fusions=False).passed
    theirs = optimize_model(str(tmp_path / "plain.onnx"), model_type="gpt2",
                            num_heads=producers.HEADS, hidden_size=producers.HIDDEN,
                            opt_level=0).get_fused_operator_statistics().get("Attention", 0)
    print(f"{name}: Attention ours {counts['Attention']}, onnxruntime optimizer {theirs}")
    assert counts["Attention"] >= theirs


def test_hf_gpt2_with_a_padding_mask_is_left_alone_saying_why(gpt2_saved, tmp_path):
    """Hugging Face's causal band replaces future scores by -1e4 and the padding mask then adds
    -1e4: a left-padded row's first queries (every past key padded) weigh their future keys
    against their past ones by the scores — no Attention mask computes that row, so the block
    stays unfused, the reason printed, and the export still matches TF on left padding."""
    from tfsurgery.transforms import fuse_attention
    result = api.optimize(api.load(gpt2_saved["hf_gpt2"]))
    exported = result.export_onnx(tmp_path / "m.onnx", fusions=True)
    assert exported.passed
    assert "Attention" not in ops_of(tmp_path / "m.onnx")
    reasons = [line for line in exported.not_fused if "Softmax" in line]
    assert len(reasons) == 2 and all(fuse_attention.CAUSAL_THEN_ADDITIVE in r for r in reasons)
    assert_matches_tf(result, tmp_path / "m.onnx", feeds_for(result))


GPT2_AT_32 = """
import os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1" if sys.argv[1] == "hf" else "0"
import tensorflow as tf
spec = tf.TensorSpec([None, 32], tf.int32)
if sys.argv[1] == "hf":
    import transformers
    tf.random.set_seed(0)
    model = transformers.TFGPT2Model(transformers.GPT2Config(
        vocab_size=100, n_embd=64, n_layer=2, n_head=2, n_positions=32))
    serve = tf.function(lambda input_ids: {"hidden": model(input_ids=input_ids).last_hidden_state})
    concrete = serve.get_concrete_function(input_ids=spec)
else:
    import keras, keras_hub
    keras.utils.set_random_seed(0)
    model = keras_hub.models.GPT2Backbone(vocabulary_size=100, num_layers=2, num_heads=2,
                                          hidden_dim=64, intermediate_dim=128,
                                          max_sequence_length=32)
    serve = tf.function(lambda token_ids, padding_mask: {"hidden": model(
        {"token_ids": token_ids, "padding_mask": padding_mask})})
    concrete = serve.get_concrete_function(token_ids=spec, padding_mask=spec)
tf.saved_model.save(model, sys.argv[2], signatures=concrete)
"""


@pytest.mark.parametrize("library", ["hf", "keras_hub"])
def test_gpt2_causal_mask_computed_from_range_fuses(library, tmp_path):
    """From seq 32 fold-constants leaves the causal triangle as Range/GreaterEqual (its value
    outweighs its ops): proven by its computed value, the GPT-2s fuse there too."""
    subprocess.run([sys.executable, "-c", GPT2_AT_32, library, str(tmp_path / "m")],
                   check=True, capture_output=True, timeout=300)
    result = api.optimize(api.load(tmp_path / "m"))
    fused = result.export_onnx(tmp_path / "fused.onnx", fusions=True)
    assert fused.passed and ops_of(tmp_path / "fused.onnx").get("Attention") == LAYERS
    rng = np.random.default_rng(1)
    mask = np.ones((4, 32), np.int32)
    mask[1, 20:], mask[2, :9], mask[3, :4], mask[3, 27:] = 0, 0, 0, 0
    feeds = {name: mask if "mask" in name else rng.integers(0, VOCAB, (4, 32)).astype(np.int32)
             for name in result.inputs}
    assert_matches_tf(result, tmp_path / "fused.onnx", feeds)
