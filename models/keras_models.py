"""Keras-made frozen graphs: Keras 3 (`tf.keras`) and legacy Keras 2 (`tf_keras`).

Keras 3 models are frozen the TF2 way (concrete function + convert_variables_to_constants_v2), so
their BN is decomposed (Rsqrt/Mul/Sub/AddV2) behind ReadVariableOp Identities. The tf_keras model
is built in graph mode in a child process (graph mode and v1 behaviour are process-global there),
giving FusedBatchNorm and Dropout under Switch/Merge driven by `keras_learning_phase`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework.convert_to_constants import (
    convert_variables_to_constants_v2)

from tfsurgery.models.common import BuiltModel, rng

_APPLICATIONS = ("MobileNetV2", "ResNet50", "EfficientNetB0")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- random weights ---------------------------------------------------------------------------

def _fan_in(leaf: str, shape, layer=None) -> int:
    """Inputs feeding one output unit, per kernel layout."""
    if layer is not None:  # Keras 3 names every kernel "kernel": go by layer type
        L = tf.keras.layers
        if isinstance(layer, L.DepthwiseConv2D):
            leaf = "depthwise_kernel"
        elif isinstance(layer, (L.Conv2DTranspose, L.Conv3DTranspose)):
            return int(np.prod(shape[:-2]) * shape[-1])      # [h, w, out, in]
    if leaf == "depthwise_kernel":
        return int(np.prod(shape[:-2]))                      # [h, w, in, multiplier]
    return int(np.prod(shape[:-1]))                          # [..., in, out]


def _random_weight(r: np.random.Generator, leaf: str, shape, layer=None):
    """A random value for a weight named `leaf`, or None to leave it (e.g. Normalization/count).

    Kernels are He-normal; BN/Normalization statistics are positive variances and non-zero means.
    """
    if leaf in ("kernel", "depthwise_kernel"):
        return r.standard_normal(shape) * np.sqrt(2.0 / _fan_in(leaf, shape, layer))
    if leaf == "gamma":
        return r.uniform(0.5, 1.5, shape)
    if leaf in ("moving_variance", "variance"):
        return r.uniform(0.5, 1.5, shape)
    if leaf in ("beta", "bias", "moving_mean", "mean"):
        return r.normal(0.0, 0.1, shape)
    return None


def _leaf(variable_name: str) -> str:
    """'block1/conv/kernel:0' -> 'kernel'."""
    return variable_name.split(":")[0].rsplit("/", 1)[-1]


def _randomise_keras3(model, r: np.random.Generator) -> None:
    """Randomise every float weight, then give BN statistics that roughly match the activations.

    Purely random moving statistics make deep nets (ResNet50, EfficientNet) either blow up or go
    input-independent. So: one training-mode pass with momentum 0 sets each BN's moving
    statistics to a random batch's statistics; then they are perturbed (mean shifted, variance
    floored at 10% of the layer mean — 1x1 late layers see few samples — and scaled), so the
    network still is not exactly normalised and folding errors stay visible.
    """
    keras = tf.keras
    for layer in model.layers:
        for v in layer.weights:
            value = _random_weight(r, _leaf(v.path), tuple(v.shape), layer)
            if value is not None:
                v.assign(value.astype(v.dtype))
        if isinstance(layer, keras.layers.Normalization):
            layer.finalize_state()  # its call reads mean/variance copied from the variables here

    bns = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    drops = [l for l in model.layers if isinstance(l, keras.layers.Dropout)]
    saved = [(l, "momentum", l.momentum) for l in bns] + [(l, "rate", l.rate) for l in drops]
    for layer, attr, _ in saved:
        setattr(layer, attr, 0.0)  # moving stats := batch stats; no dropout noise in them
    batch = r.standard_normal((32, *model.input_shape[1:])).astype(np.float32)
    model(batch, training=True)
    for layer, attr, value in saved:
        setattr(layer, attr, value)

    for bn in bns:
        var = bn.moving_variance.numpy()
        std = np.sqrt(var)
        bn.moving_mean.assign(bn.moving_mean.numpy() + r.normal(0.0, 0.1, std.shape) * std)
        var = np.maximum(var, 0.1 * var.mean()) * r.uniform(0.7, 1.4, var.shape)
        bn.moving_variance.assign(var.astype(np.float32))


# --- Keras 3 ----------------------------------------------------------------------------------

def _freeze_keras3(model) -> BuiltModel:
    """Trace model(x, training=False) with a batch-free input named `input` and freeze it."""
    spec = tf.TensorSpec([None, *model.input_shape[1:]], tf.float32, name="input")
    fn = tf.function(lambda x: model(x, training=False))
    frozen = convert_variables_to_constants_v2(fn.get_concrete_function(spec))
    graph_def = frozen.graph.as_graph_def()
    inputs = [t.op.name for t in frozen.inputs]
    outputs = [t.op.name for t in frozen.outputs]
    return BuiltModel(graph_def, inputs, outputs, None)


def _keras3_built(model, seed: int) -> BuiltModel:
    _randomise_keras3(model, rng(seed))
    return _freeze_keras3(model)


def keras_application(name: str, seed: int = 0, input_size=None, **options) -> BuiltModel:
    """A `tf.keras.applications.<name>` (MobileNetV2, ResNet50, EfficientNetB0), randomised and
    frozen. input_size defaults to 32 (the smallest all three accept); ``options`` go to the
    application (MobileNetV2's ``alpha``)."""
    if name not in _APPLICATIONS:
        raise ValueError(f"unknown application {name!r}; expected one of {_APPLICATIONS}")
    size = input_size or 32
    model = getattr(tf.keras.applications, name)(weights=None, input_shape=(size, size, 3),
                                                 **options)
    return _keras3_built(model, seed)


def keras3_small(seed: int = 0, size: int = 12, classes: int = 5) -> BuiltModel:
    """Conv2D(+bias) -> BN -> ReLU -> DepthwiseConv2D -> BN -> Conv2D(no bias) -> BN ->
    GlobalAvgPool -> Dense -> BN -> Dense. Layers are named so node names do not depend on what
    Keras built earlier in the process."""
    L = tf.keras.layers
    inp = tf.keras.Input((size, size, 3), name="input")
    x = L.Conv2D(8, 3, padding="same", name="conv1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(name="relu1")(x)
    x = L.DepthwiseConv2D(3, padding="same", name="dwconv")(x)
    x = L.BatchNormalization(name="bn2")(x)
    x = L.Conv2D(8, 1, use_bias=False, name="conv2")(x)
    x = L.BatchNormalization(name="bn3")(x)
    x = L.GlobalAveragePooling2D(name="pool")(x)
    x = L.Dense(16, name="dense1")(x)
    x = L.BatchNormalization(name="bn4")(x)
    out = L.Dense(classes, name="dense2")(x)
    return _keras3_built(tf.keras.Model(inp, out, name="keras3_small"), seed)


def keras3_conv3d(seed: int = 0, size: int = 6, depth: int = 4) -> BuiltModel:
    """Conv3D(+bias) -> BN -> ReLU on a [depth, size, size, 2] volume (channels last)."""
    L = tf.keras.layers
    inp = tf.keras.Input((depth, size, size, 2), name="input")
    x = L.Conv3D(4, 3, padding="same", name="conv3d")(inp)
    x = L.BatchNormalization(name="bn")(x)
    out = L.ReLU(name="relu")(x)
    return _keras3_built(tf.keras.Model(inp, out, name="keras3_conv3d"), seed)


def keras3_conv_transpose(seed: int = 0, size: int = 6) -> BuiltModel:
    """Conv2DTranspose(stride 2, +bias) -> BN -> ReLU. The kernel is [h, w, out, in]."""
    L = tf.keras.layers
    inp = tf.keras.Input((size, size, 3), name="input")
    x = L.Conv2DTranspose(4, 3, strides=2, padding="same", name="deconv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    out = L.ReLU(name="relu")(x)
    return _keras3_built(tf.keras.Model(inp, out, name="keras3_conv_transpose"), seed)


# --- legacy Keras 2 (tf_keras), graph mode, in a child process --------------------------------

def tf_keras_model(seed: int = 0) -> BuiltModel:
    """A tf_keras model frozen in graph mode: conv, depthwise conv, dilated conv (which TF lowers
    to SpaceToBatchND/Conv2D/BatchToSpaceND), Dense + BN, Dropout; FusedBatchNormV3 and Dropout
    sit under Switch/Merge on the `keras_learning_phase` flag.

    Graph mode needs `disable_v2_behavior()`, which is process-global, so the model is built by
    `sys.executable` in a child process that hands back the GraphDef through a temp file.
    """
    with tempfile.TemporaryDirectory() as tmp:
        code = f"import tfsurgery.models.keras_models as k; k._build_tf_keras_to({seed}, {tmp!r})"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
        proc = subprocess.run([sys.executable, "-c", code], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"tf_keras build failed:\n{proc.stderr[-3000:]}")
        with open(os.path.join(tmp, "model.pb"), "rb") as f:
            graph_def = graph_pb2.GraphDef.FromString(f.read())
        with open(os.path.join(tmp, "model.json")) as f:
            names = json.load(f)
    return BuiltModel(graph_def, names["inputs"], names["outputs"], names["training_flag"])


def _build_tf_keras_to(seed: int, out_dir: str) -> None:
    """Child-process half of `tf_keras_model`: build, randomise, freeze, write model.pb/.json."""
    tf.compat.v1.disable_v2_behavior()  # graph mode + v1 control flow, for this process only
    import tf_keras
    from tf_keras.src import backend

    L = tf_keras.layers
    inp = tf_keras.Input((12, 12, 3), name="input")
    x = L.Conv2D(8, 3, padding="same", name="conv1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(name="relu1")(x)
    x = L.DepthwiseConv2D(3, padding="same", name="dwconv")(x)
    x = L.BatchNormalization(name="bn2")(x)
    x = L.ReLU(name="relu2")(x)
    x = L.Conv2D(8, 3, padding="same", dilation_rate=2, use_bias=False, name="dilated")(x)
    x = L.BatchNormalization(name="bn3")(x)
    x = L.GlobalAveragePooling2D(name="pool")(x)
    x = L.Dense(16, name="dense1")(x)
    x = L.BatchNormalization(name="bn4")(x)
    x = L.Dropout(0.3, name="dropout")(x)
    out = L.Dense(5, activation="softmax", name="output")(x)
    model = tf_keras.Model(inp, out)

    r = rng(seed)
    for layer in model.layers:
        values = []
        for v in layer.weights:
            value = _random_weight(r, _leaf(v.name), tuple(v.shape))
            values.append(value.astype(np.float32))
        layer.set_weights(values)  # also initialises the variables in the session

    sess = backend.get_session()
    output = model.output.op.name
    graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
        sess, sess.graph.as_graph_def(), [output])
    with open(os.path.join(out_dir, "model.pb"), "wb") as f:
        f.write(graph_def.SerializeToString())
    with open(os.path.join(out_dir, "model.json"), "w") as f:
        json.dump({"inputs": [model.input.op.name], "outputs": [output],
                   "training_flag": "keras_learning_phase"}, f)
