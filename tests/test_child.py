"""`trainer.fit` where TensorFlow already started (`trainer.child`): a run that needs what
this process can no longer have (more logical devices, oneDNN's kernels off) runs in a fresh
child process and returns the same `Result`.

The pytest process is itself such a process (TensorFlow started with 4 logical CPUs by
`conftest.py`): `devices=6` cannot be had in it. The scripts run in subprocesses with hard
timeouts, each its own process group, killed when a test ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO

import trainer
from trainer import child
from trainer.child import fresh_reason
from trainer.config.compose import composed
from trainer.distribute.devices import ONEDNN_STAYS_ON, set_determinism
from trainer.internals.tf_runtime import onednn_enabled

QUIET = ["verbose=0", "logger=[]", "accelerator=cpu"]

# The script's task: data and a builder, as functions in its `__main__`.
TASK = """
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.arange(1, 5, dtype="float32") > 0).astype("int32")


def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss="sparse_categorical_crossentropy")
    return model
"""
# The script's run: on 2 logical CPUs unless its command line says otherwise.
ARGS = ["accelerator=cpu", "epochs=2", "logger=[]", "seed=1", "verbose=2",
        "dataset.shuffle=false", "batch.per_replica=8"]

# A script as a user writes it: functions in `__main__`, TensorFlow started at module level
# (where LAYER_FIRST says), then `trainer.fit` on 2 logical CPUs; it prints the history and
# the last checkpoint's weights.
SCRIPT = """
import json, os, sys
import numpy as np
import keras
import trainer

if os.environ.get("LAYER_FIRST"):
    first = keras.layers.Dense(2)
    first.build((None, 3))  # TensorFlow's runtime starts here, with one CPU device
if os.environ.get("ONEDNN_ASKED") is None:
    os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None)  # as if TensorFlow started on its default
""" + TASK + f"""

from trainer.internals.tf_runtime import onednn_enabled
parent_onednn = onednn_enabled()
try:
    result = trainer.fit([*{ARGS!r}, *sys.argv[2:]], model=build, data=(x, y),
                         run_dir=sys.argv[1])
except trainer.TrainerError as error:
    print(json.dumps({{"error": str(error), "exit_code": error.exit_code}}))
    raise SystemExit(1)
weights = keras.models.load_model(result.checkpoints["last"]).get_weights()
print(json.dumps({{"history": result.history, "weights": [w.tolist() for w in weights],
                  "deterministic": result.summary["deterministic"],
                  "parent_onednn": parent_onednn}}))
"""


def _sigint_as_from_a_terminal() -> None:
    # pytest-xdist's workers ignore SIGINT, and a child inherits that; Ctrl-C is tested here
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Scripts:
    """Runs the script in subprocesses at once, each in its own process group, with a hard
    timeout; kills what is left."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        (tmp_path / "script.py").write_text(SCRIPT)
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        base = {k: v for k, v in os.environ.items()
                if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG", "TF_ENABLE_ONEDNN_OPTS")}
        base.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
        base["TMPDIR"] = str(self.tmp_path)  # the child's files: named by this test's path
        proc = subprocess.Popen(
            [sys.executable, "script.py", str(self.tmp_path / name), *args],
            cwd=self.tmp_path, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True, preexec_fn=_sigint_as_from_a_terminal)
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float = 300) -> tuple[dict, str, str]:
        """The script's printed outcome, its stdout and stderr; fails unless it exits 0."""
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1]), out, err

    def read_until(self, proc: subprocess.Popen, text: str, timeout: float = 300) -> str:
        """The script's output up to the line holding `text`."""
        seen, timer = [], threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        try:
            for line in proc.stdout:
                seen.append(line)
                if text in line:
                    return "".join(seen)
        finally:
            timer.cancel()
        pytest.fail(f"no {text!r} in the output:\n{''.join(seen)[-3000:]}")

    def children(self) -> list[int]:
        """The fresh processes (`python -m trainer.child`) this test started, alive."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().split()[2]
            except (OSError, ValueError):
                continue
            if "trainer.child" in cmdline and str(self.tmp_path) in cmdline and state != "Z":
                found.append(int(entry.name))
        return found

    def kill(self) -> None:
        for pid in self.children():
            os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def scripts(tmp_path):
    found = Scripts(tmp_path)
    yield found
    found.kill()


def test_a_script_that_started_tensorflow_trains_on_two_devices_as_a_fresh_process_does(
        scripts, tmp_path, capsys):
    """A layer built at module level, then `devices=2` with the script's own `__main__`
    functions: the run goes to a fresh child, its progress comes out here, and its `Result`
    (history, weights) is the one the same task gets where it runs in the process that
    called `fit` (here: this process has 4 logical CPUs)."""
    child = scripts.start("child", "devices=2", env={"LAYER_FIRST": "1"})
    task = {"np": np, "keras": keras}
    exec(TASK, task)
    result = trainer.fit([*ARGS, "devices=2"], model=task["build"],
                         data=(task["x"], task["y"]), run_dir=tmp_path / "here")
    assert "trainer.fit runs in a fresh process" not in capsys.readouterr().out
    weights = keras.models.load_model(result.checkpoints["last"]).get_weights()
    got, out, err = scripts.finish(child)
    assert got["history"] == json.loads(json.dumps(result.history))
    assert got["weights"] == [w.tolist() for w in weights]
    assert out.startswith("trainer.fit runs in a fresh process: TensorFlow already started "
                          "in this process with 1 logical CPU device(s), so /cpu:1 cannot "
                          "be created\n")
    assert "Epoch 2/2" in out and "Fatal" not in err and "Traceback" not in err


def test_deterministic_true_after_tensorflow_started_with_onednn_runs_in_a_fresh_process(
        scripts):
    """`deterministic=true` where TensorFlow started with oneDNN's kernels on (forced here,
    as a CPU with AVX-512 does by default): the run goes to a fresh process, where they are
    off, as in a run started from the command line."""
    on = {"LAYER_FIRST": "1", "TF_ENABLE_ONEDNN_OPTS": "1"}
    got, out, _ = scripts.finish(scripts.start("child", "devices=1", "deterministic=true",
                                               env=on))
    if not got["parent_onednn"]:
        pytest.skip("this TensorFlow build has no oneDNN kernels to switch")
    assert "trainer.fit runs in a fresh process: deterministic=true takes TensorFlow's own " \
           "CPU kernels" in out
    assert "oneDNN's CPU kernels off (TF_ENABLE_ONEDNN_OPTS=0)" in got["deterministic"]


def test_an_error_in_the_fresh_process_is_the_same_one_line(tmp_path):
    """The child's refusal comes back as the `TrainerError` this process would raise: the
    command line's line and exit code."""
    x = np.zeros((8, 4), "float32")

    def build():  # sent by value, as a notebook's function (this module imports conftest)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    with pytest.raises(trainer.TrainerError) as raised:
        trainer.fit([*QUIET, "devices=6", "epochs=0"], model=build, data=(x, x[:, :1]),
                    run_dir=tmp_path / "run")
    assert raised.value.exit_code == 2
    assert "epochs" in str(raised.value) and "received: 0" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "run").exists()


def test_a_fresh_process_that_ends_without_returning_is_one_line(tmp_path):
    """A child that dies (a crash, a kill) is one `TrainerError` naming its exit code."""
    x = np.zeros((8, 4), "float32")

    def dies():  # sent by value, as a notebook's function (this module imports conftest)
        os._exit(3)  # the fresh process ends without a word: as a crash of TensorFlow would

    with pytest.raises(trainer.TrainerError) as raised:
        trainer.fit([*QUIET, "devices=6", "epochs=1"], model=dies, data=(x, x[:, :1]),
                    run_dir=tmp_path / "run")
    assert str(raised.value) == ("the fresh process running trainer.fit ended with exit code "
                                 "3 before returning (its output is above)")
    assert raised.value.exit_code == 3


def _build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_an_object_that_cannot_be_sent_is_one_line_naming_it(tmp_path):
    """Where the run needs a fresh process, a `tf.data.Dataset` whose state lives outside
    its graph (a Python generator's: any other goes as its graph) or a builder holding a
    lock cannot go there: one line names which argument, and what to pass instead. Nothing
    is started or written."""
    x = np.zeros((8, 4), "float32")
    dataset = tf.data.Dataset.from_generator(
        lambda: iter([(x[:4], x[:4, :1])]),
        output_signature=(tf.TensorSpec((None, 4), tf.float32),
                          tf.TensorSpec((None, 1), tf.float32)))
    overrides = [*QUIET, "devices=6"]
    run_dir = tmp_path / "run"
    with pytest.raises(trainer.TrainerError, match=r"TensorFlow already started in this "
                       r"process with 4 logical CPU device\(s\), so /cpu:4, /cpu:5 cannot be "
                       r"created\), and data= \(\w*Dataset\w*\) cannot be sent to it: .*; pass "
                       r"a function that makes it \(data=make_it"):
        trainer.fit(overrides, model=_build, data=dataset, run_dir=run_dir)
    with pytest.raises(trainer.TrainerError, match=r"and data\['validation'\] \(\w*Dataset\w*\)"
                       r" cannot be sent"):
        trainer.fit(overrides, model=_build, data={"train": (x, x[:, :1]),
                                                   "validation": dataset}, run_dir=run_dir)
    lock = threading.Lock()

    def build_locked():
        with lock:
            return _build()

    with pytest.raises(trainer.TrainerError, match=r"and model= \(function\) cannot be sent "
                       r"to it: TypeError: cannot pickle '_thread.lock' object"):
        trainer.fit(overrides, model=build_locked, data=(x, x[:, :1]), run_dir=run_dir)
    assert not run_dir.exists()


def test_a_run_this_process_can_have_stays_here():
    """What decides: a device the runtime lacks, oneDNN's kernels fixed on under
    `deterministic=true`, a cluster's worker; nothing else."""
    assert fresh_reason([], "cpu", 4, False, False) is None
    assert "/cpu:4, /cpu:5 cannot be created" in fresh_reason(["/cpu:4", "/cpu:5"], "cpu", 4,
                                                               False, False)
    assert "oneDNN" in fresh_reason([], "cpu", 4, True, False)
    assert "multi-worker strategy" in fresh_reason([], "cpu", 4, False, True)


def test_what_this_process_has_stays_here(monkeypatch):
    """In the test process (4 logical CPUs started): `devices=2` runs here, `devices=6` does
    not; `deterministic=true` with oneDNN's kernels on runs here only where the user asked
    for them (`TF_ENABLE_ONEDNN_OPTS=1`)."""
    def needed(args: list[str]):
        return child.needed(composed(args))

    assert needed(["accelerator=cpu", "devices=2"]) is None
    fresh = needed(["accelerator=cpu", "devices=6"])
    assert fresh.plan.names == tuple(f"/cpu:{i}" for i in range(6))
    if not onednn_enabled():
        return  # no oneDNN kernels on in this process: deterministic=true runs here
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    assert needed(["accelerator=cpu", "devices=1", "deterministic=true"]) is None
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    fresh = needed(["accelerator=cpu", "devices=1", "deterministic=true"])
    assert "oneDNN" in fresh.reason and dict(fresh.environ) == {"TF_ENABLE_ONEDNN_OPTS": "0"}


def _gone(scripts: Scripts, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while scripts.children() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not scripts.children()


def test_ctrl_c_stops_the_fresh_process_as_it_stops_a_run_here(scripts):
    """Ctrl-C in the script while its fit trains in a fresh process: the child stops with a
    backup, and the script gets the `TrainerError` (exit code 75) a run here raises."""
    proc = scripts.start("run", "devices=2", "epochs=400", env={"LAYER_FIRST": "1"})
    scripts.read_until(proc, "Epoch 2/400")
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    found = json.loads(out.strip().splitlines()[-1])
    assert found["exit_code"] == 75, err[-2000:]
    assert found["error"].startswith("stopped by signal 2 at epoch ")
    assert (scripts.tmp_path / "run" / "backup").is_dir()
    assert _gone(scripts, 10)


def test_the_fresh_process_ends_with_the_script(scripts):
    """The script killed while its fit trains in a fresh process: the child stops too."""
    proc = scripts.start("run", "devices=2", "epochs=400", env={"LAYER_FIRST": "1"})
    scripts.read_until(proc, "Epoch 2/400")
    assert scripts.children()
    os.killpg(proc.pid, signal.SIGKILL)  # the script's group; the child has its own
    proc.wait(timeout=30)
    assert _gone(scripts, 60)


def test_deterministic_true_in_this_process_says_onednn_stays_on(monkeypatch, caplog):
    """Where a run goes on in a process whose TensorFlow started with oneDNN's kernels on
    (`train(cfg)` here; `trainer.fit` starts a fresh process), `deterministic=true` says in
    one line that they stay on and what that costs; not where the user asked for them."""
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("a GPU run: oneDNN's CPU kernels are not the model's")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    try:
        set_determinism(True)
        said = [r.getMessage() for r in caplog.records if "oneDNN" in r.getMessage()]
        assert said == ([ONEDNN_STAYS_ON] if onednn_enabled() else [])
        caplog.clear()
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
        set_determinism(True)
        assert "oneDNN" not in caplog.text
    finally:
        set_determinism(False)
