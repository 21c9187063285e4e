"""A run stopped at any moment, on 1 process or 2 workers, then started again by the
launcher (`--max-restarts`) or by hand (the same command again), ends with what the
uninterrupted run reports: its weights, its history (every epoch's training and validation
metrics over all their steps), its test metrics and its counts, not only its weights.

The moments (tests/pause_at.py holds the run there, once, and the test SIGKILLs it): the
first step, mid-epoch (a mid-epoch backup behind), an epoch's end (its backup being
written), after the last epoch's backup (before the final evaluation, which the chief's
peer is already in on 2 workers). A restart kills the chief alone; a relaunch kills every
process of the launch. `IN_CI` is the cells CI runs; the rest is one slow test
(tests/slow_tests.txt). A mid-epoch restart of 2 workers (worker 1 killed, the launcher's
lines checked) is tests/test_restarts.py's.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.test_multiworker import COMMON, assert_same_weights, launches, reference

__all__ = ["launches"]  # the fixture, imported for the tests below

pytestmark = pytest.mark.multiworker

MOMENTS = ("first_step", "mid_epoch", "epoch_end", "train_end")
CELLS = [(moment, workers, how) for moment in MOMENTS for workers in (1, 2)
         for how in ("restart", "relaunch")]
# CI's: the chief lost after the last epoch's backup, restarted and relaunched (#61's
# done-when); a mid-epoch restart of 2 workers is tests/test_restarts.py's, and Ray's
# tests/test_ray.py's
IN_CI = [("train_end", 2, "restart"), ("train_end", 2, "relaunch")]
# lr 0.01 and a fixed global batch: 2 workers train as 1 device to 1e-5
BATCH = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01",
         "deterministic=true", "checkpoint.backup_every=5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_config_module) -> dict:
    """The same training never stopped (1 device in this process) and its summary."""
    where = tmp_path_factory.mktemp("uninterrupted")
    run_dir = reference(where, tiny_config_module, "whole", *BATCH)
    return {"run_dir": run_dir, "summary": json.loads((run_dir / "summary.json").read_text())}


@pytest.fixture(scope="module")
def tiny_config_module():
    from tests.conftest import TINY, make_config

    def compose_tiny(*overrides: str):
        return make_config(*TINY, *overrides)
    return compose_tiny


def stop_and_finish(tmp_path: Path, launches, moment: str, workers: int,  # noqa: F811
                    how: str) -> Path:
    """Trains, holds the run at `moment`, SIGKILLs it there as `how` says, lets it finish;
    its run directory."""
    cell = f"{moment}-{workers}-{how}"
    run_dir, marker = tmp_path / f"run-{cell}", tmp_path / f"{cell}.held"
    args = [*COMMON, *BATCH, f"hydra.run.dir={run_dir}",
            "+callbacks.pause._target_=tests.pause_at.PauseAt", f"+callbacks.pause.moment={moment}",
            f"+callbacks.pause.marker={marker}", f"+callbacks.pause.backups={run_dir / 'backup'}"]
    restarts = ["--max-restarts", "1"] if how == "restart" else []
    launch = launches(workers, *args, *restarts, grace=10)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert launch.proc.poll() is None and time.monotonic() < deadline, launch.output[-3000:]
        time.sleep(0.05)
    if how == "restart":
        import os

        os.kill(launch.worker_pid(0), signal.SIGKILL)
        assert launch.wait(timeout=300) == 0, launch.output[-3000:]
        assert "[launch] restart 1 of 1" in launch.output, launch.output[-3000:]
        return run_dir
    launch.kill()  # every process of the launch, as a lost machine or a `kill -9` of all
    again = launches(workers, *args, grace=10)
    assert again.wait(timeout=300) == 0, again.output[-3000:]
    return run_dir


def assert_reports_as_uninterrupted(run_dir: Path, uninterrupted: dict, moment: str,
                                    how: str) -> None:
    expected = uninterrupted["summary"]
    summary = json.loads((run_dir / "summary.json").read_text())
    # it did stop there: past the first step, the run went on from a backup
    assert (summary["resumed_from"] is None) == (moment == "first_step"), summary["resumed_from"]
    if moment == "train_end":
        assert summary["resumed_from"].get("training_done") is True
    assert_same_weights(run_dir, uninterrupted["run_dir"], atol=1e-5)
    for key, values in expected["history"].items():
        assert summary["history"][key] == pytest.approx(values, abs=1e-5), key
    assert set(summary["history"]) == set(expected["history"])
    assert summary["test_metrics"] == pytest.approx(expected["test_metrics"], abs=1e-5)
    assert summary["validation_metrics"] == pytest.approx(expected["validation_metrics"],
                                                          abs=1e-5)
    for count in ("epochs_done", "steps_per_epoch", "train_examples", "validation_examples",
                  "test_examples"):
        assert summary[count] == expected[count], count
    if how == "restart":
        assert summary["restarts"]["count"] == 1


@pytest.mark.parametrize(("moment", "workers", "how"), IN_CI)
def test_a_run_stopped_at_a_moment_reports_what_the_uninterrupted_run_reports(
        tmp_path, launches, uninterrupted, moment, workers, how):  # noqa: F811
    run_dir = stop_and_finish(tmp_path, launches, moment, workers, how)
    assert_reports_as_uninterrupted(run_dir, uninterrupted, moment, how)


def test_every_other_moment_worker_count_and_way_back(tmp_path, launches,  # noqa: F811
                                                      uninterrupted):
    for moment, workers, how in CELLS:
        if (moment, workers, how) in IN_CI:
            continue
        run_dir = stop_and_finish(tmp_path, launches, moment, workers, how)
        try:
            assert_reports_as_uninterrupted(run_dir, uninterrupted, moment, how)
        except AssertionError as failed:
            raise AssertionError(f"{moment}, {workers} worker(s), {how}: {failed}") from None
