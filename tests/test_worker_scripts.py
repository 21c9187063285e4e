"""A user's script on several workers: `python -m trainer.launch --workers N script.py ARGS`
runs the script as each worker, and the same script started by hand with `TF_CONFIG` (as
SLURM or Kubernetes would) ends cleanly on every worker, its `trainer.fit` returning the
run's `Result` on each.

Each process runs in its own process group with a hard timeout; none is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from tests.test_multiworker import launches, processes_with  # noqa: F401
from trainer.distribute.launch import free_ports, main, split_script

# The script docs/several-machines.md shows, as written (its `train.py` block), then a line
# printing what its `trainer.fit` returned; a layer built first where LAYER_FIRST says
# (TensorFlow started before `fit`).
LAYER_FIRST = """import os
import keras
if os.environ.get("LAYER_FIRST"):
    keras.layers.Dense(2).build((None, 3))  # TensorFlow's runtime starts here
"""
REPORT = """
import json
print("result " + json.dumps({"history": result.history, "run_dir": str(result.run_dir),
                              "workers": result.summary["workers"]}))
"""


def documented_script() -> str:
    """The `train.py` block of docs/several-machines.md."""
    page = (REPO / "docs" / "several-machines.md").read_text()
    block = page.split("```python\n# train.py\n", 1)[1].split("```", 1)[0]
    return block


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(LAYER_FIRST + documented_script() + REPORT)
    return path


def _results(output: str) -> list[dict]:
    return [json.loads(line.split("result ", 1)[1]) for line in output.splitlines()
            if "result {" in line]


@pytest.mark.multiworker
def test_a_script_runs_as_every_worker_under_the_launcher(tmp_path, launches):  # noqa: F811
    """`trainer.launch --workers 2 train.py RUN`: each worker runs the script, its
    `trainer.fit` joins the cluster, and every worker returns the run's history."""
    launch = launches(2, str(_script(tmp_path)), str(tmp_path / "run"))
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["strategy"] == "multi_worker"
    found = _results(launch.output)
    assert len(found) == 2 and found[0] == found[1]
    assert found[0]["history"] == summary["history"] and found[0]["workers"] == 2
    assert "Traceback" not in launch.output


@pytest.mark.multiworker
def test_a_script_that_started_tensorflow_runs_as_every_worker(tmp_path, launches,  # noqa: F811
                                                               monkeypatch):
    """The same with a layer built before `trainer.fit` on every worker: each worker's fit
    runs in a fresh process (the multi-worker strategy must come first), which joins."""
    monkeypatch.setenv("LAYER_FIRST", "1")  # the launcher's environment, so its workers'
    launch = launches(2, str(_script(tmp_path)), str(tmp_path / "run"))
    assert launch.wait(timeout=400) == 0, launch.output[-3000:]
    assert launch.output.count("trainer.fit runs in a fresh process: a worker's multi-worker "
                               "strategy must be created before TensorFlow starts") == 2
    found = _results(launch.output)
    assert len(found) == 2 and found[0] == found[1] and found[0]["workers"] == 2


@pytest.mark.multiworker
def test_a_script_started_by_hand_with_tf_config_ends_cleanly_on_every_worker(tmp_path):
    """The script started twice with `TF_CONFIG`, each naming the run directory of its own
    machine (`run0`, `run1`: two file systems, as on Kubernetes): both exit 0 and return the
    run's history; only the chief writes (the other worker's `.hydra/` goes to a temporary
    directory, never into a run directory, shared on SLURM)."""
    script = _script(tmp_path)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(tmp_path))
    procs = []
    try:
        for index in (0, 1):
            config = {"cluster": {"worker": addresses}, "task": {"type": "worker",
                                                                 "index": index}}
            procs.append(subprocess.Popen(
                [sys.executable, str(script), str(tmp_path / f"run{index}")], cwd=tmp_path,
                env={**env, "TF_CONFIG": json.dumps(config)}, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True))
        outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0], [o[-3000:] for o in outputs]
    chief, other = (_results(output) for output in outputs)
    summary = json.loads((tmp_path / "run0" / "summary.json").read_text())
    assert chief[0]["history"] == other[0]["history"] == summary["history"]
    assert chief[0]["workers"] == other[0]["workers"] == 2
    assert [found[0]["run_dir"] for found in (chief, other)] == [str(tmp_path / "run0"),
                                                                 str(tmp_path / "run1")]
    assert "worker 1 of 2 finished" in outputs[1] and not (tmp_path / "run1").exists()
    assert not list(tmp_path.glob("trainer-worker-*"))  # the other worker's, removed
    assert not processes_with(str(tmp_path))


def test_the_launchers_command_line_splits_at_the_script():
    """Everything from the script's path on is the script's (its own options too); a
    `.py` value of an option or an override is not a script."""
    assert split_script(["--workers", "2", "train.py", "--workers", "9", "x=1"]) == (
        ["--workers", "2"], ["train.py", "--workers", "9", "x=1"])
    assert split_script(["--workers", "2", "epochs=3", "hydra.run.dir=a.py"]) == (
        ["--workers", "2", "epochs=3", "hydra.run.dir=a.py"], None)


@pytest.mark.parametrize(("args", "line"), [
    (["--workers", "2", "epochs=3", "{script}"], "a script takes its own arguments after its "
                                                 "path"),
    (["--workers", "2", "--evaluator", "{script}"], "--evaluator validates a run of python -m "
                                                   "trainer, not a script's fit"),
    (["--workers", "2", "missing.py"], "the script missing.py does not exist"),
])
def test_a_script_the_launcher_cannot_run_is_one_line(tmp_path, capsys, args, line):
    script = _script(tmp_path)
    assert main([a.format(script=script) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {line}") and err.count("\n") == 1
