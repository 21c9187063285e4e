"""Models as keras.io writes them (#50): a `keras.Model` subclass with its own
`train_step(self, data)` and no `call()` or `test_step`, compiled with an optimizer alone and
fitted on inputs alone (keras.io's VAE is of this form: `vae.fit(mnist_digits, ...)`).

Keras's `fit` never calls such a model, and passes its `train_step` the images themselves,
not a 1-tuple: trainer does the same, on 1 device and on 2 replicas, and says in one line
what is missing only where something would need it (a validation split).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import trainer

QUIET = ["verbose=0", "logger=[]", "accelerator=cpu", "epochs=1"]


class Sampling(keras.layers.Layer):
    """Draws z from (mean, log-variance)."""

    def call(self, inputs):
        mean, log_var = inputs
        return mean + tf.exp(0.5 * log_var) * tf.random.normal(tf.shape(mean))


class AsKerasIoWritesIt(keras.Model):
    """keras.io's VAE's form: a `train_step` that encodes `data` as it comes (a tensor of
    images, never a tuple), no `call`, no `test_step`."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            error = tf.reduce_mean(tf.reduce_sum(
                keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
            kl = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            kl = tf.reduce_mean(tf.reduce_sum(kl, axis=1))
            total = error + kl
        grads = tape.gradient(total, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))  # noqa: B905 - as keras.io
        self.total_loss_tracker.update_state(total)
        self.kl_loss_tracker.update_state(kl)
        return {"loss": self.total_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}


def build():
    """The encoder and decoder (28x28x1 images, 2 latents), the model compiled with Adam's
    defaults alone."""
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu", strides=4, padding="same")(inputs)
    x = keras.layers.Flatten()(x)
    z_mean, z_log_var = keras.layers.Dense(2)(x), keras.layers.Dense(2)(x)
    encoder = keras.Model(inputs, [z_mean, z_log_var, Sampling()([z_mean, z_log_var])])
    latent = keras.Input(shape=(2,))
    x = keras.layers.Dense(7 * 7 * 4, activation="relu")(latent)
    x = keras.layers.Reshape((7, 7, 4))(x)
    outputs = keras.layers.Conv2DTranspose(1, 3, activation="sigmoid", strides=4,
                                           padding="same")(x)
    vae = AsKerasIoWritesIt(encoder, keras.Model(latent, outputs))
    vae.compile(optimizer=keras.optimizers.Adam())
    return vae


DIGITS = np.random.default_rng(0).uniform(size=(64, 28, 28, 1)).astype("float32")


@pytest.mark.parametrize("devices, extra", [(1, ["loss=null"]), (2, ["loop=custom"]), (2, [])])
def test_a_model_with_no_call_and_no_test_step_trains_on_inputs_alone(tmp_path, devices,
                                                                      extra):
    """Nothing calls the model, its `train_step` receives the images (a tuple would fail
    its loss on a shape (1, None, 28, 28, 1)), nothing asks for a `test_step` where nothing
    is validated, and `loss=null` is no loss."""
    result = trainer.fit([*QUIET, f"devices={devices}", "batch.per_replica=16", *extra],
                         model=build, data=DIGITS, run_dir=tmp_path / "run")
    assert result.summary["replicas"] == devices
    assert sorted(result.history) == ["kl_loss", "loss"]
    assert np.isfinite(result.history["loss"][0])
    assert result.summary["loss"].startswith("none compiled")


def test_with_a_validation_split_a_missing_test_step_is_one_line(tmp_path):
    """Validation would need the `test_step` (or a `call`) the model lacks: said before
    training, naming the class and the split."""
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit([*QUIET, "devices=1"], model=build,
                    data={"train": DIGITS[:48], "validation": DIGITS[48:]},
                    run_dir=tmp_path / "run")
    message = str(error.value)
    assert "\n" not in message
    assert "AsKerasIoWritesIt trains with its own train_step, but has no test_step" in message
    assert "the run has a validation split" in message


def test_a_model_with_no_call_and_no_train_step_is_one_line(tmp_path):
    """Keras's own step would call the model: a class with neither is named."""

    class Empty(keras.Model):
        pass

    def build_empty():
        model = Empty()
        model.compile(optimizer="adam", loss="mse")
        return model

    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit([*QUIET, "devices=1"], model=build_empty,
                    data=(DIGITS, DIGITS), run_dir=tmp_path / "run")
    assert "model class Empty defines no call()" in str(error.value)
