"""Transformers as the real libraries build them (issue 48), for the benchmark: Hugging Face
``transformers`` 4.46 TF classes (tf_keras) and keras-hub, built from configs — random weights,
no downloads — and frozen from their serving function as tfsurgery's loader freezes a model
(variables → constants, inputs named after the model's own). Each builder takes the size
(layers, hidden, heads, seq) and returns a ``BuiltModel``. ``build`` runs one in a process of
its own: importing Hugging Face's TF classes turns ``tf.keras`` into tf_keras for the process,
keras-hub wants Keras 3.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict

from tfsurgery.models.common import BuiltModel

VOCAB = 1000


def _frozen(call: Callable, specs: Dict[str, tuple], label: str) -> BuiltModel:
    """``call(**inputs)`` traced at ``specs`` (name → (shape, dtype)) and frozen."""
    import tensorflow as tf
    from tfsurgery.io import freeze_concrete_function
    signature = [tf.TensorSpec(shape, dtype, name=name) for name, (shape, dtype) in specs.items()]

    def serve(*xs):
        return call(**dict(zip(specs, xs)))
    loaded = freeze_concrete_function(tf.function(serve).get_concrete_function(*signature),
                                      label)
    return BuiltModel(loaded.graph_def, loaded.inputs, loaded.outputs, None)


def _tokens(seq: int, *names: str) -> Dict[str, tuple]:
    import tensorflow as tf
    return {name: ((None, seq), tf.int32) for name in names}


def hf_bert(layers: int, hidden: int, heads: int, seq: int) -> BuiltModel:
    from transformers import BertConfig, TFBertModel
    model = TFBertModel(BertConfig(vocab_size=VOCAB, hidden_size=hidden,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   intermediate_size=4 * hidden, max_position_embeddings=seq))
    return _frozen(lambda **x: model(**x, training=False).last_hidden_state,
                   _tokens(seq, "input_ids", "attention_mask", "token_type_ids"), "hf-bert")


def hf_gpt2(layers: int, hidden: int, heads: int, seq: int) -> BuiltModel:
    from transformers import GPT2Config, TFGPT2Model
    model = TFGPT2Model(GPT2Config(vocab_size=VOCAB, n_positions=seq, n_embd=hidden,
                                   n_layer=layers, n_head=heads))
    return _frozen(lambda **x: model(**x, training=False).last_hidden_state,
                   _tokens(seq, "input_ids", "attention_mask"), "hf-gpt2")


def hf_vit(layers: int, hidden: int, heads: int, seq: int, patch: int = 16) -> BuiltModel:
    """``seq`` patches (a square number) of ``patch`` pixels: image side √seq · patch."""
    import tensorflow as tf
    from transformers import TFViTModel, ViTConfig
    side = int(round(seq ** 0.5)) * patch
    model = TFViTModel(ViTConfig(hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=4 * hidden,
                                 image_size=side, patch_size=patch))
    return _frozen(lambda **x: model(**x, training=False).last_hidden_state,
                   {"pixel_values": ((None, 3, side, side), tf.float32)}, "hf-vit")


def keras_hub_bert(layers: int, hidden: int, heads: int, seq: int) -> BuiltModel:
    import keras_hub
    from tfsurgery.models import transformers
    model = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=layers,
                                          num_heads=heads, hidden_dim=hidden,
                                          intermediate_dim=4 * hidden, max_sequence_length=seq)
    return transformers.freeze(model)


BUILDERS = {"hf-bert": hf_bert, "hf-gpt2": hf_gpt2, "hf-vit": hf_vit,
            "keras-hub-bert": keras_hub_bert}
# what onnxruntime's transformer optimizer is told each model is (its model_type)
ORT_MODEL_TYPES = {"hf-bert": "bert", "hf-gpt2": "gpt2", "hf-vit": "vit",
                   "keras-hub-bert": "bert"}


def build(label: str, params: dict, timeout: float = 1800) -> BuiltModel:
    """``BUILDERS[label](**params)`` frozen in a process of its own."""
    import tensorflow as tf
    with tempfile.TemporaryDirectory(prefix="tfsurgery-library-") as tmp:
        out = Path(tmp) / "model.pb"
        done = subprocess.run([sys.executable, "-m", "benchmarks.library_transformers", label,
                               json.dumps(params), str(out)], capture_output=True, text=True,
                              timeout=timeout, cwd=Path(__file__).resolve().parent.parent)
        if done.returncode != 0:
            raise RuntimeError(f"building {label} failed: {done.stderr.strip().splitlines()[-1:]}")
        names = json.loads(out.with_suffix(".json").read_text())
        graph_def = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    return BuiltModel(graph_def, names["inputs"], names["outputs"], None)


if __name__ == "__main__":
    built = BUILDERS[sys.argv[1]](**json.loads(sys.argv[2]))
    Path(sys.argv[3]).write_bytes(built.graph_def.SerializeToString())
    Path(sys.argv[3]).with_suffix(".json").write_text(json.dumps(
        {"inputs": list(built.inputs), "outputs": list(built.outputs)}))
