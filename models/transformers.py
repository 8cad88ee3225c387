"""Small transformers from Keras 3 layers, random seeded weights, no downloads.

The styles users ship (keras-hub backbones are built the same way from the same layers):
  * BERT: token ids, segment ids and a padding mask (a dict or a list of inputs); token +
    position + segment embeddings and LayerNorm; post-LN blocks of `MultiHeadAttention` with the
    padding mask and a tanh-GELU FFN; sequence output and a tanh-pooled first token.
  * GPT-2: token ids and a padding mask; pre-LN blocks with a causal mask, tanh GELU.
  * DistilBERT: token ids and a padding mask; post-LN blocks with exact GELU (`Erfc` in TF 2.21).
  * ViT: an image cut into patches by a strided Conv2D, a class token, pre-LN blocks with exact
    GELU, a dense head on the class token.
`freeze` turns one into a frozen GraphDef the way tfsurgery freezes Keras 3 models (`io`).
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tfsurgery.models.common import BuiltModel, rng

keras = tf.keras
L = keras.layers
ops = keras.ops
MAX_LENGTH = 512        # rows of the position table (keras-hub's default max_sequence_length)


# --- blocks -----------------------------------------------------------------------------------

def _attention_mask(padding_mask):
    """[batch, seq] 0/1 → [batch, 1, seq] bool: every query sees the valid keys."""
    return ops.cast(ops.expand_dims(padding_mask, axis=1), "bool")


def _ffn(x, hidden: int, exact_gelu: bool, name: str):
    inner = L.Dense(4 * hidden, name=f"{name}_ffn_in")(x)
    inner = L.Activation(lambda t: keras.activations.gelu(t, approximate=not exact_gelu),
                         name=f"{name}_gelu")(inner)
    return L.Dense(hidden, name=f"{name}_ffn_out")(inner)


def _block(x, mask, hidden: int, heads: int, *, exact_gelu: bool, pre_norm: bool,
           causal: bool, name: str):
    """One encoder/decoder block: attention and FFN, each with a residual and a LayerNorm
    (after the residual for BERT-style post-LN, before the sublayer for pre-LN)."""
    attention = L.MultiHeadAttention(heads, hidden // heads, name=f"{name}_attention")
    norm1 = L.LayerNormalization(epsilon=1e-6 if pre_norm else 1e-12, name=f"{name}_ln1")
    norm2 = L.LayerNormalization(epsilon=1e-6 if pre_norm else 1e-12, name=f"{name}_ln2")
    if pre_norm:
        h = norm1(x)
        x = x + attention(h, h, attention_mask=mask, use_causal_mask=causal)
        return x + _ffn(norm2(x), hidden, exact_gelu, name)
    x = norm1(x + attention(x, x, attention_mask=mask, use_causal_mask=causal))
    return norm2(x + _ffn(x, hidden, exact_gelu, name))


class _Positions(L.Layer):
    """Adds a learned position embedding (keras-hub's PositionEmbedding): rows 0..seq-1 of a
    [max_length, hidden] table, so the sequence may be shorter than the table."""

    def __init__(self, max_length: int, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.max_length, input_shape[-1]), name="embeddings")

    def call(self, x):
        return x + self.table[None, :ops.shape(x)[1], :]


def _token_inputs(seq, names):
    return {n: keras.Input((seq,), dtype="int32", name=n) for n in names}


def _packed(inputs: dict, as_dict: bool):
    return inputs if as_dict else list(inputs.values())


# --- the four styles --------------------------------------------------------------------------

def bert(layers=2, hidden=64, heads=4, seq=16, vocab=100, segments=2, *, as_dict=True,
         exact_gelu=False, max_length=MAX_LENGTH, seed=0):
    """BERT-style encoder (keras-hub BertBackbone's layout). Outputs: sequence, pooled."""
    inputs = _token_inputs(seq, ("token_ids", "segment_ids", "padding_mask"))
    x = L.Embedding(vocab, hidden, name="token_embedding")(inputs["token_ids"])
    x = x + L.Embedding(segments, hidden, name="segment_embedding")(inputs["segment_ids"])
    x = _Positions(max(seq, max_length), name="position_embedding")(x)
    x = L.LayerNormalization(epsilon=1e-12, name="embeddings_ln")(x)
    mask = _attention_mask(inputs["padding_mask"])
    for i in range(layers):
        x = _block(x, mask, hidden, heads, exact_gelu=exact_gelu, pre_norm=False, causal=False,
                   name=f"layer{i}")
    pooled = L.Dense(hidden, activation="tanh", name="pooler")(x[:, 0, :])
    model = keras.Model(_packed(inputs, as_dict), [x, pooled], name="bert")
    return _randomised(model, seed)


def gpt2(layers=2, hidden=64, heads=4, seq=16, vocab=100, *, as_dict=True,
         max_length=MAX_LENGTH, seed=0):
    """GPT-2-style decoder: pre-LN, causal and padding masks, tanh GELU, a final LayerNorm."""
    inputs = _token_inputs(seq, ("token_ids", "padding_mask"))
    x = L.Embedding(vocab, hidden, name="token_embedding")(inputs["token_ids"])
    x = _Positions(max(seq, max_length), name="position_embedding")(x)
    mask = _attention_mask(inputs["padding_mask"])
    for i in range(layers):
        x = _block(x, mask, hidden, heads, exact_gelu=False, pre_norm=True, causal=True,
                   name=f"layer{i}")
    x = L.LayerNormalization(epsilon=1e-5, name="final_ln")(x)
    return _randomised(keras.Model(_packed(inputs, as_dict), x, name="gpt2"), seed)


def distilbert(layers=2, hidden=64, heads=4, seq=16, vocab=100, *, as_dict=True,
               max_length=MAX_LENGTH, seed=0):
    """DistilBERT-style encoder: no segments, post-LN, exact GELU (TF 2.21 lowers it to Erfc)."""
    inputs = _token_inputs(seq, ("token_ids", "padding_mask"))
    x = L.Embedding(vocab, hidden, name="token_embedding")(inputs["token_ids"])
    x = _Positions(max(seq, max_length), name="position_embedding")(x)
    x = L.LayerNormalization(epsilon=1e-12, name="embeddings_ln")(x)
    mask = _attention_mask(inputs["padding_mask"])
    for i in range(layers):
        x = _block(x, mask, hidden, heads, exact_gelu=True, pre_norm=False, causal=False,
                   name=f"layer{i}")
    return _randomised(keras.Model(_packed(inputs, as_dict), x, name="distilbert"), seed)


class _ClassToken(L.Layer):
    """Prepends a learned [1, 1, hidden] class token to every sequence."""

    def build(self, input_shape):
        self.token = self.add_weight(shape=(1, 1, input_shape[-1]), name="embeddings")

    def call(self, x):
        return ops.concatenate([ops.tile(self.token, (ops.shape(x)[0], 1, 1)), x], axis=1)


def vit(layers=2, hidden=64, heads=4, seq=16, patch=4, channels=3, classes=10, *, seed=0):
    """ViT-style classifier on a square image of `seq` patches (seq a square number)."""
    side = math.isqrt(seq)
    if side * side != seq:
        raise ValueError(f"seq must be a square number of patches, not {seq}")
    image = keras.Input((side * patch, side * patch, channels), name="image")
    x = L.Conv2D(hidden, patch, strides=patch, name="patches")(image)
    x = L.Reshape((seq, hidden), name="sequence")(x)
    x = _Positions(seq + 1, name="position_embedding")(_ClassToken(name="class_token")(x))
    for i in range(layers):
        x = _block(x, None, hidden, heads, exact_gelu=True, pre_norm=True, causal=False,
                   name=f"layer{i}")
    x = L.LayerNormalization(epsilon=1e-6, name="final_ln")(x)
    logits = L.Dense(classes, name="head")(x[:, 0, :])
    return _randomised(keras.Model(image, logits, name="vit"), seed)


# --- random weights ---------------------------------------------------------------------------

def _random_value(r: np.random.Generator, path: str, shape):
    """Kernels scaled by their fan-in (so activations stay O(1) through the blocks), LayerNorm
    gamma around 1, biases/betas small and non-zero, embeddings unit normal."""
    leaf = path.rsplit("/", 1)[-1]
    if leaf == "kernel":
        # EinsumDense kernels: query/key/value [hidden, heads, dim], output [heads, dim, hidden]
        fan_in = int(np.prod(shape[:-1])) if len(shape) != 3 or "attention_output" in path \
            else int(shape[0])
        return r.standard_normal(shape) / np.sqrt(fan_in)
    if leaf == "gamma":
        return r.uniform(0.5, 1.5, shape)
    if leaf in ("beta", "bias"):
        return r.normal(0.0, 0.1, shape)
    return r.standard_normal(shape)  # embeddings, class token


def _randomised(model, seed: int):
    r = rng(seed)
    for v in model.weights:
        v.assign(_random_value(r, v.path, tuple(v.shape)).astype(v.dtype))
    return model


# --- freezing ---------------------------------------------------------------------------------

def freeze(model, *, dynamic: bool = False) -> BuiltModel:
    """A frozen GraphDef of `model(inputs, training=False)`, as `tfsurgery.io.load_keras`
    freezes a Keras 3 file: one placeholder per model input, named after it, batch dimension
    free; `dynamic` also frees the sequence length ([None, None] token inputs)."""
    from tfsurgery.io import freeze_concrete_function

    def spec(t):
        shape = [None, *t.shape[1:]]
        if dynamic and len(shape) == 2:
            shape = [None, None]
        return tf.TensorSpec(shape, t.dtype, name=t.name)

    names = [t.name for t in model.inputs]
    as_dict = isinstance(model.input, dict)

    def call(*xs):
        return model(dict(zip(names, xs)) if as_dict else
                     (list(xs) if len(xs) > 1 else xs[0]), training=False)

    function = tf.function(call).get_concrete_function(*[spec(t) for t in model.inputs])
    loaded = freeze_concrete_function(function, model.name)
    return BuiltModel(loaded.graph_def, loaded.inputs, loaded.outputs, None)


STYLES = {"bert": bert, "gpt2": gpt2, "distilbert": distilbert, "vit": vit}


def frozen(style: str, *, dynamic: bool = False, **params) -> BuiltModel:
    """Build a `style` model (bert, gpt2, distilbert, vit) with `params` and freeze it."""
    return freeze(STYLES[style](**params), dynamic=dynamic)
