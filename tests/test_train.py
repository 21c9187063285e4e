"""train(cfg) in-process on logical CPU replicas: what it trains, writes and reports."""

from __future__ import annotations

import json
import math

import keras
import pytest

from tests.conftest import TINY, make_config
from trainer.config.errors import ConfigError
from trainer.run.train import train

DIGITS_TRAIN, DIGITS_VAL = 1437, 180

# Runs several tests read, each trained once (model=small, as `tiny_config`): the weak-scaling
# run on one replica is also the TensorBoard test's and seed 0's; on two, the fit loop's run
# directory (two epochs, TensorBoard), which the weak-scaling test reads as well; the custom
# loop's (4 steps a call) is also the schedule test's (an epoch of warm-up, no decay).
SHARED = {1: ("devices=1", "seed=0", "logger=[tensorboard]"),
          2: ("devices=2", "loop=fit", "steps_per_execution=1", "epochs=2",
              "logger=[tensorboard]"),
          "custom": ("devices=2", "loop=custom", "steps_per_execution=4", "epochs=2",
                     "logger=[tensorboard]", "optimizer=sgd_momentum_cosine",
                     "optimizer.warmup_epochs=1", "optimizer.decay=none")}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """`finished(key)`: the summary and run directory of the run `SHARED[key]` names,
    trained on its first use."""
    runs = {}

    def run(key):
        if key not in runs:
            run_dir = tmp_path_factory.mktemp(f"run{key}")
            cfg = make_config(*TINY, "model=small", "accelerator=cpu", *SHARED[key])
            runs[key] = train(cfg, run_dir=run_dir), run_dir
        return runs[key]
    return run


# 4 replicas: the strong-scaling run below (its devices and batch split); the weak-scaling
# rule (a per-replica batch, the rate scaled linearly) is the same on 2.
@pytest.mark.parametrize("replicas", [1, 2])
def test_weak_scaling_run(finished, replicas):
    summary, tmp_path = finished(replicas)
    assert summary["replicas"] == replicas
    assert summary["devices"] == [f"/cpu:{i}" for i in range(replicas)]
    assert summary["strategy"] == ("default" if replicas == 1 else "mirrored")
    assert summary["batch"]["per_replica"] == 64
    assert summary["batch"]["global"] == 64 * replicas
    assert summary["learning_rate"]["base"] == 0.001
    assert summary["learning_rate"]["scaled"] == pytest.approx(0.001 * replicas)
    assert summary["steps_per_epoch"] == math.ceil(DIGITS_TRAIN / (64 * replicas))
    assert summary["train_examples"] == DIGITS_TRAIN
    assert summary["validation_examples"] == DIGITS_VAL
    assert 0.0 <= summary["validation_metrics"]["accuracy"] <= 1.0
    assert summary["train_metrics"]["loss"] > 0
    assert summary["time"]["first_step_s"] > 0
    assert summary["time"]["wall_s"] > summary["time"]["first_step_s"]
    assert summary["examples_per_sec"] > 0
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "checkpoints" / "last.keras").is_file()
    assert (tmp_path / "checkpoints" / "best.keras").is_file()


def test_a_later_run_in_a_process_counts_its_start_up_from_its_own_checks(tiny_config,
                                                                          tmp_path,
                                                                          monkeypatch):
    """The summary's "start-up before it" is the process's age for its first run (the
    imports count), and for a later run (a second `trainer.fit` in one script) only what
    came before that run's own first step: never the runs before it."""
    import time

    from trainer.run.session import Session

    monkeypatch.setattr(Session, "runs_in_process", 1)  # a run before this one, here
    cfg = tiny_config("devices=1", "export=false")
    began = time.perf_counter()
    summary = train(cfg, run_dir=tmp_path)
    assert 0 < summary["time"]["startup_s"] <= time.perf_counter() - began


@pytest.mark.long  # the default run stays under 8 minutes on 2 cores
def test_strong_scaling_splits_the_global_batch(tiny_config, tmp_path):
    cfg = tiny_config("accelerator=cpu", "devices=4", "batch.per_replica=null",
                      "batch.global_size=128")
    summary = train(cfg, run_dir=tmp_path)
    assert summary["devices"] == [f"/cpu:{i}" for i in range(4)]
    assert summary["strategy"] == "mirrored"
    assert summary["batch"] == {"per_replica": 32, "replicas": 4, "accumulate": 1, "global": 128,
                                "max_per_replica": None, "drop_remainder": False}
    assert summary["steps_per_epoch"] == math.ceil(DIGITS_TRAIN / 128)
    # reference_batch: auto, and a fixed global batch: the rate is the one-device script's,
    # whatever the replica count (tests/test_lr_reference.py)
    assert summary["learning_rate"]["reference_batch"] == 128
    assert summary["learning_rate"]["scaled"] == pytest.approx(0.001)
    assert summary["cross_device_ops"] == "collective"


def test_schedule_is_applied_to_the_optimizer(finished):
    summary, tmp_path = finished("custom")  # 2 replicas, 2 epochs: the first of warm-up
    steps = summary["steps_per_epoch"]
    assert summary["learning_rate"]["warmup_steps"] == steps
    assert summary["learning_rate"]["scaled"] == pytest.approx(0.1 * 128 / 256)
    model = keras.models.load_model(tmp_path / "checkpoints" / "last.keras")
    assert int(model.optimizer.iterations) == 2 * steps
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)  # past warm-up
    schedule = model.optimizer._learning_rate
    assert float(schedule(0)) == pytest.approx(0.1)  # warm-up starts at the unscaled rate


def test_tensorboard_logs_are_written(finished):
    _, run_dir = finished(1)  # logger=[tensorboard] on one device
    events = list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert {p.parent.name for p in events} >= {"train", "validation"}


@pytest.mark.long  # a minute; the zoo (keras_app) trains in the default run on small inputs
def test_mobilenet_on_synthetic_data(tiny_config, tmp_path):
    cfg = tiny_config("model=mobilenet", "dataset=synthetic", "dataset.train_examples=128",
                      "dataset.validation_examples=40", "dataset.image_size=32",
                      "accelerator=cpu", "devices=2")
    summary = train(cfg, run_dir=tmp_path)
    assert summary["model"] == "mobilenet" and summary["dataset"] == "synthetic"
    assert summary["validation_examples"] == 40 and summary["replicas"] == 2


def test_mobilenet_refuses_small_images(tiny_config, tmp_path):
    # tiny_config's explicit dataset.image_size=8, below model.min_image_size: refused in the
    # pre-flight, before anything is built
    with pytest.raises(ConfigError, match=r"dataset.image_size=8 is below the smallest side "
                                          r"model=mobilenet takes, 32x32 \(model.min_image_size\)"):
        train(tiny_config("model=mobilenet", "accelerator=cpu", "devices=1"), run_dir=tmp_path)
    # and by the builder itself, for a dataset that states no image_size (a user's own)
    from trainer.models import mobilenet

    with pytest.raises(ConfigError, match="at least 32x32; received: 8x8"):
        mobilenet.build((8, 8, 1), 10)


def test_config_errors_leave_nothing_behind(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="does not divide evenly over 3"):
        train(tiny_config("accelerator=cpu", "devices=3", "batch.per_replica=null",
                          "batch.global_size=100"), run_dir=run_dir)
    assert not run_dir.exists()


@pytest.mark.parametrize("loop, steps", [("fit", 1), ("custom", 4)])
def test_loops_write_the_same_run_directory(finished, loop, steps):
    # loop=fit with steps_per_execution=1; loop=custom with 4 (and the schedule test's rate)
    summary, tmp_path = finished(2 if loop == "fit" else "custom")
    assert summary["loop"] == loop and summary["steps_per_execution"] == steps
    assert set(summary["train_metrics"]) == {"loss", "accuracy"}
    assert set(summary["validation_metrics"]) == {"loss", "accuracy"}
    assert summary["validation_metrics"]["accuracy"] > 0.5  # it learns
    assert (tmp_path / "checkpoints" / "last.keras").is_file()
    assert (tmp_path / "checkpoints" / "best.keras").is_file()
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    model = keras.models.load_model(tmp_path / "checkpoints" / "last.keras")
    assert int(model.optimizer.iterations) == 2 * summary["steps_per_epoch"]


@pytest.mark.parametrize("seed", [0, -1, 2**31, 10**20])
def test_any_integer_seed_trains(tiny_config, tmp_path, finished, seed):
    """TensorFlow's global seed 0 used to crash the per-epoch shuffle (OperatorNotAllowedInGraph
    Error), and NumPy refuses negative seeds; every integer must train, reproducibly."""
    if seed == 0:
        summary, _ = finished(1)  # seed=0 on one device
    else:
        summary = train(tiny_config(f"seed={seed}", "accelerator=cpu", "devices=1"),
                        run_dir=tmp_path)
    assert summary["seed"] == seed and summary["train_metrics"]["loss"] > 0


def test_runtime_seed_keeps_ordinary_seeds_and_maps_the_rest():
    from trainer.config.validate import SEED_LIMIT, runtime_seed

    assert runtime_seed(None) is None
    assert runtime_seed(42) == 42 and runtime_seed(SEED_LIMIT - 1) == SEED_LIMIT - 1
    mapped = [runtime_seed(s) for s in (0, -1, -42, SEED_LIMIT, 2**64, 10**20)]
    assert all(1 <= m < SEED_LIMIT for m in mapped)
    assert len(set(mapped)) == len(mapped)  # distinct seeds stay distinct
    assert runtime_seed(0) == runtime_seed(0)  # fixed, not random
