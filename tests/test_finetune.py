"""Fine-tuning: a frozen backbone (head only, batch norm in inference mode), unfrozen from an
epoch on, its gradient scale, and a resume across the unfreeze epoch."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.test_resume import SigtermAt
from trainer.config.errors import ConfigError, Interrupted
from trainer.evaluate import load_checkpoint
from trainer.run.train import train
from trainer.task.finetune import FULL, HEAD, boundaries, check, phase_at
from trainer.task.freeze import scale_backbone_gradients

TINY_APP = ["model._target_=test_finetune.tiny", "model.dropout=0", "dataset=synthetic",
            "dataset.train_examples=32", "dataset.validation_examples=8",
            "dataset.image_size=8", "batch.per_replica=8", "verbose=0", "logger=[]",
            "optimizer=sgd_momentum_cosine", "optimizer.lr=0.05"]


def tiny(input_shape, num_classes, dropout=0.0):
    """A small model shaped like model=keras_app's: `backbone` (with batch norm), `pool`,
    `head`. (An ImageNet network from scratch, batch norm in inference mode, gives features
    of 1e-13 at random init: too small to move the head in a test.)"""
    backbone = keras.Sequential([
        keras.Input(input_shape), keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.BatchNormalization(), keras.layers.Conv2D(8, 3),
        keras.layers.BatchNormalization(), keras.layers.ReLU()], name="backbone")
    inputs = keras.Input(input_shape)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(backbone(inputs))
    x = keras.layers.Dropout(dropout)(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs)


def ft(**options):
    return OmegaConf.create({"freeze_backbone": False, "unfreeze_at_epoch": None,
                             "unfreeze_layers": None, "backbone_lr_scale": 1.0, **options})


def test_phases_by_epoch():
    assert phase_at(0, ft()) == "all" and boundaries(ft(), 5) == []
    frozen = ft(freeze_backbone=True, unfreeze_at_epoch=3)
    assert [phase_at(e, frozen) for e in range(4)] == [HEAD, HEAD, FULL, FULL]
    assert boundaries(frozen, 5) == [2] and boundaries(frozen, 2) == []
    assert phase_at(9, ft(freeze_backbone=True)) == HEAD


@pytest.mark.parametrize("options, message", [
    ({"unfreeze_at_epoch": 2}, "needs finetune.freeze_backbone=true"),
    ({"freeze_backbone": True, "unfreeze_at_epoch": 0}, "must be an epoch >= 1"),
    ({"freeze_backbone": True, "unfreeze_layers": 0}, "must be a positive number of layers"),
    ({"backbone_lr_scale": 0}, "must be a positive number"),
])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        check(ft(**options), "keras.optimizers.SGD")


def test_a_backbone_learning_rate_scale_needs_sgd():
    check(ft(freeze_backbone=True, backbone_lr_scale=0.1), "keras.optimizers.SGD")
    with pytest.raises(ConfigError, match="Adam normalises the scale away: use optimizer=sgd"):
        check(ft(freeze_backbone=True, backbone_lr_scale=0.1), "keras.optimizers.Adam")


def test_the_scale_multiplies_the_backbones_sgd_step_only():
    inputs = keras.Input((3,))
    backbone = keras.Sequential([keras.layers.Dense(2)], name="backbone")
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(backbone(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    scale_backbone_gradients(model, 0.25)
    before = [v.numpy().copy() for v in model.trainable_variables]
    grads = [np.ones(v.shape, np.float32) for v in model.trainable_variables]
    model.optimizer.apply(grads, model.trainable_variables)
    steps = [b - v.numpy() for b, v in zip(before, model.trainable_variables, strict=True)]
    inside = {id(v) for v in backbone.weights}
    for v, step in zip(model.trainable_variables, steps, strict=True):
        np.testing.assert_allclose(step, 0.025 if id(v) in inside else 0.1, rtol=1e-6)


class Snapshots(keras.callbacks.Callback):
    """The backbone's and the head's weights at the start and after each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = []

    def take(self):
        self.taken.append(([w.copy() for w in self.model.get_layer("backbone").get_weights()],
                           [w.copy() for w in self.model.get_layer("head").get_weights()]))

    def on_train_begin(self, logs=None):
        if not self.taken:
            self.take()

    def on_epoch_end(self, epoch, logs=None):
        self.take()


def changed(before, after) -> list[bool]:
    return [not np.array_equal(a, b) for a, b in zip(before, after, strict=True)]


@pytest.mark.long
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_frozen_then_unfrozen_backbone_per_variable(make_run, tmp_path, loop):
    snaps = Snapshots()
    summary = train(make_run(*TINY_APP, f"loop={loop}", "accelerator=cpu", "devices=2",
                             "epochs=2", "finetune.freeze_backbone=true",
                             "finetune.unfreeze_at_epoch=2"),
                    run_dir=tmp_path / "run", callbacks=[snaps])
    (start_b, start_h), (one_b, one_h), (two_b, two_h) = snaps.taken
    # epoch 1, frozen: every backbone variable (batch-norm statistics too) as it was
    assert not any(changed(start_b, one_b)) and all(changed(start_h, one_h))
    # epoch 2, unfrozen: backbone kernels move; batch-norm statistics stay (inference mode)
    moved = changed(one_b, two_b)
    names = [w.path for w in snaps.model.get_layer("backbone").weights]
    kernels = [m for m, n in zip(moved, names, strict=True) if n.endswith("kernel")]
    statistics = [m for m, n in zip(moved, names, strict=True)
                  if n.endswith(("moving_mean", "moving_variance"))]
    assert all(kernels) and statistics and not any(statistics)
    trains = [(p["from_epoch"], p["trains"]) for p in summary["finetune"]]
    assert trains == [(1, HEAD), (2, FULL)]
    head_only, full = summary["finetune"]
    assert head_only["trainable"] < full["trainable"] < full["total"] == head_only["total"]


@pytest.mark.long
def test_a_run_stopped_after_the_unfreeze_epoch_resumes_equal_to_an_uninterrupted_one(
        make_run, tmp_path):
    options = [*TINY_APP, "deterministic=true", "epochs=3", "finetune.freeze_backbone=true",
               "finetune.unfreeze_at_epoch=2", "finetune.unfreeze_layers=30",
               "checkpoint.backup_every=2"]
    reference = tmp_path / "reference"
    train(make_run(*options), run_dir=reference)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(make_run(*options), run_dir=run_dir, callbacks=[SigtermAt(2, 2)])
    summary = train(make_run(*options), run_dir=run_dir)
    assert summary["resumed_from"]["epoch"] == 3  # past the unfreeze epoch
    expected = load_checkpoint(reference / "checkpoints" / "last.keras").get_weights()
    resumed = load_checkpoint(run_dir / "checkpoints" / "last.keras").get_weights()
    for a, b in zip(expected, resumed, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
