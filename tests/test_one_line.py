"""One line where a traceback was left: a loss that cannot take the targets, too few output
units, a model's own step that cannot be validated, the user module's own error, a full
disk at the lock and in the log, damaged checkpoints and prediction inputs, and
`trainer.tune`'s arguments."""

from __future__ import annotations

import errno
import io
import logging
import zipfile

import keras
import pytest

import trainer
from tests.conftest import error_lines, run_main
from trainer.config.errors import ConfigError
from trainer.evaluate import load_checkpoint
from trainer.predict import predict_run
from trainer.run import process
from trainer.rundir import lock

QUIET = ["epochs=1", "verbose=0", "logger=[]", "dataset._target_=onel_rows.load"]

MODULES = {
    "onel_rows.py": """
import numpy as np

from trainer.data.pipeline import Source


def load(**_):  # 3 classes of 4 features
    rng = np.random.default_rng(0)
    x, y = rng.random((96, 4), dtype=np.float32), rng.integers(0, 3, 96)
    return Source.from_arrays(x[:64], y[:64], x[64:], y[64:], num_classes=3)
""",
    "onel_models.py": """
import keras
import tensorflow as tf


def mse_on_classes(input_shape, num_classes, **_):
    model = keras.Sequential([keras.Input(input_shape),
                              keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer="sgd", loss="mse")
    return model


def two_units(input_shape, **_):
    return keras.Sequential([keras.Input(input_shape),
                             keras.layers.Dense(2, activation="softmax")])


class OwnStep(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, self(x)))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


def own_step(input_shape, num_classes, **_):  # compiled as keras.io's VAE is: no loss
    inputs = keras.Input(input_shape)
    model = OwnStep(inputs, keras.layers.Dense(num_classes, activation="softmax")(inputs))
    model.compile(optimizer="adam")
    return model
""",
    "onel_broken.py": "import keras\n\n\ndef build(input_shape, **_)\n    return None\n",
}


@pytest.fixture
def project(tmp_path):
    """The modules, named apart from other tests' (a test process imports each name once)."""
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("overrides, message", [
    (["model._target_=onel_models.mse_on_classes", "checkpoint.monitor=val_loss"],
     "error: loss mse cannot take the model's output of shape (None, 3) and its targets of "
     "shape (None,) int64: InvalidArgumentError: Incompatible shapes: [8] vs. [8,3]; use a "
     "loss for these targets"),
    (["model._target_=onel_models.two_units"],
     "error: the model's output has 2 units, but the dataset has 3 classes (labels 0..2): "
     "sparse_categorical_crossentropy needs one unit per class"),
    (["model._target_=onel_models.own_step", "checkpoint.monitor=val_loss"],
     "error: model class OwnStep trains with its own train_step, but has no test_step and no "
     "loss to validate with"),
    (["model._target_=onel_broken.build"],
     "error: model._target_='onel_broken.build' cannot be imported: SyntaxError in {}, line 4: "
     "expected ':'"),
])
def test_what_would_fail_in_the_first_step_or_validation_is_one_line_before_training(
        project, overrides, message):
    run_dir = project / "run"
    out = run_main(*QUIET, *overrides, f"hydra.run.dir={run_dir}", cwd=project)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = error_lines(out.stderr)
    expected = message.format(project / "onel_broken.py")
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert not run_dir.exists()


def test_a_full_disk_at_the_lock_is_one_line_leaving_nothing(tmp_path, monkeypatch):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lock.os, "pwrite", full)
    with pytest.raises(ConfigError, match=r"cannot write the lock file of run directory .*run: "
                                          r"No space left on device; free some space"):
        lock.acquire(tmp_path / "run")
    assert not (tmp_path / "run").exists()


class FullDisk(io.StringIO):
    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_log_that_cannot_be_written_is_one_warning_not_a_traceback_per_record(
        monkeypatch, capsys):
    monkeypatch.setattr(logging.Handler, "handleError", logging.Handler.handleError)
    monkeypatch.setattr(logging, "raiseExceptions", True)
    process.one_logging_error()
    log = logging.getLogger("test_one_line.full")
    handler = logging.StreamHandler(FullDisk())
    log.addHandler(handler)
    try:
        for i in range(5):
            log.warning("record %d", i)
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert "Logging error" not in err
    assert err.strip().splitlines() == [
        "warning: the log could not be written ([Errno 28] No space left on device); later "
        "log records that fail are dropped unreported"]


def test_a_damaged_checkpoint_is_named_in_one_line(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    good = tmp_path / "good.keras"
    model.save(good)
    empty, cut, other = tmp_path / "empty.keras", tmp_path / "cut.keras", tmp_path / "zip.keras"
    empty.write_bytes(b"")
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("notes.txt", "not a model")
    for path, expected in ((empty, "is not a Keras model file: a .keras file is a zip archive, "
                                   "and this one is empty (0 bytes)"),
                           (cut, "is not a Keras model file: a .keras file is a zip archive, "
                                 "and this one is damaged or cut off"),
                           (other, "is a zip archive but not a Keras model file (KeyError"),
                           (tmp_path / "none.keras", "does not exist or is not a file")):
        with pytest.raises(ConfigError) as caught:
            load_checkpoint(path)
        assert str(caught.value).startswith(f"{path} {expected}"), caught.value
        assert "\n" not in str(caught.value)
    assert load_checkpoint(good).count_params() == 8


def test_an_empty_npy_given_to_predict_is_one_line(tmp_path, monkeypatch):
    """NumPy's EOFError was a traceback; the input is read before any model is built."""
    empty = tmp_path / "x.npy"
    empty.write_bytes(b"")
    monkeypatch.setattr("trainer.predict.reopen", lambda *_: type(
        "Opened", (), {"images": False})())
    with pytest.raises(ConfigError, match=r"input=.*x.npy cannot be read as a .npy file \(an "
                                          r"empty file\): No data left in file"):
        predict_run(tmp_path, empty, tmp_path / "p.csv")


def test_tune_takes_its_overrides_as_fit_does(tmp_path):
    with pytest.raises(trainer.TrainerError) as caught:
        trainer.tune("epochs=1 devices=2", run_dir=tmp_path / "run")
    assert str(caught.value).startswith("trainer.tune: overrides are a list of strings, one "
                                        "key=value each: ['epochs=1', 'devices=2']")
    assert caught.value.exit_code == 2 and not (tmp_path / "run").exists()
