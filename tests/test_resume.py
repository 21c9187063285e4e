"""Resuming: on another device count at the same global batch, and never with a changed task.

A run stopped mid-epoch on 4 replicas at a global batch of 128 continues on 2 (accumulating
2 micro-batches) and ends with the weights of an uninterrupted 4-replica run. A rerun that
would change what is trained (model, dataset, optimizer, seed, the global batch) is refused
with one line, and leaves the run directory exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import error_lines, run_main
from tests.test_fault_tolerance import _damage_the_middle
from tests.test_parity import _tiny_config
from trainer.config.errors import ConfigError, Interrupted
from trainer.evaluate import load_checkpoint
from trainer.run.train import train
from trainer.rundir.backup import Backup, BackupStore, StopRequest, _load_metrics, _metrics_taken
from trainer.rundir.resume import check_global_batch, check_resume, flatten

ELASTIC = ["optimizer=sgd_momentum_cosine", "optimizer.lr=0.05", "model.dropout=0.0",
           "deterministic=true",
           "batch.per_replica=null", "batch.global_size=128", "accelerator=cpu", "epochs=2",
           "loop=custom"]


class SigtermAt(keras.callbacks.Callback):
    """Sends this process SIGTERM after a given step of a given epoch, as a scheduler would;
    records the epochs whose validation ran."""

    def __init__(self, epoch: int, step: int) -> None:
        super().__init__()
        self.at, self.epoch, self.validated = (epoch, step), 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_test_begin(self, logs=None):
        self.validated.append(self.epoch)

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch + 1) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.long  # three runs on up to 4 replicas; the 1-replica resume proofs run by default
def test_stopped_on_four_replicas_resumed_on_two_equals_an_uninterrupted_run(tiny_config,
                                                                              tmp_path):
    reference = tmp_path / "reference"
    train(tiny_config(*ELASTIC, "devices=4"), run_dir=reference)
    run_dir = tmp_path / "run"
    signal_at = SigtermAt(1, 5)
    with pytest.raises(Interrupted, match="at epoch 2"):
        train(tiny_config(*ELASTIC, "devices=4"), run_dir=run_dir, callbacks=[signal_at])
    assert signal_at.validated == [0]  # stopped at once: no validation of the cut epoch
    newest = sorted(p.name for p in (run_dir / "backup").glob("ckpt-*"))[-1]
    assert newest == "ckpt-000001-000000006"  # mid-epoch: the step after the signal

    summary = train(tiny_config(*ELASTIC, "devices=2", "batch.accumulate=auto",
                                "batch.max_per_replica=32"), run_dir=run_dir)
    assert summary["replicas"] == 2
    assert summary["batch"] == {"per_replica": 32, "replicas": 2, "accumulate": 2,
                                "global": 128, "max_per_replica": 32, "drop_remainder": False}
    assert summary["resumed_from"] == {"epoch": 2, "step": 6, "changed": {
        "batch.accumulate": [1, "auto"], "batch.max_per_replica": [None, 32],
        "devices": [4, 2]}}
    expected = load_checkpoint(reference / "checkpoints" / "last.keras")
    resumed = load_checkpoint(run_dir / "checkpoints" / "last.keras")
    assert int(resumed.optimizer.iterations) == int(expected.optimizer.iterations) == 24
    for a, b in zip(expected.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_per_replica_on_other_devices_is_refused_in_code_too(tiny_config, tmp_path):
    train(tiny_config("accelerator=cpu", "devices=2", "batch.per_replica=32"), run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"devices from 2 to 4 under batch.per_replica: the "
                                          r"global batch of 64 would change with the devices; "
                                          r"pass batch.per_replica=null batch.global_size=64"):
        train(tiny_config("accelerator=cpu", "devices=4", "batch.per_replica=32", "epochs=2",
                          f"resume={tmp_path}"))


def test_a_different_global_batch_found_at_run_time_is_refused():
    state = {"epoch": 1, "step": 0, "global_batch": 128, "replicas": 2, "accumulate": 1}
    check_global_batch(Path("run"), state, 128, 4, 1)
    with pytest.raises(ConfigError, match=r"cannot resume run: it trained with a global batch "
                                          r"of 128 \(2 replicas x 1 micro-batches\), this run's "
                                          r"is 256 \(4 x 1\); pass batch.per_replica=null "
                                          r"batch.global_size=128"):
        check_global_batch(Path("run"), state, 256, 4, 1)


def _state(**config):
    base = {"model": {"_target_": "m.build", "dropout": 0.1}, "seed": 1, "epochs": 4,
            "devices": 2, "batch": {"per_replica": 32, "global_size": None, "accumulate": 1},
            "checkpoint": {"backup_every": 0}, "verbose": "auto"}
    return {"epoch": 2, "step": 5, "global_batch": 64, "config": base}, base


def _with(config, **changes):
    flat = flatten(config)
    flat.update(changes)
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def test_what_may_change_on_resume():
    state, config = _state()
    assert check_resume(Path("r"), state, config) == {}
    free = _with(config, **{"epochs": 6, "verbose": 0, "checkpoint.backup_every": 10})
    assert check_resume(Path("r"), state, free) == {
        "checkpoint.backup_every": [0, 10], "epochs": [4, 6], "verbose": ["auto", 0]}
    # the same global batch, now fixed, on other devices with accumulation
    elastic = _with(config, **{"batch.per_replica": None, "batch.global_size": 64,
                               "devices": 1, "batch.accumulate": 2})
    assert set(check_resume(Path("r"), state, elastic)) == {
        "batch.per_replica", "batch.global_size", "devices", "batch.accumulate"}


def test_trackers_sweep_and_network_keys_may_change_on_resume():
    # Keys a backup from before the logger group lacks, and ones that only say where a run
    # logs, what a sweep reads from it, or which ports its workers use.
    state, config = _state()
    new = _with(config, **{"logger.csv.filename": "metrics.csv",
                           "logger.tensorboard.update_freq": "epoch",
                           "optimized_metric": "val_accuracy", "profile": [5, 8],
                           "cluster.port_base": 9000})
    assert set(check_resume(Path("r"), state, new)) == {
        "logger.csv.filename", "logger.tensorboard.update_freq", "optimized_metric", "profile",
        "cluster.port_base"}


def test_a_backup_from_before_models_stated_their_smallest_input_resumes():
    # model.min_image_size only raises dataset.image_size, which is compared itself
    state, config = _state()
    state["config"]["dataset"] = {"image_size": 32}
    new = _with(config, **{"model.min_image_size": 32, "dataset.image_size": 32})
    assert check_resume(Path("r"), state, new) == {"model.min_image_size": [None, 32]}
    with pytest.raises(ConfigError, match=r"dataset.image_size from 32 to 48"):
        check_resume(Path("r"), state, _with(new, **{"dataset.image_size": 48}))


def test_a_backup_from_before_test_splits_resumes_with_its_old_data_values():
    state, config = _state()
    state["config"]["dataset"] = {"_target_": "trainer.data.digits.load",
                                  "validation_fraction": 0.2}
    config = _with(config, **{"dataset._target_": "trainer.data.digits.load",
                              "dataset.validation_fraction": 0.2, "dataset.test_fraction": 0,
                              "finetune.freeze_backbone": False,
                              "finetune.unfreeze_at_epoch": None,
                              "finetune.backbone_lr_scale": 1.0})
    assert check_resume(Path("r"), state, config) == {}
    with pytest.raises(ConfigError, match=r"finetune.freeze_backbone from None to True"):
        check_resume(Path("r"), state, _with(config, **{"finetune.freeze_backbone": True}))
    with pytest.raises(ConfigError, match=r"dataset.test_fraction from None to 0.1"):
        check_resume(Path("r"), state, _with(config, **{"dataset.test_fraction": 0.1}))
    tfds_state, tfds = _state()
    tfds_state["config"]["dataset"] = {"name": "mnist", "validation_split": "test"}
    tfds = _with(tfds, **{"dataset.name": "mnist", "dataset.validation_split": "test",
                          "dataset.test_split": None, "dataset.validation_fraction": 0.1})
    assert check_resume(Path("r"), tfds_state, tfds) == {}


@pytest.mark.parametrize("changes, named", [
    ({"model._target_": "other.build"}, "model._target_ from 'm.build' to 'other.build'"),
    ({"model.dropout": 0.2}, "model.dropout from 0.1 to 0.2"),
    ({"seed": 2}, "seed from 1 to 2"),
    ({"batch.per_replica": 16}, "batch.per_replica from 32 to 16"),
    ({"batch.per_replica": None, "batch.global_size": 128},
     "batch.global_size from None to 128"),
    ({"optimizer.lr": 0.1}, "optimizer.lr from None to 0.1"),
])
def test_what_is_refused_on_resume(changes, named):
    state, config = _state()
    with pytest.raises(ConfigError, match="cannot resume r with a changed config") as error:
        check_resume(Path("r"), state, _with(config, **changes))
    assert named in str(error.value)


def test_fewer_epochs_than_reached_is_refused():
    state, config = _state()  # stopped in the third epoch
    check_resume(Path("r"), state, _with(config, epochs=3))
    with pytest.raises(ConfigError, match="it has reached epoch 3, and epochs=2 is fewer; "
                                          "pass epochs>=3"):
        check_resume(Path("r"), state, _with(config, epochs=2))


def _digest(run_dir: Path) -> dict[str, str]:
    """Every file's hash but the lock's (which holds the last holder's pid)."""
    files = [p for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"]
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in files}


BASE = ["dataset.image_size=8", "logger=[]", "verbose=0", "epochs=1"]


@pytest.mark.parametrize("change, key", [
    ("model=cifar10_cnn", "model._target_ from 'trainer.models.cnn.build' to "
                          "'trainer.models.cifar10_cnn.build'"),
    ("dataset=synthetic", "dataset._target_ from 'trainer.data.digits.load' to "
                          "'trainer.data.synthetic.load'"),
    ("optimizer=sgd", "optimizer._target_ from 'keras.optimizers.Adam' to "
                      "'keras.optimizers.SGD'"),
    ("seed=7", "seed from 42 to 7"),
    ("accelerator=cpu devices=2", "devices from 'auto' to 2 under batch.per_replica"),
])
def test_a_changed_resume_on_the_command_line_leaves_the_run_untouched(tmp_path, change, key,
                                                                       finished_run):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    before = _digest(run_dir)
    assert any(name.startswith(".hydra/") for name in before)
    assert any(name.startswith("backup/") for name in before)
    out = run_main(*BASE, *change.split(), "epochs=2", f"hydra.run.dir={run_dir}",
                  f"resume={run_dir}", cwd=tmp_path, timeout=120)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f"error: cannot resume {run_dir}") and key in lines[0], lines
    assert _digest(run_dir) == before


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    out = run_main(*BASE, f"hydra.run.dir={run_dir}", cwd=run_dir.parent, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return run_dir


def test_resume_of_a_directory_that_is_not_a_run_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_main(*BASE, f"resume={empty}", f"hydra.run.dir={empty}", cwd=tmp_path, timeout=120)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0] == (f"error: resume={empty} is not a run directory (no backup/, "
                        "checkpoints/ or summary.json in it); pass the directory of an earlier "
                        "run")
    assert list(empty.iterdir()) == []


def test_resume_into_another_finished_run_directory_is_refused(tmp_path, finished_run):
    other = tmp_path / "other"
    shutil.copytree(finished_run, other)
    before = _digest(other)
    out = run_main(*BASE, "epochs=2", f"resume={finished_run}", f"hydra.run.dir={other}",
                  cwd=tmp_path, timeout=120)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f"error: hydra.run.dir={other} holds another finished run")
    assert _digest(other) == before


@pytest.mark.parametrize("damage", [lambda p: p.write_bytes(b"not an h5 file"),
                                    _damage_the_middle])
def test_unloadable_backups_are_refused_not_replaced(tmp_path, finished_run, damage):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    # the weights, or the link to the best checkpoint of the same epoch (a new file, so the
    # checkpoint itself stays whole)
    for weights in (run_dir / "backup").glob("ckpt-*/model.*"):
        whole = weights.read_bytes()
        weights.unlink()
        weights.write_bytes(whole)
        damage(weights)
    before = _digest(run_dir)
    out = run_main(*BASE, "epochs=2", f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'logs'}",
                  cwd=tmp_path, timeout=300)
    lines = error_lines(out.stderr)
    assert out.returncode == 2, out.stderr[-2000:]
    assert lines[-1].startswith(f"error: no backup in {run_dir / 'backup'} loads into this "
                                "model (ckpt-000001-000000000: "), lines
    assert "move the directory away, or choose a new run directory" in lines[-1]
    assert _digest(run_dir) == before


def test_a_second_run_in_a_busy_run_directory_is_refused(tmp_path):
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    first = subprocess.Popen([sys.executable, "-m", "trainer", *BASE, "epochs=5",
                              "batch.per_replica=8", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints").is_dir():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        before = _digest(run_dir / ".hydra")
        out = run_main(*BASE, "epochs=5", "batch.per_replica=8", f"hydra.run.dir={run_dir}",
                      cwd=tmp_path, timeout=120)
        lines = error_lines(out.stderr)
        assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
        assert lines[0] == (f"error: run directory {run_dir} is in use by another run (pid "
                            f"{first.pid}); wait for it to end, or choose another "
                            "hydra.run.dir")
        assert _digest(run_dir / ".hydra") == before
    finally:
        first.kill()
        first.wait(timeout=30)
    # The killed holder's lock went with it: the same command now resumes.
    from trainer.rundir.lock import check_unlocked

    check_unlocked(run_dir)


def test_a_signal_stops_fit_at_once_without_validating_the_cut_epoch(tiny_config, tmp_path):
    signal_at = SigtermAt(0, 3)
    with pytest.raises(Interrupted, match="stopped by signal 15 at epoch 1"):
        train(tiny_config("epochs=2"), run_dir=tmp_path, callbacks=[signal_at])
    assert signal_at.validated == []
    assert [p.name for p in (tmp_path / "backup").iterdir()] == ["ckpt-000000-000000004"]


# A finished 2-epoch run with mid-epoch backups, made once: the tests that refuse to resume
# it work on their own copies.
TWO_EPOCHS = ["epochs=2", "checkpoint.backup_every=5"]


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("two_epochs") / "run"
    train(_tiny_config(*TWO_EPOCHS), run_dir)
    return run_dir


def _copy(run_dir: Path, to: Path) -> Path:
    """A copy of a shared run, every file's bytes and times kept."""
    subprocess.run(["cp", "-a", str(run_dir), str(to)], check=True)
    return to


@pytest.mark.xdist_group("test_resume.two_epochs")
def test_rerunning_with_fewer_epochs_than_reached_is_refused(tiny_config, tmp_path, two_epochs):
    run_dir = _copy(two_epochs, tmp_path / "run")
    before = _digest(run_dir)
    with pytest.raises(ConfigError, match="it has reached epoch 2, and epochs=1 is fewer; pass "
                                          "epochs>=2"):
        train(tiny_config(*TWO_EPOCHS, "epochs=1", f"resume={run_dir}"))
    assert _digest(run_dir) == before


def test_a_backup_from_before_loggers_named_their_builders_resumes_unchanged(tmp_path):
    from trainer.rundir.resume import check_resume

    old = {"epochs": 2, "logger": {"tensorboard": {"update_freq": "epoch"}}}
    new = {"epochs": 2, "logger": {"tensorboard": {
        "_target_": "trainer.track.trackers.tensorboard", "update_freq": "epoch"}}}
    assert check_resume(tmp_path, {"config": old, "epoch": 0, "step": 0}, new) == {}


# A stop in the middle of the first epoch (12 steps at a global batch of 128), resumed on the
# same devices.
METRICS_RESUME = ["deterministic=true", "batch.per_replica=null", "batch.global_size=128",
                  "accelerator=cpu", "epochs=1"]


@pytest.fixture(scope="module")
def stopped_mid_epoch(tmp_path_factory):
    """A 1-replica run under fit stopped by SIGTERM after step 5 of its only epoch, made
    once: the tests that resume it work on their own copies."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.raises(Interrupted, match="at epoch 1"):
        train(_tiny_config(*METRICS_RESUME, "loop=fit", "devices=1"), run_dir=run_dir,
              callbacks=[SigtermAt(0, 5)])
    return run_dir


STOPPED_MID_EPOCH = pytest.mark.xdist_group("test_resume.stopped_mid_epoch")


@pytest.mark.parametrize("loop, devices", [
    pytest.param("fit", 1, marks=STOPPED_MID_EPOCH), ("custom", 1),
    # on 2 replicas too (about 30 s each); test_metric_state_assigned_across_replicas... fast
    pytest.param("fit", 2, marks=pytest.mark.long),
    pytest.param("custom", 2, marks=pytest.mark.long)])
def test_the_epoch_resumed_mid_way_reports_the_training_metrics_of_all_its_steps(
        tiny_config, tmp_path, request, loop, devices):
    """The metrics' totals and counts at the stop are kept in the backup (metrics.npz) and
    assigned back after the loop resets them: the resumed epoch's loss and accuracy are the
    uninterrupted run's, not those of the steps after the resume."""
    args = [*METRICS_RESUME, f"loop={loop}", f"devices={devices}"]
    reference = train(tiny_config(*args), run_dir=tmp_path / "reference")
    run_dir = tmp_path / "run"
    if (loop, devices) == ("fit", 1):
        _copy(request.getfixturevalue("stopped_mid_epoch"), run_dir)
    else:
        with pytest.raises(Interrupted, match="at epoch 1"):
            train(tiny_config(*args), run_dir=run_dir, callbacks=[SigtermAt(0, 5)])
    newest = sorted((run_dir / "backup").glob("ckpt-*"))[-1]
    assert newest.name == "ckpt-000000-000000006"
    assert (newest / "metrics.npz").is_file()
    resumed = train(tiny_config(*args), run_dir=run_dir)
    assert resumed["resumed_from"]["step"] == 6
    assert reference["train_metrics"].keys() == resumed["train_metrics"].keys() != set()
    for name, value in reference["train_metrics"].items():
        assert resumed["train_metrics"][name] == pytest.approx(value, abs=1e-6), name
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(resumed["history"][name], reference["history"][name],
                                   rtol=0, atol=1e-6, err_msg=name)


@STOPPED_MID_EPOCH
@pytest.mark.long  # in the long pass with the [fit-1] test above, whose stopped run it shares
def test_a_mid_epoch_backup_without_metrics_still_resumes(tiny_config, tmp_path,
                                                          stopped_mid_epoch):
    """Backups written before metrics.npz existed: the resumed epoch counts from the resume."""
    args = [*METRICS_RESUME, "loop=fit", "devices=1"]
    run_dir = _copy(stopped_mid_epoch, tmp_path / "run")
    newest = sorted((run_dir / "backup").glob("ckpt-*"))[-1]
    (newest / "metrics.npz").unlink()
    state = json.loads((newest / "state.json").read_text())
    del state["sha256"]["metrics.npz"]
    (newest / "state.json").write_text(json.dumps(state))
    resumed = train(tiny_config(*args), run_dir=run_dir)
    assert resumed["resumed_from"]["step"] == 6
    assert resumed["epochs"] == 1 and np.isfinite(resumed["train_metrics"]["loss"])


def test_metric_state_assigned_across_replicas_reads_back_whole():
    """Metric variables are summed on read over the replicas (SyncOnRead, SUM): a backup
    saves the sum, and the cross-replica assign at the resume splits it back over them."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mean = keras.metrics.Mean(name="loss")
    values = tf.constant([[1.0, 2.0], [3.0, 10.0]])
    batches = strategy.experimental_distribute_values_from_function(
        lambda context: values[context.replica_id_in_sync_group])
    strategy.run(mean.update_state, args=(batches,))
    assert float(mean.result()) == 4.0 and float(mean.variables[1].numpy()) == 4.0
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"metrics-{os.getpid()}.npz"
    try:
        _metrics_taken(mean.variables)(path)
        saved = _load_metrics(path)
    finally:
        path.unlink(missing_ok=True)
    mean.reset_state()
    backup = Backup(BackupStore(Path("unused")), 0, 1, StopRequest(), initial_epoch=1,
                    initial_step=3)
    backup.metric_source = lambda: mean.variables
    backup.resumed_metrics = saved
    backup.on_epoch_begin(1)
    assert [float(v.numpy()) for v in mean.variables] == [16.0, 4.0]
    assert float(mean.result()) == 4.0
    strategy.run(mean.update_state, args=(batches,))  # the steps after the resume add on
    assert [float(v.numpy()) for v in mean.variables] == [32.0, 8.0]


def test_a_path_spelled_another_way_is_no_change(tmp_path, monkeypatch):
    (tmp_path / "images").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "images")
    monkeypatch.chdir(tmp_path)
    state, config = _state()
    config["dataset"] = {"path": "images"}
    for spelling in (str(tmp_path / "images"), str(tmp_path / "link"), "./link/",
                     str(tmp_path / "other" / ".." / "images")):
        assert check_resume(Path("r"), state, _with(config, **{"dataset.path": spelling})) == {}
    with pytest.raises(ConfigError, match=r"dataset.path from 'images' to "
                                          rf"'{tmp_path / 'other'}'"):
        check_resume(Path("r"), state, _with(config, **{"dataset.path": str(tmp_path / "other")}))
    # only existing paths are compared as places: a missing folder's spellings differ
    config["dataset"] = {"path": "gone"}
    with pytest.raises(ConfigError, match=r"dataset.path from 'gone' to './gone'"):
        check_resume(Path("r"), state, _with(config, **{"dataset.path": "./gone"}))


def test_a_run_resumes_on_its_folder_spelled_through_a_symlink(tmp_path, monkeypatch):
    from tests.conftest import make_config
    from tests.test_data import write_images

    write_images(tmp_path / "images")
    (tmp_path / "link").symlink_to(tmp_path / "images")
    monkeypatch.chdir(tmp_path)
    folder = ["dataset=image_folder", "dataset.image_size=8", "verbose=0", "logger=[]",
              "batch.per_replica=4", "model=small"]
    run_dir = tmp_path / "run"
    train(make_config(*folder, "dataset.path=images", "epochs=1"), run_dir)
    summary = train(make_config(*folder, f"dataset.path={tmp_path / 'link'}", "epochs=2",
                                f"resume={run_dir}"))
    assert summary["epochs_done"] == 2
    assert "dataset.path" not in (summary.get("resumed_from") or {}).get("changed", {})


def _every_byte(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and mtime_ns, by path, the lock file's included."""
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.xdist_group("test_resume.two_epochs")
def test_a_refused_resume_leaves_every_byte_as_it_was_the_lock_file_included(tmp_path,
                                                                             two_epochs):
    run_dir = _copy(two_epochs, tmp_path / "run")
    (run_dir / "summary.json").unlink()  # as if stopped: a rerun continues it
    (run_dir / ".lock").write_text("4242\n")  # the pid of the run that made it, long gone
    os.utime(run_dir / ".lock", ns=(1_000_000_000, 1_000_000_000))
    before = _every_byte(run_dir)
    out = run_main("epochs=2", "verbose=0", "dataset.image_size=8", "logger=[]",
                   "model=small", "seed=7", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 2 and "with a changed config" in error_lines(out.stderr)[0]
    assert _every_byte(run_dir) == before
