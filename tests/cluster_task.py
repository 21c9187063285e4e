"""Models and a callback for the tests of what a cluster reports (tests/test_cluster_trust.py):
named by `_target_` on the workers' command lines, so importable from the repository root."""

from __future__ import annotations

import json

import keras
import tensorflow as tf


def batch_norm_model(input_shape: tuple[int, ...], num_classes: int,
                     dropout: float = 0.0) -> keras.Model:
    """Conv 8, BatchNormalization (per replica unless sync_batchnorm), ReLU, softmax."""
    del dropout
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    x = keras.layers.Activation("relu")(keras.layers.BatchNormalization()(x))
    outputs = keras.layers.Dense(num_classes, activation="softmax")(keras.layers.Flatten()(x))
    return keras.Model(inputs, outputs, name="batch_norm")


class OwnLosses(keras.Model):
    """A model whose own `train_step` and `test_step` log their own dict of losses, as
    keras.io's VAE does: a `Mean` tracker per loss, named otherwise than its log, so Keras
    reports the step's logs (not the trackers' results). Distribution-aware as Keras's own
    step: the gradient is of the loss divided by the replicas in sync (Keras's optimizer
    sums the replicas' gradients)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.total = keras.metrics.Mean(name="total_tracker")
        self.penalty = keras.metrics.Mean(name="penalty_tracker")

    @property
    def metrics(self):
        return [self.total, self.penalty]

    def _compute_both(self, data, training):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        predicted = self(x, training=training)
        crossentropy = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, predicted))
        penalty = 0.01 * keras.ops.mean(keras.ops.square(predicted))
        return crossentropy + penalty, penalty

    def _logs(self, loss, penalty):
        self.total.update_state(loss)
        self.penalty.update_state(penalty)
        return {"loss": self.total.result(), "penalty": self.penalty.result()}

    def train_step(self, data):
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        with tf.GradientTape() as tape:
            loss, penalty = self._compute_both(data, training=True)
            scaled = loss / replicas
        gradients = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply(gradients, self.trainable_weights)
        return self._logs(loss, penalty)

    def test_step(self, data):
        return self._logs(*self._compute_both(data, training=False))


def own_losses_model(input_shape: tuple[int, ...], num_classes: int,
                     dropout: float = 0.0) -> keras.Model:
    """Flatten, softmax, in `OwnLosses`; seeded, so every worker and run starts alike."""
    del dropout
    inputs = keras.Input(shape=tuple(input_shape))
    outputs = keras.layers.Dense(num_classes, activation="softmax",
                                 kernel_initializer=keras.initializers.GlorotUniform(seed=1))(
        keras.layers.Flatten()(inputs))
    return OwnLosses(inputs, outputs, name="own_losses")


class PrintLogs(keras.callbacks.Callback):
    """Prints each epoch's logs at full precision: `LOGS {"epoch": 0, "loss": ...}`."""

    def on_epoch_end(self, epoch, logs=None):
        print("LOGS " + json.dumps({"epoch": epoch, **{k: float(v) for k, v in
                                                       (logs or {}).items()}}), flush=True)
