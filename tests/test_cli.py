"""The command line, in subprocesses: training, sweeps over devices, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY, error_lines, run_cli, run_main

# The design card's command, and the zoo's on the default digits: each as the README writes
# it (tests/test_docs.py maps them to these tests).
DESIGN_CARD = "python -m trainer model=mobilenet devices=[0,1]"
KERAS_APP = "python -m trainer model=keras_app accelerator=cpu devices=2"
SHORT = ["epochs=1", "verbose=0", "logger=[]"]


def _as_written(command: str) -> list[str]:
    words = command.split()
    assert words[:3] == ["python", "-m", "trainer"]
    return words[3:]


def _trains_on_two_logical_cpus(out, run_dir: Path, model: str) -> dict:
    assert out.returncode == 0 and error_lines(out.stderr) == [], out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model"] == model and summary["dataset"] == "digits"
    assert summary["replicas"] == 2 and summary["strategy"] == "mirrored"
    assert summary["devices"] == ["/cpu:0", "/cpu:1"]
    assert summary["batch"]["global"] == 2 * summary["batch"]["per_replica"] == 128
    lr = summary["learning_rate"]
    assert lr["scaled"] == pytest.approx(lr["base"] * 128 / lr["reference_batch"])
    # the 8x8 digits at the model's smallest input, said in the summary with the reason
    assert summary["image_size"] == {
        "size": 32, "own": 8, "minimum": 32,
        "why": f"32x32: dataset=digits is 8x8, resized up to the smallest side model={model} "
               "takes (model.min_image_size=32)"}
    assert "Summary" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("  image size"))
    assert row.split(None, 2)[2] == summary["image_size"]["why"]
    return summary


def test_the_design_cards_command_trains(tmp_path):
    """`python -m trainer model=mobilenet devices=[0,1]` on the default digits, one epoch:
    MobileNetV2 at its smallest input (32x32) on 2 logical CPU devices (no GPU here)."""
    run_dir = tmp_path / "run"
    out = run_main(*_as_written(DESIGN_CARD), *SHORT, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    summary = _trains_on_two_logical_cpus(out, run_dir, "mobilenet")
    assert summary["device_notes"] == ["no GPU: devices=[0,1] runs on 2 logical CPU devices"]
    row = next(line for line in out.stdout.splitlines() if line.startswith("  devices"))
    assert row.endswith("/cpu:0, /cpu:1 (no GPU: devices=[0,1] runs on 2 logical CPU devices)")


@pytest.mark.parametrize("command, model", [(DESIGN_CARD, "mobilenet"),
                                            (KERAS_APP, "keras_app")])
def test_the_headline_commands_as_written(tmp_path, command, model):
    """The whole command in a fresh process, all 8 epochs (only the run directory added)."""
    out = run_cli(*_as_written(command), f"hydra.run.dir={tmp_path}", cwd=tmp_path, timeout=900)
    summary = _trains_on_two_logical_cpus(out, tmp_path, model)
    assert summary["epochs_done"] == 8
    # devices=[0,1] with no GPU falls back to 2 logical CPUs, saying so; accelerator=cpu
    # asked for them: no "no GPU" note, the shared cores' one
    assert summary["device_notes"] == (
        ["no GPU: devices=[0,1] runs on 2 logical CPU devices"] if model == "mobilenet" else
        ["the host CPU as 2 logical devices, one replica on each of 2: they share its cores "
         "(no speed-up; for checking a multi-device run)"])
    assert (tmp_path / ".hydra" / "config.yaml").is_file()


def test_sweep_over_devices_gives_each_job_its_devices(tmp_path):
    """Devices are fixed once per process, so each job must run in a fresh one."""
    sweep = tmp_path / "sweep"
    out = run_cli("-m", "accelerator=cpu", "devices=1,2,4", *TINY, f"hydra.sweep.dir={sweep}",
                  cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 3
    for path, replicas in zip(summaries, (1, 2, 4), strict=True):
        summary = json.loads(path.read_text())
        assert summary["replicas"] == replicas
        assert summary["devices"] == [f"/cpu:{i}" for i in range(replicas)]
        assert summary["batch"]["global"] == 64 * replicas
        assert Path(summary["run_dir"]) == path.parent
        assert (path.parent / ".hydra" / "overrides.yaml").is_file()


@pytest.mark.parametrize("args, message", [
    (["model=resnet"], "error: unknown model 'resnet'; available: cifar10_cnn, cnn, keras_app, "
                    "mobilenet"),
    (["dataset=imagenet"], "error: unknown dataset 'imagenet'; available: cats_vs_dogs, "
     "cifar10, digits, image_folder, mnist, synthetic, tfds, tfrecord"),
    (["epochs=x"], "Value 'x' of type 'str' could not be converted to Integer"),
    (["epochs=0"], "error: epochs must be a positive integer; received: 0"),
    (["model.widht=3"], "Key 'widht' not in 'CnnConfig'"),
    (["batch.global_size=256"], "error: set exactly one of batch.per_replica and batch.global"),
    (["accelerator=gpu", "devices=[0,3]"], "error: accelerator=gpu but TensorFlow sees no GPU"),
    (["accelerator=cpu", "devices=3", "batch.per_replica=null", "batch.global_size=100"],
     "error: batch.global_size=100 does not divide evenly over 3 replicas"),
    # Hydra's syntax errors, an overflowing integer, out-of-range values (#16.11)
    (["epochs=[1,2"], "error: cannot parse the override 'epochs=[1,2': no viable alternative"),
    (["=5"], "error: cannot use the overrides =5"),
    (["epochs"], "error: Error parsing override 'epochs'; missing EQUAL"),
    (["batch.per_replica=99999999999999999999"],
     "error: batch.per_replica must be at most 2147483647"),
    (["dataset.validation_fraction=0"], "error: dataset.validation_fraction must be between 0 "
                                        "and 1 (exclusive); received: 0.0"),
    (["dataset.validation_fraction=1.5"], "error: dataset.validation_fraction must be between"),
    (["model.dropout=1.5"], "error: model.dropout must be in [0, 1); received: 1.5"),
    # speed typos, caught before TensorFlow starts (#16.13)
    (["precision=fp16"], "error: precision must be one of auto, float32, mixed_float16, "
                         "mixed_bfloat16; received: 'fp16'"),
    (["jit_compile=yes"], "error: jit_compile must be auto, true or false; received: 'yes'"),
    (["steps_per_execution=0"], "error: steps_per_execution must be auto or a positive integer"),
    (["verbose=7"], "error: verbose must be 0 (silent), 1 (progress bar), 2 (a line per "
                    "epoch) or auto; received: 7"),
    # degenerate data (#16.8) and the full name of a missing key (#16.18)
    (["dataset=synthetic", "dataset.num_classes=1"],
     "error: dataset.num_classes must be at least 2 for a classifier; received: 1"),
    (["dataset=synthetic", "dataset.image_size=0"], "error: dataset.image_size must be a positive"),
    # the built-in datasets follow a model's min_image_size; an explicit smaller size cannot
    (["model=mobilenet", "dataset.image_size=8"],
     "error: dataset.image_size=8 is below the smallest side model=mobilenet takes, 32x32"),
    (["dataset=synthetic", "dataset.channels=0"], "error: dataset.channels must be a positive"),
    (["dataset=synthetic", "dataset.train_examples=0"],
     "error: dataset.train_examples must be a positive integer; received: 0"),
    (["dataset=tfds"], "error: dataset.name must be set (no default)"),
    (["batch.accumulate=0"], "error: batch.accumulate must be a positive integer or auto"),
    (["batch.max_per_replica=32"], "error: batch.per_replica=64 is above batch.max_per_replica"),
    # keys no part of a run reads (#22.6), and class weights that are not weights
    (["+epoch=1"], "error: unknown key epoch (did you mean epochs?): no part of a run reads"),
    (["+batch.size=32"], "error: unknown key batch.size: no part of a run reads it"),
    (["class_weight={0: -1}"], "error: class_weight must map class indices to non-negative"),
    (["+callbacks.mine._target_=nonexistent_mod.Cb"],
     "error: callbacks.mine._target_='nonexistent_mod.Cb': no module named 'nonexistent_mod' "
     "(is it installed, or in the working directory?)"),
])
def test_config_errors_are_one_line_and_exit_2(tmp_path, args, message):
    run_dir = tmp_path / "run"
    # in this process where the pre-flight refuses, in a subprocess where the job does;
    # test_refusals_from_a_fresh_process runs some of the first kind as a user would
    out = run_main(*args, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    lines = error_lines(out.stderr)
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and message in lines[0], lines
    # Nothing written: not even Hydra's .hydra/ and log (#16.17).
    assert not run_dir.exists(), sorted(p.name for p in run_dir.rglob("*"))


@pytest.mark.parametrize("args, message", [
    (["epochs=0"], "error: epochs must be a positive integer; received: 0"),
    (["+epoch=1"], "error: unknown key epoch (did you mean epochs?)"),
    (["accelerator=cpu", "devices=3", "batch.per_replica=null", "batch.global_size=100"],
     "error: batch.global_size=100 does not divide evenly over 3 replicas"),
])
def test_refusals_from_a_fresh_process(tmp_path, args, message):
    run_dir = tmp_path / "run"
    out = run_main(*args, f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=120)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(message), lines
    assert not run_dir.exists()


def test_image_folder_with_one_class_is_refused(tmp_path):
    from PIL import Image

    folder = tmp_path / "images" / "cat"
    folder.mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(folder / f"{i}.png")
    run_dir = tmp_path / "run"
    out = run_main("dataset=image_folder", f"dataset.path={tmp_path / 'images'}",
                  f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=120)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert "holds one class folder (cat); a classifier needs at least 2" in lines[0]
    assert not run_dir.exists()


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    import os
    import signal
    import subprocess
    import time

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    run_dir = tmp_path / "run"
    # As from a terminal: pytest-xdist's workers ignore SIGINT, which a child inherits (and
    # Python then leaves Ctrl-C ignored, as it should for a run started under nohup).
    process = subprocess.Popen([sys.executable, "-m", "trainer", f"hydra.run.dir={run_dir}"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "trainer.log").is_file():  # Hydra is running the job: start-up
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err[-2000:]
    assert error_lines(err) == ["interrupted: Ctrl-C outside the training steps; rerun the same "
                                "command to start again, or to finish from the last backup"]
    assert not run_dir.exists()


def test_full_error_shows_the_traceback(tmp_path):
    out = run_cli("epochs=0", f"hydra.run.dir={tmp_path}", cwd=tmp_path,
                  env={"HYDRA_FULL_ERROR": "1"}, timeout=120)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_console_script_composes_and_resolves_the_config(tmp_path):
    script = Path(sys.executable).parent / "trainer"
    if not script.exists():
        pytest.fail(f"console script not installed next to {sys.executable}")
    import subprocess

    out = subprocess.run([str(script), "model=mobilenet", "--cfg", "job", "--resolve"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "_target_: trainer.models.mobilenet.build" in out.stdout
    # the digits at the model's smallest input, resolved by Hydra itself
    assert "  min_image_size: 32\n" in out.stdout and "  image_size: 32\n" in out.stdout


def test_unknown_experiment_is_one_line_and_trains_nothing(tmp_path):
    out = run_main("experiment=nope", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                  timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        "error: unknown experiment 'nope'; available: cats_vs_dogs_mobilenet, "
        "cifar10_multi_gpu, digits_towers, mnist_towers"]
    assert not (tmp_path / "run").exists()


def test_an_unknown_key_in_an_experiment_file_is_one_line(tmp_path):
    experiments = tmp_path / "conf" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "typo.yaml").write_text("# @package _global_\nepochs: 1\n"
                                           "class_wieght: {0: 1.0}\n")
    out = run_main("--config-dir", str(tmp_path / "conf"), "experiment=typo",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        "error: In 'experiment/typo': ConfigKeyError raised while composing config Key "
        "'class_wieght' not in 'Config'"]
    assert not (tmp_path / "run").exists()


# A default run as a user starts it (`python -m trainer`: run as `-m` runs it), then the
# garbage collector's part in TensorFlow's start (`GC collections-during enabled-after
# frozen-after`), then the modules it imported, printed after it ended; then Keras's parts
# whose import was deferred (`trainer.internals.tf_start.optional_parts_deferred`), used: they
# load as Keras's own.
DEFAULT_RUN = ("import gc, runpy, sys\n"
               "import trainer.run.process as process\n"
               "started, seen = process.tensorflow_started, []\n"
               "def counted():\n"
               "    before = sum(s['collections'] for s in gc.get_stats())\n"
               "    started()\n"
               "    seen[:] = [sum(s['collections'] for s in gc.get_stats()) - before,\n"
               "               gc.isenabled(), gc.get_freeze_count()]\n"
               "process.tensorflow_started = counted\n"
               "try:\n    runpy.run_module('trainer', run_name='__main__', alter_sys=True)\n"
               "except SystemExit as exit:\n    assert not exit.code, exit.code\n"
               "print('GC', *seen)\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] in {'optuna', 'mlflow', "
               "'wandb', 'submitit', 'tensorflow_datasets'} or m in "
               "{'trainer.models.keras_app', 'trainer.models.mobilenet', 'trainer.data.tfds', "
               "'trainer.data.image_folder', 'matplotlib.pyplot'}))\n"
               "import keras, sklearn.base\n"
               "from keras.src.visualization.plot_image_gallery import plot_image_gallery\n"
               "print(issubclass(keras.wrappers.SKLearnClassifier, sklearn.base.BaseEstimator), "
               "keras.visualization.plot_image_gallery is plot_image_gallery, "
               "'matplotlib.pyplot' in sys.modules)\n")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A whole default run (its TensorBoard logger, its progress lines; two epochs on the
    8x8 digits) in a fresh process with TensorFlow's logging as a user's shell leaves it:
    the process's output, and the environment it had."""
    tmp_path = tmp_path_factory.mktemp("default")
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYDRA_FULL_ERROR", "TF_CPP_MIN_LOG_LEVEL", "TRAINER_TF_LOGS")}
    out = subprocess.run([sys.executable, "-c", DEFAULT_RUN, "epochs=2", "dataset.image_size=8",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    return out, env, tmp_path


@pytest.mark.long
def test_a_normal_run_prints_nothing_on_stderr(finished):
    """No TensorFlow start-up notices (CUDA, cuInit, CPU features), no C++ warnings."""
    out, env, tmp_path = finished
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr == "", out.stderr[-3000:]
    assert "Summary" in out.stdout and "Epoch 2/2" in out.stdout
    # The switch brings TensorFlow's own lines back.
    shown = subprocess.run([sys.executable, "-m", "trainer", "epochs=1", "dataset.image_size=8",
                            f"hydra.run.dir={tmp_path / 'shown'}"], cwd=tmp_path,
                           env={**env, "TRAINER_TF_LOGS": "1"}, capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0 and shown.stderr.strip(), shown.stderr[-3000:]


USER_SCRIPT = """
import sys
import trainer
import keras, numpy as np, tensorflow as tf

def make():
    x = np.random.RandomState(0).rand(64, 8, 8, 1).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, np.arange(64) % 3)).batch(16)

def build():
    m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                          keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return m

trainer.fit(["accelerator=cpu", "devices=2", "epochs=1", "verbose=0"], run_dir=sys.argv[1],
            model=build, data=make)
"""


@pytest.mark.long
def test_a_users_script_that_imports_tensorflow_after_trainer_prints_nothing_on_stderr(
        tmp_path):
    """`import trainer` then the user's own `import tensorflow` (the usual top of a script),
    and `trainer.fit` of a `tf.data.Dataset` with integer labels on 2 devices: neither
    TensorFlow's start-up notices nor its C++ warnings during the run reach stderr;
    `TRAINER_TF_LOGS=1` brings them back."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYDRA_FULL_ERROR", "TF_CPP_MIN_LOG_LEVEL", "TRAINER_TF_LOGS")}
    (tmp_path / "script.py").write_text(USER_SCRIPT)
    for switch, run in (("0", "quiet"), ("1", "shown")):
        out = subprocess.run([sys.executable, "script.py", str(tmp_path / run)], cwd=tmp_path,
                             env={**env, "TRAINER_TF_LOGS": switch,
                                  "PYTHONPATH": str(Path(__file__).parent.parent)},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert (out.stderr == "") == (switch == "0"), out.stderr[-3000:]


@pytest.mark.parametrize("bad, message", [
    (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    (lambda p: p.write_text("hello, not an image"), "is not a JPG image"),
    (lambda p: p.write_bytes(p.read_bytes()[:200]), "is truncated (no end-of-image marker)"),
])
def test_a_bad_image_file_is_named_before_training(tmp_path, bad, message):
    from PIL import Image

    for name in ("cat", "dog"):
        folder = tmp_path / "images" / name
        folder.mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (32, 32), (i * 60, 20, 200)).save(folder / f"{i}.jpg")
    broken = tmp_path / "images" / "dog" / "1.jpg"
    bad(broken)
    run_dir = tmp_path / "run"
    out = run_main("dataset=image_folder", f"dataset.path={tmp_path / 'images'}",
                  f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=120)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0] == f"error: dataset=image_folder: {broken} {message}" + lines[0].split(
        message, 1)[1]
    assert not run_dir.exists()



def png_with_garbage_pixels() -> bytes:
    """A PNG whose signature, header and end are valid, its image data garbage: the cheap
    checks before training pass it, TensorFlow's decoder fails on it mid-epoch."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", b"garbage" * 20) + chunk(b"IEND", b""))


def test_an_image_that_does_not_decode_mid_training_is_named_in_one_line(tmp_path):
    from PIL import Image

    for name in ("cat", "dog"):
        folder = tmp_path / "images" / name
        folder.mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8), (i * 60, 20, 200)).save(folder / f"{i}.png")
    broken = tmp_path / "images" / "dog" / "2.png"
    broken.write_bytes(png_with_garbage_pixels())
    run_dir = tmp_path / "run"
    out = run_main(*TINY, "dataset=image_folder", f"dataset.path={tmp_path / 'images'}",
                   "dataset.validation_fraction=0.25", "dataset.test_fraction=0",
                   f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert error_lines(out.stderr) == [
        f"error: dataset=image_folder: {broken} does not decode as an image (Invalid PNG "
        f"data, size {broken.stat().st_size}); remove it or replace it with a good copy"]
    assert not run_dir.exists()

def test_a_run_directory_that_is_a_file_is_one_line(tmp_path):
    target = tmp_path / "taken"
    target.write_text("a file")
    out = run_main(f"hydra.run.dir={target}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [f"error: run directory {target} is a file, not a "
                                       "directory; choose another hydra.run.dir"]
    assert target.read_text() == "a file"


def test_a_config_reading_hydra_at_run_time_still_runs(tmp_path):
    """`${hydra:...}` resolves only inside the job: the early checks leave such a config to it,
    and the file it names lands in the run directory (lightning-hydra-template's idiom)."""
    run_dir = tmp_path / "run"
    out = run_main(*TINY, "model=small",
                   "+callbacks.csv._target_=keras.callbacks.CSVLogger",
                   "+callbacks.csv.filename=${hydra:runtime.output_dir}/epochs.csv",
                   f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (run_dir / "epochs.csv").read_text().startswith("epoch,")
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "${hydra:runtime.output_dir}/epochs.csv" in overrides  # kept as typed


def test_composing_keeps_an_override_that_reads_the_running_job_as_typed():
    """The pre-flight composes before Hydra's job runs: `${hydra:...}` cannot resolve yet
    (it stopped every such run with "HydraConfig was not set")."""
    from trainer.config.compose import composed

    typed = "+callbacks.csv.filename=${hydra:runtime.output_dir}/epochs.csv"
    run = composed(["+callbacks.csv._target_=keras.callbacks.CSVLogger", typed])
    assert typed in run.overrides


def test_a_read_only_run_directory_is_refused(tmp_path, monkeypatch):
    """Decided by `os.access` (tests run as root, for whom nothing is read-only: faked)."""
    from trainer.config.errors import ConfigError
    from trainer.rundir.lock import check_writable

    check_writable(tmp_path / "new" / "run")
    monkeypatch.setattr("trainer.rundir.lock.os.access", lambda path, mode: False)
    with pytest.raises(ConfigError, match=rf"run directory {tmp_path / 'new' / 'run'} cannot be "
                                          rf"written \({tmp_path} is read-only for this user\)"):
        check_writable(tmp_path / "new" / "run")



@pytest.mark.parametrize("name", ["x" * 300 + "/run", "a/" * 2100 + "run"])
def test_a_run_directory_name_too_long_for_the_file_system_is_one_line(tmp_path, name):
    run_dir = tmp_path / name
    out = run_main(*TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: run directory "), lines
    assert "choose a shorter hydra.run.dir" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("empty", ["hydra.run.dir=", 'hydra.run.dir=""', "hydra.run.dir=' '"])
def test_an_empty_run_directory_is_one_line_and_writes_nothing(tmp_path, empty):
    """`Path('')` is the working directory: an empty value would fill it with the run."""
    out = run_main(*TINY, empty, cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: hydra.run.dir is empty ("), lines
    assert "hydra.run.dir=runs/NAME" in lines[0]
    assert list(tmp_path.iterdir()) == []


# Every check a command-line run makes of its config, its run directory and its data, and
# the parsers of config values (each value is parsed once, into the run's `Spec`).
CHECKS = ("check_name", "check_writable", "validate", "check_loggers", "check", "check_finetune",
          "check_converters", "resolve", "resolve_cluster", "check_resume_target",
          "nothing_to_add", "refuse_finished_run", "check_backups_kept", "latest_state",
          "check_resume", "check_same_data", "check_global_batch", "check_metric_name",
          "check_inputs", "check_class_weight", "check_free_space", "parse_devices",
          "export_formats", "read_pipeline", "service_of")
# What one new run checks and parses once each, the command line's and trainer.fit's alike.
ONCE = {("trainer.config.validate", "validate", False),
        ("trainer.config.validate", "parse_devices", False),
        ("trainer.config.validate", "export_formats", False),
        # the dataset's pipeline options (`Spec.pipeline`): the data reads the record
        ("trainer.config.validate", "read_pipeline", False),
        ("trainer.config.validate", "service_of", False),
        ("trainer.track.loggers", "check_loggers", False),
        ("trainer.track.loggers", "check_loggers", True),
        ("trainer.data.augment", "check", False),
        ("trainer.task.finetune", "check", False),
        ("trainer.models.formats", "check_converters", False),
        ("trainer.run.prepare.resolve", "resolve", False),
        ("trainer.rundir.names", "check_name", False),
        ("trainer.rundir.lock", "check_writable", False),
        ("trainer.rundir.resume", "refuse_finished_run", False),
        ("trainer.rundir.resume", "check_backups_kept", False),
        ("trainer.rundir.resume", "latest_state", False),
        ("trainer.data.fingerprint", "check_same_data", False),
        ("trainer.rundir.resume", "check_global_batch", False),
        ("trainer.track.sweep", "check_metric_name", False),
        ("trainer.rundir.space", "check_free_space", False)}


def _count_checks(monkeypatch) -> dict:
    """Wraps every check (by its defining function, wherever a module imported it) with a
    counter: `{(module, name, reach): calls}`."""
    import importlib
    import pkgutil

    import trainer

    for info in pkgutil.walk_packages(trainer.__path__, "trainer."):
        if info.name not in ("trainer.__main__", "trainer.launch"):
            importlib.import_module(info.name)
    targets = {}
    for name, module in list(sys.modules.items()):
        for attr in CHECKS:
            fn = getattr(module, attr, None) if name.startswith("trainer") else None
            if callable(fn) and getattr(fn, "__module__", None) == name:
                targets[id(fn)] = fn
    calls: dict = {}
    wrapped = {}
    for key, fn in targets.items():
        def counted(*args, _fn=fn, **kwargs):
            found = (_fn.__module__, _fn.__name__, bool(kwargs.get("reach")))
            calls[found] = calls.get(found, 0) + 1
            return _fn(*args, **kwargs)
        wrapped[key] = counted
    for name, module in list(sys.modules.items()):
        if name.startswith("trainer"):
            for attr, value in list(vars(module).items()):
                if id(value) in wrapped and callable(value):
                    monkeypatch.setattr(module, attr, wrapped[id(value)])
    return calls


def test_one_command_line_run_makes_every_check_once(tmp_path, monkeypatch):
    """A new run, then a resume of it with one more epoch: each check of the config, the
    run directory and the data runs once per command (none twice, none skipped)."""
    calls = _count_checks(monkeypatch)
    run = tmp_path / "run"
    out = run_main(*TINY, "model=small", f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert {k: v for k, v in calls.items() if v != 1} == {}
    assert ONCE <= set(calls), ONCE - set(calls)
    calls.clear()
    out = run_main(*TINY, "model=small", "epochs=2", f"resume={run}", f"hydra.run.dir={run}",
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert {k: v for k, v in calls.items() if v != 1} == {}
    assert {("trainer.rundir.resume", "check_resume", False),
            ("trainer.rundir.resume", "nothing_to_add", False),
            ("trainer.rundir.resume", "check_resume_target", False)} <= set(calls)


def test_one_fit_run_makes_every_check_and_parses_every_value_once(tmp_path, monkeypatch):
    """`trainer.fit`, as the command line: `devices`, `export` and the dataset's pipeline
    options parsed once (into the run's `Spec`), every check once. Two known exceptions,
    both before the pre-flight: in a process whose TensorFlow started (this one),
    `trainer.child.needed` parses `devices` and resolves the cluster to decide whether the
    run needs a fresh process, and `trainer.api` resolves the cluster to send a non-chief
    worker's `.hydra/` elsewhere. Both are pure readings of the composed config, made before
    the pre-flight decides where the run writes."""
    import trainer

    calls = _count_checks(monkeypatch)
    trainer.fit([*TINY, "model=small", "accelerator=cpu", "devices=[0,1]", "export=false"],
                run_dir=tmp_path / "run")
    before_the_preflight = {("trainer.config.validate", "parse_devices", False): 2,
                            ("trainer.distribute.cluster", "resolve_cluster", False): 3}
    assert {k: v for k, v in calls.items() if v != 1} == before_the_preflight
    assert ONCE <= set(calls), ONCE - set(calls)


def test_a_default_run_imports_no_tracker_sweeper_or_zoo(finished):
    """What only some runs need is not paid by the others: after a whole default run (the
    TensorBoard logger included), none of these was imported; nor `matplotlib.pyplot`, which
    `import keras` brings (the curves draw on matplotlib's Agg canvas). Keras's scikit-learn
    wrappers and its image gallery, deferred, still load when used."""
    out, _, _ = finished
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "True True True"]


def test_tensorflow_starts_with_no_garbage_collection_and_its_objects_frozen(finished):
    """Importing TensorFlow and Keras makes about a million objects that live as long as the
    process: a run imports them with the collector paused (no collection walks the objects
    of the half-done import), freezes them (no later one walks them), then turns it back on."""
    out, _, _ = finished
    assert out.returncode == 0, out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-3].split()
    assert line[:3] == ["GC", "0", "True"] and int(line[3]) > 500_000, line
