"""Users' own tasks for the Keras-parity tests: dict inputs, two heads, text, own train_step.

Each `load` returns a `trainer.data.Source` from arrays, each `build` a Keras model; the
tests name them as `_target_`s (this directory is on the tests' import path).
"""

from __future__ import annotations

import keras
import numpy as np

from trainer.data.pipeline import Source

ROWS, VALIDATION, CATEGORIES = 301, 29, 7


def _table(rows: int, seed: int):
    """Numeric features and a category; the class and the score depend on both."""
    rng = np.random.default_rng(seed)
    num = rng.normal(size=(rows, 4)).astype("float32")
    cat = rng.integers(0, CATEGORIES, size=(rows, 1)).astype("int32")
    signal = num[:, 0] + num[:, 1] - 0.8 * (cat[:, 0] % 3 == 0)
    label = (signal > 0).astype("int32")
    score = (2.0 * num[:, 2] + 0.5 * signal).astype("float32")
    return {"num": num, "cat": cat}, label, score


def dict_inputs(**_: object) -> Source:
    """Two named inputs, one class target (301 training rows: an uneven last batch)."""
    x, y, _score = _table(ROWS, 0)
    vx, vy, _ = _table(VALIDATION, 1)
    return Source.from_arrays(x, y, vx, vy, num_classes=2)


def two_targets(**_: object) -> Source:
    """Two named inputs, two targets: a class (`cls`) and a score (`reg`)."""
    x, y, score = _table(ROWS, 0)
    vx, vy, vscore = _table(VALIDATION, 1)
    return Source.from_arrays(x, {"cls": y, "reg": score}, vx, {"cls": vy, "reg": vscore},
                              num_classes=2)


def _trunk():
    num = keras.Input((4,), name="num")
    cat = keras.Input((1,), name="cat", dtype="int32")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(CATEGORIES, 3)(cat))
    hidden = keras.layers.Dense(16, activation="relu")(
        keras.layers.Concatenate()([num, embedded]))
    return {"num": num, "cat": cat}, hidden


def dict_model(**_: object) -> keras.Model:
    inputs, hidden = _trunk()
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))


def two_head_model(**_: object) -> keras.Model:
    inputs, hidden = _trunk()
    cls = keras.layers.Dense(2, activation="softmax", name="cls")(hidden)
    reg = keras.layers.Dense(1, name="reg")(hidden)
    return keras.Model(inputs, {"cls": cls, "reg": reg})


WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "a", "movie", "plot"]


def _sentences(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, size=rows).astype("int32")
    text = []
    for y in label:
        mood = WORDS[:3] if y else WORDS[3:6]
        words = list(rng.choice(WORDS[6:], size=3)) + [str(rng.choice(mood))]
        rng.shuffle(words)
        text.append(" ".join(words))
    return np.array(text), label


def text(**_: object) -> Source:
    """Sentences as strings; the model vectorises them itself."""
    x, y = _sentences(ROWS, 0)
    vx, vy = _sentences(VALIDATION, 1)
    return Source.from_arrays(x, y, vx, vy, num_classes=2)


def text_model(**_: object) -> keras.Model:
    vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=4,
                                               vocabulary=WORDS)
    inputs = keras.Input((), dtype="string")
    x = keras.layers.Embedding(20, 8)(vectorize(inputs))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


class CountingModel(keras.Model):
    """A model with its own `train_step`, which counts its calls (in a variable, since the
    step runs in a graph)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = keras.Variable(0, dtype="int32", trainable=False, name="calls")

    def train_step(self, data):
        self.calls.assign_add(1)
        return super().train_step(data)


def counting_model(**_: object) -> keras.Model:
    inputs, hidden = _trunk()
    return CountingModel(inputs, keras.layers.Dense(2, activation="softmax")(hidden))


class Subclassed(keras.Model):
    """A subclassed model (its own `call`, no `get_config`): its variables exist only once it
    has seen a batch, so trainer builds it from a symbolic one, as Keras's fit does."""

    def __init__(self, classes: int, **kwargs):
        super().__init__(**kwargs)
        init = keras.initializers.GlorotUniform(seed=3)
        normal = keras.initializers.RandomNormal(seed=4)
        self.embed = keras.layers.Embedding(CATEGORIES, 3, embeddings_initializer=normal)
        self.hidden = keras.layers.Dense(16, activation="relu", kernel_initializer=init)
        self.head = keras.layers.Dense(classes, activation="softmax", kernel_initializer=init)

    def call(self, inputs):
        embedded = keras.ops.reshape(self.embed(inputs["cat"]), (-1, 3))
        return self.head(self.hidden(keras.ops.concatenate([inputs["num"], embedded], axis=-1)))


def subclassed_model(num_classes: int, **_: object) -> keras.Model:
    return Subclassed(num_classes)


def tuple_targets(**_: object) -> Source:
    """Two inputs and two targets as tuples (a class and a score), and a sample weight per
    training example."""
    x, y, score = _table(ROWS, 0)
    vx, vy, vscore = _table(VALIDATION, 1)
    weights = np.random.default_rng(2).uniform(0.5, 2.0, size=ROWS).astype("float32")
    return Source.from_arrays((x["num"], x["cat"]), (y, score), (vx["num"], vx["cat"]),
                              (vy, vscore), num_classes=2, sample_weight=weights)


def tuple_model(**_: object) -> keras.Model:
    """`keras.Model((a, b), [cls, reg])`: tuple inputs, a list of outputs."""
    inputs, hidden = _trunk()
    cls = keras.layers.Dense(2, activation="softmax", name="cls")(hidden)
    reg = keras.layers.Dense(1, name="reg")(hidden)
    return keras.Model((inputs["num"], inputs["cat"]), [cls, reg])


def seeded_model(**_: object) -> keras.Model:
    """`dict_model` with seeded initial weights: the same wherever it is built."""
    init = keras.initializers.GlorotUniform(seed=5)
    num = keras.Input((4,), name="num")
    cat = keras.Input((1,), name="cat", dtype="int32")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(
        CATEGORIES, 3, embeddings_initializer=keras.initializers.RandomNormal(seed=6))(cat))
    hidden = keras.layers.Dense(16, activation="relu", kernel_initializer=init)(
        keras.layers.Concatenate()([num, embedded]))
    outputs = keras.layers.Dense(2, activation="softmax", kernel_initializer=init)(hidden)
    return keras.Model({"num": num, "cat": cat}, outputs)


def compiled_model(**_: object) -> keras.Model:
    """A model its builder compiled: its optimizer, loss, metrics and loss weights."""
    model = seeded_model()
    model.compile(optimizer=keras.optimizers.SGD(0.2, momentum=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=1,
                                                                                  name="top1")],
                  loss_weights=0.5)
    return model


def regression_targets(**_: object) -> Source:
    """The score alone: a float regression target, no classes."""
    x, _, score = _table(ROWS, 0)
    vx, _, vscore = _table(VALIDATION, 1)
    return Source.from_arrays(x, score, vx, vscore)


def scaled_crossentropy(y_true, y_pred, scale=1.0):
    """A loss of the user's: a plain function, named by its dotted path in the config."""
    return scale * keras.losses.sparse_categorical_crossentropy(y_true, y_pred)


def _declared(train_size: int, filtered: bool) -> Source:
    """A user's own tf.data source declaring `train_size` (the data holds 301); filtered,
    tf.data does not know its length."""
    import tensorflow as tf

    x, y, _ = _table(ROWS, 0)
    vx, vy, _ = _table(VALIDATION, 1)
    train = tf.data.Dataset.from_tensor_slices((x, y))
    if filtered:
        train = train.filter(lambda *_: True)
    return Source(train=train, validation=tf.data.Dataset.from_tensor_slices((vx, vy)),
                  train_size=train_size, validation_size=VALIDATION,
                  input_shape={"num": (4,), "cat": (1,)}, num_classes=2)


def declares_300(**_: object) -> Source:
    return _declared(300, filtered=False)


def declares_400_filtered(**_: object) -> Source:
    return _declared(400, filtered=True)


def compiled_without_metrics(**_: object) -> keras.Model:
    """Compiled by its builder with a loss alone: Keras's fit logs the loss only."""
    model = seeded_model()
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss="sparse_categorical_crossentropy")
    return model


def batchnorm_model(**_: object) -> keras.Model:
    """`seeded_model` with BatchNormalization after the hidden layer, and a second one in a
    nested model: its training step uses the batch's own mean and variance."""
    init = keras.initializers.GlorotUniform(seed=5)
    num = keras.Input((4,), name="num")
    cat = keras.Input((1,), name="cat", dtype="int32")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(
        CATEGORIES, 3, embeddings_initializer=keras.initializers.RandomNormal(seed=6))(cat))
    hidden = keras.layers.Dense(16, kernel_initializer=init)(
        keras.layers.Concatenate()([num, embedded]))
    nested = keras.Sequential([keras.layers.BatchNormalization(momentum=0.8),
                               keras.layers.Activation("relu")], name="nested")
    hidden = keras.layers.BatchNormalization(momentum=0.8)(nested(hidden))
    outputs = keras.layers.Dense(2, activation="softmax", kernel_initializer=init)(hidden)
    return keras.Model({"num": num, "cat": cat}, outputs)


def activity_model(**_: object) -> keras.Model:
    """A model that adds a loss in its forward pass (an L2 activity regulariser: a sum over
    the batch)."""
    inputs, hidden = _trunk()
    hidden = keras.layers.Dense(8, activity_regularizer="l2")(hidden)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))
