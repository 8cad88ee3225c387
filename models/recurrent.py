"""Recurrent models in the forms their authors publish them (tests/test_recurrent_forms.py):

- tf_keras (Keras 2) LSTM/GRU with dropout and recurrent dropout, written as ``.h5``, as a
  SavedModel, and as a ``.pb`` frozen by TF2 with lowering (``convert_variables_to_constants_v2``
  with its defaults: the loop becomes Enter/Exit/NextIteration around TensorList ops — the form
  Android apps ship);
- a tf.while_loop over a TensorArray frozen with lowering, writing step ``t`` at index ``t``
  (a Keras ``return_sequences`` layer's pattern) — and, asking its list for its length every
  step (``TensorListLength``, no TensorArray twin), what no converter takes;
- a TF1 v1 loop whose TensorArray of differently sized pieces is concatenated after it
  (``TensorArrayConcatV3``, an MTCNN-style image pyramid), which tf2onnx cannot convert;
- a TF1 ``tf.compat.v1.nn.dynamic_rnn`` graph (v1 while loop over TensorArrays), frozen, with an
  ``is_train`` flag, a ``dropout`` rate placeholder of unknown rank that only feeds the training
  side of a cond, and a ``DropoutWrapper`` whose keep probability is ``cond(is_train, 0.75, 1)``:
  dropout inside the loop body.

- a Keras 2.2-style sequence classifier written as ``.h5``: batch-normalized inputs, three
  branches of Conv1D → SpatialDropout1D → Conv1D → ``GRU(go_backwards=True, reset_after=False)``,
  concatenated; loaded, it is frozen without lowering into three alike functional ``While``
  loops over TensorLists;
- a Keras 3 LSTM/GRU frozen with lowering: with dropout TF's freezer refuses it, so the graph
  comes from its converter unchecked, or repaired as tf2onnx's loader repairs it.

Weights and biases are random (never Keras' zeros); units and features are tiny.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import numpy as np
import tensorflow as tf

from tfsurgery.models.common import BuiltModel, rng
from tfsurgery.models.tf1 import v1_graph

KINDS = ("LSTM", "GRU")


def write_tf_keras_recurrent(kind: str, folder, *, seed: int = 0, units: int = 3,
                             features: int = 2) -> Dict[str, Path]:
    """A tf_keras ``kind`` layer (dropout 0.25, recurrent dropout 0.25) + Dense, written to
    ``folder`` as ``{kind}.h5``, ``{kind}_saved_model/`` and ``{kind}_lowered.pb`` (input ``x``,
    output ``Identity``); returns {"h5"|"saved_model"|"lowered": path}."""
    import tf_keras
    from tensorflow.python.framework.convert_to_constants import \
        convert_variables_to_constants_v2
    folder, r = Path(folder), rng(seed)
    layer = getattr(tf_keras.layers, kind)(units, dropout=0.25, recurrent_dropout=0.25)
    model = tf_keras.Sequential([tf_keras.Input((None, features)), layer,
                                 tf_keras.layers.Dense(2)])
    for weight in model.weights:
        weight.assign(r.normal(0, 0.5, weight.shape).astype("float32"))
    paths = {"h5": folder / f"{kind}.h5", "saved_model": folder / f"{kind}_saved_model",
             "lowered": folder / f"{kind}_lowered.pb"}
    model.save(paths["h5"])
    model.save(paths["saved_model"], save_format="tf")
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, None, features], tf.float32, name="x"))
    lowered = convert_variables_to_constants_v2(function).graph.as_graph_def()
    paths["lowered"].write_bytes(lowered.SerializeToString())
    return paths


def write_tf_keras_gru_branches(path, *, seed: int = 0, steps: int = 8, features: int = 4,
                                units: int = 3):
    """The three-branch GRU classifier (see module doc) with random weights and BN statistics,
    written to ``path`` (.h5); returns the tf_keras model (its own ``predict`` is an oracle)."""
    import tf_keras
    layers, r = tf_keras.layers, rng(seed)
    inputs = tf_keras.Input((steps, features), name="input")
    x = layers.BatchNormalization(name="bn_in")(inputs)
    branches = []
    for k, width in enumerate((2, 3, 5)):
        b = layers.Conv1D(4, width, padding="same", activation="relu", name=f"conv{k}a")(x)
        b = layers.SpatialDropout1D(0.2, name=f"drop{k}")(b)
        b = layers.Conv1D(4, width, padding="same", activation="relu", name=f"conv{k}b")(b)
        branches.append(layers.GRU(units, go_backwards=True, reset_after=False,
                                   name=f"gru{k}")(b))
    outputs = layers.Dense(3, activation="softmax", name="output")(
        layers.Concatenate(name="concat")(branches))
    model = tf_keras.Model(inputs, outputs)
    for weight in model.weights:
        leaf = weight.name.split(":")[0].rsplit("/", 1)[-1]
        value = r.uniform(0.5, 1.5, weight.shape) if leaf in ("gamma", "moving_variance") \
            else r.normal(0, 0.5, weight.shape)
        weight.assign(value.astype("float32"))
    model.save(path)
    return model


def tf1_dynamic_rnn(kind: str = "LSTM", seed: int = 0, units: int = 3,
                    features: int = 2) -> BuiltModel:
    """``input`` [batch, time, features] → cond(is_train, dropout(rate=``dropout``), identity)
    → dynamic_rnn(DropoutWrapper(cell, output_keep_prob=cond(is_train, 0.75, 1))) → last
    step → MatMul → ``output``."""
    from tf_keras.src.layers.rnn import legacy_cell_wrappers, legacy_cells
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, features], name="input")
        is_train = tf.compat.v1.placeholder(tf.bool, [], name="is_train")
        rate = tf.compat.v1.placeholder(tf.float32, None, name="dropout")   # unknown rank
        x = tf.compat.v1.cond(is_train, lambda: tf.nn.dropout(x, rate=rate),
                              lambda: tf.identity(x), name="input_dropout")
        keep = tf.compat.v1.cond(is_train, lambda: 0.75, lambda: 1.0, name="keep_prob")
        cell = legacy_cell_wrappers.DropoutWrapper(getattr(legacy_cells, f"{kind}Cell")(units),
                                                   output_keep_prob=keep)
        outputs, _ = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
        head = tf.constant(r.normal(0, 0.5, (units, 2)).astype("float32"), name="head")
        tf.identity(tf.matmul(outputs[:, -1], head), name="output")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for variable in tf.compat.v1.global_variables():
                variable.load(r.normal(0, 0.5, variable.shape).astype("float32"), session)
            graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), ["output"])
    return BuiltModel(graph_def, ["input"], ["output"], "is_train")


def lowered_array_loop(seed: int = 0, features: int = 2, *, ask_length: bool = False
                       ) -> BuiltModel:
    """``x`` [batch, time, features] → a tf.while_loop writing ``tanh(x[:, t] @ W)`` at index
    ``t`` of a TensorArray, stacked, frozen by TF2 with lowering. ``ask_length``: the step is
    multiplied by the array's current size (``TensorListLength`` in the body)."""
    from tensorflow.python.framework.convert_to_constants import \
        convert_variables_to_constants_v2
    weight = tf.Variable(rng(seed).normal(0, 0.5, (features, features)).astype("float32"))

    def loop(x):
        steps = tf.shape(x)[1]
        array = tf.TensorArray(tf.float32, size=0 if ask_length else steps,
                               dynamic_size=ask_length)

        def body(i, array):
            step = tf.tanh(tf.matmul(x[:, i], weight))
            if ask_length:
                step *= tf.cast(array.size(), tf.float32)
            return i + 1, array.write(i, step)
        _, array = tf.while_loop(lambda i, _: i < steps, body, [0, array])
        return tf.identity(array.stack(), name="output")
    function = tf.function(loop).get_concrete_function(
        tf.TensorSpec([None, None, features], tf.float32, name="x"))
    graph_def = convert_variables_to_constants_v2(function).graph.as_graph_def()
    return BuiltModel(graph_def, ["x"], [function.outputs[0].op.name])


def tf1_array_concat_loop(seed: int = 0, features: int = 2, pieces: int = 3) -> BuiltModel:
    """``input`` [n, features] → a v1 while loop writing ``tanh(input[:i + 1] @ W)`` (a piece
    of i + 1 rows) into a TensorArray, concatenated after the loop → ``output``."""
    r = rng(seed)
    with v1_graph() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="input")
        weight = tf.constant(r.normal(0, 0.5, (features, features)).astype("float32"))
        array = tf.TensorArray(tf.float32, size=pieces, infer_shape=False)

        def body(i, array):
            return i + 1, array.write(i, tf.tanh(tf.matmul(x[:i + 1], weight)))
        _, array = tf.compat.v1.while_loop(lambda i, _: i < pieces, body, [0, array])
        tf.identity(array.concat(), name="output")
    return BuiltModel(graph.as_graph_def(), ["input"], ["output"])


def keras3_lowered(kind: str = "LSTM", seed: int = 0, *, units: int = 3, features: int = 2,
                   batch=None, dropout: float = 0.25, repaired: bool = True):
    """A Keras 3 ``kind`` layer (+ Dense) frozen by TF2 *with lowering* (input ``x``, output
    ``Identity``). With dropout, TF's own ``convert_variables_to_constants_v2`` refuses the
    model (its seed-state assignments now write to constants): the graph is TF's converter's
    output before that check, and ``repaired`` drops those assignments as tf2onnx's loader does
    (``fix_freezing_errors``) — the two .pb files such a user can have. ``batch``: a fixed batch
    size (the loop's list then has a fully known element shape). Returns (the BuiltModel, the
    concrete function it was frozen from)."""
    import keras
    from tensorflow.python.framework import convert_to_constants as freezing
    layer = getattr(keras.layers, kind)(units, dropout=dropout, recurrent_dropout=dropout)
    model = keras.Sequential([keras.Input((None, features), batch_size=batch), layer,
                              keras.layers.Dense(2)])
    r = rng(seed)
    for weight in model.weights:
        weight.assign(r.normal(0, 0.5, weight.shape).astype("float32"))
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([batch, None, features], tf.float32, name="x"))
    data = freezing._FunctionConverterDataInEager(           # noqa: SLF001 - TF's own converter,
        func=function, lower_control_flow=True, aggressive_inlining=False)  # minus its check
    graph_def, _ = freezing._replace_variables_by_constants(converter_data=data)  # noqa: SLF001
    if repaired:
        from tf2onnx import tf_loader
        graph_def = tf_loader.fix_freezing_errors(graph_def)
    return BuiltModel(graph_def, ["x"], [function.outputs[0].op.name]), function
