"""Data and models for `tests/test_objects.py` by dotted name: a VAE-like model with its own
`train_step` (trained on inputs alone), and a small regression."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def regression(n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` rows of 5 features and a linear target, the same on every call."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 5)).astype("float32")
    return x, (x @ np.arange(1, 6, dtype="float32") / 5)[:, None] + 0.1


@keras.saving.register_keras_serializable(package="objects_task")
class VAE(keras.Model):
    """Encoder to a mean and log-variance of 2 latents, a sampled latent, a decoder; its
    `train_step` minimises reconstruction error plus the KL term, on `x` alone."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoder = keras.Sequential([keras.layers.Dense(8, activation="relu"),
                                         keras.layers.Dense(4)])
        self.decoder = keras.Sequential([keras.layers.Dense(8, activation="relu"),
                                         keras.layers.Dense(6)])
        self.total = keras.metrics.Mean(name="loss")

    def call(self, x):
        return self.decoder(self.encoder(x)[:, :2])

    @property
    def metrics(self):
        return [self.total]

    def train_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        with tf.GradientTape() as tape:
            h = self.encoder(x)
            mean, log_var = h[:, :2], h[:, 2:]
            z = mean + tf.exp(0.5 * log_var) * tf.random.normal(tf.shape(mean), seed=1)
            error = tf.reduce_mean(tf.reduce_sum(tf.square(x - self.decoder(z)), -1))
            kl = -0.5 * tf.reduce_mean(tf.reduce_sum(1 + log_var - mean**2 - tf.exp(log_var),
                                                     -1))
            loss = error + kl
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
        self.total.update_state(loss)
        return {"loss": self.total.result()}

    def test_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        self.total.update_state(tf.reduce_mean(tf.reduce_sum(tf.square(x - self(x)), -1)))
        return {"loss": self.total.result()}


@keras.saving.register_keras_serializable(package="objects_task")
class Reconstructing(keras.layers.Layer):
    """A dense layer whose loss is its own reconstruction error (`add_loss`): a model of it
    trains on inputs alone, compiled with no loss."""

    def build(self, input_shape):
        self.dense = keras.layers.Dense(input_shape[-1])
        self.dense.build(input_shape)

    def call(self, x):
        y = self.dense(x)
        self.add_loss(keras.ops.mean(keras.ops.square(y - x)))
        return y


def build_vae() -> keras.Model:
    """The VAE, compiled with an optimizer and no loss (its `train_step` makes it)."""
    keras.utils.set_random_seed(2)
    model = VAE()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    return model


def load_x() -> np.ndarray:
    """96 rows of 6 features: inputs alone, no targets."""
    return np.random.default_rng(0).normal(size=(96, 6)).astype("float32")


def build_regression() -> keras.Model:
    """A small regression model, compiled with SGD and mean squared error."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def load_stream() -> tf.data.Dataset:
    """TensorFlow's multi-worker tutorial's form: 48 rows in batches of 16, repeated for
    ever (`steps_per_epoch` bounds an epoch)."""
    return tf.data.Dataset.from_tensor_slices(regression(48)).batch(16).repeat()


def load_passes() -> tf.data.Dataset:
    """The same 48 rows in batches of 16, finite: `steps_per_epoch=1` reads a pass over 3
    epochs."""
    return tf.data.Dataset.from_tensor_slices(regression(48)).batch(16)


class SigtermAt(keras.callbacks.Callback):
    """Sends this process SIGTERM after step `step` of epoch index `epoch`, as a scheduler
    would (`tests/test_resume.py` has one too, which a worker process cannot import)."""

    def __init__(self, epoch: int, step: int) -> None:
        super().__init__()
        self.at, self.epoch = (epoch, step), 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch + 1) == self.at:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
