"""`python -m trainer.ray` on Ray's own local multi-node cluster (tests/ray_cluster.py: a head
without CPUs and 2 simulated nodes of 1 CPU, every process on 127.0.0.1): Ray Train places
the workers (`--spread`: one a node), sets their `TF_CONFIG` and restarts the group when a
node is lost; the run ends as an uninterrupted one on 1 device would.

The cluster is started once for the module, in a process of its own, and every process it
or a run started is killed at the end (they all name its temporary directory).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO

from tests.test_healing import BATCH, tiny_config_module, uninterrupted
from tests.test_multiworker import COMMON, assert_same_weights, processes_with

__all__ = ["tiny_config_module", "uninterrupted"]  # fixtures, for the tests below

pytest.importorskip("ray", reason="Ray is an extra: pip install 'trainer[ray]'")

pytestmark = pytest.mark.multiworker

HOLD = ["+callbacks.pause._target_=tests.pause_at.PauseAt", "+callbacks.pause.moment=mid_epoch"]


class RayCluster:
    """tests/ray_cluster.py in a process of its own: `address`, `remove(node)`."""

    def __init__(self, nodes: int, cpus: int) -> None:
        # short: Ray's Unix sockets live under it (a socket's path is at most 107 bytes)
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        self.storage = f"{self.temp_dir}/results"  # Ray Train's (not ~/ray_results), removed after
        self.env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                    "TMPDIR": self.temp_dir, "PYTHONPATH": str(REPO),
                    # Ray Train's elastic restart reads the room left from a view refreshed
                    # every 20 s: it may first try the old size on a node just lost, and
                    # waits this long (default 60 s) for that group before it goes on
                    # with fewer
                    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "25"}
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "ray_cluster.py"), str(nodes), str(cpus),
             self.temp_dir], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=self.env, start_new_session=True)
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        assert self.address.startswith("127.0.0.1:"), "the Ray cluster did not start"

    def remove(self, node: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"remove {node}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "removed"

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        left = processes_with(self.temp_dir)
        if left:
            subprocess.run(["pkill", "-9", "-f", self.temp_dir], check=False)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        assert not left, f"processes left behind: {left}"


@pytest.fixture(scope="module")
def cluster():
    started = RayCluster(nodes=2, cpus=1)
    yield started
    started.close()


def ray_run(cluster: RayCluster, tmp_path: Path, *args: str, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    """`python -m trainer.ray --address <the cluster> ARGS` to its end, from `tmp_path`."""
    return subprocess.run(
        [sys.executable, "-m", "trainer.ray", "--address", cluster.address,
         "--storage", cluster.storage, *args],
        cwd=tmp_path, env=cluster.env, capture_output=True, text=True, timeout=timeout)


def start_ray(cluster: RayCluster, tmp_path: Path, *args: str) -> subprocess.Popen:
    log = open(tmp_path / "ray.log", "w")  # noqa: SIM115 - the child holds it
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.ray", "--address", cluster.address,
         "--storage", cluster.storage, *args],
        cwd=tmp_path, env=cluster.env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)


def assert_as_uninterrupted(run_dir: Path, uninterrupted: dict) -> dict:
    expected = uninterrupted["summary"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert_same_weights(run_dir, uninterrupted["run_dir"], atol=1e-5)
    for key, values in expected["history"].items():
        assert summary["history"][key] == pytest.approx(values, abs=1e-5), key
    assert summary["test_metrics"] == pytest.approx(expected["test_metrics"], abs=1e-5)
    for count in ("epochs_done", "steps_per_epoch", "train_examples", "test_examples"):
        assert summary[count] == expected[count], count
    return summary


def test_two_workers_on_two_nodes_one_lost_mid_run_end_on_one_as_the_uninterrupted_run(
        tmp_path, cluster, uninterrupted):
    # One worker a node (`--spread`, a node has 1 CPU); node 1 lost in the second epoch (a
    # backup at its step 5 behind): Ray stops the group and, with no room for 2 workers
    # left, starts it again on 1 (`--min-workers 1`, its elastic training), which resumes
    # at the same global batch. The run ends with the weights, history and test metrics of
    # the uninterrupted run on 1 device (the first epoch, before the loss, trained on 2
    # nodes), and says so.
    run_dir, marker = tmp_path / "run", tmp_path / "held"
    proc = start_ray(cluster, tmp_path, "--workers", "2", "--min-workers", "1", "--spread",
                     "--max-failures", "1", *COMMON, *BATCH, *HOLD,
                     f"+callbacks.pause.marker={marker}", f"hydra.run.dir={run_dir}")
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                (tmp_path / "ray.log").read_text()[-3000:])
            time.sleep(0.1)
        cluster.remove(1)  # a machine lost: its raylet and its worker killed outright
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = (tmp_path / "ray.log").read_text()
    assert code == 0, output[-3000:]
    summary = assert_as_uninterrupted(run_dir, uninterrupted)
    assert summary["resumed_from"] is not None  # it went on from the mid-epoch backup
    assert summary["restarts"] == {"count": 1, "steps_trained_again": 0,
                                   "workers_at_start": 2}, summary["restarts"]
    assert summary["workers"] == 1 and summary["batch"]["global"] == 64
    assert summary["cluster"]["source"] == "TF_CONFIG"
    # trainer's lines alone: each worker's prefixed, the start and the restart; none of
    # Ray's (a lost raylet's last records) or TensorFlow's
    lines = output.splitlines()
    assert lines[0].startswith("[ray] 2 workers on the Ray cluster"), lines[:3]
    assert "[ray] restart 1 on 1 workers" in output, output[-3000:]
    assert [line for line in lines[1:] if not line.startswith(
        ("[worker 0] ", "[worker 1] ", "[ray] restart 1 "))] == [], output[-3000:]


def test_a_cluster_without_room_for_the_workers_is_one_line_exit_2_and_writes_nothing(
        tmp_path, cluster):
    done = ray_run(cluster, tmp_path, "--workers", "3", timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: the Ray cluster has "), done.stderr
    assert "3 workers of 1 CPU each need 3" in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout == "" and list(tmp_path.iterdir()) == []
