"""A summary that says what ran: the model and dataset a `_target_` replaced, the rate a
callback set, the note on a CPU split into devices, checkpoint loading advice that holds
(a custom class nothing registers loads through `load_checkpoint`), and prediction files
named by the model's outputs."""

from __future__ import annotations

import json
import re

import keras
import numpy as np
import pytest

import trainer
from tests.conftest import run_main
from trainer.distribute.device_plan import DevicePlan
from trainer.evaluate import load_checkpoint
from trainer.run.end.summary import device_notes, format_summary, named

MODULE = '''
import keras
import numpy as np

from trainer.data.pipeline import Source


def load(**_):  # 4 features; a class (3) and a score per row
    rng = np.random.default_rng(0)
    x = rng.random((96, 4), dtype=np.float32)
    label, score = rng.integers(0, 3, 96), x.sum(1).astype("float32")
    return Source.from_arrays(x[:64], (label[:64], score[:64]), x[64:],
                              (label[64:], score[64:]), num_classes=3)


class Scale(keras.layers.Layer):  # registered nowhere: plain Keras cannot locate it
    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def build(input_shape, **_):
    inputs = keras.Input(input_shape)
    hidden = keras.layers.Dense(8, activation="relu")(Scale()(inputs))
    return keras.Model(inputs, [keras.layers.Dense(3, activation="softmax", name="label")(hidden),
                                keras.layers.Dense(1, name="score")(hidden)])


class Drive(keras.callbacks.LearningRateScheduler):
    def __init__(self):
        super().__init__(lambda epoch, lr: 1e-5)
'''


def test_a_choice_is_named_unless_a_target_replaced_it():
    assert named("model", "cnn", "trainer.models.cnn.build") == "cnn"
    assert named("model", "cnn", "wine.build") == "wine.build"
    assert named("dataset", "digits", "wine.load") == "wine.load"
    assert named("model", "small", "small_model.build") == "small"  # no shipped file
    assert named("model", None, "my_task.models.build") == "models"


def test_a_cpu_split_into_devices_is_noted():
    split = DevicePlan("cpu", (), 2, ("/cpu:0", "/cpu:1"))
    assert device_notes(split) == [
        "the host CPU as 2 logical devices, one replica on each of 2: they share its cores "
        "(no speed-up; for checking a multi-device run)"]
    read = DevicePlan("cpu", (), 2, ("/cpu:0", "/cpu:1"), notes=("no GPU: devices=2 runs ...",))
    assert device_notes(read) == ["no GPU: devices=2 runs ..."]
    assert device_notes(DevicePlan("cpu", (), 0, ("/cpu:0",))) == []


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("what_ran")
    (root / "what_task.py").write_text(MODULE)
    out = run_main("dataset._target_=what_task.load", "model._target_=what_task.build",
                   "loss=[sparse_categorical_crossentropy, mse]", "metrics=null",
                   "checkpoint.monitor=val_loss", "+callbacks.drive._target_=what_task.Drive",
                   "optimizer=sgd", "accelerator=cpu", "devices=2", "epochs=1", "verbose=0",
                   "logger=[]", f"hydra.run.dir={root / 'run'}", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    return root, json.loads((root / "run" / "summary.json").read_text())


def test_the_summary_names_what_ran(finished):
    _, summary = finished
    assert (summary["model"], summary["dataset"]) == ("what_task.build", "what_task.load")
    assert summary["image_size"] is None  # the digits' option, passed on to rows of 4
    rate = summary["learning_rate"]
    assert (rate["final"], rate["set_by"]) == (pytest.approx(1e-5), ["Drive"])
    text = format_summary(summary)
    assert re.search(r"model / dataset +what_task\.build / what_task\.load\n", text)
    assert "1e-05 at the end, set by Drive" in text
    assert "the host CPU as 2 logical devices" in text


def test_a_class_nothing_registers_loads_as_the_summary_says(finished, monkeypatch):
    root, summary = finished
    assert summary["checkpoints_load_with"].startswith(
        "trainer.evaluate.load_checkpoint (they hold what_task.Scale")
    monkeypatch.syspath_prepend(str(root))
    best = root / "run" / "checkpoints" / "best.keras"
    with pytest.raises((TypeError, ValueError), match="Scale"):
        keras.models.load_model(best)
    model = load_checkpoint(best)
    assert type(model.layers[1]).__name__ == "Scale" and model.layers[1].factor == 2.0


def test_prediction_files_are_named_by_the_models_outputs(finished, monkeypatch):
    root, _ = finished
    monkeypatch.syspath_prepend(str(root))
    x = np.random.default_rng(1).random((5, 4), dtype=np.float32)
    found = trainer.predict(root / "run", x, root / "p.npz")
    with np.load(found["output"]) as saved:
        assert sorted(saved.files) == ["label", "score"]
        assert saved["label"].shape == (5, 3) and saved["score"].shape == (5, 1)
