"""A small CNN trained on scikit-learn's bundled handwritten digits (real data, no download)."""
import numpy as np

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
