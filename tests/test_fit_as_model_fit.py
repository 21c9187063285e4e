"""`trainer.fit` as `model.fit`: Keras's own arguments with their meaning, a compiled model
instance rebuilt in the strategy's scope, and what the script made (module-level datasets,
callbacks, functions AutoGraph converts) carried to a fresh process by value. The scripts
run as a user runs them: `python script.py`, in a fresh process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trainer
from tests.conftest import error_lines
from tests.keras_fit_scripts import COMPILED, DATASETS, HELD, IMPORTED_FIRST, VAE
from tests.test_multiworker import launches
from trainer.api import FitCall, keras_data, keras_overrides

__all__ = ["launches"]  # the fixture, imported for the tests below


def _script(tmp_path: Path, text: str, *args: str, **env_set: str) -> tuple[dict, str]:
    """Runs a script as `python script.py ARGS` from an empty folder (the environment with
    `env_set`, and without `TF_CPP_MIN_LOG_LEVEL` where it sets it to ""); its RESULT line
    and its stderr."""
    path = tmp_path / "script.py"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR",)}
    env.update(env_set)
    env = {k: v for k, v in env.items() if v != ""}
    done = subprocess.run([sys.executable, str(path), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), done.stderr


@pytest.mark.long
@pytest.mark.parametrize("devices", [1, 2])
def test_a_compiled_model_and_keras_arguments_train_as_model_fit(tmp_path, devices):
    """`trainer.fit(model, x, y, batch_size=32, epochs=2, validation_split=0.2,
    callbacks=[cb], shuffle=False)`: on one device the weights written back into `model`
    are `model.fit`'s (1e-5); on 2 replicas (a fresh process: the script's TensorFlow
    started with one device) too, to float error. `cb` saw every epoch and batch in both,
    the batch is 32 split over the replicas, and the rate the compiled one."""
    found, _ = _script(tmp_path, COMPILED, str(devices))
    assert found["replicas"] == devices
    assert found["diff"] <= 1e-5, found
    assert (found["epochs"], found["batches"]) == (2, 10)  # 160 examples at 32, 2 epochs
    assert found["batch"]["global"] == 32 and found["batch"]["per_replica"] == 32 // devices
    assert found["lr"]["base"] == found["lr"]["scaled"] == pytest.approx(0.05)


@pytest.mark.long
@pytest.mark.parametrize("devices", [1, 2])
def test_keras_ios_vae_as_written_trains_and_its_weights_come_back(tmp_path, devices):
    """keras.io's VAE, a subclassed model without `get_config` whose constructor takes its
    encoder and decoder, given to `trainer.fit` as `vae.fit` takes it: rebuilt from its
    parts in the strategy's scope (in a fresh process on 2 replicas: the script built its
    model with TensorFlow's one device), trained, its weights back in `vae`."""
    found, stderr = _script(tmp_path, VAE, str(devices))
    assert found["replicas"] == devices and found["batch"] == 128
    assert len(found["loss"]) == 1 and found["loss"][0] == found["loss"][0]  # not NaN
    assert found["moved"] > 0
    assert "UserWarning" not in stderr, stderr[-3000:]


# keras.io's structured-data example's data as it loads them: module-level `tf.data`
# datasets of (dict of columns, 0/1 target) in batches of 32, made before the port's block.
STRUCTURED_DATA = """
import json
import sys

import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)


def split(n):
    features = {"age": rng.normal(50, 9, n).astype("float32"),
                "chol": rng.normal(240, 40, n).astype("float32"),
                "sex": rng.integers(0, 2, n).astype("int64"),
                "cp": rng.integers(0, 4, n).astype("int64")}
    labels = rng.integers(0, 2, size=(n,)).astype("int64")
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(32)


train_ds, val_ds = split(64), split(32)
numeric_features, categorical_features = ["age", "chol"], ["sex", "cp"]
"""


@pytest.mark.long
@pytest.mark.parametrize("devices", [1, 2])
def test_the_structured_data_port_as_docs_show_it_runs_as_a_script(tmp_path, devices):
    """docs/porting.md's structured-data block as written (lookups adapted on module-level
    datasets), after its data, as `python script.py`: one quiet epoch on `devices`."""
    from tests.test_porting import ports

    block = ports()["structured/trainer"]
    assert "epochs=50" in block and "devices=2)" in block
    block = block.replace("epochs=50", "epochs=1").replace(
        "devices=2)", "devices=int(sys.argv[1]), accelerator='cpu', verbose=0, "
        "overrides=['logger=[]'])")
    script = (STRUCTURED_DATA + block + '\nprint("RESULT", json.dumps({"replicas": '
              'result.summary["replicas"], "loss": result.history["loss"]}))\n')
    found, _ = _script(tmp_path, script, str(devices))
    assert found["replicas"] == devices and len(found["loss"]) == 1


@pytest.mark.long
def test_a_script_that_imported_keras_first_shows_no_tensorflow_notices_during_the_run(
        tmp_path):
    """`import keras` before `import trainer` (every porting.md block): TensorFlow read its
    C++ log level then, unset. On 2 replicas in the script's process, the run's C++ INFO
    and WARNING lines (tf.data's notes on its generator dataset) and the no-GPU notice are
    dropped as they arrive, while the script's own stderr lines come through, in order;
    with `TRAINER_TF_LOGS=1` (nothing dropped) the same run shows those notes."""
    found, stderr = _script(tmp_path, IMPORTED_FIRST, TF_CPP_MIN_LOG_LEVEL="")
    assert found["replicas"] == 2
    during = stderr[stderr.index("Could not find cuda drivers"):]  # after the import's
    notices = re.compile(r"^[IWE]\d{4} .*(dataset\.cc|generator_dataset_op|cuda_platform)",
                         re.M)
    assert not notices.search(during), during[-3000:]
    own = re.findall(r"^the script's own line, epoch (\d)$", stderr, re.M)
    assert own == ["0", "1"], stderr[-3000:]
    _, loud = _script(tmp_path, IMPORTED_FIRST, TF_CPP_MIN_LOG_LEVEL="", TRAINER_TF_LOGS="1")
    assert re.search(r"^W\d{4} .*dataset\.cc", loud, re.M), loud[-3000:]


@pytest.mark.long
@pytest.mark.parametrize("devices", [1, 2])
def test_module_level_datasets_and_their_functions_reach_a_fresh_process(tmp_path, devices):
    """The multi-worker tutorial's form, a script that imported TensorFlow first: on 2
    replicas its module-level datasets (a `repeat()` stream with `steps_per_epoch`, and
    the one the builder adapts on) travel by value, and AutoGraph converts the script's
    functions there (no warning that it could not); on 1 device, in the script's process,
    it ends with plain Keras's `fit`'s weights on the same stream (1e-5)."""
    found, stderr = _script(tmp_path, DATASETS, str(devices))
    assert found["replicas"] == devices and found["steps"] == 3
    if devices == 1:
        assert found["diff"] <= 1e-5, found
    assert len(found["val_accuracy"]) == 2
    assert "AutoGraph could not transform" not in stderr, stderr[-3000:]


def test_keras_arguments_map_to_the_config_with_their_meaning():
    call = FitCall(None, "x", "y", batch_size=32, validation_split=0.2, shuffle=False,
                   class_weight={0: 1, 1: 5}, devices=[0, 1], verbose=2, steps_per_epoch=7)
    assert keras_overrides(call) == [
        "devices=[0,1]", "epochs=1", "batch.global_size=32", "verbose=2",
        "validation_split=0.2", "dataset.shuffle=false", "class_weight={0: 1.0, 1: 5.0}",
        "steps_per_epoch=7"]
    # the command-line form keeps the config's defaults (8 epochs)
    assert keras_overrides(FitCall(data="d")) == []
    assert keras_data("x", "y", None, ("xv", "yv")) == {"train": ("x", "y"),
                                                       "validation": ("xv", "yv")}
    assert keras_data("ds", None, None, None) == {"train": "ds"}
    assert keras_data("x", "y", "w", None) == {"train": ("x", "y", "w")}


@pytest.mark.parametrize("extra, said", [
    ({"initial_epoch": 3}, "does not take initial_epoch=3"),
    ({"validation_freq": 2}, "validation_freq=2 cannot be honoured"),
    ({"shuffle": "batch"}, "takes shuffle=True or False; received: 'batch'"),
    ({"class_weight": [1, 2]}, "class_weight is a dict of class index to weight"),
    ({"data": ([1], [2])}, "takes the data once"),
])
def test_what_trainer_cannot_honour_is_one_line(tmp_path, extra, said):
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit(lambda: None, [[0.0]], [0], run_dir=tmp_path / "run", **extra)
    assert said in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.long
def test_sigterm_in_a_first_step_held_in_cpp_stops_within_seconds_in_one_line(tmp_path):
    """SIGTERM while the first step is held in TensorFlow's C++ code (a compile: here, a
    step that does not return for two minutes), where no Python handler runs: the process
    ends within 10 s, one line, exit 75."""
    (tmp_path / "script.py").write_text(HELD)
    mark = tmp_path / "mark"
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
           "MARK": str(mark)}
    proc = subprocess.Popen([sys.executable, "script.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 75 and took < 10, (took, err[-2000:])
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith(
        "interrupted: SIGTERM while the first training step compiled"), err[-2000:]


def test_the_printed_summary_shows_from_logits_and_the_users_callbacks(tmp_path, capsys):
    import keras
    import numpy as np

    class Mine(keras.callbacks.Callback):
        pass

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 4), "float32"), rng.integers(0, 3, 64)
    trainer.fit(model, x, y, callbacks=[Mine()], devices=1, verbose=0,
                overrides=["logger=[]"], run_dir=tmp_path / "run")
    out = capsys.readouterr().out
    assert "sparse_categorical_crossentropy (from_logits=True)" in out
    assert any(line.split() == ["callbacks", "Mine"] for line in out.splitlines()), out


@pytest.mark.multiworker
@pytest.mark.parametrize("script", ["compiled", "datasets", "vae"])
def test_the_ported_scripts_train_on_two_workers(tmp_path, launches, script):
    """`python -m trainer.launch --workers 2 script.py`: each worker's `trainer.fit` runs in
    a fresh process (its multi-worker strategy must come first), with the script's model,
    module-level datasets and callbacks by value. The compiled model's weights on the chief
    are `model.fit`'s on one device (1e-5); every worker's callback saw every epoch and
    batch. keras.io's VAE, rebuilt from its parts, trains; its weights come back on the
    chief."""
    (tmp_path / "script.py").write_text({"compiled": COMPILED, "datasets": DATASETS,
                                         "vae": VAE}[script])
    launch = launches(2, "script.py", "1")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    found = {int(index): json.loads(text) for index, text in
             re.findall(r"^\[worker (\d)\] RESULT (.*)$", launch.output, re.M)}
    assert sorted(found) == [0, 1], launch.output[-3000:]
    assert all(f["replicas"] == 2 for f in found.values())
    if script == "compiled":
        assert found[0]["diff"] <= 1e-5
        assert all((f["epochs"], f["batches"]) == (2, 10) for f in found.values())
    elif script == "vae":
        assert found[0]["moved"] > 0 and found[0]["batch"] == 128
    else:
        assert all(f["steps"] == 3 for f in found.values())


def _gen(rng):
    for i in range(4):
        yield rng.random((8, 5 - i % 2), "float32"), rng.integers(0, 3, 8)


@pytest.mark.parametrize("case, said", [
    ("generator", "its train generator's batch 1 has parts of shape (None, 4), (None,) past "
                  "the batch axis, and batch 0 (None, 5), (None,)"),
    ("strings", "the targets of the model's output are strings ('a', 'b', 'c'), and loss "
                "sparse_categorical_crossentropy takes numbers"),
    ("ragged", "a train array is a NumPy array of objects of shape (64,)"),
    ("weights", "its train sample weights have shape (64, 2), and its targets (64,): give "
                "one weight per example"),
    ("class_weight", "class_weight={0: 2.0} gives no weight to class(es) 1, 2 of this "
                     "dataset's 3"),
])
def test_data_keras_fails_on_deep_in_a_step_is_one_line_before_training(tmp_path, case, said):
    """What failed in a 70-130 line traceback from NumPy or a graph (as it does in Keras's
    own fit): one line naming the value and what would be valid, nothing written."""
    import keras
    import numpy as np

    def build():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 4), "float32"), rng.integers(0, 3, 64)
    given = {
        "generator": {"x": _gen(rng)},
        "strings": {"x": x, "y": np.array(["a", "b", "c"] * 21 + ["a"])},
        "ragged": {"x": np.array([np.zeros(3), np.zeros(4)] * 32, dtype=object), "y": y},
        "weights": {"x": x, "y": y, "sample_weight": rng.random((64, 2), "float32")},
        "class_weight": {"x": x, "y": y, "class_weight": {0: 2.0}},
    }[case]
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit(build, devices=1, verbose=0, overrides=["logger=[]"],
                    run_dir=tmp_path / "run", **given)
    assert said in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert error.value.exit_code == 2
    assert not (tmp_path / "run").exists()
