"""A small CNN trained on scikit-learn's bundled handwritten digits (real data, no download)."""
import functools

import numpy as np
from tensorflow.core.framework import graph_pb2

TRAIN, CALIBRATE = 1000, 400            # rows of load_digits' 1,797; the rest are unseen


def digits():
    from sklearn.datasets import load_digits
    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[..., None]      # (1797, 8, 8, 1) in [0, 1]
    order = np.random.default_rng(0).permutation(len(images))     # writers spread over parts
    return images[order], data.target.astype(np.int64)[order]


def trained_cnn(images, labels):
    """Conv-ReLU ×2 → Dense, trained a few epochs with fixed seeds; frozen (Keras 3)."""
    import keras
    from models.keras_models import _freeze_keras3
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images[:TRAIN], labels[:TRAIN], epochs=12, batch_size=32, verbose=0)
    return _freeze_keras3(model)


@functools.lru_cache(maxsize=None)
def _trained():
    images, labels = digits()
    return images, labels, trained_cnn(images, labels).graph_def.SerializeToString()


def digits_on_disk(folder):
    """The trained digits CNN (trained once per test process: every int8 test module shares it)
    as ``folder/digits.pb``, its calibration rows as ``folder/calibration.npz``. Returns (the
    .pb's path, images, labels, a GraphDef of its own)."""
    images, labels, serialized = _trained()
    pb = folder / "digits.pb"
    pb.write_bytes(serialized)
    np.savez(folder / "calibration.npz", input=images[TRAIN:TRAIN + CALIBRATE])
    return pb, images, labels, graph_pb2.GraphDef.FromString(serialized)
