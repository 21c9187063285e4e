"""The multi-worker decisions as pure functions: cluster, strategy, lost-peer messages, launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, error_lines

from trainer.config.errors import ConfigError
from trainer.distribute.cluster import (
    choose_communication,
    from_tf_config,
    from_workers,
    lost_tasks,
    resolve_cluster,
)
from trainer.distribute.launch import (
    Launcher,
    describe_exit,
    ending,
    first_cause,
    free_ports,
    tf_configs,
    worker_commands,
)
from trainer.distribute.strategy import choose_strategy

TWO = json.dumps({"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},
                  "task": {"type": "worker", "index": 1}})


def test_tf_config_as_a_cluster_manager_writes_it():
    cluster = from_tf_config(TWO)
    assert cluster.num_workers == 2 and cluster.task_id == 1 and not cluster.is_chief
    assert cluster.addresses == ["10.0.0.1:2222", "10.0.0.2:2222"]
    assert cluster.source == "TF_CONFIG"


def test_tf_config_with_a_chief_job_makes_the_chief_task_zero():
    text = json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"],
                                   "evaluator": ["e:1"]},
                       "task": {"type": "worker", "index": 0}})
    cluster = from_tf_config(text)
    assert cluster.num_workers == 3 and cluster.task_id == 1 and not cluster.is_chief
    chief = from_tf_config(text.replace('"type": "worker"', '"type": "chief"'))
    assert chief.is_chief and chief.addresses == ["c:1", "w0:1", "w1:1"]


@pytest.mark.parametrize("config, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}},
     "parameter servers are another strategy"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}},
     "task index 3 is not a task of job 'worker'"),
    ({"cluster": {"worker": ["a:1"], "evaluator": ["e:1"]},
      "task": {"type": "evaluator", "index": 0}}, "task type 'evaluator' cannot run training"),
    ({"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}},
     "host:port addresses"),
])
def test_bad_tf_config_is_one_clear_error(config, message):
    text = config if isinstance(config, str) else json.dumps(config)
    with pytest.raises(ConfigError, match=message):
        from_tf_config(text)


def test_tf_config_without_a_cluster_is_no_cluster():
    assert from_tf_config("{}") is None
    assert resolve_cluster([], 0, None) is None


def test_command_line_cluster_wins_over_tf_config():
    cluster = resolve_cluster(["h1:10", "h2:20", "h3:30"], 2, TWO)
    assert cluster.source == "cluster.workers" and cluster.task_id == 2
    assert cluster.addresses == ["h1:10", "h2:20", "h3:30"]


@pytest.mark.parametrize("workers, index, message", [
    (["h1:10", "h2:20"], 2, r"cluster.task_index must be in 0..1 for 2 workers; received: 2"),
    (["h1:10", "h1:10"], 0, "lists an address twice"),
    (["h1:port"], 0, "host:port addresses"),
])
def test_bad_command_line_cluster(workers, index, message):
    with pytest.raises(ConfigError, match=message):
        from_workers(workers, index)


def test_lost_tasks_named_from_tensorflow_errors():
    cluster = from_workers(["127.0.0.1:1000", "127.0.0.1:2000"], 0)
    # As TF 2.21 reports a crashed peer on the survivor (device names of the survivor included).
    crashed = ("{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0"
               "/device:CPU:0}} Collective ops is aborted by: The following tasks are unhealthy "
               "(stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have "
               "crashed.")
    assert lost_tasks(crashed, cluster) == ["worker 1 (127.0.0.1:2000)"]
    worker = from_workers(["127.0.0.1:1000", "127.0.0.1:2000"], 1)
    gone = ("device_/job:worker/replica:0/task:1/device:CPU:0}} failed to connect ... remote "
            "target /job:worker/replica:0/task:0 while calling CompleteInstance")
    assert lost_tasks(gone, worker) == ["worker 0 (127.0.0.1:1000)"]
    assert lost_tasks("no task named", worker) == []
    three = from_workers(["h:1", "h:2", "h:3"], 1)
    relayed = ("remote target /job:worker/replica:0/task:0: Error reported from "
               "/job:worker/task:0: The following tasks are unhealthy (stopped sending "
               "heartbeats):\n/job:worker/replica:0/task:2\n")
    assert lost_tasks(relayed, three) == ["worker 2 (h:3)"]


def test_communication_choices():
    assert choose_communication("ring", "cpu") == "ring"
    assert choose_communication("nccl", "gpu") == "nccl"
    with pytest.raises(ConfigError, match="communication=nccl needs GPUs"):
        choose_communication("nccl", "cpu")
    with pytest.raises(ConfigError, match="must be one of auto, ring, nccl; received: 'mpi'"):
        choose_communication("mpi", "cpu")


@pytest.mark.parametrize("name, replicas, workers, kind, chosen", [
    ("auto", 1, 2, "cpu", "multi_worker"),
    ("auto", 4, 2, "gpu", "multi_worker"),
    ("multi_worker", 1, 1, "cpu", "multi_worker"),
    ("multi_worker", 2, 3, "gpu", "multi_worker"),
])
def test_strategy_for_a_cluster(name, replicas, workers, kind, chosen):
    assert choose_strategy(name, replicas, workers, kind) == chosen


def test_single_machine_strategy_in_a_cluster_is_refused():
    with pytest.raises(ConfigError, match="strategy=mirrored runs on one machine but the "
                                          "cluster has 2 workers"):
        choose_strategy("mirrored", 2, 2, "gpu")


def test_multi_worker_on_several_cpu_devices_is_refused():
    with pytest.raises(ConfigError, match="one replica per CPU worker, but 2 CPU devices"):
        choose_strategy("multi_worker", 2, 2, "cpu")


def test_launcher_cluster_and_commands(tmp_path):
    ports = free_ports(3)
    assert len(set(ports)) == 3
    configs = [json.loads(c) for c in tf_configs(["127.0.0.1:1", "127.0.0.1:2"])]
    assert [c["task"]["index"] for c in configs] == [0, 1]
    assert all(c["cluster"]["worker"] == ["127.0.0.1:1", "127.0.0.1:2"] for c in configs)
    commands = worker_commands(2, ["epochs=3", "hydra.run.dir=ignored"], "runs/x", tmp_path)
    assert commands[0][-1] == "hydra.run.dir=runs/x"
    assert commands[1][-1] == f"hydra.run.dir={tmp_path / 'worker-1'}"
    for command in commands:
        assert command[1:3] == ["-m", "trainer"]
        assert "strategy=multi_worker" in command and "verbose=2" in command
        assert "epochs=3" in command and "hydra.run.dir=ignored" not in command
    mine = worker_commands(1, ["strategy.name=multi_worker", "verbose=1"], "r", tmp_path)[0]
    assert "strategy=multi_worker" not in mine and "verbose=2" not in mine
    assert describe_exit(-9) == "SIGKILL" and describe_exit(4) == "exit code 4"


def test_the_worker_that_stopped_the_cluster_is_named_not_the_one_that_lost_it():
    assert first_cause([(0, 4), (1, -9)]) == (1, -9)
    assert first_cause([(0, 4)]) == (0, 4)
    assert first_cause([(0, 1), (1, -9)]) == (0, 1)


# What a worker printed when its peer was SIGKILLed (two runs: the heartbeat noticed first,
# or the connection reset), then its own line and a line of the user's that merely looks alike.
PEER_LOST = """\
E0000 00:00:1795880400.468393   24754 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='x']
E0000 00:00:1795880443.274097   26486 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
The error could be from a previous operation. Restart your program to reset. [type.googleapis.com/tensorflow.DerivedStatus='']
error: lost worker 1 (127.0.0.1:48997): it stopped responding during epoch 2; this worker stopped
/job:worker/replica:0/task:1
"""  # noqa: E501 - as TensorFlow wrote them


@pytest.mark.parametrize("everything", [False, True])
def test_a_workers_records_of_a_lost_peer_are_left_out_of_the_launchers_output(
        tmp_path, monkeypatch, everything):
    import io
    import sys

    if everything:
        monkeypatch.setenv("TRAINER_TF_LOGS", "1")
    else:
        monkeypatch.delenv("TRAINER_TF_LOGS", raising=False)
    (tmp_path / "lines.txt").write_text(PEER_LOST)
    out = io.StringIO()
    launcher = Launcher([[sys.executable, "-c", "import sys; sys.stdout.write(open(sys.argv[1])"
                          ".read())", str(tmp_path / "lines.txt")]], [dict(os.environ)], out=out)
    launcher.start()
    assert launcher.wait() == 0
    lines = [line for line in out.getvalue().splitlines() if line.startswith("[worker 0]")]
    if everything:
        assert len(lines) == len(PEER_LOST.splitlines())
    else:
        assert lines == ["[worker 0] error: lost worker 1 (127.0.0.1:48997): it stopped "
                         "responding during epoch 2; this worker stopped",
                         "[worker 0] /job:worker/replica:0/task:1"]


def test_a_killed_worker_reaped_after_the_peer_it_left_is_still_the_cause():
    import io
    import signal
    import sys

    # worker 0 notices the loss first (exit 4); worker 1's SIGKILL shows half a second later
    commands = [[sys.executable, "-c", "import sys; sys.exit(4)"],
                [sys.executable, "-c", "import os, signal, time; time.sleep(0.5); "
                                       "os.kill(os.getpid(), signal.SIGKILL)"]]
    out = io.StringIO()
    launcher = Launcher(commands, [dict(os.environ)] * 2, grace=5, out=out)
    launcher.start()
    assert launcher.wait() == 128 + signal.SIGKILL
    assert "[launch] worker 1 stopped with SIGKILL; stopping the others" in out.getvalue()


@pytest.mark.parametrize("args, line", [
    (["--workers", "0"], "error: --workers must be a positive number; received: 0"),
    (["--workers", "2", "cluster.task_index=1"],
     "error: the launcher sets the cluster itself; remove cluster.task_index=1"),
])
def test_launcher_bad_arguments(tmp_path, args, line):
    result = subprocess.run([sys.executable, "-m", "trainer.launch", *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, env=_env())
    assert result.returncode == 2
    assert error_lines(result.stderr) == [line]


def test_launcher_stops_on_a_config_error_without_leaving_anything(tmp_path):
    """The launcher composes the workers' config first (their run directory): a config that
    does not compose is its one line, exit 2, before any worker starts."""
    result = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--workers", "2", "model.widht=3",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**_env(), "TMPDIR": str(tmp_path)})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "widht" in lines[0], lines
    assert "[launch]" not in result.stdout  # no worker started
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("trainer-launch-")]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG")} | {
        "PYTHONPATH": str(REPO)}


def test_multi_worker_config_composes(tiny_config):
    cfg = tiny_config("strategy=multi_worker", "cluster.workers=[a:1,b:2]", "cluster.task_index=1")
    assert cfg.strategy.name == "multi_worker" and cfg.strategy.timeout_s == 600
    assert list(cfg.cluster.workers) == ["a:1", "b:2"] and cfg.cluster.task_index == 1


def test_bad_timeout_is_refused(tiny_config):
    from trainer.run.prepare.preflight import check_config as validate

    with pytest.raises(ConfigError, match="strategy.timeout_s must be a positive number"):
        validate(tiny_config("strategy=multi_worker", "strategy.timeout_s=0"))


def test_multi_worker_without_a_seed_is_refused(tmp_path):
    from conftest import run_main

    result = run_main("strategy=multi_worker", "seed=null", "epochs=1", "logger=[]",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "error: strategy=multi_worker needs a seed: every worker shuffles the data alike and "
        "takes its share of the same global batches; received: seed=null (set seed=N)"]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_cluster_option_typos_fail_at_compose_time(tmp_path):
    result = subprocess.run([sys.executable, "-m", "trainer", "cluster.worker=[a:1]"],
                            cwd=Path(tmp_path), capture_output=True, text=True, timeout=60,
                            env=_env())
    assert result.returncode == 2 and "cluster.worker" in result.stderr


def test_multi_worker_strategy_gets_the_communication_options(tmp_path):
    """`strategy.communication` reaches TensorFlow, and no per-collective timeout does (it
    would start a thread per collective). Own process: the strategy must come first."""
    code = (
        "from trainer.distribute.runtime import build_strategy\n"
        "s = build_strategy('multi_worker', ('/cpu:0',), 'collective (ring)', None, 'ring')\n"
        "o = s.extended._communication_options\n"
        "print(type(s).__name__, o.implementation.name, o.timeout_seconds, "
        "s.num_replicas_in_sync)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env=_env())
    assert result.returncode == 0, result.stderr[-2000:]
    # MultiWorkerMirroredStrategy, reading a worker's share of the input where the pipeline
    # built one (trainer.distribute.runtime.SharedInput).
    assert result.stdout.split() == ["SharedInput", "RING", "None", "1"]


def test_step_watchdog_fires_when_progress_stops():
    import time

    from trainer.run.assembly.callbacks import StepWatchdog

    fired = []
    dog = StepWatchdog(0.3, fired.append)
    dog.set_params({"steps": 3})
    dog.on_train_begin()
    time.sleep(0.6)  # the first step traces: exempt however long it takes
    for batch in range(3):
        dog.on_train_batch_end(batch)
        time.sleep(0.05)
    time.sleep(0.6)  # the first validation traces too: exempt
    dog.on_epoch_end(0)
    for batch in range(3):  # steady steps, then validation, quicker than the timeout
        time.sleep(0.1)
        dog.on_train_batch_end(batch)
    time.sleep(0.1)
    dog.on_epoch_end(1)
    assert fired == []
    deadline = time.monotonic() + 5  # now a step that never ends
    while not fired and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(fired) == 1 and fired[0] > 0.3
    dog.on_train_end()


def test_launcher_last_line_says_what_to_do():
    assert ending(2, "runs/a") == ("[launch] failed (a configuration error, above); fix it and "
                                   "launch again")
    assert ending(130, "runs/a") == ("[launch] interrupted; to resume, launch again with "
                                     "hydra.run.dir=runs/a")
    assert ending(4, "runs/a").startswith("[launch] failed (exit code 4); to resume")
