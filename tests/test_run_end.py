"""The end of a run is a state like any other: stopped in the final evaluation or export, a
rerun finishes exactly that; a finished run resumed with nothing to add is left alone; two
starts at once leave one run and an intact directory; a signal at start-up is one line."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import keras
import pytest

from tests.conftest import error_lines, run_main
from tests.test_fault_tolerance import start_cli, wait_for
from trainer.config.errors import EXIT_INTERRUPTED, Interrupted
from trainer.run.train import train

# 8x8 digits with a test share; `mode=max` over val_loss makes best.keras the worst epoch, so
# testing with it (test_with=best) differs from testing the last weights.
ENDING = ["epochs=2", "verbose=0", "dataset.image_size=8", "logger=[]", "deterministic=true",
          "checkpoint.monitor=val_loss", "checkpoint.mode=max", "model=small"]
SAME = ("epochs_done", "train_metrics", "validation_metrics", "test_metrics",
        "test_checkpoint", "history", "train_examples", "test_examples")


def tree(run_dir: Path) -> dict[str, str]:
    """Every file's path and content hash, with its modification time."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            + f"@{p.stat().st_mtime_ns}" for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, request):
    """A finished run (in code) and its summary."""
    from tests.conftest import make_config

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    summary = train(make_config(*ENDING), run_dir)
    return run_dir, summary


def _rerun(run_dir: Path, *extra: str, callbacks=()):
    from tests.conftest import make_config

    return train(make_config(*ENDING, *extra), run_dir, callbacks=callbacks)


def test_a_run_stopped_after_its_last_epoch_finishes_as_the_uninterrupted_one(finished,
                                                                              tmp_path):
    run_dir, whole = finished
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    (copy / "summary.json").unlink()  # stopped in the final evaluation, test or export
    summary = _rerun(copy)
    assert whole["test_checkpoint"].endswith("best.keras")
    for key in SAME:
        expected = whole[key]
        if key == "test_checkpoint":
            expected = expected.replace(str(run_dir), str(copy))
        assert summary[key] == expected, key
    assert len(summary["history"]["loss"]) == 2
    assert summary["resumed_from"]["training_done"] is True
    assert summary["resumed_from"]["epoch"] == 2
    assert summary["time"]["first_step_s"] is None
    assert json.loads((copy / "summary.json").read_text())["test_metrics"] == \
        whole["test_metrics"]


def test_a_damaged_best_checkpoint_at_the_end_is_one_warning_and_the_last_weights(
        finished, tmp_path, caplog):
    run_dir, whole = finished
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    (copy / "summary.json").unlink()
    best = copy / "checkpoints" / "best.keras"
    data = bytearray(best.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = b"\0" * 64
    best.write_bytes(bytes(data))  # in place: no other name shares the file
    summary = _rerun(copy)
    assert summary["test_checkpoint"].endswith("last.keras")
    warned = [r.getMessage() for r in caplog.records if "best.keras" in r.getMessage()]
    assert warned and "last.keras" in warned[0] and "\n" not in warned[0]


def test_a_finished_run_resumed_with_nothing_to_add_is_left_byte_identical(finished):
    run_dir, whole = finished
    before = tree(run_dir)
    result = run_main(*ENDING, f"resume={run_dir}", f"hydra.run.dir={run_dir}",
                      cwd=run_dir.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("finished: ")
    assert "nothing to do" in result.stdout and "epochs=3" in result.stdout
    assert error_lines(result.stderr) == []
    assert tree(run_dir) == before
    # in code too: the summary as it was, nothing written
    assert _rerun(run_dir, f"resume={run_dir}") == whole
    assert tree(run_dir) == before


class _SignalAtTrainEnd(keras.callbacks.Callback):
    """SIGTERM to this process as training ends: it arrives in the final evaluation."""

    def on_train_end(self, logs=None):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_in_the_final_evaluation_stops_and_a_rerun_finishes(finished, tmp_path):
    _, whole = finished
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted, match="during the final validation.*rerun the same"):
        _rerun(run_dir, callbacks=[_SignalAtTrainEnd()])
    assert not (run_dir / "summary.json").exists()
    summary = _rerun(run_dir)
    assert summary["epochs_done"] == 2 and summary["resumed_from"]["training_done"]
    assert summary["test_checkpoint"].endswith("best.keras")
    assert summary["train_metrics"] == whole["train_metrics"]
    assert summary["test_metrics"] == whole["test_metrics"]


def test_sigterm_at_start_up_is_one_line_and_leaves_nothing(tmp_path):
    run_dir = tmp_path / "run"
    process = start_cli("epochs=1", "verbose=0", "logger=[]", f"hydra.run.dir={run_dir}",
                     cwd=tmp_path)
    try:
        # Hydra's job has started (its log), TensorFlow not yet
        wait_for(lambda: (run_dir / "trainer.log").exists(), process)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == EXIT_INTERRUPTED, err
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("interrupted: SIGTERM"), err
    assert not run_dir.exists()


def test_two_starts_at_once_and_a_third_later_leave_one_run(tmp_path):
    run_dir = tmp_path / "run"
    args = ["epochs=50", "verbose=0", "logger=[]", "dataset.image_size=8",
            f"hydra.run.dir={run_dir}"]
    first = start_cli(*args, cwd=tmp_path)
    time.sleep(0.05)
    second = start_cli(*args, cwd=tmp_path)
    started = [first, second]
    try:
        # the winner trains (a backup at its first epoch's end); the loser is refused
        refused = []
        for process in (first, second):
            wait_for(lambda p=process: p.poll() is not None
                  or (run_dir / "backup").is_dir(), process)
        wait_for(lambda: second.poll() is not None or first.poll() is not None, first)
        loser = second if second.poll() is not None else first
        winner = first if loser is second else second
        out, err = loser.communicate(timeout=60)
        refused.append((loser.returncode, err))
        assert (run_dir / ".hydra" / "config.yaml").is_file()
        assert (run_dir / ".lock").is_file()
        # a third start while the winner trains: refused, nothing removed (in this process:
        # the lock is the winner's either way)
        third = run_main(*args, cwd=tmp_path)
        refused.append((third.returncode, third.stderr))
        for code, err in refused:
            lines = error_lines(err)
            assert code == 2 and len(lines) == 1 and "is in use by another run" in lines[0], err
        assert winner.poll() is None, "the winner was stopped"
        assert (run_dir / ".hydra" / "config.yaml").is_file()
        assert (run_dir / ".lock").read_text().strip() == str(winner.pid)
        winner.send_signal(signal.SIGTERM)
        winner.communicate(timeout=120)
        assert winner.returncode == EXIT_INTERRUPTED
        assert {p.name for p in run_dir.iterdir()} >= {".hydra", ".lock", "backup",
                                                        "checkpoints"}
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()


def test_a_start_refused_by_the_lock_removes_nothing_it_did_not_create(tmp_path, monkeypatch):
    """The interleaving that lost a winner's directory: this start finds no directory, then
    another creates it and locks it before this one locks."""
    import fcntl

    import trainer.run.prepare.preflight as entry

    run_dir = tmp_path / "run"
    held = []
    checked = entry.check_config

    def another_start_wins(cfg, **kwargs):
        if not held:
            run_dir.mkdir()
            (run_dir / ".hydra").mkdir()
            fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pwrite(fd, b"4242\n", 0)
            held.append(fd)
        return checked(cfg, **kwargs)

    monkeypatch.setattr(entry, "check_config", another_start_wins)
    try:
        result = run_main("epochs=1", "logger=[]", f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert result.returncode == 2
        # the holder named by the kernel's lock table (here this very process), not by the
        # pid written in the file
        assert error_lines(result.stderr) == [
            f"error: run directory {run_dir} is in use by another run in this process (pid "
            f"{os.getpid()}); wait for it to end, or choose another hydra.run.dir"]
        assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", ".lock"]
    finally:
        for fd in held:
            os.close(fd)


def _evaluable_copy(finished, tmp_path) -> Path:
    from omegaconf import OmegaConf

    from tests.conftest import make_config

    run_dir, _ = finished
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    (copy / ".hydra").mkdir()
    OmegaConf.save(make_config(*ENDING), copy / ".hydra" / "config.yaml")
    return copy


def _own_copy(path: Path, data: bytes) -> None:
    path.write_bytes(data)  # in place: no other name shares the file


@pytest.mark.parametrize("damage", ["garbage in best", "truncated last, no hash",
                                    "invalid yaml", "not a config"])
def test_evaluate_on_damage_is_one_line(finished, tmp_path, capsys, damage):
    from trainer.evaluate import main

    copy = _evaluable_copy(finished, tmp_path)
    best, last = copy / "checkpoints" / "best.keras", copy / "checkpoints" / "last.keras"
    args = [str(copy)]
    if damage == "garbage in best":
        data = bytearray(best.read_bytes())
        data[len(data) // 2:len(data) // 2 + 100] = b"x" * 100
        _own_copy(best, bytes(data))
        expected = f"error: {best} is damaged"
    elif damage == "truncated last, no hash":
        _own_copy(last, last.read_bytes()[:1000])
        Path(f"{last}.sha256").unlink()
        args.append("checkpoint=last")
        expected = f"error: {last} does not load ("
    elif damage == "invalid yaml":
        (copy / ".hydra" / "config.yaml").write_text("model: [unclosed\n  epochs: 3: 4\n")
        expected = f"error: {copy / '.hydra' / 'config.yaml'} is not a readable config ("
    else:
        (copy / ".hydra" / "config.yaml").write_text("- just\n- a list\n")
        expected = f"error: {copy / '.hydra' / 'config.yaml'} is not a run's config"
    assert main(args) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_evaluate_warns_nothing_a_user_cannot_act_on(finished, tmp_path, capsys):
    import warnings

    from trainer.evaluate import main

    copy = _evaluable_copy(finished, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([str(copy)]) == 0
    assert [str(w.message) for w in caught if "optimizer" in str(w.message)] == []
    assert json.loads(capsys.readouterr().out)["checkpoint"].endswith("best.keras")
