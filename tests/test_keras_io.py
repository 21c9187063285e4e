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


# 2 replicas under loop=fit: tests/test_porting.py runs the doc's VAE so
@pytest.mark.parametrize("devices, extra", [(1, ["loss=null"]), (2, ["loop=custom"])])
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


def _regression(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 5)).astype("float32")
    return x, (x @ np.arange(1, 6, dtype="float32") / 5)[:, None]


def _sgd_builder():
    def build_regression():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    return build_regression


def test_arrays_with_no_batch_setting_train_at_keras_32_and_the_scripts_rate(tmp_path):
    """`fit(x, y)` trains at 32 examples a step: `data=(x, y)` with no batch override on 2
    replicas is a global batch of 32 (16 each), the compiled rate 0.05 unscaled, and ends
    with the weights Keras's `fit(x, y, shuffle=False)` reaches on one device."""
    x, y = _regression(96)
    build_regression = _sgd_builder()
    result = trainer.fit([*QUIET, "devices=2", "dataset.shuffle=false"],
                         model=build_regression, data=(x, y), run_dir=tmp_path / "run")
    batch, rate = result.summary["batch"], result.summary["learning_rate"]
    assert (batch["global"], batch["per_replica"]) == (32, 16)
    assert rate["base"] == pytest.approx(0.05) and rate["scaled"] == pytest.approx(0.05)
    reference = build_regression()
    reference.fit(x, y, epochs=1, shuffle=False, verbose=0)
    trained = keras.models.load_model(result.checkpoints["last"]).get_weights()
    assert max(float(np.abs(a - b).max())
               for a, b in zip(trained, reference.get_weights(), strict=True)) < 1e-5


def test_kerass_32_over_three_replicas_rounds_up_to_an_even_split(tmp_path):
    """Keras's strategies split 32 over 3 replicas as 11, 11, 10; trainer splits evenly, so
    the batch nobody chose becomes 33 (11 each) and the rate scales with it, where it was
    refused ("batch.global_size=32 does not divide evenly over 3 replicas")."""
    result = trainer.fit([*QUIET, "devices=3"], model=_sgd_builder(), data=_regression(96),
                         run_dir=tmp_path / "run")
    batch, rate = result.summary["batch"], result.summary["learning_rate"]
    assert (batch["global"], batch["per_replica"]) == (33, 11)
    assert rate["scaled"] == pytest.approx(0.05 * 33 / 32)


def test_batch_global_size_alone_sets_the_global_batch(tmp_path):
    """`batch.global_size=48` without `batch.per_replica=null`: 24 per replica on 2."""
    result = trainer.fit([*QUIET, "devices=2", "batch.global_size=48"],
                         model=_sgd_builder(), data=_regression(96), run_dir=tmp_path / "run")
    batch = result.summary["batch"]
    assert (batch["global"], batch["per_replica"]) == (48, 24)


def _jit_builder():
    def build_jit():
        model = _sgd_builder()()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=True)
        return model

    return build_jit


def test_a_models_jit_compile_is_honoured_or_trained_without_and_said(tmp_path):
    """`compile(jit_compile=True)` in the builder: the step is compiled by XLA on one device
    (the summary says why); on 2 CPU replicas, where XLA cannot run, and beside the config's
    `jit_compile=false`, the run trains without XLA and the summary says why: the user's own
    argument is never a refusal."""
    result = trainer.fit([*QUIET, "devices=1"], model=_jit_builder(), data=_regression(64),
                         run_dir=tmp_path / "run")
    assert result.summary["jit_compile"] is True
    assert any(r == "jit_compile=true: the model was compiled with jit_compile=True"
               for r in result.summary["speed_reasons"])
    for overrides, said in ((["devices=2"], "XLA cannot run on 2 CPU replicas"),
                            (["devices=1", "jit_compile=false"], "asked for by the config")):
        result = trainer.fit([*QUIET, *overrides], model=_jit_builder(), data=_regression(64),
                             run_dir=tmp_path / said.replace(" ", "_"))
        assert result.summary["jit_compile"] is False
        assert any(r.startswith("jit_compile=false: ") and said in r
                   for r in result.summary["speed_reasons"]), result.summary["speed_reasons"]


SCRIPT_CALLBACK = '''
import keras

class CountEpochs(keras.callbacks.Callback):
    """A script's own callback, defined in its __main__."""

    def __init__(self):
        super().__init__()
        self.epochs, self.losses = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)
        self.losses.append(logs["loss"])
'''


@pytest.mark.parametrize("overrides", [["devices=1"], ["devices=2"],
                                       ["devices=2", "loop=custom"]],
                         ids=["one-device", "two-replicas", "two-replicas-custom-loop"])
def test_a_scripts_callback_is_called_every_epoch(tmp_path, overrides):
    """`trainer.fit(callbacks=[...])` with a class defined in a script's `__main__`: called
    at every epoch's end with the epoch's logs, as `model.fit` calls it, and named in the
    summary."""
    namespace = {"__name__": "__main__"}
    exec(compile(SCRIPT_CALLBACK, "script.py", "exec"), namespace)  # noqa: S102
    counter = namespace["CountEpochs"]()
    result = trainer.fit([*QUIET, *overrides, "epochs=3"], model=_sgd_builder(),
                         data=_regression(64), run_dir=tmp_path / "run", callbacks=[counter])
    assert counter.epochs == [0, 1, 2]
    assert counter.losses == pytest.approx(result.history["loss"])
    assert result.summary["callbacks"] == ["CountEpochs"]


@pytest.mark.parametrize("callbacks, said", [
    ("early_stopping", "takes callbacks as a list of Keras callbacks"),
    ([print], "callbacks[0] must be a keras.callbacks.Callback object"),
])
def test_callbacks_that_are_not_keras_callbacks_are_one_line(tmp_path, callbacks, said):
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit([*QUIET, "devices=1"], model=_sgd_builder(), data=_regression(64),
                    run_dir=tmp_path / "run", callbacks=callbacks)
    assert said in str(error.value) and "\n" not in str(error.value)


def test_a_compiled_model_instance_is_rebuilt_in_scope_and_gets_its_trained_weights(
        tmp_path):
    """A compiled model instance in the command-line form's `model=` too: trained on 2
    replicas from its own weights and compile arguments, the trained weights written back
    into it (those of `last.keras`)."""
    model = _sgd_builder()()
    before = [w.copy() for w in model.get_weights()]
    result = trainer.fit([*QUIET, "devices=2"], model=model, data=_regression(64),
                         run_dir=tmp_path / "run")
    assert result.summary["replicas"] == 2
    last = keras.saving.load_model(result.checkpoints["last"])
    for mine, saved, old in zip(model.get_weights(), last.get_weights(), before, strict=True):
        np.testing.assert_array_equal(mine, saved)
        assert not np.array_equal(mine, old)


def test_a_subclassed_model_keras_cannot_rebuild_is_one_line_before_training(tmp_path):
    class NoConfig(keras.Model):
        def __init__(self, units):
            super().__init__()
            self.dense = keras.layers.Dense(units)

        def call(self, x):
            return self.dense(x)

    model = NoConfig(1)
    model(np.zeros((1, 3), "float32"))
    model.compile("sgd", "mse")
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit([*QUIET, "devices=1"], model=model, data=_regression(64),
                    run_dir=tmp_path / "run")
    line = str(error.value)
    assert line.startswith("trainer.fit cannot rebuild the model") and "\n" not in line
    assert "get_config()" in line and "model=build" in line
    assert not (tmp_path / "run").exists()


def test_resuming_an_objects_run_without_its_objects_is_the_documented_line(tmp_path):
    """docs/api.md: without the objects, one line saying which the run was started from
    and what to pass (not a diff of the config's markers)."""
    build_regression = _sgd_builder()
    trainer.fit([*QUIET, "devices=1"], model=build_regression, data=_regression(64),
                run_dir=tmp_path / "run")
    for given, role in (({}, "model"), ({"model": build_regression}, "data")):
        with pytest.raises(trainer.TrainerError) as error:
            trainer.fit([*QUIET, "devices=1", "epochs=2", f"resume={tmp_path / 'run'}"],
                        **given)
        assert str(error.value).startswith(f"this run's {role} was a Python object")
        assert f"pass it again ({role}=... to trainer.fit" in str(error.value)


@pytest.mark.parametrize("inputs_alone, said", [
    (False, "was created outside the strategy's scope"),
    (True, "compiled the model with loss mse, which needs targets"),
])
def test_variables_made_outside_the_scope_are_one_line(tmp_path, inputs_alone, said):
    """A layer built before the builder runs (at a script's top level) is not mirrored:
    one line naming its variable, before training (it failed in the first step with a bare
    AssertionError); inputs alone for a loss that needs targets is one line too (trainer's
    own message crashed on the missing targets)."""
    outside = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])

    def build_around():
        inner = (keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)]) if inputs_alone
                 else outside)
        model = keras.Sequential([inner])
        model.compile(optimizer="sgd", loss="mse")
        return model

    x, y = _regression(64)
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit([*QUIET, "devices=2"], model=build_around,
                    data=x if inputs_alone else (x, y), run_dir=tmp_path / "run")
    assert said in str(error.value) and "\n" not in str(error.value)


def test_weighted_metrics_are_taken_as_kerass_compile_takes_them(tmp_path):
    """`weighted_metrics=[mae]` with sample weights on 2 replicas: logged under the names
    Keras's `fit` logs, with the value it reaches on one device."""
    x, y = _regression(64)
    w = np.linspace(0.1, 2.0, 64).astype("float32")

    def build_uncompiled():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])

    result = trainer.fit([*QUIET, "devices=2", "loss=mse", "weighted_metrics=[mae]",
                          "dataset.shuffle=false"], model=build_uncompiled, data=(x, y, w),
                         run_dir=tmp_path / "run")
    reference = build_uncompiled()
    reference.compile(optimizer=keras.optimizers.Adam(0.001), loss="mse",
                      weighted_metrics=["mae"])
    logs = reference.fit(x, y, sample_weight=w, epochs=1, shuffle=False, verbose=0).history
    assert sorted(result.history) == sorted(logs)
    assert result.history["mae"][0] == pytest.approx(logs["mae"][0], rel=1e-4)
