"""A cluster that restarts itself: `python -m trainer.launch --max-restarts N` starts every
worker again from the last complete backup; what it never retries; its pauses."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import replace

import pytest

from tests.test_multiworker import (
    COMMON,
    SIGNALLED,
    assert_same_weights,
    launches,
    reference,
    wait_for,
)
from tests.test_remote_rundir import BUCKET, s3
from trainer.distribute.restarts import (
    Failure,
    newest_backup,
    restart_pause,
    restart_refusal,
    steps_again,
    workers_left,
)

__all__ = ["launches", "s3"]  # the fixtures, imported for the tests below


def mid_epoch_backup(backups) -> bool:
    """Whether these backup folders hold one made within the second epoch."""
    return any(p.name.startswith("ckpt-000001-") and not p.name.endswith("-000000000")
               for p in backups)


@pytest.mark.parametrize("code", [4, 75, 137, 1, 3])
def test_a_lost_worker_a_stop_a_kill_or_a_crash_is_restarted(code):
    assert restart_refusal(Failure(code, "ckpt-000001-000000005"), None, 0, 2) is None


def test_a_config_error_and_the_users_stop_are_never_restarted():
    assert "configuration" in restart_refusal(Failure(2, "ckpt-000001-000000005"), None, 0, 2)
    assert "asked to stop" in restart_refusal(Failure(130, None), None, 0, 2)


def test_the_launchers_own_preemption_notice_is_left_to_the_scheduler():
    assert "preempted" in restart_refusal(Failure(75, "ckpt-000001-000000005"), None, 0, 2,
                                          noticed=True)


def test_restarts_stop_at_the_limit():
    assert restart_refusal(Failure(4, "ckpt-000002-000000000"), Failure(4, "ckpt-000001-"
                                                                         "000000000"), 1, 2) is None
    assert "2 restarts used" in restart_refusal(Failure(4, "b"), Failure(4, "a"), 2, 2)
    assert "1 restart used" in restart_refusal(Failure(4, "a"), None, 1, 1)


def test_the_same_backup_failing_twice_is_not_restarted_again():
    first = Failure(4, "ckpt-000001-000000005")
    assert "twice from the same backup (ckpt-000001-000000005)" in restart_refusal(
        Failure(75, "ckpt-000001-000000005"), first, 1, 5)
    assert "twice" in restart_refusal(Failure(4, None), Failure(4, None), 1, 5)
    assert restart_refusal(Failure(4, "ckpt-000001-000000010"), first, 1, 5) is None


def test_the_pause_grows_and_is_capped():
    assert [restart_pause(n) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]
    assert restart_pause(3, first=0.5, cap=100) == 2.0


def test_steps_trained_again_are_those_past_the_backup(tmp_path):
    progress = tmp_path / "progress.json"
    assert steps_again("ckpt-000001-000000005", progress) == 0  # the chief said nothing
    progress.write_text(json.dumps({"epoch": 1, "step": 12, "steps_per_epoch": 23}))
    assert steps_again("ckpt-000001-000000005", progress) == 7
    assert steps_again("ckpt-000001-000000000", progress) == 12
    assert steps_again(None, progress) == 23 + 12  # no backup: from the start


def test_the_newest_complete_backup_is_named(tmp_path):
    assert newest_backup(tmp_path) is None
    for name in ("ckpt-000000-000000010", "ckpt-000001-000000000", ".tmp-1-ckpt-000001-5"):
        (tmp_path / "backup" / name).mkdir(parents=True)
    assert newest_backup(tmp_path) == "ckpt-000001-000000000"


@pytest.mark.multiworker
def test_a_killed_worker_is_restarted_and_the_run_ends_as_an_uninterrupted_one(
        tmp_path, launches, tiny_config):
    # lr 0.01 and a fixed global batch: 2 workers train as 1 to 1e-5 (test_multiworker's
    # test_two_workers_train_like_one), so one device in this process is the reference.
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01",
             "deterministic=true", "checkpoint.backup_every=5"]
    # `${now:...}` to the microsecond: read once by the launcher, for every worker and every
    # restart (read again, the restart would train from scratch in another folder)
    launch = launches(2, *SIGNALLED, *batch, "hydra.run.dir=runs/r-${now:%H-%M-%S-%f}",
                      "--max-restarts", "2", grace=10)
    wait_for(lambda: mid_epoch_backup((tmp_path / "runs").glob("*/backup/*")), 240, launch,
             "a mid-epoch backup in epoch 2")
    [run_dir] = (tmp_path / "runs").iterdir()
    os.kill(launch.worker_pid(1), signal.SIGKILL)
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    output = launch.output
    said = re.findall(r"\[launch\] restart (\d) of 2 in 2 s: the cluster stopped with SIGKILL; "
                      r"every worker starts again from (ckpt-000001-\d+)", output)
    assert len(said) == 1 and said[0][0] == "1", output[-3000:]
    assert output.count("[launch] 2 workers on") == 2
    # a survivor's own line says which peer it lost: none of TensorFlow's records of it
    assert not re.search(r"^\[worker \d\] ([EW]\d{4} |/job:)", output, re.M), output[-3000:]
    assert "retracing" not in output
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"]["count"] == 1
    assert summary["restarts"]["steps_trained_again"] >= 0
    assert summary["resumed_from"]["epoch"] == 2
    assert summary["resumed_from"]["step"] == int(said[0][1].rsplit("-", 1)[1])
    expected = reference(tmp_path, tiny_config, "one", *batch, signalled=True)
    assert_same_weights(run_dir, expected, atol=1e-5)
    # every reported number, not only the weights: the resumed epoch's training metrics
    # over all its steps, as the uninterrupted run reports them
    uninterrupted = json.loads((expected / "summary.json").read_text())
    for key, values in uninterrupted["history"].items():
        assert summary["history"][key] == pytest.approx(values, abs=1e-5), key
    assert summary["epochs_done"] == uninterrupted["epochs_done"]


@pytest.mark.multiworker
def test_a_config_error_under_max_restarts_is_not_retried(tmp_path, launches):
    launch = launches(2, *COMMON, "optimizer.lr=-1", f"hydra.run.dir={tmp_path / 'run'}",
                      "--max-restarts", "2")
    assert launch.wait(timeout=120) == 2, launch.output[-3000:]
    assert launch.output.count("[launch] 2 workers on") == 1, launch.output[-3000:]
    assert "restart" not in launch.output.replace("--max-restarts", "")


def test_a_negative_max_restarts_is_one_line(capsys):
    from trainer.distribute.launch import main

    assert main(["--workers", "2", "--max-restarts", "-1"]) == 2
    assert capsys.readouterr().err == "error: --max-restarts must be 0 or more; received: -1\n"


@pytest.mark.parametrize(("args", "said"), [
    (["--min-workers", "3"], "--min-workers must be 1 to --workers (2); received: 3"),
    (["--min-workers", "0"], "--min-workers must be 1 to --workers (2); received: 0"),
    (["--min-workers", "1"], "--min-workers 1 goes on with fewer workers at a restart; give "
                             "--max-restarts N too"),
])
def test_a_bad_min_workers_is_one_line_and_nothing_starts(capsys, tmp_path, args, said):
    from trainer.distribute.launch import main

    assert main(["--workers", "2", *args, f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err == f"error: {said}\n"
    assert not (tmp_path / "run").exists()


def test_only_workers_killed_are_left_out_and_never_below_the_floor():
    # each worker's exit code: SIGKILL (-9, or 137 from a shell) is a machine gone for good
    assert workers_left([-9, 0], 2, 1) == 1
    assert workers_left([0, 137, 0, 0], 4, 2) == 3
    assert workers_left([1, 4], 2, 1) == 2  # a crash, a lost peer: every worker restarts
    assert workers_left([-9, -9], 2, 1) == 2  # below the floor: all start again
    assert workers_left([-9, 0], 2, 2) == 2  # --min-workers = --workers: as before


@pytest.mark.multiworker
def test_a_worker_lost_for_good_leaves_the_run_to_the_others_at_the_same_global_batch(
        tmp_path, launches, tiny_config):
    """`--max-restarts 1 --min-workers 1`: worker 1 SIGKILLed mid-epoch (its machine gone)
    is not started again; the chief resumes alone from the last backup, at the same global
    batch of 64, and ends with the weights and history of the same training on 1 device
    never stopped (1e-5), saying in its summary that it went on with fewer workers."""
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01",
             "deterministic=true", "checkpoint.backup_every=5"]
    run_dir = tmp_path / "run"
    launch = launches(2, *COMMON, *batch, f"hydra.run.dir={run_dir}", "--max-restarts", "1",
                      "--min-workers", "1", grace=10)
    wait_for(lambda: mid_epoch_backup((run_dir / "backup").glob("*")), 240, launch,
             "a mid-epoch backup in epoch 2")
    os.kill(launch.worker_pid(1), signal.SIGKILL)
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    output = launch.output
    assert ("[launch] going on without the 1 worker(s) killed (gone for good): 1 of 2 from "
            "now on, at the same global batch") in output, output[-3000:]
    assert output.count("[launch] 1 workers on") == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 1 and summary["batch"]["global"] == 64
    assert summary["restarts"]["count"] == 1 and summary["restarts"]["workers_at_start"] == 2
    assert summary["resumed_from"]["epoch"] == 2
    assert "went on without the one(s) lost for good" in output
    expected = reference(tmp_path, tiny_config, "one", *batch)
    assert_same_weights(run_dir, expected, atol=1e-5)
    uninterrupted = json.loads((expected / "summary.json").read_text())
    for key, values in uninterrupted["history"].items():
        assert summary["history"][key] == pytest.approx(values, abs=1e-5), key



def lost_peer(tmp_path, max_restarts: int, environ: dict, monkeypatch):
    """The error a worker of a 2-worker cluster ends with when its peer is lost."""
    import tensorflow as tf

    from trainer.config.errors import WorkerLost
    from trainer.distribute.cluster import from_workers
    from trainer.run.guards import translate

    for key in ("SLURM_RESTART_COUNT",):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    cluster = replace(from_workers(["127.0.0.1:1", "127.0.0.1:2"], 0),
                      max_restarts=max_restarts)
    with pytest.raises(WorkerLost) as lost:
        translate(tf.errors.UnavailableError(None, None, "Connection reset by peer"), None,
                  tmp_path, 0, cluster, 1)
    return lost.value


def test_cluster_max_restarts_makes_a_lost_peer_ask_the_scheduler_to_start_again(
        tmp_path, monkeypatch):
    assert lost_peer(tmp_path, 0, {}, monkeypatch).exit_code == 4
    asked = lost_peer(tmp_path, 2, {}, monkeypatch)
    assert asked.exit_code == 75
    assert str(asked).endswith("exit 75 (cluster.max_restarts=2): the scheduler starts every "
                               "worker again from the last backup")
    assert lost_peer(tmp_path, 2, {"SLURM_RESTART_COUNT": "1"}, monkeypatch).exit_code == 75
    assert lost_peer(tmp_path, 2, {"SLURM_RESTART_COUNT": "2"}, monkeypatch).exit_code == 4


def test_a_negative_cluster_max_restarts_is_refused(tiny_config):
    from trainer.config.errors import ConfigError
    from trainer.config.validate import validate

    with pytest.raises(ConfigError, match="cluster.max_restarts must be a whole number >= 0"):
        validate(tiny_config("cluster.max_restarts=-1"))


def test_a_failing_chief_tells_the_launcher_the_step_it_reached(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from trainer.distribute.cluster import from_workers
    from trainer.run.guards import say_progress

    progress = tmp_path / "progress.json"
    monkeypatch.setenv("TRAINER_PROGRESS_FILE", str(progress))
    backup = SimpleNamespace(epoch=1, reached=12)
    say_progress(backup, 23, from_workers(["127.0.0.1:1", "127.0.0.1:2"], 1))
    assert not progress.exists()  # another worker: the chief says it
    say_progress(backup, 23, from_workers(["127.0.0.1:1", "127.0.0.1:2"], 0))
    assert steps_again("ckpt-000001-000000005", progress) == 7


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_pause_before_a_restart_ends_the_launch_with_its_line(tmp_path,
                                                                             signum):
    """The launcher between two attempts (no worker running): SIGTERM or Ctrl-C ends it
    with the interrupted line and how to resume, as at any other moment (SIGTERM ended it
    without a line, exit 143)."""
    import subprocess
    import sys

    (tmp_path / "crash.py").write_text("raise SystemExit(1)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.launch", "--workers", "1", "--max-restarts", "3",
         "crash.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[launch] restart 1 of 3 in"):
                proc.send_signal(signum)
                break
        out = "".join(lines) + proc.stdout.read()
        assert proc.wait(timeout=30) == 130, out
    finally:
        proc.kill()
    assert "[launch] interrupted in the pause before a restart" in out
    assert out.rstrip().splitlines()[-1].startswith("[launch] interrupted; to resume"), out


def test_the_chief_notes_each_complete_backup_for_its_launcher(tmp_path, monkeypatch):
    """Where the launcher cannot list the backups (a URL, a script's run directory), the
    chief notes each one once complete, beside its progress file; nothing without one."""
    from trainer.rundir.layout import PROGRESS, note_backup, noted_backup

    progress = tmp_path / "progress.json"
    note_backup("ckpt-000001-000000005")  # no launcher: nothing written
    assert noted_backup(progress) is None and not list(tmp_path.iterdir())
    monkeypatch.setenv(PROGRESS, str(progress))
    note_backup("ckpt-000001-000000005")
    note_backup("ckpt-000002-000000000")
    assert noted_backup(progress) == "ckpt-000002-000000000"


@pytest.mark.multiworker
@pytest.mark.long
def test_a_run_at_a_url_survives_two_kills_in_different_epochs(tmp_path, launches, s3):
    """`--max-restarts 3` with the run directory at a URL: the launcher finds the newer
    backup from the chief's note (it listed local directories only, so the second restart
    was refused as 'failed twice from the same backup'); the run ends as an uninterrupted
    one."""
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=3", "optimizer.lr=0.01",
             "deterministic=true", "checkpoint.backup_every=5"]
    url = f"s3://{BUCKET}/runs/twice"
    launch = launches(2, *SIGNALLED, *batch, f"hydra.run.dir={url}", "--max-restarts", "3",
                      grace=10)
    for epoch, attempt in ((1, 1), (2, 2)):
        deadline = time.monotonic() + 240
        while not (launch.output.count("[launch] 2 workers on") == attempt and any(
                re.search(rf"backup/ckpt-00000{epoch}-0*[1-9]\d*/state.json$", key)
                for key in s3.fs.find(f"{BUCKET}/runs/twice"))):
            assert launch.proc.poll() is None and time.monotonic() < deadline, (
                launch.output[-3000:])
            time.sleep(0.2)
        pids = re.findall(r"\[launch\] worker 1: pid (\d+)", launch.output)
        os.kill(int(pids[-1]), signal.SIGKILL)
    assert launch.wait(timeout=400) == 0, launch.output[-3000:]
    said = re.findall(r"\[launch\] restart (\d) of 3 .* from (ckpt-\d+-\d+)", launch.output)
    assert [n for n, _ in said] == ["1", "2"] and said[0][1] != said[1][1], said
    summary = json.loads(s3.fs.cat_file(f"{BUCKET}/runs/twice/summary.json"))
    assert summary["restarts"]["count"] == 2 and summary["epochs_done"] == 3
