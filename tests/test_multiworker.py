"""Multi-worker training through `python -m trainer.launch`: workers on 127.0.0.1, free ports.

Each test starts the launcher in its own process group with a hard timeout, and checks (and
enforces) that no process it started is left behind.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_main

from tests.test_readme_examples import examples
from trainer.evaluate import load_checkpoint
from trainer.run.train import train

pytestmark = pytest.mark.multiworker

# Dropout off: dropout masks depend on how a batch is split, the maths of the rest does not.
# SGD: the sums of per-replica gradients differ from one replica's in the last bits, and
# Adam's first steps (about lr * sign(gradient)) turn that into 1e-2 where a gradient is near
# zero; with SGD 2 workers and 1 agree to 2e-7.
# The network: tests/small_model.py (one conv layer) where the cluster is tested, not the
# network; a worker's run is then about 3 s shorter. The tests that signal a worker while it
# trains take SIGNALLED, the default network, whose steps are slow enough to stop mid-epoch.
SIGNALLED = ["dataset.image_size=8", "logger=[]", "model.dropout=0", "seed=42",
             "optimizer=sgd_momentum_cosine", "optimizer.lr=0.05"]
COMMON = [*SIGNALLED, "model._target_=tests.small_model.build"]



def _sigint_as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)

class Launch:
    """`python -m trainer.launch` in a subprocess, its output in a file."""

    def __init__(self, tmp_path: Path, workers: int, *overrides: str, grace: int = 20) -> None:
        self.tmp_path = tmp_path
        self.log = tmp_path / f"launch-{time.monotonic_ns()}.log"
        scratch = tmp_path / "tmp"
        scratch.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG")}
        env.update(PYTHONPATH=str(REPO), TMPDIR=str(scratch), TF_CPP_MIN_LOG_LEVEL="2")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer.launch", "--workers", str(workers),
                 "--grace", str(grace), *overrides], cwd=tmp_path, env=env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                # as from a terminal: a shell's background job (or pytest-xdist's worker)
                # ignores SIGINT, and a child inherits that; Ctrl-C is what is tested here
                preexec_fn=_sigint_as_from_a_terminal)

    @property
    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"launcher still running after {timeout} s:\n{self.output[-3000:]}")

    def worker_pid(self, index: int) -> int:
        found = re.search(rf"\[launch\] worker {index}: pid (\d+)", self.output)
        assert found, self.output
        return int(found.group(1))

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def processes_with(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (this test's tmp_path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(cmdline)
    return found


@pytest.fixture
def launches(tmp_path):
    """Starts launchers; afterwards fails if any of their processes is left, and kills them."""
    started: list[Launch] = []

    def start(*args, **kwargs) -> Launch:
        launch = Launch(tmp_path, *args, **kwargs)
        started.append(launch)
        return launch

    yield start
    for launch in started:
        if launch.proc.poll() is None:
            launch.kill()
    left = processes_with(str(tmp_path))
    if left:
        subprocess.run(["pkill", "-9", "-f", str(tmp_path)], check=False)
    assert not left, f"processes left behind: {left}"


def wait_for(condition, timeout: float, launch: Launch, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if launch.proc.poll() is not None:
            pytest.fail(f"launcher ended before {what}:\n{launch.output[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout} s:\n{launch.output[-3000:]}")
        time.sleep(0.2)


def weights(run_dir: Path) -> list[np.ndarray]:
    return load_checkpoint(run_dir / "checkpoints" / "last.keras").get_weights()


def assert_same_weights(actual: Path, expected: Path, atol: float) -> None:
    for a, b in zip(weights(actual), weights(expected), strict=True):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0)


def reference(tmp_path: Path, tiny_config, name: str, *overrides: str,
              signalled: bool = False) -> Path:
    """The same training on one device in this process, with the same global batch and
    network (COMMON's, or SIGNALLED's where `signalled`)."""
    run_dir = tmp_path / name
    base = [*SIGNALLED, "model=cnn"] if signalled else COMMON
    train(tiny_config(*base, "devices=1", "loop=custom", *overrides),
          run_dir=run_dir)
    return run_dir


def test_two_workers_train_like_one(tmp_path, launches, tiny_config):
    # lr 0.01, not COMMON's 0.05: at 0.05 the last-bit differences of summed gradients grow
    # to 1.6e-5 in 46 steps (TensorFlow 2.21; the same before and after the typed-run change),
    # at 0.01 to 7.5e-9; a per-replica loss average would differ by orders of magnitude more.
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01"]
    run_dir = tmp_path / "run"
    launch = launches(2, *COMMON, *batch, f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replicas"] == 2
    assert summary["strategy"] == "multi_worker" and summary["loop"] == "custom"
    assert summary["batch"] == {"per_replica": 32, "replicas": 2, "accumulate": 1, "global": 64,
                                "max_per_replica": None, "drop_remainder": False}
    assert summary["cluster"]["source"] == "TF_CONFIG" and summary["cluster"]["task_id"] == 0
    assert any("keras-team/keras#20585" in r for r in summary["speed_reasons"])
    assert "[worker 1] worker 1 of 2 finished" in launch.output
    assert (run_dir / "checkpoints" / "last.keras").is_file()
    assert [p.name for p in (run_dir / "backup").iterdir()]
    # The other worker wrote only to its temporary places, and removed them.
    assert list((tmp_path / "tmp").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run", "tmp", launch.log.name])

    expected = reference(tmp_path, tiny_config, "one", *batch)
    assert_same_weights(run_dir, expected, atol=1e-5)
    one = json.loads((expected / "summary.json").read_text())
    assert summary["learning_rate"]["scaled"] == one["learning_rate"]["scaled"]
    assert summary["validation_metrics"]["accuracy"] == pytest.approx(
        one["validation_metrics"]["accuracy"], abs=1e-6)


def test_two_workers_accumulating_two_train_like_one_accumulating_four(tmp_path, launches,
                                                                     tiny_config):
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01"]
    run_dir = tmp_path / "run"
    launch = launches(2, *COMMON, *batch, "batch.accumulate=2", f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["batch"]["accumulate"] == 2
    assert summary["batch"]["per_replica"] == 16 and summary["batch"]["global"] == 64
    expected = reference(tmp_path, tiny_config, "one", *batch, "batch.accumulate=4")
    assert json.loads((expected / "summary.json").read_text())["batch"]["per_replica"] == 16
    assert_same_weights(run_dir, expected, atol=1e-5)


def test_the_readmes_two_output_example_trains_on_two_workers_like_one(tmp_path, launches):
    """The README's shop.py (two named inputs, two outputs, a loss, metrics and loss weight
    per output) with its command's overrides and strategy=multi_worker on 2 local workers
    (`loop=custom`, several outputs through the compiled loss) ends with the weights of one
    worker at the same global batch. `devices=2` is the one override left out: a CPU worker
    runs one replica (asking for 2 is refused in one line)."""
    blocks = examples()
    (tmp_path / "shop.py").write_text(blocks["shop.py"])
    command = shlex.split(blocks["shop.sh"].replace("\\\n", " "))
    assert command[:3] == ["python", "-m", "trainer"] and "devices=2" in command
    overrides = [a for a in command[3:] if a != "devices=2"]
    same = ["epochs=2", "verbose=0", "logger=[]", "batch.per_replica=null",
            "batch.global_size=64"]
    run_dir = tmp_path / "run"
    launch = launches(2, *overrides, *same, "strategy=multi_worker", f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=120) == 0, launch.output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replicas"] == 2 and summary["loop"] == "custom"
    assert summary["loss"] == "label: sparse_categorical_crossentropy, score: mse"

    one = run_main(*overrides, *same, "accelerator=cpu", "devices=1", "loop=custom",
                   f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    assert_same_weights(run_dir, tmp_path / "one", atol=1e-5)
    alone = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["validation_metrics"] == pytest.approx(alone["validation_metrics"],
                                                          rel=1e-5, abs=1e-6)


def test_killed_worker_stops_the_other_and_the_run_resumes(tmp_path, launches):
    run_dir = tmp_path / "run"
    args = [*SIGNALLED, "epochs=3", "deterministic=true", "batch.per_replica=8",
            "checkpoint.backup_every=10", f"hydra.run.dir={run_dir}"]
    launch = launches(2, *args)
    backups = run_dir / "backup"
    # Mid-epoch in the second epoch: a backup of epoch index 1 after some of its steps.
    wait_for(lambda: backups.is_dir() and any(
        p.name.startswith("ckpt-000001-") and not p.name.endswith("-000000000")
        for p in backups.iterdir()), 240, launch, "mid-epoch backup in epoch 2")
    os.kill(launch.worker_pid(1), signal.SIGKILL)
    killed = time.monotonic()
    code = launch.wait(timeout=120)
    stopped_after = time.monotonic() - killed
    output = launch.output
    assert code == 128 + signal.SIGKILL, output[-3000:]
    assert re.search(r"\[worker 0\] error: lost worker 1 \(127\.0\.0\.1:\d+\): it stopped "
                     r"responding .* during epoch \d; this worker stopped\. The last backup "
                     rf"is in {re.escape(str(backups))}", output), output[-3000:]
    # The survivor notices by itself (heartbeats, ~10 s), well inside the launcher's grace.
    assert stopped_after < 20 + 5, stopped_after
    assert not (run_dir / "summary.json").exists()
    assert not processes_with(str(tmp_path))

    again = launches(2, *args)
    assert again.wait(timeout=300) == 0, again.output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"]["epoch"] >= 2
    assert "[worker 1] " in again.output and "resuming from the chief's backup" in again.output
    # Against the same run never interrupted: over hundreds of steps, 1 and 2 replicas drift
    # apart from their last-bit differences alone, so the reference has 2 workers too.
    whole = tmp_path / "whole"
    uninterrupted = launches(2, *args[:-1], f"hydra.run.dir={whole}")
    assert uninterrupted.wait(timeout=300) == 0, uninterrupted.output[-3000:]
    assert_same_weights(run_dir, whole, atol=1e-6)


def test_stuck_worker_fails_the_run_after_the_step_timeout(tmp_path, launches):
    """A peer alive but stuck (SIGSTOP): the survivor's watchdog ends the run after
    strategy.timeout_s, sooner than TensorFlow's heartbeats (~10 s) notice anything."""
    run_dir = tmp_path / "run"
    launch = launches(2, *SIGNALLED, "epochs=20", "batch.per_replica=8", "strategy.timeout_s=3",
                      f"hydra.run.dir={run_dir}", grace=3)
    backups = run_dir / "backup"
    wait_for(lambda: backups.is_dir() and any(p.name.startswith("ckpt-000001-")
                                              for p in backups.iterdir()),
             240, launch, "backup after epoch 1")
    time.sleep(0.5)  # into epoch 2's steps: everything after the first epoch is watched
    os.kill(launch.worker_pid(1), signal.SIGSTOP)
    stopped = time.monotonic()
    code = launch.wait(timeout=120)
    output = launch.output
    assert code == 4, output[-3000:]
    assert re.search(r"\[worker 0\] error: a training step has not finished after [3-9] s "
                     r"\(strategy.timeout_s=3\) during epoch \d+: a peer worker is stuck", output)
    assert "lost worker" not in output
    assert time.monotonic() - stopped < 60


def test_sigterm_to_one_worker_stops_all_at_one_step(tmp_path, launches):
    """A preempted machine: only worker 1 gets SIGTERM; all stop together, the chief backs up
    at that step, and launching again continues from there."""
    run_dir = tmp_path / "run"
    # two epochs: stopped in the last, the relaunch finishes it (a third added nothing)
    args = [*SIGNALLED, "epochs=2", "batch.per_replica=8", "checkpoint.nan_check_every=5",
            f"hydra.run.dir={run_dir}"]
    launch = launches(2, *args)
    backups = run_dir / "backup"
    wait_for(lambda: backups.is_dir() and any(p.name.startswith("ckpt-000001-")
                                              for p in backups.iterdir()),
             240, launch, "backup after epoch 1")
    os.kill(launch.worker_pid(1), signal.SIGTERM)
    assert launch.wait(timeout=120) == 75, launch.output[-3000:]
    output = launch.output
    assert re.search(r"\[worker 1\] interrupted: stopped by signal 15; every worker stopped at "
                     r"epoch 2; backup in the chief's run directory", output), output[-3000:]
    assert re.search(r"\[worker 0\] interrupted: another worker was asked to stop; every worker "
                     rf"stopped at epoch 2; backup in {re.escape(str(backups))}", output)
    assert "lost worker" not in output
    newest = max(p.name for p in backups.iterdir())
    assert newest.startswith("ckpt-000001-") and not newest.endswith("-000000000"), newest

    again = launches(2, *args)
    assert again.wait(timeout=300) == 0, again.output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == {"epoch": 2, "step": int(newest.rsplit("-", 1)[1]),
                                       "changed": {}}


def test_ctrl_c_stops_every_worker(tmp_path, launches):
    run_dir = tmp_path / "run"
    launch = launches(2, *SIGNALLED, "epochs=50", "batch.per_replica=8",
                      f"hydra.run.dir={run_dir}")
    wait_for(lambda: (run_dir / "backup").is_dir() and any((run_dir / "backup").iterdir()),
             240, launch, "first backup")
    launch.proc.send_signal(signal.SIGINT)
    assert launch.wait(timeout=90) == 130, launch.output[-3000:]
    assert "[launch] interrupted: stopping every worker" in launch.output
    assert f"[launch] interrupted; to resume, launch again with hydra.run.dir={run_dir}" in (
        launch.output)
    assert "crashed" not in launch.output and "Traceback" not in launch.output
    assert not processes_with(str(tmp_path))
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("how", ["cluster.workers", "TF_CONFIG with a chief job"])
def test_two_processes_started_by_hand(tmp_path, how):
    """The README's two-machine commands on one machine: `cluster.workers` and `task_index`,
    or `TF_CONFIG` as Kubernetes' TFJob writes it, with a `chief` job and a `worker` job."""
    from trainer.distribute.launch import free_ports

    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    tasks = []
    for index in (0, 1):
        if how == "cluster.workers":
            cluster = [f"cluster.workers=[{','.join(addresses)}]", f"cluster.task_index={index}"]
            task_env = env
        else:
            cluster = []
            task = {"type": "chief", "index": 0} if index == 0 else {"type": "worker",
                                                                       "index": 0}
            task_env = {**env, "TF_CONFIG": json.dumps({
                "cluster": {"chief": addresses[:1], "worker": addresses[1:]}, "task": task})}
        tasks.append(([*COMMON, "epochs=1", "verbose=0", "strategy=multi_worker", *cluster,
                       f"hydra.run.dir={tmp_path / f'run{index}'}"], task_env))
    logs = run_tasks(tmp_path, tasks, "worker")
    summary = json.loads((tmp_path / "run0" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replicas"] == 2
    assert summary["cluster"]["source"] == how.split()[0]
    assert summary["cluster"]["tasks"] == addresses and summary["cluster"]["task_id"] == 0
    # The other worker's own Hydra directory keeps only its config and log.
    assert sorted(p.name for p in (tmp_path / "run1").iterdir()) == [".hydra", "trainer.log"]
    assert "worker 1 of 2 finished" in logs[1]


def consecutive_free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 all free on 127.0.0.1 (SLURM's port_base layout)."""
    import random
    import socket

    for _ in range(200):
        base = random.randint(20000, 60000)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no consecutive free ports")


def run_slurm_step(tmp_path: Path, *args: str, tasks: int = 2) -> list[str]:
    """Runs `python -m trainer ARGS` as the tasks of a faked one-node SLURM step on
    127.0.0.1 (ports from a free base); `{i}` in an argument becomes the task's index.

    Returns:
        Each task's output; fails unless every task exits 0.
    """
    base = consecutive_free_ports(tasks)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG") and not k.startswith("SLURM")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", SLURM_JOB_NODELIST="127.0.0.1",
               SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS=str(tasks),
               SLURM_STEP_NUM_TASKS=str(tasks), SLURM_STEP_TASKS_PER_NODE=str(tasks),
               SLURMD_NODENAME="127.0.0.1")
    return run_tasks(tmp_path, [([*(a.replace("{i}", str(i)) for a in args),
                                  f"cluster.port_base={base}"],
                                 {**env, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)})
                                for i in range(tasks)], "task")


def run_tasks(tmp_path: Path, tasks: list[tuple[list[str], dict]], name: str,
              wrap=lambda index: []) -> list[str]:
    """Runs `python -m trainer ARGS` once per (ARGS, environment), all at once, each in its
    own process group with a hard timeout, behind `wrap(index)` (a command that runs it,
    e.g. in a namespace of its own); kills what is left. Fails unless all exit 0.

    Returns:
        Each process's output (also in `tmp_path/<name><i>.log`).
    """
    procs = []
    try:
        for index, (args, env) in enumerate(tasks):
            log = open(tmp_path / f"{name}{index}.log", "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(
                [*wrap(index), sys.executable, "-m", "trainer", *args], cwd=tmp_path, env=env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
        codes = [proc.wait(timeout=300) for proc, _ in procs]
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    logs = [(tmp_path / f"{name}{i}.log").read_text() for i in range(len(tasks))]
    assert codes == [0] * len(tasks), [log[-3000:] for log in logs]
    return logs


def test_a_faked_slurm_step_trains_as_two_workers_like_one_and_only_the_chief_logs(
        tmp_path, tiny_config):
    from mlflow.tracking import MlflowClient

    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01"]
    run_slurm_step(tmp_path, *COMMON, *batch, "verbose=0", "logger=[csv,mlflow]",
                   f"hydra.run.dir={tmp_path / 'run{i}'}")
    summary = json.loads((tmp_path / "run0" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["strategy"] == "multi_worker"
    assert summary["cluster"]["source"] == "SLURM"
    base = int(summary["cluster"]["tasks"][0].rpartition(":")[2])
    assert summary["cluster"]["tasks"] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    expected = reference(tmp_path, tiny_config, "one", *batch)
    assert_same_weights(tmp_path / "run0", expected, atol=1e-5)

    # Only the chief logged: one CSV (a row per epoch), one MLflow run; task 1 wrote nothing.
    assert len((tmp_path / "run0" / "metrics.csv").read_text().splitlines()) == 1 + 2
    assert sorted(p.name for p in (tmp_path / "run1").iterdir()) == [".hydra", "trainer.log"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("trainer").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "run0"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_loss")] == [0, 1]


def test_a_sweep_job_of_several_slurm_tasks_is_one_trial_written_by_the_chief(tmp_path):
    # What Hydra's submitit SLURM launcher does with tasks_per_node=2: every task runs the
    # sweep's job; each becomes a worker of one cluster, and only task 0 reports.
    sweep = tmp_path / "sweep"
    logs = run_slurm_step(tmp_path, "-m", *COMMON, "epochs=1", "verbose=0",
                          "optimized_metric=val_accuracy", f"hydra.sweep.dir={sweep}")
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["cluster"]["source"] == "SLURM"
    assert "worker 1 of 2 finished" in logs[1]
    trial = json.loads((sweep / "0" / "trial.json").read_text())
    assert trial["status"] == "completed"
    assert trial["value"] == summary["validation_metrics"]["accuracy"]
    assert (sweep / "trials.md").read_text().startswith("# Trials: 1 (1 completed, 0 failed)")
