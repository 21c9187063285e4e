"""Every experiment file composes and runs one short epoch on 2 logical replicas (mock data)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from trainer.config.schema import config_dir
from trainer.run.train import train

EXPERIMENTS = sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml"))
SHORT = ["accelerator=cpu", "devices=2", "epochs=1", "verbose=0", "logger=[]"]


def test_the_classic_examples_are_there():
    assert {"mnist_towers", "cifar10_multi_gpu", "cats_vs_dogs_mobilenet"} <= set(EXPERIMENTS)


# MobileNetV2 and the 32x32 tower network take 20-30 s each: with the slow tests
HEAVY = {"cats_vs_dogs_mobilenet", "digits_towers"}


@pytest.mark.parametrize("experiment", [pytest.param(e, marks=pytest.mark.slow) if e in HEAVY
                                        else e for e in EXPERIMENTS])
def test_experiment_runs_one_short_epoch(make_run, tmp_path: Path, experiment):
    # ImageNet weights need a network this machine does not have: the same network from
    # scratch (the offline error itself is tested in test_zoo.py)
    offline = ["model.weights=null"] if experiment == "cats_vs_dogs_mobilenet" else []
    tfds_dir = [] if experiment.startswith("digits") else [f"dataset.data_dir={tmp_path / 'tfds'}"]
    cfg = make_run(f"experiment={experiment}", *SHORT, *offline, *tfds_dir)
    with tfds.testing.mock_data(num_examples=10, policy=tfds.testing.MockPolicy.USE_CODE):
        summary = train(cfg, run_dir=tmp_path / "run")
    assert summary["replicas"] == 2 and summary["epochs"] == 1
    assert (tmp_path / "run" / "summary.json").is_file()


def test_experiments_set_what_their_examples_set(make_run):
    towers = make_run("experiment=mnist_towers")
    assert towers.model._target_.endswith("cnn.build") and towers.dataset.name == "mnist"
    assert towers.batch.global_size == 256 and towers.batch.per_replica is None
    # train / validation / test roles: validation carved from train, test kept for the end
    assert (towers.dataset.validation_split, towers.dataset.test_split) == ("auto", "auto")
    assert towers.optimizer._target_ == "keras.optimizers.Adam" and towers.optimizer.lr == 0.001
    cifar = make_run("experiment=cifar10_multi_gpu")
    assert cifar.model._target_.endswith("cifar10_cnn.build") and cifar.dataset.name == "cifar10"
    assert cifar.optimizer._target_ == "keras.optimizers.SGD"
    assert cifar.optimizer.decay == "exponential"
    assert cifar.batch.per_replica == 128
    cats = make_run("experiment=cats_vs_dogs_mobilenet")
    assert cats.model._target_.endswith("keras_app.build") and cats.model.name == "MobileNetV2"
    assert cats.model.weights == "imagenet" and cats.finetune.freeze_backbone
    assert cats.dataset.image_size == 224 and cats.dataset.test_split == "train[90%:]"
    assert cats.batch.per_replica == 64 and cats.optimizer.lr == 0.001
    # Anything still overrides an experiment on the command line.
    assert make_run("experiment=mnist_towers", "batch.global_size=512").batch.global_size == 512
