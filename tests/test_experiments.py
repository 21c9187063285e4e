"""Every experiment file composes and runs one short epoch on 2 logical replicas (mock data),
and every model file trains one short epoch on the default dataset (the digits, at the
model's smallest input where the digits' 8x8 is below it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from tests.conftest import error_lines, run_main
from trainer.config.schema import config_dir
from trainer.run.train import train

EXPERIMENTS = sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml"))
MODELS = sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))
SHORT = ["accelerator=cpu", "devices=2", "epochs=1", "verbose=0", "logger=[]"]


def test_the_classic_examples_are_there():
    assert {"mnist_towers", "cifar10_multi_gpu", "cats_vs_dogs_mobilenet"} <= set(EXPERIMENTS)


# MobileNetV2 and the 32x32 tower network take 10-30 s each: with the long tests
HEAVY = {"cats_vs_dogs_mobilenet", "digits_towers"}
# The smallest input of the network an experiment file trains at a larger one.
SMALLEST = {"cats_vs_dogs_mobilenet": 32, "digits_towers": 8}


@pytest.mark.parametrize("experiment", [pytest.param(e, marks=pytest.mark.long) if e in HEAVY
                                        else e for e in EXPERIMENTS])
def test_experiment_runs_one_short_epoch(make_run, tmp_path: Path, experiment):
    # ImageNet weights need a network this machine does not have: the same network from
    # scratch (the offline error itself is tested in test_zoo.py)
    offline = ["model.weights=null"] if experiment == "cats_vs_dogs_mobilenet" else []
    # the network's smallest input, not the file's 224x224 or 32x32 (what composes and runs
    # is tested)
    offline += [f"dataset.image_size={SMALLEST[experiment]}"] if experiment in SMALLEST else []
    tfds_dir = [] if experiment.startswith("digits") else [f"dataset.data_dir={tmp_path / 'tfds'}"]
    cfg = make_run(f"experiment={experiment}", *SHORT, *offline, *tfds_dir)
    with tfds.testing.mock_data(num_examples=10, policy=tfds.testing.MockPolicy.USE_CODE):
        summary = train(cfg, run_dir=tmp_path / "run")
    assert summary["replicas"] == 2 and summary["epochs"] == 1
    assert (tmp_path / "run" / "summary.json").is_file()


# MobileNetV2 (alone and as keras_app's backbone) takes 20-30 s: with the long tests; the
# default run trains model=mobilenet on the digits as the design card's command
# (tests/test_cli.py::test_the_design_cards_command_trains)
HEAVY_MODELS = {"mobilenet", "keras_app"}


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.long)
                                   if m in HEAVY_MODELS else m for m in MODELS])
def test_every_model_trains_on_the_default_dataset(make_run, tmp_path, model):
    cfg = make_run(f"model={model}", "epochs=1", "verbose=0", "logger=[]")
    minimum = cfg.model.get("min_image_size")
    summary = train(cfg, run_dir=tmp_path / "run")
    assert summary["model"] == model and summary["dataset"] == "digits"
    assert summary["epochs_done"] == 1 and summary["validation_examples"] == 180
    assert summary["image_size"]["size"] == max(8, minimum or 0)


def test_the_shipped_models_are_there():
    assert {"cnn", "cifar10_cnn", "mobilenet", "keras_app"} <= set(MODELS)


def test_imagenet_weights_offline_are_one_line_naming_the_cause(tmp_path, monkeypatch):
    """cats_vs_dogs_mobilenet as written (ImageNet weights) on a machine without the network:
    one line naming the file and how to pass it, exit 2 (its data mocked: TFDS would download
    it too)."""
    import urllib.error

    if any((Path.home() / ".keras" / "models").glob("mobilenet_v2_*no_top.h5")):
        pytest.skip("the ImageNet weights are in ~/.keras/models: nothing to download")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("keras.src.utils.file_utils.urlretrieve", offline)
    with tfds.testing.mock_data(num_examples=10, policy=tfds.testing.MockPolicy.USE_CODE):
        out = run_main("experiment=cats_vs_dogs_mobilenet", "accelerator=cpu", "devices=1",
                       f"dataset.data_dir={tmp_path / 'tfds'}", "logger=[]", "verbose=0",
                       f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "error: model.weights=imagenet: Keras could not download "
        "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224_no_top.h5"), lines
    assert "(no network)" in lines[0] and "pass model.weights=/path/to/" in lines[0]


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
