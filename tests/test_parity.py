"""Keras parity on N replicas: what Keras's fit trains on one device trains on several,
with the same weights, through the whole run (`train`), on users' own tasks.

The tasks are in `parity_task.py`: dict inputs (numeric + categorical into an Embedding),
two heads (a class and a score, a loss per output, loss weights, metrics per output),
strings into a `TextVectorization`, a model with its own `train_step`. Each has 301
training rows at a global batch of 64: the last batch (45) splits unevenly over 2 replicas.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import TINY, _chooses_model, make_config
from tests.test_loop import strategy_for
from trainer.config.errors import ConfigError
from trainer.data.pipeline import (
    Batches,
    DataError,
    Epochs,
    Order,
    Source,
    build_training_epochs,
)
from trainer.internals.keras_step import build_from_one_replica
from trainer.run.assembly.step import exact_train_step
from trainer.run.train import train

RTOL = 1e-5
# plain SGD at a fixed rate: the weights compare to 1e-5
EXACT = ["optimizer=sgd", "optimizer.lr=0.3", "optimizer.lr_scaling=none",
         "optimizer.warmup_epochs=0", "optimizer.decay=none", "deterministic=true",
         "epochs=2", "batch.global_size=64", "batch.per_replica=null", "accelerator=cpu"]


class Keep(keras.callbacks.Callback):
    """Keeps the trained weights at the end of the run."""

    def on_train_end(self, logs=None):
        self.weights = self.model.get_weights()


def run(tiny_config, tmp_path, devices: int, *overrides: str, name: str = "run"):
    keep = Keep()
    summary = train(tiny_config(*EXACT, f"devices={devices}", *overrides),
                    run_dir=tmp_path / f"{name}{devices}", callbacks=[keep])
    return summary, keep.weights


def same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(y, x, rtol=RTOL, atol=1e-6)


def _tiny_config(*overrides: str):
    """What the `tiny_config` fixture composes, for runs made once per session."""
    small = [] if any(map(_chooses_model, overrides)) else ["model=small"]
    return make_config(*TINY, *small, *overrides)


# The tests that read the runs `trained` makes: one test process for them (`--dist
# loadgroup`), so each run is made once, in this module and in tests/test_keras_models.py.
SHARES_RUNS = pytest.mark.xdist_group("test_parity.trained")


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """`run` made once per session for each devices and overrides: the one-replica
    references (and runs) several tests compare with only, none writing into the run.

    Returns:
        A function of (devices, *overrides) returning `run`'s (summary, weights).
    """
    made = {}

    def once(devices: int, *overrides: str):
        key = (devices, *overrides)
        if key not in made:
            made[key] = run(_tiny_config, tmp_path_factory.mktemp("trained"), devices,
                            *overrides)
        return made[key]

    return once


DICT = ["model._target_=parity_task.dict_model", "dataset._target_=parity_task.dict_inputs"]
TWO = ["model._target_=parity_task.two_head_model",
       "dataset._target_=parity_task.two_targets",
       "loss={cls: sparse_categorical_crossentropy, reg: mean_squared_error}",
       "+loss_weights={cls: 1.0, reg: 0.5}", "metrics={cls: [accuracy], reg: [mae]}",
       "checkpoint.monitor=val_cls_accuracy"]


@SHARES_RUNS
def test_dict_inputs_count_examples_and_equal_one_replica(trained):
    one, w1 = trained(1, *DICT)
    two, w2 = trained(2, *DICT)
    assert two["train_examples"] == 301 and two["validation_examples"] == 29
    assert two["steps_per_epoch"] == 5
    same(w1, w2)
    # it learned: better than always answering the commoner class
    assert two["validation_metrics"]["accuracy"] > 0.75


@SHARES_RUNS
@pytest.mark.long  # the default run stays under 8 minutes on 2 cores
def test_several_steps_per_execution_under_fit_equal_one_step_on_one_replica(tiny_config,
                                                                            tmp_path, trained):
    """4 steps per graph call on 2 replicas, 5 steps per epoch (a chunk of 4, then 1): the
    same weights as one step per call on 1 replica, and no batch of the next epoch read."""
    one, w1 = trained(1, *DICT)
    four, w4 = run(tiny_config, tmp_path, 2, *DICT, "steps_per_execution=4", name="four")
    assert four["steps_per_execution"] == 4
    same(w1, w4)
    assert four["validation_metrics"] == pytest.approx(one["validation_metrics"], rel=1e-5)


@SHARES_RUNS
def test_two_heads_train_on_two_replicas_like_one(tiny_config, tmp_path, trained):
    one, w1 = trained(1, *TWO)
    two, w2 = run(tiny_config, tmp_path, 2, *TWO)
    same(w1, w2)
    logged = two["validation_metrics"]
    assert {"loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae"} <= set(logged)
    assert logged["cls_accuracy"] > 0.75
    # the score's error is below that of predicting its mean
    _, _, score = __import__("parity_task")._table(29, 1)
    assert logged["reg_mae"] < float(np.mean(np.abs(score - score.mean())))
    best = json.loads((tmp_path / "run2" / "checkpoints" / "best.keras.best.json").read_text())
    assert best["monitor"] == "val_cls_accuracy"


@SHARES_RUNS
def test_a_loss_per_output_trains_under_the_custom_loop_as_under_fit(tiny_config, tmp_path,
                                                                     trained):
    """The custom loop runs the model's compiled loss (a loss per output, loss weights) and
    metrics, as fit does: 2 replicas of it end where fit ends on 1, logging what fit logs."""
    fit, w1 = trained(1, *TWO)
    custom, w2 = run(tiny_config, tmp_path, 2, *TWO, "loop=custom")
    same(w1, w2)
    assert set(custom["history"]) == set(fit["history"])
    assert custom["validation_metrics"] == pytest.approx(fit["validation_metrics"], rel=1e-4)
    assert custom["train_metrics"] == pytest.approx(fit["train_metrics"], rel=1e-4)


def test_text_classifier_trains_and_evaluates_on_two_replicas(tiny_config, tmp_path):
    summary, _ = run(tiny_config, tmp_path, 2, "model._target_=parity_task.text_model",
                     "dataset._target_=parity_task.text", "optimizer=adam",
                     "optimizer.lr=0.01")
    assert summary["validation_metrics"]["accuracy"] > 0.8


def test_uneven_first_validation_batch_trains_under_fit(tiny_config, tmp_path):
    """29 validation images at a global batch of 32 on 2 replicas (Keras 3.15 reduced the
    first batch over the replicas to build the model, and failed on 15 + 14)."""
    summary = train(tiny_config("dataset=synthetic", "dataset.validation_examples=29",
                                "dataset.train_examples=64", "accelerator=cpu", "devices=2",
                                "dataset.image_size=8", "batch.per_replica=16"),
                    run_dir=tmp_path)
    assert summary["validation_examples"] == 29


def test_class_weight_changes_training_as_keras_class_weight(tmp_path):
    """The training batches trainer builds with class_weight, on 2 replicas, end where plain
    Keras's fit(class_weight=...) ends on one device with the same batches."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(75, 6)).astype("float32")
    y = (x[:, 0] + 0.3 * rng.normal(size=75) > 0.5).astype("int32")
    weights = {0: 1.0, 1: 4.0}

    def model_on(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2, "softmax")])
            model.compile(optimizer=keras.optimizers.SGD(0.5),
                          loss="sparse_categorical_crossentropy")
        return model

    def epochs(class_weight):
        return build_training_epochs(tf.data.Dataset.from_tensor_slices((x, y)),
                                     Batches(32, 2, 75), Epochs(0, 2), order=Order(seed=3),
                                     class_weight=class_weight)

    plain = model_on(strategy_for(1))
    plain.fit(epochs(None), class_weight=weights, epochs=1, steps_per_epoch=6, verbose=0)
    mirrored = strategy_for(2)
    ours = model_on(mirrored)
    ours.train_step = exact_train_step(ours)
    build_from_one_replica(ours)
    ours.fit(epochs(weights), epochs=1, steps_per_epoch=6, verbose=0)
    same(plain.get_weights(), ours.get_weights())
    unweighted = model_on(mirrored)
    unweighted.train_step = exact_train_step(unweighted)
    unweighted.fit(epochs(None), epochs=1, steps_per_epoch=6, verbose=0)
    assert not np.allclose(unweighted.get_weights()[0], ours.get_weights()[0], rtol=1e-3)


@SHARES_RUNS
def test_class_weight_from_config_is_applied_and_checked(tiny_config, tmp_path, trained):
    plain, w0 = trained(1, *DICT)
    weighted, w1 = run(tiny_config, tmp_path, 2, *DICT, "class_weight={0: 1.0, 1: 3.0}")
    assert not np.allclose(w0[0], w1[0], rtol=1e-3)
    with pytest.raises(ConfigError, match="class_weight names class 5; this dataset has 2"):
        run(tiny_config, tmp_path, 1, *DICT, "class_weight={0: 1.0, 5: 3.0}", name="bad")


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_own_train_step_is_called_by_both_loops_and_refused_where_not_honoured(
        tiny_config, tmp_path, loop):
    model = ["model._target_=parity_task.counting_model",
             "dataset._target_=parity_task.dict_inputs"]

    class Calls(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.calls = int(self.model.calls.numpy())

    calls = Calls()
    summary = train(tiny_config(*EXACT, "devices=2", f"loop={loop}", *model),
                    run_dir=tmp_path / loop, callbacks=[calls])
    # two epochs of five steps, each through the user's step (its variable is mirrored:
    # each replica's call counts once per step)
    assert calls.calls == 2 * 5
    assert summary["train_step"].startswith("the model's own train_step")
    if loop == "custom":
        return
    with pytest.raises(ConfigError, match="defines its own train_step; batch.accumulate=2"):
        train(tiny_config(*EXACT, "devices=1", "batch.accumulate=2", *model),
              run_dir=tmp_path / "accumulate")


def test_from_arrays_counts_examples_not_keys_and_checks_its_arguments():
    x = {"num": np.zeros((10, 4), "float32"), "cat": np.zeros((10, 1), "int32")}
    source = Source.from_arrays(x, np.zeros(10, "int32"), x, np.zeros(10, "int32"),
                                num_classes=2)
    assert source.train_size == 10 and source.validation_size == 10
    assert source.input_shape == {"num": (4,), "cat": (1,)}
    both = (np.zeros((6, 3)), np.zeros((6, 2)))
    assert Source.from_arrays(both, np.zeros(6), both, np.zeros(6)).input_shape == ((3,), (2,))
    with pytest.raises(DataError, match=r"x_train=...\): its arrays hold different numbers "
                                        r"of examples \(num=10, cat=9\)"):
        Source.from_arrays({"num": x["num"], "cat": x["cat"][:9]}, np.zeros(10), x,
                           np.zeros(10))
    with pytest.raises(DataError, match="x_train holds 10 examples, y_train 8"):
        Source.from_arrays(x, np.zeros(8), x, np.zeros(10))
    with pytest.raises(DataError, match=r"y_validation=...\) must be an array .*received str"):
        Source.from_arrays(x, np.zeros(10), x, "labels")
    with pytest.raises(DataError, match="num_classes=...\\) must be a positive int"):
        Source.from_arrays(x, np.zeros(10), x, np.zeros(10), num_classes="2")
    with pytest.raises(TypeError):  # keyword-only after the four arrays
        Source.from_arrays(x, np.zeros(10), x, np.zeros(10), 2)
