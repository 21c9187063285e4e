"""What a cluster says, and when it says no: workers that disagree stop before training with
one line, a start without a chief or with a taken port gives up in one line (and at once on
SIGTERM), and 2 workers report the numbers of 1 worker and of `trainer.evaluate`.

Workers run as processes on free 127.0.0.1 ports, each in its own process group with a hard
timeout; nothing is left running (the `launches` fixture checks it for the launcher's)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, error_lines

from tests.test_multiworker import launches  # noqa: F401 - the fixture
from trainer.distribute.launch import free_ports
from trainer.evaluate import evaluate_run
from trainer.run.train import train

pytestmark = pytest.mark.multiworker

# (these runs stop before a model is built)
TINY = ["strategy=multi_worker", "dataset.image_size=8", "logger=[]", "seed=1", "epochs=1",
        "verbose=0"]


def start(tmp_path: Path, name: str, *args: str, command=("-m", "trainer"),
          cwd: Path | None = None) -> subprocess.Popen:
    """`python -m trainer ARGS` in its own process group, its output in `name.log`."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    with open(tmp_path / f"{name}.log", "w") as log:
        return subprocess.Popen([sys.executable, *command, *args], cwd=cwd or tmp_path,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


# TensorFlow's server finding the port taken after the meeting (a race): one line too.
SERVER_PORT_TAKEN = """
import socket, sys
from trainer.config.errors import ConfigError
from trainer.distribute.cluster import from_workers
from trainer.distribute.runtime import build_strategy

ports = [int(p) for p in sys.argv[1:]]
held = socket.create_server(("127.0.0.1", ports[0]))
try:
    build_strategy("multi_worker", ("/cpu:0",), "collective",
                   from_workers([f"127.0.0.1:{p}" for p in ports], 0))
except ConfigError as error:
    print(f"error: {error}")
"""


def finish(tmp_path: Path, procs: dict[str, subprocess.Popen], timeout: float = 240) -> dict:
    """Each process's exit code and output lines; kills what is left at the end."""
    deadline = time.monotonic() + timeout
    try:
        codes = {name: proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                 for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return {name: (code, error_lines((tmp_path / f"{name}.log").read_text()))
            for name, code in codes.items()}


def cluster(ports: list[int], index: int) -> list[str]:
    return [f"cluster.workers=[{','.join(f'127.0.0.1:{p}' for p in ports)}]",
            f"cluster.task_index={index}"]


def test_workers_that_disagree_each_stop_with_one_line_naming_keys_and_values(tmp_path):
    """Different epochs, seed and dataset.image_size: before, 99- and 116-line tracebacks
    (a shape mismatch in a collective), or a seed that trained silently. And a second
    cluster at once, of one config but each worker's own copy of an image folder, one with
    more files: checked once the data is read, before the model is built."""
    from tests.test_data import write_images

    ports = free_ports(4)
    procs = {f"w{i}": start(tmp_path, f"w{i}", *TINY, *overrides, *cluster(ports[:2], i),
                            f"hydra.run.dir={tmp_path / f'run{i}'}")
             for i, overrides in enumerate([[], ["epochs=2", "seed=2",
                                                 "dataset.image_size=16"]])}
    for i, per_class in enumerate((10, 12)):
        write_images(tmp_path / f"copy{i}" / "images", per_class=per_class)
        procs[f"data{i}"] = start(tmp_path, f"data{i}", *TINY, "dataset=image_folder",
                                  "dataset.path=images", *cluster(ports[2:], i),
                                  f"hydra.run.dir={tmp_path / f'data-run{i}'}",
                                  cwd=tmp_path / f"copy{i}")
    ended = finish(tmp_path, procs)
    expected = (f"error: workers disagree on dataset.image_size: the chief has 8, worker 1 "
                f"(127.0.0.1:{ports[1]}) has 16; on seed: the chief has 1, worker 1 has 2; on "
                "epochs: the chief has 1, worker 1 has 2; start every worker with the same "
                "config and the same trainer, TensorFlow and Keras")
    assert (ended["w0"], ended["w1"]) == ((2, [expected]), (2, [expected]))
    code, lines = ended["data0"]
    assert code == 2 and ended["data1"] == ended["data0"] and len(lines) == 1, ended
    assert re.fullmatch(r"error: workers disagree on data\.train_size: the chief has 16, "
                        rf"worker 1 \(127\.0\.0\.1:{ports[3]}\) has 20; .*data\.fingerprint\..*; "
                        "give every worker the same data", lines[0]), lines
    # nothing written beside the logs and the images
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "copy0", "copy1", "data0.log", "data1.log", "w0.log", "w1.log"]


def test_a_start_gives_up_cleanly_without_a_chief_and_on_a_taken_port(tmp_path):
    """Processes at once: a worker whose chief never comes (a small
    strategy.start_timeout_s), another one sent SIGTERM while it waits (before, TensorFlow's
    start-up held it for about 580 s and ignored SIGTERM), and a chief whose port is taken
    (before, a 73-line traceback ending 'Could not start gRPC server'), found by the meeting
    or, in a race after it, by TensorFlow's server."""
    ports = free_ports(7)  # the chiefs of `alone` and `stopped` (0, 2) are never started
    chief = f"127.0.0.1:{ports[0]}"
    with socket.create_server(("127.0.0.1", ports[4])) as taken:
        procs = {
            "server": start(tmp_path, "server", str(ports[5]), str(ports[6]),
                            command=("-c", SERVER_PORT_TAKEN)),
            "alone": start(tmp_path, "alone", *TINY, *cluster(ports[0:2], 1),
                           "strategy.start_timeout_s=3", f"hydra.run.dir={tmp_path / 'a'}"),
            "stopped": start(tmp_path, "stopped", *TINY, *cluster(ports[2:4], 1),
                             f"hydra.run.dir={tmp_path / 's'}"),
        }
        log = tmp_path / "stopped.log"
        deadline = time.monotonic() + 180
        while "waiting for the chief" not in log.read_text():
            assert procs["stopped"].poll() is None and time.monotonic() < deadline, (
                log.read_text())
            time.sleep(0.2)
        os.killpg(procs["stopped"].pid, signal.SIGTERM)
        signalled = time.monotonic()
        procs["stopped"].wait(timeout=30)
        after_sigterm = time.monotonic() - signalled
        procs["taken"] = start(tmp_path, "taken", *TINY, *cluster([ports[4], ports[1]], 0),
                               f"hydra.run.dir={tmp_path / 'chief'}")
        ended = finish(tmp_path, procs)
        taken.close()
    print(f"SIGTERM to a worker waiting for its chief: ended after {after_sigterm:.2f} s")
    assert after_sigterm < 10
    code, lines = ended["alone"]
    assert code == 4 and len(lines) == 1, lines
    assert re.fullmatch(rf"error: worker 1 \(127\.0\.0\.1:{ports[1]}\) waited 3 s \(strategy"
                        rf"\.start_timeout_s\) for the chief at {chief}, which never "
                        r"answered; .*", lines[0]), lines
    code, lines = ended["stopped"]
    assert code == 75 and lines[-1].startswith("interrupted: SIGTERM"), lines
    code, lines = ended["taken"]
    assert code == 2 and lines == [f"error: port {ports[4]} (the chief's address 127.0.0.1:"
                                   f"{ports[4]}) is "
                                   "in use by another process; stop that process, or give "
                                   "this worker another port (cluster.workers, TF_CONFIG or "
                                   "cluster.port_base)"], lines
    assert ended["server"] == (0, [f"error: port {ports[5]} (this worker's address 127.0.0.1:"
                                   f"{ports[5]}) is in use by another process; stop that "
                                   "process, or give this worker another port"]), ended
    # Nothing written: no Hydra directory, no run directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone.log", "server.log",
                                                          "stopped.log", "taken.log"]


def test_a_batch_norm_models_final_numbers_on_two_workers_are_its_checkpoints(
        tmp_path, launches):  # noqa: F811
    """Without synchronized batch norm each replica keeps moving statistics of its own; the
    final test scored that mix on 2 workers (test loss 1.82964 where trainer.evaluate gives
    1.82968 for the checkpoint it names). Now every replica evaluates the chief's weights."""
    run_dir = tmp_path / "run"
    launch = launches(2, "dataset.image_size=8", "logger=[]", "seed=1", "epochs=2",
                      "model._target_=tests.cluster_task.batch_norm_model",
                      f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["batch_norm"].startswith("per replica: 1 BatchNormalization layer")
    assert Path(summary["test_checkpoint"]).name == "best.keras"
    test = evaluate_run(run_dir, ["split=test", "devices=1"])
    validation = evaluate_run(run_dir, ["split=validation", "devices=1", "checkpoint=last"])
    print(f"2 workers: test {summary['test_metrics']}, validation "
          f"{summary['validation_metrics']}; trainer.evaluate: test {test['metrics']}, "
          f"validation {validation['metrics']}")
    assert summary["test_metrics"] == pytest.approx(test["metrics"], rel=1e-6, abs=1e-6)
    assert summary["validation_metrics"] == pytest.approx(validation["metrics"], rel=1e-6,
                                                          abs=1e-6)


OWN_STEP = ["dataset=synthetic", "dataset.train_examples=256",
            "dataset.validation_examples=128", "dataset.image_size=8", "dataset.channels=1",
            "model._target_=tests.cluster_task.own_losses_model", "checkpoint.monitor=loss",
            "+callbacks.logs._target_=tests.cluster_task.PrintLogs", "batch.per_replica=null",
            "batch.global_size=64", "optimizer=sgd_momentum_cosine", "optimizer.lr=0.05",
            "seed=42", "epochs=2", "logger=[]"]


def test_a_models_own_step_logs_the_clusters_loss_on_every_worker_as_one_worker(
        tmp_path, launches, capsys):  # noqa: F811
    """keras.io's VAE shape: the step returns its own dict of losses. Each worker logged its
    own first replica's (epoch 2: 2.3836 on worker 0, 2.4042 on worker 1, 2.3939 on one
    worker); now the mean over every replica of every worker, as Keras reduces the replicas
    of one machine: one number on both workers, the one worker's."""
    run_dir = tmp_path / "run"
    launch = launches(2, *OWN_STEP, f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    logged = {w: [json.loads(line) for line in re.findall(rf"\[worker {w}\] LOGS (.*)",
                                                          launch.output)] for w in (0, 1)}
    assert len(logged[0]) == 2 and logged[0] == logged[1], logged
    from conftest import make_config

    capsys.readouterr()
    one = train(make_config(*OWN_STEP, "verbose=0", "devices=1", "loop=custom"),
                run_dir=tmp_path / "one")
    alone = [json.loads(line[5:]) for line in capsys.readouterr().out.splitlines()
             if line.startswith("LOGS ")]
    print(f"2 workers: {logged[0]}; 1 worker: {alone}")
    assert alone == [pytest.approx(epoch, rel=1e-5, abs=1e-7) for epoch in logged[0]]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["history"]["loss"] == pytest.approx(one["history"]["loss"], rel=1e-5)
