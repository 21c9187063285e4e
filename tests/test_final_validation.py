"""The run's final validation (the summary's `validation_metrics`) scores what `last.keras`
holds. Where training's last validation scored exactly those weights on every replica, its
numbers are taken, not computed by a second pass over the split; where anything changed
them since, or the replicas differ, the split is evaluated again."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

import trainer.run.end.finish as finish
from trainer.distribute.multiworker import weights_digest
from trainer.evaluate import evaluate_run
from trainer.run.train import train


def with_batch_norm(input_shape, num_classes, dropout=0.0):
    """The tests' small network with batch normalization: each replica keeps its own moving
    statistics, so two replicas end holding different weights."""
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs)


@pytest.fixture
def validations(monkeypatch):
    """The splits the run's end evaluated: 'validation' or 'test', in order."""
    found = []
    evaluate = finish.evaluate_split

    def recorded(run, dataset, loop=None):
        found.append("validation" if dataset is run.data.validation else "test")
        return evaluate(run, dataset, loop)

    monkeypatch.setattr(finish, "evaluate_split", recorded)
    return found


def trained(config, run_dir):
    """`train` as the command line runs it: the composed config saved in the run directory
    first (Hydra's `.hydra/config.yaml`), which `trainer.evaluate` composes again."""
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(config, run_dir / ".hydra" / "config.yaml")
    return train(config, run_dir=run_dir)


def last_epochs(summary):
    return {k.removeprefix("val_"): v[-1] for k, v in summary["history"].items()
            if k.startswith("val_")}


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_the_last_validation_is_taken_where_it_scored_the_final_weights(
        tiny_config, tmp_path, validations, loop):
    summary = trained(tiny_config("accelerator=cpu", "devices=2", f"loop={loop}",
                                  "checkpoint.save_best=false"), tmp_path)
    assert validations == ["test"]  # no second pass over the validation split
    assert summary["validation_metrics"] == last_epochs(summary)
    again = evaluate_run(tmp_path, ["checkpoint=last", "split=validation"])
    assert again["metrics"] == pytest.approx(summary["validation_metrics"], rel=1e-6)


def test_replicas_that_differ_are_validated_again_on_the_first_ones_weights(
        tiny_config, tmp_path, validations):
    summary = trained(tiny_config("accelerator=cpu", "devices=2",
                                  f"model._target_={__name__}.with_batch_norm",
                                  "checkpoint.save_best=false"), tmp_path)
    assert validations == ["validation", "test"]
    again = evaluate_run(tmp_path, ["checkpoint=last", "split=validation"])
    assert again["metrics"] == pytest.approx(summary["validation_metrics"], rel=1e-6)
    # training's own validation scored a mix of the two replicas' statistics
    assert summary["validation_metrics"] != last_epochs(summary)


class HalvedAtTheEnd(keras.callbacks.Callback):
    """A user's callback that changes the weights after each epoch's validation (before
    `last.keras` is written at the end of training)."""

    def on_epoch_end(self, epoch, logs=None):
        kernel = self.model.weights[0]
        kernel.assign(kernel * 0.5)


def test_weights_changed_after_the_last_validation_are_validated_again(
        tiny_config, tmp_path, validations):
    config = tiny_config("checkpoint.save_best=false")
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(config, tmp_path / ".hydra" / "config.yaml")
    summary = train(config, run_dir=tmp_path, callbacks=[HalvedAtTheEnd()])
    assert validations == ["validation", "test"]
    again = evaluate_run(tmp_path, ["checkpoint=last", "split=validation"])
    assert again["metrics"] == pytest.approx(summary["validation_metrics"], rel=1e-6)
    assert summary["validation_metrics"] != last_epochs(summary)


def test_the_digest_follows_the_weights_and_is_none_where_replicas_differ():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    first = weights_digest(strategy, model)
    assert first is not None and weights_digest(strategy, model) == first
    kernel = model.weights[0]
    kernel.assign(kernel.numpy() + 1)  # every replica alike
    changed = weights_digest(strategy, model)
    assert changed is not None and changed != first
    copies = kernel.value.values
    copies[1].assign(copies[1].numpy() + 1)  # one replica alone
    assert weights_digest(strategy, model) is None
    alone = tf.distribute.OneDeviceStrategy("/cpu:0")
    with alone.scope():
        one = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert weights_digest(alone, one) is not None
    np.testing.assert_equal(weights_digest(alone, one), weights_digest(alone, one))
