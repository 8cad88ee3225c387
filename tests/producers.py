"""Transformers as their real libraries write them (issue 48), saved with ``tf.saved_model.save``
for tfsurgery to load as a user would. Random weights from configs, no downloads; small: 2
layers, hidden 64, sequence 16.

Each family is built in a process of its own (``python -m tests.producers FAMILY DIR``):
Hugging Face ``transformers`` and tf_keras (``legacy``) need ``TF_USE_LEGACY_KERAS=1``,
keras-hub needs Keras 3. ``build(family, directory)`` runs that and returns {model: SavedModel path}.
"""
import os
import subprocess
import sys
from pathlib import Path

SEQ, HIDDEN, LAYERS, HEADS, FFN, VOCAB, IMAGE = 16, 64, 2, 2, 128, 100, 32
# one process per family: Hugging Face and tf_keras share tf_keras (TF_USE_LEGACY_KERAS=1)
FAMILIES = {"legacy": ("hf_bert", "hf_gpt2", "hf_gpt2_causal", "hf_vit", "tf_keras_mha",
                       "hand_tf"),
            "keras_hub": ("keras_hub_bert", "keras_hub_gpt2", "keras_hub_vit")}
ROOT = Path(__file__).resolve().parent.parent


def build(family: str, directory: Path, timeout: float = 600, only=()) -> dict:
    """{model name: SavedModel directory} of ``family``, built in a subprocess; ``only``: just
    those models saved (the family's others are still constructed, not saved)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               TF_USE_LEGACY_KERAS="0" if family == "keras_hub" else "1")
    done = subprocess.run([sys.executable, "-m", "tests.producers", family, str(directory),
                           *only], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: directory / name for name in FAMILIES[family] if not only or name in only}


def _save(tf, module, function, signature, path):
    if WANTED and path.name not in WANTED:      # build(..., only=...): the others not saved
        return
    concrete = tf.function(function).get_concrete_function(**signature)
    tf.saved_model.save(module, str(path), signatures=concrete)


def _ids(tf):
    return tf.TensorSpec([None, SEQ], tf.int32)


def hugging_face(directory: Path):
    import tensorflow as tf
    import transformers as hf
    tf.random.set_seed(0)
    bert = hf.TFBertModel(hf.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=32))
    _save(tf, bert, lambda input_ids, attention_mask, token_type_ids: {
        "hidden": bert(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids).last_hidden_state},
        dict(input_ids=_ids(tf), attention_mask=_ids(tf), token_type_ids=_ids(tf)),
        directory / "hf_bert")
    gpt2 = hf.TFGPT2Model(hf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS,
                                        n_head=HEADS, n_positions=32))
    _save(tf, gpt2, lambda input_ids, attention_mask: {
        "hidden": gpt2(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state},
        dict(input_ids=_ids(tf), attention_mask=_ids(tf)), directory / "hf_gpt2")
    _save(tf, gpt2, lambda input_ids: {                 # no padding mask: the causal mask alone
        "hidden": gpt2(input_ids=input_ids).last_hidden_state},
        dict(input_ids=_ids(tf)), directory / "hf_gpt2_causal")
    vit = hf.TFViTModel(hf.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=FFN,
                                     image_size=IMAGE, patch_size=8, num_channels=3))
    _save(tf, vit, lambda pixel_values: {
        "hidden": vit(pixel_values=pixel_values).last_hidden_state},
        dict(pixel_values=tf.TensorSpec([None, 3, IMAGE, IMAGE], tf.float32)),
        directory / "hf_vit")


def tf_keras_encoders(directory: Path):
    """A Model Garden / TF Hub style encoder from tf_keras layers (``MultiHeadAttention``,
    ``LayerNormalization`` at its default epsilon: the FusedBatchNorm form), and a hand-written
    TF one (``tf.nn.moments`` LayerNorm, tanh GELU with ``x·x·x``, quick GELU)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    tf.random.set_seed(0)
    ids = keras.Input([SEQ], dtype="int32", name="ids")
    x = keras.layers.Embedding(VOCAB, HIDDEN)(ids)
    x = keras.layers.LayerNormalization()(x)
    for _ in range(LAYERS):
        attended = keras.layers.MultiHeadAttention(HEADS, HIDDEN // HEADS)(x, x)
        x = keras.layers.LayerNormalization()(x + attended)
        inner = keras.layers.Dense(FFN, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(HIDDEN)(inner))
    encoder = keras.Model(ids, x)
    for layer in encoder.layers:          # LayerNorm scales and offsets not 1 and 0
        if isinstance(layer, keras.layers.LayerNormalization):
            layer.set_weights([w + np.random.default_rng(1).normal(0, 0.2, w.shape)
                               for w in layer.get_weights()])
    _save(tf, encoder, lambda ids: {"hidden": encoder(ids)}, dict(ids=_ids(tf)),
          directory / "tf_keras_mha")

    rng = np.random.default_rng(2)

    def variable(*shape):
        return tf.Variable(rng.normal(0, 0.3, shape).astype(np.float32))

    class HandWritten(tf.Module):
        def __init__(self):
            self.table = variable(VOCAB, HIDDEN)
            self.norms = [(variable(HIDDEN) + 1, variable(HIDDEN)) for _ in range(2 * LAYERS)]
            self.dense = [(variable(HIDDEN, FFN), variable(FFN), variable(FFN, HIDDEN))
                          for _ in range(LAYERS)]

        def norm(self, x, k):
            gamma, beta = self.norms[k]
            mean, variance = tf.nn.moments(x, axes=[2], keepdims=True)
            return (x - mean) / tf.sqrt(variance + 1e-6) * gamma + beta

        def __call__(self, ids):
            x = tf.gather(self.table, ids)
            for k, (w1, b1, w2) in enumerate(self.dense):
                h = tf.einsum("bsh,hf->bsf", self.norm(x, 2 * k), w1) + b1
                if k % 2 == 0:        # GPT-2's tanh GELU, the cube written out
                    h = 0.5 * h * (1 + tf.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
                else:                 # CLIP's quick GELU
                    h = h * tf.sigmoid(1.702 * h)
                x = self.norm(x + tf.einsum("bsf,fh->bsh", h, w2), 2 * k + 1)
            return x

    hand = HandWritten()
    _save(tf, hand, lambda ids: {"hidden": hand(ids)}, dict(ids=_ids(tf)),
          directory / "hand_tf")


def keras_hub(directory: Path):
    import keras
    import keras_hub
    import tensorflow as tf
    keras.utils.set_random_seed(0)
    sizes = dict(num_layers=LAYERS, num_heads=HEADS, hidden_dim=HIDDEN, intermediate_dim=FFN)
    bert = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, max_sequence_length=32,
                                         **sizes)
    _save(tf, bert, lambda token_ids, segment_ids, padding_mask: {
        "hidden": bert({"token_ids": token_ids, "segment_ids": segment_ids,
                        "padding_mask": padding_mask})["sequence_output"]},
        dict(token_ids=_ids(tf), segment_ids=_ids(tf), padding_mask=_ids(tf)),
        directory / "keras_hub_bert")
    gpt2 = keras_hub.models.GPT2Backbone(vocabulary_size=VOCAB, max_sequence_length=32,
                                         **sizes)
    _save(tf, gpt2, lambda token_ids, padding_mask: {
        "hidden": gpt2({"token_ids": token_ids, "padding_mask": padding_mask})},
        dict(token_ids=_ids(tf), padding_mask=_ids(tf)), directory / "keras_hub_gpt2")
    vit = keras_hub.models.ViTBackbone(image_shape=(IMAGE, IMAGE, 3), patch_size=8,
                                       mlp_dim=FFN, **{k: v for k, v in sizes.items()
                                                       if k != "intermediate_dim"})
    _save(tf, vit, lambda images: {"hidden": vit(images)},
          dict(images=tf.TensorSpec([None, IMAGE, IMAGE, 3], tf.float32)),
          directory / "keras_hub_vit")


WANTED = set()

if __name__ == "__main__":
    family, out = sys.argv[1], Path(sys.argv[2])
    WANTED.update(sys.argv[3:])
    for builder in {"legacy": (hugging_face, tf_keras_encoders), "keras_hub": (keras_hub,)}[family]:
        builder(out)
