"""Builders that see the data: a model builder naming `train` receives the training split
(unbatched, as the model takes it) to `adapt` its preprocessing layers; the adapted state
is part of the model, in its checkpoints, the same on 1 and 2 replicas, and on 2 workers
computed once, on the chief, and sent to the other."""

from __future__ import annotations

import json
import textwrap

import keras
import numpy as np
import pytest

from tests.test_multiworker import launches  # noqa: F401
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


ON_WORKERS = ADAPTING + '''
import json
import os
from pathlib import Path


def _task():
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def build_on_workers(input_shape, num_classes, train):
    seen = int(train.reduce(0, lambda n, _: n + 1))  # what this call's adapt reads
    with open(f"adapted-{_task()}.txt", "a") as out:
        out.write(f"{seen}\\n")
    return build(input_shape, num_classes, train)


class RecordMean(keras.callbacks.Callback):
    """Writes each worker's Normalization mean as training begins."""

    def on_train_begin(self, logs=None):
        mean = np.asarray(self.model.get_layer("norm").mean).reshape(-1)
        Path(f"mean-{_task()}.json").write_text(json.dumps(mean.tolist()))
'''


@pytest.mark.multiworker
def test_on_two_workers_the_chief_alone_adapts_and_hands_its_state_on(tmp_path,
                                                                       launches):  # noqa: F811
    """2 workers: the chief's builder adapts on the 64 training examples, the other's only
    ever sees a stand-in of one element (once to learn that Normalization's state can be
    sent, once to build); both train from the data's mean, and the summary says so."""
    (tmp_path / "adapting_workers.py").write_text(textwrap.dedent(ON_WORKERS))
    run_dir = tmp_path / "run"
    launch = launches(2, "model._target_=adapting_workers.build_on_workers",
                      "dataset._target_=adapting_workers.load", "epochs=1", "logger=[]",
                      "verbose=0", "checkpoint.monitor=val_loss", "batch.per_replica=16",
                      "+callbacks.record._target_=adapting_workers.RecordMean",
                      f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=400) == 0, launch.output[-3000:]
    assert (tmp_path / "adapted-0.txt").read_text().split() == ["64"]
    assert (tmp_path / "adapted-1.txt").read_text().split() == ["1", "1"]
    x = np.random.default_rng(0).normal(loc=[1.0, 2.0, 3.0, 4.0], scale=[1.0, 2.0, 3.0, 4.0],
                                        size=(96, 4)).astype("float32")
    for task in (0, 1):
        mean = json.loads((tmp_path / f"mean-{task}.json").read_text())
        np.testing.assert_allclose(mean, x[:64].mean(axis=0), rtol=1e-5)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("the chief adapted the model's preprocessing (Normalization)" in n
               for n in summary["data_notes"])


def test_only_state_held_in_variables_is_sent_from_the_chief():
    """Normalization's adapted state is variables, which a collective sends; a
    TextVectorization's vocabulary is a lookup table, which none does: a model holding one
    is adapted on every worker, and the note names it. The stand-in reads no example."""
    import tensorflow as tf

    from trainer.distribute.adapt import adapt_note, sent_from_chief, stand_in

    norm = keras.Sequential([keras.Input((4,)), keras.layers.Normalization()])
    text = keras.Sequential([keras.Input((1,), dtype="string"),
                             keras.layers.TextVectorization(max_tokens=10),
                             keras.layers.Embedding(10, 2)])
    assert sent_from_chief(norm) and not sent_from_chief(text)
    assert "the chief adapted the model's preprocessing (Normalization)" in adapt_note(norm, True)
    assert "TextVectorization keep state no collective sends" in adapt_note(text, False)
    read = []
    split = tf.data.Dataset.range(5).map(
        lambda i: (tf.numpy_function(lambda v: read.append(v) or v, [i], tf.int64),
                   tf.strings.as_string(i)))
    (number, words), = stand_in(split).as_numpy_iterator()
    assert (number, words) == (0, b"") and read == []


TEXT_ON_WORKERS = '''
import json
import os
from pathlib import Path

import keras
import numpy as np

from trainer.data.pipeline import Source

WORDS = ["good", "great", "bad", "awful", "the", "a", "movie", "plot"]


def _task():
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def load(**_):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 96)
    x = np.array([f"{WORDS[4 + i % 4]} {WORDS[2 * (1 - label) + i % 2]}"
                  for i, label in enumerate(y)])
    return Source.from_arrays(x[:64], y[:64], x[64:], y[64:], num_classes=2)


def build(num_classes, train):
    seen = int(train.reduce(0, lambda n, _: n + 1))
    with open(f"adapted-{_task()}.txt", "a") as out:
        out.write(f"{seen}\\n")
    vectorize = keras.layers.TextVectorization(output_sequence_length=2, name="words")
    vectorize.adapt(train.map(lambda x, y: x).batch(16))
    inputs = keras.Input((), dtype="string")
    x = keras.layers.Embedding(12, 4)(vectorize(inputs))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


class RecordWords(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        words = self.model.get_layer("words").get_vocabulary()
        Path(f"words-{_task()}.json").write_text(json.dumps(words))
'''


@pytest.mark.multiworker
def test_on_two_workers_a_vocabulary_is_adapted_by_each_and_the_summary_says_so(
        tmp_path, launches):  # noqa: F811
    """A TextVectorization's vocabulary is a lookup table no collective sends: the other
    worker learns so on the stand-in, then adapts on the whole split as the chief does; both
    hold the same vocabulary, and the summary names the layer."""
    (tmp_path / "text_workers.py").write_text(textwrap.dedent(TEXT_ON_WORKERS))
    run_dir = tmp_path / "run"
    launch = launches(2, "model._target_=text_workers.build", "dataset._target_=text_workers.load",
                      "epochs=1", "logger=[]", "verbose=0", "checkpoint.monitor=val_loss",
                      "batch.per_replica=16", "+callbacks.record._target_=text_workers.RecordWords",
                      f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=400) == 0, launch.output[-3000:]
    assert (tmp_path / "adapted-0.txt").read_text().split() == ["64"]
    assert (tmp_path / "adapted-1.txt").read_text().split() == ["1", "64"]
    words = [json.loads((tmp_path / f"words-{task}.json").read_text()) for task in (0, 1)]
    assert words[0] == words[1] and "movie" in words[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("each worker adapted the model's preprocessing on the whole training split: "
               "TextVectorization" in n for n in summary["data_notes"])
