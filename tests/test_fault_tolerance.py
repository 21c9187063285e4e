"""Fault tolerance: kill and resume, SIGTERM, NaN, corrupt backups, no overwrite, export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import error_lines, run_cli, run_main
from tests.test_parity import _tiny_config
from trainer.config.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, ConfigError
from trainer.evaluate import evaluate_run, load_checkpoint
from trainer.run.train import train
from trainer.rundir.backup import BackupStore

# 8x8 digits, 8 per step: 180 steps an epoch, long enough to stop in the middle of one.
RESUMABLE = ["dataset.image_size=8", "logger=[]", "verbose=0", "epochs=2",
             "batch.per_replica=8", "deterministic=true", "checkpoint.backup_every=20"]


def start_cli(*args: str, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"gave up waiting (exit {process.returncode}): {err[-2000:]}")
        time.sleep(0.05)


def weights(run_dir: Path) -> list[np.ndarray]:
    return load_checkpoint(run_dir / "checkpoints" / "last.keras").get_weights()


def mid_epoch_backup(run_dir: Path, epoch: int = 0):
    return lambda: any(not p.name.endswith("000000000")
                       for p in (run_dir / "backup").glob(f"ckpt-{epoch:06d}-*"))


@pytest.mark.long  # its SIGTERM twin below runs by default
def test_sigkill_mid_epoch_then_rerun_equals_an_uninterrupted_run(tmp_path):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    assert run_cli(*RESUMABLE, f"hydra.run.dir={clean}", cwd=tmp_path).returncode == 0
    process = start_cli(*RESUMABLE, f"hydra.run.dir={killed}", cwd=tmp_path)
    try:
        wait_for(mid_epoch_backup(killed, epoch=1), process)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
    assert not (killed / "summary.json").exists()
    rerun = run_cli(*RESUMABLE, f"hydra.run.dir={killed}", cwd=tmp_path, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["resumed_from"]["epoch"] == 2
    assert summary["resumed_from"]["step"] % 20 == 0 and summary["resumed_from"]["step"] > 0
    model = load_checkpoint(killed / "checkpoints" / "last.keras")
    assert int(model.optimizer.iterations) == 2 * summary["steps_per_epoch"]
    for a, b in zip(weights(clean), weights(killed), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_sigterm_stops_at_a_step_and_resumes_from_it(tmp_path):
    run_dir = tmp_path / "run"
    # 90 steps an epoch (16 examples a step; the half second below stays well inside the two
    # epochs left on a fast machine): the stop and the resume are what is tested
    args = [*RESUMABLE, "batch.per_replica=16", "checkpoint.backup_every=0", "epochs=3",
            f"hydra.run.dir={run_dir}"]
    process = start_cli(*args, cwd=tmp_path)
    try:
        wait_for(lambda: (run_dir / "backup" / "ckpt-000001-000000000").exists(), process)
        time.sleep(0.5)  # into epoch 2
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == EXIT_INTERRUPTED, err[-2000:]
    assert "interrupted" in err and "rerun the same command to resume" in err
    state = json.loads(BackupStore(run_dir / "backup").backups()[0].joinpath("state.json")
                       .read_text())
    assert state["epoch"] in (1, 2) and (state["step"] > 0 or state["epoch"] == 2)
    rerun = run_main(*args, cwd=tmp_path)  # the same command again (in this process)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == {"epoch": state["epoch"] + 1, "step": state["step"],
                                       "changed": {}}
    model = load_checkpoint(run_dir / "checkpoints" / "last.keras")
    assert int(model.optimizer.iterations) == 3 * summary["steps_per_epoch"]


BLOW_UP = """
import keras


class BlowUp(keras.callbacks.Callback):
    \"\"\"Sends the weights to infinity as the second epoch starts, as a huge rate would.\"\"\"

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            for variable in self.model.trainable_variables:
                variable.assign(variable * 1e30)
"""


def test_diverging_learning_rate_stops_with_the_nan_error(tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "blowup.py").write_text(BLOW_UP)
    out = run_main("dataset.image_size=8", "logger=[]", "verbose=0", "model=small",
                   "optimizer=sgd_momentum_cosine",
                  "checkpoint.nan_check_every=1", "epochs=2", "+callbacks.blowup._target_="
                  "blowup.BlowUp", f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=300)
    lines = error_lines(out.stderr)
    assert out.returncode == EXIT_DIVERGED, out.stderr[-3000:]
    assert lines[-1].startswith("error: loss became "), lines
    assert "at epoch 2, step" in lines[-1] and "the last good backup is in" in lines[-1]
    # last.keras is written when training ends well; the best one of epoch 1 is kept
    assert not (run_dir / "checkpoints" / "last.keras").exists()
    model = load_checkpoint(run_dir / "checkpoints" / "best.keras")
    assert all(np.isfinite(w).all() for w in model.get_weights())
    point = BackupStore(run_dir / "backup").restore(model)
    assert (point.epoch, point.step) == (1, 0)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def small_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    return model


def two_backups(tmp_path: Path):
    """A store with backups at steps 10 and 20 of different weights; (store, weights at 10,
    the newest backup's directory)."""
    store = BackupStore(tmp_path / "backup")
    model = small_model()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    store.save(model, 0, 10)
    first = model.get_weights()
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), verbose=0)
    latest = store.save(model, 0, 20)
    store.wait()  # completed beside the caller
    return store, first, latest


def assert_restores_the_first(store: BackupStore, first) -> None:
    restored = small_model()
    point = store.restore(restored)
    assert (point.epoch, point.step) == (0, 10)
    for a, b in zip(first, restored.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_corrupt_latest_backup_falls_back_to_the_previous(tmp_path, caplog):
    store, first, latest = two_backups(tmp_path)
    with open(latest / "model.weights.h5", "r+b") as f:
        f.truncate(100)
    assert_restores_the_first(store, first)
    assert "does not load" in caplog.text


def test_backups_are_complete_and_only_two_kept(tmp_path):
    store = BackupStore(tmp_path / "backup")
    model = small_model()
    for step in (5, 10, 15):
        store.save(model, 0, step)
    names = [p.name for p in store.backups()]
    assert names == ["ckpt-000000-000000015", "ckpt-000000-000000010"]
    assert not list((tmp_path / "backup").glob(".tmp-*"))


def test_finished_run_is_not_overwritten_unless_resumed(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    first = run_main("dataset.image_size=8", "epochs=1", "verbose=0", "logger=[]",
                     "model=small", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    again = run_main("dataset.image_size=8", "model=small", "epochs=3",
                     f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=120)
    lines = error_lines(again.stderr)
    assert again.returncode == 2 and len(lines) == 1 and "holds a finished run" in lines[0]
    assert (run_dir / ".hydra" / "config.yaml").read_text() == config
    # resume= continues it: two more epochs on top of the first.
    summary = train(tiny_config("epochs=3", f"resume={run_dir}"))  # the CLI's
    assert summary["resumed_from"] == {"epoch": 2, "step": 0, "changed": {"epochs": [1, 3]}}
    model = load_checkpoint(run_dir / "checkpoints" / "last.keras")
    assert int(model.optimizer.iterations) == 3 * summary["steps_per_epoch"]


def test_export_and_evaluate_a_finished_run(tmp_path, tiny_config):
    summary = train(tiny_config("export=true", "accelerator=cpu", "devices=2"), run_dir=tmp_path)
    assert summary["exports"] == {"saved_model": summary["saved_model"]}  # true: a SavedModel
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(
        __import__("omegaconf").OmegaConf.to_yaml(tiny_config("accelerator=cpu", "devices=2")))
    model = load_checkpoint(tmp_path / "checkpoints" / "last.keras")
    served = tf.saved_model.load(summary["saved_model"])
    x = np.random.default_rng(0).random((5, 8, 8, 1)).astype("float32")
    np.testing.assert_allclose(served.serve(x).numpy(), model.predict(x, verbose=0), rtol=1e-5,
                               atol=1e-6)
    one = evaluate_run(tmp_path, ["devices=1", "checkpoint=last"])
    two = evaluate_run(tmp_path, ["devices=2", "checkpoint=last"])
    assert one["replicas"] == 1 and two["replicas"] == 2
    assert one["metrics"]["accuracy"] == pytest.approx(two["metrics"]["accuracy"], abs=1e-7)
    assert one["metrics"]["accuracy"] == pytest.approx(
        summary["validation_metrics"]["accuracy"], abs=1e-7)


def test_a_nan_before_any_backup_does_not_point_to_one(tmp_path):
    out = run_main("dataset.image_size=8", "logger=[]", "verbose=0", "model=small",
                   "optimizer=sgd_momentum_cosine",
                  "optimizer.lr=1e30", "checkpoint.nan_check_every=1", "epochs=1",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    lines = error_lines(out.stderr)
    assert out.returncode == EXIT_DIVERGED, out.stderr[-3000:]
    assert lines[-1].startswith("error: loss became ") and "at epoch 1, step " in lines[-1]
    assert "no backup was written before it" in lines[-1] and "backup is in" not in lines[-1]


def _damage_the_middle(path: Path) -> None:
    """Garbage bytes in the middle of a file, its size unchanged: HDF5 still opens it."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 64)


def test_garbage_in_the_middle_of_a_backup_is_caught_by_its_checksum(tmp_path, caplog):
    store, first, latest = two_backups(tmp_path)
    _damage_the_middle(latest / "model.weights.h5")
    assert_restores_the_first(store, first)
    assert f"{latest / 'model.weights.h5'} is damaged" in caplog.text


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    """A finished 2-epoch run of the small network, made once: the tests that damage or
    resume it work on their own copies."""
    run_dir = tmp_path_factory.mktemp("two_epochs") / "run"
    train(_tiny_config("epochs=2"), run_dir=run_dir)
    return run_dir


def _copy(run_dir: Path, to: Path) -> Path:
    """A copy of a shared run, every file's bytes and times kept."""
    subprocess.run(["cp", "-a", str(run_dir), str(to)], check=True)
    return to


@pytest.mark.xdist_group("test_fault_tolerance.two_epochs")
def test_a_damaged_checkpoint_is_named_on_load(tmp_path, two_epochs):
    from trainer.config.errors import ConfigError

    run_dir = _copy(two_epochs, tmp_path / "run")
    last = run_dir / "checkpoints" / "last.keras"
    assert (run_dir / "checkpoints" / "last.keras.sha256").is_file()
    load_checkpoint(last)
    _damage_the_middle(last)
    with pytest.raises(ConfigError, match=f"{last} is damaged"):
        load_checkpoint(last)


def test_a_backup_directory_removed_during_a_write_is_made_again(tmp_path, monkeypatch):
    import trainer.rundir.backup as backup
    from trainer.rundir.atomic import write_checksum

    store = BackupStore(tmp_path / "backup")
    model = small_model()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    original, calls = backup.copy_open, []

    def removed_once(source, path):
        calls.append(path)
        if len(calls) == 1:
            import shutil

            shutil.rmtree(store.directory)
        return original(source, path)

    monkeypatch.setattr(backup, "copy_open", removed_once)
    best = tmp_path / "best.keras"
    model.save(best)
    write_checksum(best)
    path = store.save(model, 0, 5, same_as=best)
    assert store.backups() == [path] and len(calls) == 2
    assert (path / "model.keras").read_bytes() == best.read_bytes()


def test_a_backup_holds_the_state_it_was_taken_at_and_saves_as_keras_does(tmp_path, held):
    import h5py

    store = BackupStore(tmp_path / "backup")
    model = small_model()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    taken = [w.copy() for w in model.get_weights()]
    model.save_weights(tmp_path / "keras.weights.h5")
    path = store.save(model, 0, 5)
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), verbose=0)  # while the write waits
    held.set()
    restored = small_model()
    assert store.restore(restored).step == 5
    for a, b in zip(taken, restored.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)

    def contents(file):
        found = {}
        file.visititems(lambda name, item: found.__setitem__(
            name, item[()].tolist() if isinstance(item, h5py.Dataset) else dict(item.attrs)))
        return found

    with h5py.File(path / "model.weights.h5") as ours, \
            h5py.File(tmp_path / "keras.weights.h5") as theirs:
        assert contents(ours) == contents(theirs)  # the file save_weights wrote then


@pytest.mark.xdist_group("test_fault_tolerance.two_epochs")
def test_leftovers_are_cleaned_and_a_finished_run_keeps_two_backups(tmp_path, tiny_config,
                                                                    two_epochs):
    run_dir = _copy(two_epochs, tmp_path / "run")
    assert sorted(p.name for p in (run_dir / "backup").iterdir()) == [
        "ckpt-000001-000000000", "ckpt-000002-000000000"]
    # What a kill in the middle of writes would leave:
    (run_dir / "backup" / ".tmp-abc123").mkdir()
    (run_dir / "backup" / ".tmp-abc123" / "model.weights.h5").write_bytes(b"half")
    (run_dir / "checkpoints" / ".tmp-last.keras").write_bytes(b"half")
    summary = train(tiny_config("epochs=3", f"resume={run_dir}"))
    assert summary["resumed_from"]["epoch"] == 3
    assert not list(run_dir.rglob(".tmp-*"))
    assert sorted(p.name for p in (run_dir / "backup").iterdir()) == [
        "ckpt-000002-000000000", "ckpt-000003-000000000"]


@pytest.mark.xdist_group("test_fault_tolerance.two_epochs")
@pytest.mark.parametrize("damage", ["state", "weights"])
def test_a_finished_run_whose_newest_backup_is_damaged_resumes_from_the_one_before(
        tmp_path, tiny_config, two_epochs, damage):
    """64 damaged bytes in the newest backup's weights, or its `state.json` emptied: the
    finished run still resumes (`resume=`, one epoch more), from the backup before it."""
    run_dir = _copy(two_epochs, tmp_path / "run")
    newest = run_dir / "backup" / "ckpt-000002-000000000"
    if damage == "state":
        (newest / "state.json").write_text("")
    else:
        weights = max(newest.iterdir(), key=lambda p: p.stat().st_size)  # the model's
        data = bytearray(weights.read_bytes())
        data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
        weights.write_bytes(bytes(data))
    summary = train(tiny_config("epochs=3", f"resume={run_dir}"))
    assert summary["resumed_from"]["epoch"] == 2 and summary["epochs_done"] == 3


def test_progress_of_a_resumed_run_counts_in_the_whole_run(capsys):
    from trainer.run.assembly.callbacks import RunProgress

    progress = RunProgress(epochs=3, steps=23, start=(1, 5))
    # The rest of epoch 2 as its own fit call: Keras passes that call's epochs and steps.
    progress.set_params({"verbose": 1, "epochs": 2, "steps": 18})
    progress.on_train_begin()
    progress.on_epoch_begin(1)
    progress.on_train_batch_end(0, {"loss": 1.0})
    assert "Epoch 2/3" in capsys.readouterr().out
    assert (progress.progbar.target, progress.progbar._seen_so_far) == (23, 6)
    progress.on_epoch_begin(2)  # later epochs count from their start
    progress.on_train_batch_end(0, {"loss": 1.0})
    assert (progress.progbar.target, progress.progbar._seen_so_far) == (23, 1)


def test_too_little_disk_space_is_refused_before_training(tmp_path, tiny_config, monkeypatch):
    from collections import namedtuple

    from trainer.config.errors import ConfigError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("trainer.rundir.space.shutil.disk_usage",
                        lambda path: usage(10**6, 10**6 - 1000, 1000))
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=rf"the disk of {run_dir} has 1,000 bytes free; this "
                                          r"run's backups and checkpoints need about [\d,]+;"):
        train(tiny_config(), run_dir=run_dir)
    assert not run_dir.exists()


def _disk_use(root: Path) -> int:
    """Bytes of the files under `root`, each hard-linked file once."""
    seen, total = set(), 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except OSError:  # removed meanwhile
                continue
            if stat.st_ino not in seen:
                seen.add(stat.st_ino)
                total += stat.st_size
    return total


def _measure_peak(monkeypatch, root: Path, peak: list) -> None:
    """Samples `root`'s disk use before every call that frees space (a rename over a file,
    a removal): between them a run only writes, so the largest sample is its peak."""
    def sampled(function):
        def call(*args, **kwargs):
            peak[0] = max(peak[0], _disk_use(root))
            return function(*args, **kwargs)
        return call

    for name in ("replace", "rename", "remove", "unlink"):
        monkeypatch.setattr(os, name, sampled(getattr(os, name)))
    monkeypatch.setattr("shutil.rmtree", sampled(__import__("shutil").rmtree))


def test_the_free_space_asked_for_covers_the_peak_of_a_real_run(tmp_path, tiny_config,
                                                                monkeypatch):
    """Mid-epoch backups, a best checkpoint replaced each epoch (val_loss falls), export, and
    a resume of the finished run (its last.keras and saved_model/ kept beside the new ones):
    the estimate made before training is above every moment's disk use (58.6 MB for a peak of
    35.0 MB). Before, it counted the optimizer unbuilt (Adam's two slots per weight left out)
    and no export: 17.8 MB."""
    import trainer.run.guards as guards

    estimates, peak = [], [0]
    needed_bytes = guards.needed_bytes

    def recorded(*args, **kwargs):
        estimates.append(needed_bytes(*args, **kwargs))
        return estimates[-1]

    monkeypatch.setattr(guards, "needed_bytes", recorded)
    run_dir = tmp_path / "run"
    _measure_peak(monkeypatch, run_dir, peak)
    # The default network: on a small one, the files' fixed overhead would dominate.
    args = ["model=cnn", "accelerator=cpu", "devices=1", "checkpoint.monitor=val_loss",
            "checkpoint.backup_every=5", "export=true"]
    train(tiny_config(*args, "epochs=2"), run_dir=run_dir)
    train(tiny_config(*args, "epochs=3", f"resume={run_dir}"), run_dir=run_dir)
    peak[0] = max(peak[0], _disk_use(run_dir))
    assert (run_dir / "saved_model").is_dir()
    assert len(estimates) == 2 and estimates[0] == estimates[1]
    assert estimates[0] >= peak[0], (estimates[0], peak[0])
    assert estimates[0] < 4 * peak[0], (estimates[0], peak[0])  # a bound, not a refusal


# the state taken in the step loop, or the rest beside it: its failure said at the next
# backup (3 epochs) or at the run's end (2 epochs: the second backup is the last)
@pytest.mark.parametrize(("part", "epochs"), [("_capture", 3), ("_complete", 3),
                                              ("_complete", 2)])
def test_a_disk_that_fills_mid_run_is_one_error_and_keeps_the_last_backup(tmp_path, tiny_config,
                                                                           monkeypatch, part,
                                                                           epochs):
    import errno

    from trainer.config.errors import ConfigError

    original, calls = getattr(BackupStore, part), []

    def full_at_the_second(self, *args):
        calls.append(args)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.directory))
        return original(self, *args)

    monkeypatch.setattr(BackupStore, part, full_at_the_second)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=rf"the disk of {run_dir} filled up while the run wrote "
                                          r"a backup or checkpoint; it needs about [\d,]+ bytes "
                                          r"free; the last good backup is kept"):
        train(tiny_config(f"epochs={epochs}"), run_dir=run_dir)
    assert not (run_dir / "summary.json").exists()
    monkeypatch.setattr(BackupStore, part, original)
    point = BackupStore(run_dir / "backup").restore(small_model_like(run_dir))
    assert (point.epoch, point.step) == (1, 0)


def small_model_like(run_dir: Path):
    """The run's model, freshly built, to load its backup into (last.keras is written only
    when training ends well: the best checkpoint of an epoch is there)."""
    model = load_checkpoint(run_dir / "checkpoints" / "best.keras")
    return model


def test_damaged_newer_backups_are_set_aside_so_new_ones_are_kept(tmp_path):
    store = BackupStore(tmp_path / "backup", keep=3)
    model = small_model()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    store.save(model, 0, 10)
    for step in (20, 30):  # two newer backups, both damaged
        path = store.save(model, 0, step)
        store.wait()  # completed beside the caller
        _damage_the_middle(path / "model.weights.h5")
    assert [p.name for p in store.backups()][:1] == ["ckpt-000000-000000030"]
    point = store.restore(small_model())
    assert (point.epoch, point.step) == (0, 10)
    assert sorted(p.name for p in store.directory.iterdir()) == [
        "ckpt-000000-000000010", "damaged-ckpt-000000-000000020",
        "damaged-ckpt-000000-000000030"]
    # The resumed run's next backups (older names than the damaged ones) survive rotation.
    for step in (15, 16, 17):
        store.save(model, 0, step)
    assert [p.name for p in store.backups()] == ["ckpt-000000-000000017",
                                                 "ckpt-000000-000000016",
                                                 "ckpt-000000-000000015"]


def test_a_resumed_run_keeps_the_best_value_so_far(tmp_path):
    # Without it, the first epoch after a resume would replace a better best.keras.
    import json

    from trainer.run.assembly.callbacks import AtomicModelCheckpoint

    path = tmp_path / "best.keras"
    (tmp_path / "best.keras.best.json").write_text(
        json.dumps({"monitor": "val_accuracy", "best": 0.93}))
    resumed = AtomicModelCheckpoint(str(path), monitor="val_accuracy", save_best_only=True,
                                    mode="max")
    assert resumed.best == 0.93
    other = AtomicModelCheckpoint(str(path), monitor="val_loss", save_best_only=True,
                                  mode="min")
    assert other.best != 0.93  # another monitor starts afresh


def _written() -> int:
    """Bytes this process has passed to write() so far (Linux's /proc/self/io wchar)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_an_epoch_writes_about_one_copy_of_the_state(tiny_config, tmp_path):
    """What each further epoch writes (the difference of a 3- and a 1-epoch run): at most
    2.5 x the model's and optimizer's variables (measured 2.02x: an epoch whose best
    improved writes best.keras and its backup's own copy of it, no two names sharing a
    file). Before hard links: last.keras, best.keras and a backup each epoch, about 3. (Its
    name is older than the copies; tests/slow_tests.txt lists it by that name.)"""
    from trainer.rundir.space import state_bytes

    class Keep(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.state = state_bytes(self.model)

    keep, written = Keep(), {}
    for epochs in (1, 3):
        before = _written()
        # The default network: on a small one, the files' fixed overhead would dominate.
        train(tiny_config("model=cnn", "accelerator=cpu", "devices=1", f"epochs={epochs}",
                          "checkpoint.monitor=val_loss"),
              run_dir=tmp_path / f"e{epochs}", callbacks=[keep])
        written[epochs] = _written() - before
    per_epoch = (written[3] - written[1]) / 2
    assert 0.9 * keep.state < per_epoch <= 2.5 * keep.state, (per_epoch, keep.state)
    backups = sorted((tmp_path / "e3" / "backup").iterdir())
    assert [p.name for p in backups] == ["ckpt-000002-000000000", "ckpt-000003-000000000"]


def test_an_epoch_backup_copies_the_best_checkpoint_written_from_the_same_state(tmp_path):
    from trainer.rundir.atomic import write_checksum

    model = small_model()
    model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=3, verbose=0)
    best = tmp_path / "best.keras"
    model.save(best)
    write_checksum(best)
    store = BackupStore(tmp_path / "backup")
    path = store.save(model, 1, 0, same_as=best)
    store.wait()  # completed beside the caller
    # the same bytes in a file of its own: damage to best.keras never reaches the backup
    assert (path / "model.keras").read_bytes() == best.read_bytes()
    assert (path / "model.keras").stat().st_ino != best.stat().st_ino
    assert best.stat().st_nlink == 1
    assert not (path / "model.weights.h5").exists()
    best.write_bytes(b"overwritten")
    other = small_model()
    other.fit(np.zeros((8, 3)), np.zeros((8, 2)), verbose=0)
    point = BackupStore(tmp_path / "backup").restore(other)
    assert (point.epoch, point.step) == (1, 0)
    for a, b in zip(model.get_weights(), other.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(other.optimizer.iterations) == int(model.optimizer.iterations) == 3


@pytest.fixture
def held(monkeypatch):
    """Holds each backup's slow part (checksums, rename, upload: `BackupStore._complete`) at
    a gate until the test opens it; `held.entered` is set once one waits there."""
    import threading

    original = BackupStore._complete
    gate = threading.Event()
    gate.entered = threading.Event()

    def at_the_gate(self, *args):
        gate.entered.set()
        assert gate.wait(10), "the gate was never opened"
        return original(self, *args)

    monkeypatch.setattr(BackupStore, "_complete", at_the_gate)
    return gate


def test_a_backup_completes_beside_the_step_loop_one_at_a_time(tmp_path, held):
    import threading

    store = BackupStore(tmp_path / "backup")
    model = small_model()
    first = store.save(model, 0, 5)  # back at once: its slow part waits at the gate
    assert held.entered.wait(10) and not first.exists() and store.flight.busy
    second = threading.Thread(target=store.save, args=(model, 0, 10))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # a new backup waits for the one in flight
    held.set()
    second.join(10)
    assert [p.name for p in store.backups()] == ["ckpt-000000-000000010", first.name]
    store.close()


def test_a_stop_and_a_recovery_wait_for_the_backup_in_flight(tmp_path, held):
    import threading

    from trainer.rundir.backup import Backup, StopNow, StopRequest

    store = BackupStore(tmp_path / "backup")
    model = small_model()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    opener = threading.Timer(0.2, held.set)  # the gate opens while the caller waits
    opener.start()
    store.save(model, 0, 10)
    restored = small_model()
    point = store.restore(restored)  # a recovery restores the newest: the one in flight
    assert point is not None and point.step == 10
    held.clear()
    request = StopRequest()
    request.signal = signal.SIGTERM
    backup = Backup(store, 0, 1, request)
    backup.set_model(model)
    backup.set_params({"steps": 10})
    backup.on_epoch_begin(0)
    threading.Timer(0.2, held.set).start()
    with pytest.raises(StopNow):
        backup.on_train_batch_end(2, {"loss": 1.0})
    # out of the step loop with the stop's backup complete, not still in flight
    assert "ckpt-000000-000000003" in [p.name for p in store._found()]
    assert not store.flight.busy
    store.close()


def test_a_backup_folder_removed_or_replaced_by_a_file_between_backups_is_said(
        tmp_path, caplog):
    """`backup/` removed between two backups: the next makes it again and says the backups
    it held are gone (it was made again without a word); a file in its place: one line at
    the next wait (a 94-line NotADirectoryError from the background writer)."""
    import shutil

    store = BackupStore(tmp_path / "backup")
    model = small_model()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    store.directory.mkdir()
    store.save(model, 0, 1)
    store.wait()
    shutil.rmtree(store.directory)
    with caplog.at_level("WARNING"):
        path = store.save(model, 0, 2)
        store.wait()
    assert store.backups() == [path]
    assert "was removed during the run, with the backups it held" in caplog.text
    shutil.rmtree(store.directory)
    store.directory.write_text("not a folder")
    store.save(model, 0, 3)
    with pytest.raises(ConfigError) as error:
        store.wait()
    assert str(error.value) == (f"{store.directory} is a file now, not the run's backup folder "
                                "(replaced during the run): move it away, then rerun the same "
                                "command; checkpoints/ is kept")
