"""`python -m trainer.ray`'s refusals that come before Ray starts anything (tests/test_ray.py
runs it on a local Ray cluster): each one line naming the value, exit 2, nothing written.
In this process: the command's `main`, as `python -m trainer.ray` calls it."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ray", reason="Ray is an extra: pip install 'trainer[ray]'")


@pytest.mark.parametrize(("args", "expected"), [
    (["--workers", "2", "--min-workers", "3"], "--min-workers must be 1 to --workers (2)"),
    (["--workers", "0"], "--workers must be a positive number; received: 0"),
    (["--workers", "2", "cluster.size=2"], "Ray sets the cluster itself; remove cluster.size=2"),
    (["--workers", "2", "optimizer.lr=fast"], "optimizer.lr must be a number; received: 'fast'"),
    (["--workers", "2", "--address", "127.0.0.1:PORT"], "no Ray cluster at 127.0.0.1:PORT "
                                                        "(nothing answers at 127.0.0.1:PORT"),
], ids=["min_workers", "workers", "cluster_key", "bad_value", "no_cluster"])
def test_a_bad_ray_command_is_one_line_exit_2_before_ray_starts_anything(
        tmp_path, monkeypatch, capsys, args, expected):
    from trainer.distribute.launch import free_ports
    from trainer.ray import main

    port = str(free_ports(1)[0])
    monkeypatch.chdir(tmp_path)
    for name in ("RAY_DEDUP_LOGS", "RAY_DISABLE_WORKER_LOG_PREFIX"):  # set by the command
        monkeypatch.setenv(name, os.environ.get(name, ""))
    code = main([arg.replace("PORT", port) for arg in args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith(f"error: {expected.replace('PORT', port)}"), err
    assert err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_the_ledger_counts_restarts_steps_again_and_the_workers_it_started_with(tmp_path):
    from trainer.distribute.on_ray import ledger_after, ledger_environment

    first = ledger_after(None, 2, None, None)
    assert first == {"restarts": 0, "steps_again": 0, "workers_at_start": 2}
    assert ledger_environment(first, 2) == {"TRAINER_RESTARTS": "0",
                                            "TRAINER_STEPS_AGAIN": "0"}
    # the chief failed at epoch 1 (0-based) step 8 of 23; its newest backup was at step 5
    progress = tmp_path / "progress.json"
    progress.write_text('{"epoch": 1, "step": 8, "steps_per_epoch": 23}')
    second = ledger_after(first, 1, "ckpt-000001-000000005", progress)
    assert second == {"restarts": 1, "steps_again": 3, "workers_at_start": 2}
    assert ledger_environment(second, 1) == {"TRAINER_RESTARTS": "1",
                                             "TRAINER_STEPS_AGAIN": "3",
                                             "TRAINER_WORKERS_AT_START": "2"}
    # a chief killed outright says nothing: the steps trained again are not counted
    assert ledger_after(second, 2, "ckpt-000002-000000000", None)["steps_again"] == 3


def test_room_and_reachability_are_judged_before_ray_is_asked():
    from trainer.distribute.on_ray import _unreachable, room

    assert room(2, 1.0, {"CPU": 2.0}) is None
    assert room(2, 1.5, {"CPU": 2.0}).startswith("the Ray cluster has 2 CPUs; 2 workers of "
                                                  "1.5 CPU each need 3")
    assert room(1, 1.0, {}) is not None  # a cluster of heads without CPUs
    assert _unreachable("ray://10.0.0.1:10001") is None  # Ray Client's: Ray judges it
    assert _unreachable("auto") is None


def test_a_refusal_a_worker_noted_ends_the_command_with_exit_2_and_its_cause_is_found(tmp_path):
    # a worker's exit 2 noted in Ray's storage for the run: the next attempt ends at once,
    # and the command reads the note from Ray's result (its storage path and file system)
    from types import SimpleNamespace

    from pyarrow import fs

    from trainer.distribute.on_ray import REFUSED, WorkerStopped, _cause, _refused

    result = SimpleNamespace(filesystem=fs.LocalFileSystem(), path=str(tmp_path))
    assert not _refused(result)
    (tmp_path / REFUSED).write_text('{"worker": 1}')
    assert _refused(result)
    assert not _refused(SimpleNamespace())  # a result of another kind: no refusal read
    # Ray Train's error wraps the worker's own: its line is what the command says
    try:
        try:
            raise WorkerStopped("worker 1 stopped with exit code 2")
        except WorkerStopped as inner:
            raise RuntimeError("Training failed due to worker errors") from inner
    except RuntimeError as outer:
        assert str(_cause(outer)) == "worker 1 stopped with exit code 2"
