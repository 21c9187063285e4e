"""Builders that see the data: a model builder naming `train` receives the training split
(unbatched, as the model takes it) to `adapt` its preprocessing layers; the adapted state
is part of the model, in its checkpoints, the same on 1 and 2 replicas."""

from __future__ import annotations

import textwrap

import keras
import numpy as np
import pytest

from trainer.run.train import train as run_training

ADAPTING = """
import keras
import numpy as np

from trainer.data.pipeline import Source

SEEN = []


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(loc=[1.0, 2.0, 3.0, 4.0], scale=[1.0, 2.0, 3.0, 4.0], size=(96, 4))
    return x.astype("float32"), rng.integers(0, 3, 96)


def load(**_):
    x, y = data()
    return Source.from_arrays(x[:64], y[:64], x[64:], y[64:], num_classes=3)


def build(input_shape, num_classes, train):
    SEEN.append(train.element_spec)
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(train.map(lambda x, y: x).batch(16))
    return keras.Sequential([keras.Input(input_shape), norm,
                             keras.layers.Dense(num_classes, activation="softmax")])
"""


@pytest.fixture
def adapting(tmp_path, monkeypatch):
    (tmp_path / "adapting_task.py").write_text(textwrap.dedent(ADAPTING))
    monkeypatch.syspath_prepend(str(tmp_path))
    import adapting_task

    yield adapting_task
    monkeypatch.delitem(__import__("sys").modules, "adapting_task")


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_builder_adapts_on_the_training_split(tiny_config, adapting, tmp_path, replicas):
    run_dir = tmp_path / "run"
    run_training(tiny_config("model._target_=adapting_task.build",
                             "dataset._target_=adapting_task.load", "accelerator=cpu",
                             f"devices={replicas}", "checkpoint.monitor=val_loss"),
                 run_dir=run_dir)
    assert [tuple(spec.shape) for spec in adapting.SEEN[-1]] == [(4,), ()]  # unbatched (x, y)
    x, _ = adapting.data()
    saved = keras.models.load_model(run_dir / "checkpoints" / "best.keras")
    mean = np.asarray(saved.get_layer("norm").mean).reshape(-1)
    np.testing.assert_allclose(mean, x[:64].mean(axis=0), rtol=1e-5)
