"""A run directory's lock belongs to its run: one run ending (in a thread of a longer
process, or `trainer.fit`) never releases another's; who holds it is told by the kernel's
lock table, not by a stale pid in the file; a `.lock` that is a directory is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainer.config.errors import ConfigError
from trainer.rundir import lock


def _in_thread(function, *args):
    """`function(*args)` in a new thread; returns its result, or the exception it raised."""
    out = []

    def body():
        try:
            out.append(function(*args))
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            out.append(error)

    worker = threading.Thread(target=body)
    worker.start()
    worker.join(60)
    return out[0]


def _refused(run_dir: Path) -> bool:
    """Whether a `hold` from a fresh thread is refused (and releases it where it was not)."""
    def try_hold():
        try:
            lock.hold(run_dir)
        except ConfigError:
            return True
        lock.release_held()
        return False
    return _in_thread(try_hold)


def test_one_thread_releasing_its_locks_leaves_another_threads_lock_held(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    taken, done, end = threading.Event(), threading.Event(), threading.Event()

    def keep_a():  # holds a until told to end, then releases its own
        lock.hold(first)
        taken.set()
        end.wait(60)
        lock.release_held()

    holder = threading.Thread(target=keep_a)
    holder.start()
    try:
        assert taken.wait(60)

        def run_b():  # a whole run's life in another thread: hold, end, release its own
            lock.hold(second)
            lock.release_held()
            done.set()

        _in_thread(run_b)
        assert done.is_set()
        assert _refused(first), "a's lock was released by b's end"
        assert lock.holder(first) == str(os.getpid())
        assert not _refused(second)  # b's own lock did go
    finally:
        end.set()
        holder.join(60)
    assert lock.holder(first) is None


def test_a_lock_handle_is_released_by_its_owner_alone(tmp_path):
    mine, theirs = lock.acquire(tmp_path / "a"), lock.acquire(tmp_path / "b")
    try:
        lock.release_held()  # the command line's end: holds nothing of `acquire`'s
        mine.release()
        assert not mine.held and theirs.held
        assert lock.holder(tmp_path / "a") is None
        assert lock.holder(tmp_path / "b") == str(os.getpid())
        # another process is refused too, naming this one
        out = subprocess.run([sys.executable, "-c",
                              "import sys; from trainer.rundir.lock import hold\n"
                              "try: hold(sys.argv[1])\n"
                              "except Exception as e: print(e)", str(tmp_path / "b")],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == (f"run directory {tmp_path / 'b'} is in use by another "
                                      f"run (pid {os.getpid()}); wait for it to end, or "
                                      "choose another hydra.run.dir"), out.stderr
    finally:
        theirs.release()


def test_a_second_hold_in_the_same_process_from_another_thread_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    with lock.acquire(run_dir):
        refused = _in_thread(lock.hold, run_dir)
        assert isinstance(refused, ConfigError)
        assert str(refused) == (f"run directory {run_dir} is in use by another run in this "
                                f"process (pid {os.getpid()}); wait for it to end, or choose "
                                "another hydra.run.dir")


def test_a_lock_held_by_another_program_names_that_program_not_the_files_stale_pid(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").write_text("999999\n")  # the pid of a run long gone
    other = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\ntime.sleep(120)", str(run_dir / ".lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as refused:
            lock.hold(run_dir)
        assert str(refused.value) == (f"run directory {run_dir} is in use by another run (pid "
                                      f"{other.pid}); wait for it to end, or choose another "
                                      "hydra.run.dir")
        assert lock.holder(run_dir) == str(other.pid)
    finally:
        other.kill()
        other.wait(30)
    assert (run_dir / ".lock").read_text() == "999999\n"


def test_taking_a_lock_over_an_existing_lock_file_does_not_rewrite_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / ".lock"
    path.write_text("4242\n")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    with lock.acquire(run_dir):
        pass
    assert path.read_text() == "4242\n" and path.stat().st_mtime_ns == 1_000_000_000
    fresh = tmp_path / "fresh"
    with lock.acquire(fresh):
        assert (fresh / ".lock").read_text() == f"{os.getpid()}\n"  # a new file: its pid


def test_a_lock_that_is_a_directory_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".lock").mkdir(parents=True)
    with pytest.raises(ConfigError) as refused:
        lock.hold(run_dir)
    assert str(refused.value) == (f"run directory {run_dir} has a directory .lock where its "
                                  f"lock file goes; remove {run_dir / '.lock'} (a run never "
                                  "makes it), or choose another hydra.run.dir")
    assert (run_dir / ".lock").is_dir()


TINY = ["epochs=1", "verbose=0", "dataset.image_size=8", "logger=[]", "model=small"]


def test_two_fits_in_two_threads_each_keep_their_own_lock(tmp_path, monkeypatch):
    """The first `fit` is held at its training's start (its lock taken, its checks passed)
    while a second trains to the end in another thread: the second's end leaves the first's
    lock held; then the first trains too."""
    import trainer
    import trainer.run.train as training

    first, second = tmp_path / "first", tmp_path / "second"
    started, go = threading.Event(), threading.Event()
    real = training.run

    def held_at_start(checked, *args, **kwargs):
        if Path(checked.run_dir) == first:
            started.set()
            assert go.wait(300)
        return real(checked, *args, **kwargs)

    monkeypatch.setattr(training, "run", held_at_start)
    results = {}

    def fit(name, run_dir):
        try:
            results[name] = trainer.fit(TINY, run_dir=run_dir)
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            results[name] = error

    one = threading.Thread(target=fit, args=("first", first))
    one.start()
    try:
        assert started.wait(300), results
        fit("second", second)  # this thread: a whole fit, start to end
        assert not isinstance(results["second"], BaseException), results["second"]
        assert results["second"].summary["epochs_done"] == 1
        assert lock.holder(first) == str(os.getpid()), "the second fit released the first's"
        assert _refused(first)
    finally:
        go.set()
        one.join(300)
    assert not isinstance(results["first"], BaseException), results["first"]
    assert results["first"].summary["epochs_done"] == 1
    assert lock.holder(first) is None and lock.holder(second) is None


def test_a_refused_fit_keeps_no_lock(tmp_path):
    import trainer

    run_dir = tmp_path / "run"
    trainer.fit(TINY, run_dir=run_dir)
    (run_dir / "summary.json").unlink()  # a run that stopped before its end
    with pytest.raises(trainer.TrainerError, match="changed config"):
        trainer.fit([*TINY, "seed=7"], run_dir=run_dir)
    assert lock.holder(run_dir) is None



def test_resuming_a_run_still_starting_says_it_is_training(tmp_path):
    from trainer.rundir.resume import check_resume_target

    run_dir = tmp_path / "run"
    with lock.acquire(run_dir):  # a run before its first backup: only its lock file
        with pytest.raises(ConfigError) as refused:
            check_resume_target(str(run_dir), None)
    assert str(refused.value) == (f"resume={run_dir} is a run still training (pid "
                                  f"{os.getpid()}), with nothing to resume from yet; wait for "
                                  "it to end, then resume it")
    with pytest.raises(ConfigError, match="is not a run directory"):  # its lock released
        check_resume_target(str(run_dir), None)


def test_a_thread_that_ends_holding_a_lock_leaves_it_free(tmp_path):
    import gc

    run_dir = tmp_path / "run"
    _in_thread(lock.hold, run_dir)  # never released by its thread
    gc.collect()
    assert lock.holder(run_dir) is None


def test_a_lock_that_is_a_directory_is_one_line_from_the_command_line(tmp_path):
    from tests.conftest import error_lines, run_main

    run_dir = tmp_path / "run"
    (run_dir / ".lock").mkdir(parents=True)
    out = run_main(*TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        f"error: run directory {run_dir} has a directory .lock where its lock file goes; "
        f"remove {run_dir / '.lock'} (a run never makes it), or choose another hydra.run.dir"]
    assert [p.name for p in run_dir.iterdir()] == [".lock"]


def failing_tracker(run_dir, params, chief):
    """A logger builder of the test's own that cannot start: a run failing once TensorFlow
    runs, its run directory made."""
    raise RuntimeError("no tracking today")


def test_the_runs_owner_releases_its_lock_exactly_once(tmp_path, monkeypatch):
    """One stack of guards (`trainer.run.prepare.owner`): a command-line run, a `trainer.fit` run
    and a command-line run failing once TensorFlow runs each release their lock once (the
    command line released it twice: in the run and again at its end), and the failed one
    leaves no directory and one line."""
    import trainer
    from tests.conftest import error_lines, run_main

    released: dict[Path, int] = {}
    real = lock.RunLock.release

    def counted(self):
        released[self.run_dir] = released.get(self.run_dir, 0) + 1
        return real(self)

    monkeypatch.setattr(lock.RunLock, "release", counted)
    cli, fit, failed = tmp_path / "cli", tmp_path / "fit", tmp_path / "failed"
    assert run_main(*TINY, f"hydra.run.dir={cli}", cwd=tmp_path).returncode == 0
    trainer.fit(TINY, run_dir=fit)
    out = run_main(*TINY, "+logger.mine._target_=test_run_lock.failing_tracker",
                   f"hydra.run.dir={failed}", cwd=tmp_path)
    assert out.returncode == 2
    assert error_lines(out.stderr) == ["error: logger mine could not start (no tracking "
                                       "today); fix its logger.mine options, or drop it: "
                                       "logger=[]"]
    assert not failed.exists()
    assert released == {cli: 1, fit: 1, failed: 1}
