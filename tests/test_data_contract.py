"""The spec of `trainer.fit(data=...)`: every form Keras's `fit` takes, each trained by
trainer and by plain Keras's `model.fit` on one device at the same global batch.

A cell is a form of the data (arrays, structures of inputs and targets, tf.data datasets,
`keras.utils.PyDataset`, a generator, what Keras's dataset utilities return), a kind of
target (integer scalar, integer `(n, 1)`, float class indices, one-hot, regression, none),
a kind of weight (none, sample, class) and a placement (1 device; 2 replicas with
`loop=fit`; 2 replicas with `loop=custom`). Each ends within `TOLERANCE` of plain Keras's
weights, or is refused in one line naming the form and what to give instead. The axes are
paired, not crossed: every form, target kind, weight kind and placement appears; each form
runs on 1 device and on 2 replicas, and most on all three placements.

Tiny models (one Dense layer, seeded, no dropout or batch norm), 64 examples, 1 epoch, a
global batch of 16, no shuffling; the reference runs once per model and data.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import trainer
from tests.test_multiworker import launches  # noqa: F401

N, FEATURES, CLASSES, BATCH, LR, TOLERANCE = 64, 5, 3, 16, 0.1, 1e-5
QUIET = ["verbose=0", "logger=[]", "accelerator=cpu", "epochs=1", "dataset.shuffle=false",
         "optimizer.lr_scaling=none"]
PLACES = {"one": ["devices=1"], "fit2": ["devices=2", "loop=fit"],
          "custom2": ["devices=2", "loop=custom"]}
CLASS_WEIGHT = {0: 1.0, 1: 2.0, 2: 0.5}

_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, FEATURES)).astype("float32")
LABELS = _rng.integers(0, CLASSES, N)
SAMPLE_WEIGHT = _rng.uniform(0.5, 2.0, N).astype("float32")
TARGETS = {
    "int": LABELS.astype("int64"),
    "int_n1": LABELS[:, None].astype("int32"),
    "float_index": LABELS.astype("float32"),
    "one_hot": np.eye(CLASSES, dtype="float32")[LABELS],
    "regression": (X @ np.arange(1, FEATURES + 1, dtype="float32") / 5)[:, None],
    "none": None,
}
LOSSES = {"int": "sparse_categorical_crossentropy",
          "int_n1": "sparse_categorical_crossentropy",
          "float_index": "sparse_categorical_crossentropy",
          "one_hot": "categorical_crossentropy", "regression": "mse", "none": None}


@keras.saving.register_keras_serializable(package="test_data_contract")
class SquaredOutput(keras.layers.Layer):
    """Its output's mean square as the model's loss (`add_loss`): trains on inputs alone."""

    def call(self, y):
        self.add_loss(keras.ops.mean(keras.ops.square(y)))
        return y


def one_layer(target: str):
    """A builder: one seeded Dense layer over `FEATURES` inputs, for the target's kind."""
    def build():
        keras.utils.set_random_seed(7)
        inputs = keras.Input((FEATURES,))
        units = 1 if target in ("regression", "none") else CLASSES
        outputs = keras.layers.Dense(units, activation=None if units == 1 else "softmax")(
            inputs)
        if target == "none":
            outputs = SquaredOutput()(outputs)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(LR), loss=LOSSES[target])
        return model

    return build


def trained(build, data, overrides, tmp_path) -> list[np.ndarray]:
    """trainer's weights after `trainer.fit` with these objects and overrides."""
    result = trainer.fit([*QUIET, *overrides], model=build, data=data, run_dir=tmp_path / "run")
    return keras.models.load_model(result.checkpoints["last"]).get_weights()


_REFERENCES: dict = {}


def reference(key, build, *args, **kwargs) -> list[np.ndarray]:
    """Plain Keras's weights after `model.fit(*args, **kwargs)` on one device, at the global
    batch, unshuffled, one epoch: once per key."""
    if key not in _REFERENCES:
        model = build()
        with tf.device("/cpu:0"):
            model.fit(*args, batch_size=BATCH, shuffle=False, epochs=1, verbose=0, **kwargs)
        _REFERENCES[key] = model.get_weights()
    return _REFERENCES[key]


def assert_close(got: list, want: list) -> None:
    assert len(got) == len(want)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True))
    assert worst < TOLERANCE, worst


# -- arrays: (x, y), (x, y, w), x; every target kind; sample and class weights -------------

ARRAY_CELLS = [
    ("int", "none", "one"), ("int", "sample", "fit2"), ("int", "class", "custom2"),
    ("int_n1", "none", "fit2"), ("int_n1", "class", "one"),
    ("float_index", "none", "custom2"), ("float_index", "class", "fit2"),
    ("one_hot", "none", "one"), ("one_hot", "sample", "custom2"),
    ("regression", "sample", "one"), ("regression", "none", "fit2"),
    ("none", "none", "custom2"), ("none", "none", "fit2"),
]


@pytest.mark.parametrize("target, weight, place", ARRAY_CELLS)
def test_arrays(target, weight, place, tmp_path):
    """`(x, y)`, `(x, y, sample_weight)` and `x` alone, with `class_weight` in the config."""
    y, build = TARGETS[target], one_layer(target)
    data = X if y is None else (X, y, SAMPLE_WEIGHT) if weight == "sample" else (X, y)
    extra = [f"batch.global_size={BATCH}", "batch.per_replica=null"]
    kwargs = {}
    if weight == "class":
        extra.append("class_weight={0: 1.0, 1: 2.0, 2: 0.5}")
        kwargs["class_weight"] = CLASS_WEIGHT
    if weight == "sample":
        kwargs["sample_weight"] = SAMPLE_WEIGHT
    want = reference(("arrays", target, weight), build, X, y, **kwargs)
    assert_close(trained(build, data, [*PLACES[place], *extra], tmp_path), want)


# -- tf.data: unbatched, batched, repeat() with steps_per_epoch, filter, from_generator ----

def _kept() -> np.ndarray:
    """Which examples `filter` keeps: the first feature above -1."""
    return X[:, 0] > -1.0


def dataset_form(form: str, y: np.ndarray | None, w: np.ndarray | None):
    """(data for trainer, its extra overrides, the arrays plain Keras trains on)."""
    parts = tuple(p for p in (X, y, w) if p is not None)
    element = parts if len(parts) > 1 else parts[0]
    plain = tf.data.Dataset.from_tensor_slices(element)
    batch = [f"batch.global_size={BATCH}", "batch.per_replica=null"]
    if form == "unbatched":
        return plain, batch, parts
    if form == "batched":
        return plain.batch(BATCH), [], parts
    if form == "repeat":
        return plain.batch(BATCH).repeat(), [f"steps_per_epoch={N // BATCH}"], parts
    if form == "filter":
        keep = _kept()
        filtered = plain.filter(lambda *e: e[0][0] > -1.0)
        return filtered.batch(BATCH), [], tuple(p[keep] for p in parts)
    if form == "from_generator":
        def rows():
            yield from zip(*parts, strict=True) if len(parts) > 1 else parts[0]

        spec = tuple(tf.TensorSpec(p.shape[1:], tf.as_dtype(p.dtype)) for p in parts)
        generated = tf.data.Dataset.from_generator(
            rows, output_signature=spec if len(spec) > 1 else spec[0])
        return generated.batch(BATCH), [], parts
    raise AssertionError(form)


DATASET_CELLS = [
    ("unbatched", "int", "none", "custom2"), ("unbatched", "one_hot", "sample", "one"),
    ("unbatched", "regression", "none", "fit2"),
    ("batched", "int", "none", "one"), ("batched", "int", "none", "fit2"),
    ("batched", "int_n1", "class", "custom2"), ("batched", "float_index", "sample", "fit2"),
    ("repeat", "int", "none", "fit2"), ("repeat", "regression", "sample", "custom2"),
    ("repeat", "int", "class", "one"),
    ("filter", "int", "none", "custom2"), ("filter", "regression", "none", "one"),
    ("filter", "int_n1", "sample", "fit2"),
    ("from_generator", "int", "none", "fit2"), ("from_generator", "none", "none", "one"),
    ("from_generator", "float_index", "class", "custom2"),
]


@pytest.mark.parametrize("form, target, weight, place", DATASET_CELLS)
def test_tf_data(form, target, weight, place, tmp_path):
    """A `tf.data.Dataset` of each form, its own batch the global batch where it has one."""
    y, build = TARGETS[target], one_layer(target)
    w = SAMPLE_WEIGHT if weight == "sample" else None
    data, extra, parts = dataset_form(form, y, w)
    kwargs = {"sample_weight": parts[2]} if w is not None else {}
    if weight == "class":
        extra = [*extra, "class_weight={0: 1.0, 1: 2.0, 2: 0.5}"]
        kwargs["class_weight"] = CLASS_WEIGHT
    want = reference((form == "filter", target, weight), build, parts[0],
                     parts[1] if len(parts) > 1 and y is not None else None, **kwargs)
    assert_close(trained(build, data, [*PLACES[place], *extra], tmp_path), want)


# -- structures: several inputs (dict, tuple, list), optional input, several targets -------

A, B = X[:, :2].copy(), X[:, 2:].copy()
PRIORITY = TARGETS["regression"]


def two_inputs(named: bool):
    """Inputs `a` (2 features) and `b` (3), concatenated into one softmax layer."""
    def build():
        keras.utils.set_random_seed(7)
        a, b = keras.Input((2,), name="a"), keras.Input((3,), name="b")
        outputs = keras.layers.Dense(CLASSES, activation="softmax")(
            keras.layers.Concatenate()([a, b]))
        model = keras.Model({"a": a, "b": b} if named else [a, b], outputs)
        model.compile(optimizer=keras.optimizers.SGD(LR),
                      loss="sparse_categorical_crossentropy")
        return model

    return build


def two_outputs():
    """The functional-API guide's shape: outputs `priority` (regression) then `department`
    (classes), compiled with a loss per output name; sorted names would swap them."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((FEATURES,))
    priority = keras.layers.Dense(1, name="priority")(inputs)
    department = keras.layers.Dense(CLASSES, activation="softmax", name="department")(inputs)
    model = keras.Model(inputs, [priority, department])
    model.compile(optimizer=keras.optimizers.SGD(LR),
                  loss={"priority": "mse", "department": "sparse_categorical_crossentropy"})
    return model


@keras.saving.register_keras_serializable(package="test_data_contract")
class Optional(keras.layers.Layer):
    """A softmax layer over `x`, plus `o` where given."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(CLASSES, activation="softmax")

    def call(self, x, o=None):
        return self.dense(x if o is None else x + o)


def with_optional():
    """Inputs `x` and an optional `o`, added to `x` where given (Keras's own test)."""
    keras.utils.set_random_seed(7)
    x, o = keras.Input((FEATURES,), name="x"), keras.Input((FEATURES,), name="o",
                                                          optional=True)
    model = keras.Model({"x": x, "o": o}, Optional()(x, o))
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="sparse_categorical_crossentropy")
    return model


def weighted_metrics():
    """A compiled builder's `weighted_metrics`, read with sample weights."""
    model = one_layer("int")()
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="sparse_categorical_crossentropy",
                  weighted_metrics=["accuracy"])
    return model


Y = TARGETS["int"]
# form: (builder, data for trainer, plain Keras's fit arguments)
STRUCTURES = {
    "dict_inputs": (two_inputs(True), ({"a": A, "b": B}, Y), ({"a": A, "b": B}, Y)),
    "tuple_inputs": (two_inputs(False), ((A, B), Y), ((A, B), Y)),
    "list_inputs": (two_inputs(False), ([A, B], Y), ([A, B], Y)),
    "tuple_targets": (two_outputs, (X, (PRIORITY, Y)), (X, (PRIORITY, Y))),
    "list_targets": (two_outputs, (X, [PRIORITY, Y]), (X, [PRIORITY, Y])),
    "dict_targets": (two_outputs, (X, {"priority": PRIORITY, "department": Y}),
                     (X, {"priority": PRIORITY, "department": Y})),
    "optional_none": (with_optional, ({"x": X, "o": None}, Y), ({"x": X, "o": None}, Y)),
    "weighted_metrics": (weighted_metrics, (X, Y, SAMPLE_WEIGHT), (X, Y, SAMPLE_WEIGHT)),
}
STRUCTURE_CELLS = [
    ("dict_inputs", "one"), ("dict_inputs", "fit2"), ("dict_inputs", "custom2"),
    ("tuple_inputs", "fit2"), ("tuple_targets", "one"),
    ("list_inputs", "one"), ("list_inputs", "fit2"), ("list_inputs", "custom2"),
    ("tuple_targets", "custom2"), ("list_targets", "one"), ("list_targets", "fit2"),
    ("dict_targets", "one"), ("dict_targets", "fit2"), ("dict_targets", "custom2"),
    ("optional_none", "one"), ("weighted_metrics", "fit2"), ("weighted_metrics", "custom2"),
]


@pytest.mark.parametrize("form, place", STRUCTURE_CELLS)
def test_structures(form, place, tmp_path):
    """Several inputs and targets in every structure Keras's `fit` takes, lists as tuples,
    dict targets matched to the outputs by name; an optional input left out (None)."""
    build, data, plain = STRUCTURES[form]
    x, y, *w = plain
    want = reference(("structure", form), build, x, y,
                     **({"sample_weight": w[0]} if w else {}))
    extra = [f"batch.global_size={BATCH}", "batch.per_replica=null"]
    assert_close(trained(build, data, [*PLACES[place], *extra], tmp_path), want)


# -- PyDataset, a generator, Keras's dataset utilities -------------------------------------

class Batches(keras.utils.PyDataset):
    """`(x, y[, w])` batches of the shared arrays, in order; counts its epochs."""

    def __init__(self, parts, endless=False):
        super().__init__()
        self.parts, self.endless, self.epochs = parts, endless, 0

    @property
    def num_batches(self):
        return None if self.endless else N // BATCH

    def __getitem__(self, index):
        index %= N // BATCH
        return tuple(p[index * BATCH:(index + 1) * BATCH] for p in self.parts)

    def on_epoch_end(self):
        self.epochs += 1


def batches_of(parts):
    """A Python generator of `(x, y[, w])` batches of the shared arrays, once."""
    for start in range(0, N, BATCH):
        yield tuple(p[start:start + BATCH] for p in parts)


def endless_batches_of(parts):
    """A Python generator of the batches, for ever."""
    while True:
        yield from batches_of(parts)


OBJECT_CELLS = [
    ("py_dataset", "int", "none", "one"), ("py_dataset", "int_n1", "sample", "fit2"),
    ("py_dataset", "one_hot", "class", "custom2"), ("py_dataset_endless", "int", "none", "fit2"),
    ("generator", "int", "none", "custom2"), ("generator", "regression", "sample", "one"),
    ("generator", "float_index", "class", "fit2"),
    ("generator_endless", "int", "none", "one"), ("generator_endless", "int", "none", "fit2"),
    ("generator_endless", "int", "none", "custom2"),
]


@pytest.mark.parametrize("form, target, weight, place", OBJECT_CELLS)
def test_py_dataset_and_generators(form, target, weight, place, tmp_path):
    """A `keras.utils.PyDataset` (finite, or endless with `steps_per_epoch`) and a Python
    generator (read once; endless with `steps_per_epoch`), their own batch the global one."""
    y, build = TARGETS[target], one_layer(target)
    parts = (X, y, SAMPLE_WEIGHT) if weight == "sample" else (X, y)
    data = {"py_dataset": lambda: Batches(parts), "generator": lambda: batches_of(parts),
            "py_dataset_endless": lambda: Batches(parts, endless=True),
            "generator_endless": lambda: endless_batches_of(parts)}[form]
    extra = [f"steps_per_epoch={N // BATCH}"] if form.endswith("endless") else []
    kwargs = {"sample_weight": SAMPLE_WEIGHT} if weight == "sample" else {}
    if weight == "class":
        extra.append("class_weight={0: 1.0, 1: 2.0, 2: 0.5}")
        kwargs["class_weight"] = CLASS_WEIGHT
    want = reference(("arrays", target, weight), build, X, y, **kwargs)
    assert_close(trained(build, data, [*PLACES[place], *extra], tmp_path), want)


class Noisy(Batches):
    """The batches with noise drawn anew on every read (random augmentation)."""

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x + np.random.default_rng().normal(size=x.shape).astype("float32"), y


def frozen_regression():
    """The regression layer at rate 0: only the data changes the loss from epoch to epoch."""
    model = one_layer("regression")()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model


def test_a_py_dataset_is_read_anew_every_epoch(tmp_path):
    """Each epoch reads the PyDataset's batches again, so what `__getitem__` draws is drawn
    anew (each epoch's loss differs at rate 0), and `on_epoch_end` runs after each pass."""
    given = Noisy((X, TARGETS["regression"]))
    result = trainer.fit([*QUIET, "devices=1", "epochs=3"], model=frozen_regression,
                         data=given, run_dir=tmp_path / "run")
    loss = result.history["loss"]
    assert len({round(v, 6) for v in loss}) == 3, loss
    assert given.epochs >= 3


def test_a_given_dataset_is_read_anew_every_epoch_unless_cache_is_set(tmp_path):
    """Random augmentation inside a given `tf.data` dataset is drawn anew every epoch (not
    cached by the default `dataset.cache`), as under Keras's `fit`; `dataset.cache=memory`
    given in the call caches it."""
    def noisy():
        ds = tf.data.Dataset.from_tensor_slices((X, TARGETS["regression"]))
        return ds.map(lambda x, y: (x + tf.random.normal(tf.shape(x)), y)).batch(BATCH)

    losses = {}
    for cache in ([], ["dataset.cache=memory"]):
        result = trainer.fit([*QUIET, "devices=1", "epochs=2", *cache], model=frozen_regression,
                             data=noisy, run_dir=tmp_path / f"run{len(cache)}")
        losses[bool(cache)] = result.history["loss"]
    assert abs(losses[False][0] - losses[False][1]) > 1e-3
    assert losses[True][0] == pytest.approx(losses[True][1], rel=1e-6)


# -- refusals: one line naming the form and what to give instead ---------------------------

REFUSED = {
    "optional_none_on_two_replicas": (
        with_optional, ({"x": X, "o": None}, Y), ["devices=2"],
        "the dataset gives input o as None (an optional input left out): a batch split "
        "over 2 replicas"),
    "inputs_alone_as_a_list": (
        two_inputs(True), [A, B], ["devices=1"],
        "a list of 2 is read as (x, y), as Keras reads it; for 2 inputs alone give a tuple "
        "holding their tuple ((a, b),) or a dict by input name"),
    "negative_sample_weights": (
        one_layer("int"), (X, Y, -SAMPLE_WEIGHT), ["devices=1"],
        "dataset trainer.fit(data=...): its train sample weights hold -"),
    "negative_sample_weights_in_a_dataset": (
        one_layer("int"),
        lambda: tf.data.Dataset.from_tensor_slices((X, Y, SAMPLE_WEIGHT - 1.0)).batch(BATCH),
        ["devices=1"], "its train sample weights hold -"),
    "split_named_valid": (
        one_layer("int"), {"train": (X, Y), "valid": (X, Y)}, ["devices=1"],
        "a dict of splits takes the keys train, validation, test; received 'valid'"),
    "split_named_Train": (
        one_layer("int"), {"Train": (X, Y)}, ["devices=1"],
        "a dict of splits takes the keys train, validation, test; received 'Train'"),
    "class_weight_with_two_targets": (
        two_outputs, (X, (PRIORITY, Y)), ["devices=1", "class_weight={0: 1.0}"],
        "class_weight weighs the classes of one class target; this dataset has a target "
        "per output"),
    "float_targets_that_are_not_classes": (
        one_layer("int"), (X, TARGETS["regression"][:, 0]), ["devices=1"],
        "loss sparse_categorical_crossentropy takes class indices, but output"),
    "endless_py_dataset_without_steps": (
        one_layer("int"), lambda: Batches((X, Y), endless=True), ["devices=1"],
        "steps_per_epoch"),
}


@pytest.mark.parametrize("form", REFUSED)
def test_refusals(form, tmp_path):
    build, data, overrides, message = REFUSED[form]
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit([*QUIET, *overrides], model=build, data=data, run_dir=tmp_path / "run")
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


# -- what Keras's dataset utilities return (batched tf.data datasets) ----------------------

WORDS = ["red", "green", "blue", "cat", "dog"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A folder of 8x8 images and one of short texts, 2 classes of 8 each."""
    root, rng = tmp_path_factory.mktemp("folders"), np.random.default_rng(3)
    for name in ("a", "b"):
        (root / "img" / name).mkdir(parents=True)
        (root / "txt" / name).mkdir(parents=True)
        for i in range(8):
            keras.utils.save_img(root / "img" / name / f"{i}.png",
                                 rng.integers(0, 255, (8, 8, 3)).astype("uint8"))
            words = rng.choice(WORDS, 3)
            (root / "txt" / name / f"{i}.txt").write_text(" ".join(words))
    return root


def utility_cell(kind: str, root):
    """(builder, a function returning the utility's dataset) for one of Keras's utilities."""
    if kind == "image":
        def data():
            return keras.utils.image_dataset_from_directory(
                root / "img", image_size=(8, 8), batch_size=4, shuffle=False)
        layers = [keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255),
                  keras.layers.Flatten()]
        units, loss = 2, "sparse_categorical_crossentropy"
    elif kind == "text":
        def data():
            return keras.utils.text_dataset_from_directory(root / "txt", batch_size=4,
                                                           shuffle=False)
        layers = [keras.Input((), dtype="string"), keras.layers.TextVectorization(
            vocabulary=WORDS, output_mode="multi_hot")]
        units, loss = 2, "sparse_categorical_crossentropy"
    else:
        series = np.sin(np.arange(80, dtype="float32") / 5)[:, None]

        def data():
            return keras.utils.timeseries_dataset_from_array(
                series[:-5], series[5:, 0], sequence_length=5, batch_size=8)
        layers = [keras.Input((5, 1)), keras.layers.Flatten()]
        units, loss = 1, "mse"

    def build():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([*layers, keras.layers.Dense(
            units, activation="softmax" if units > 1 else None)])
        model.compile(optimizer=keras.optimizers.SGD(LR), loss=loss)
        return model

    return build, data


UTILITY_CELLS = [("image", "one"), ("image", "fit2"), ("image", "custom2"), ("text", "one"),
                 ("text", "fit2"), ("text", "custom2"), ("timeseries", "custom2"),
                 ("timeseries", "fit2")]


@pytest.mark.parametrize("kind, place", UTILITY_CELLS)
def test_keras_dataset_utilities(kind, place, folders, tmp_path):
    """`image_dataset_from_directory`, `text_dataset_from_directory` and
    `timeseries_dataset_from_array` as they return: batched, their batch the global one."""
    build, data = utility_cell(kind, folders)
    model = build()
    with tf.device("/cpu:0"):
        model.fit(data(), epochs=1, verbose=0, shuffle=False)
    assert_close(trained(build, data, PLACES[place], tmp_path), model.get_weights())


# -- a slice on 2 workers ------------------------------------------------------------------

@pytest.mark.multiworker
@pytest.mark.parametrize("form", ["int_dataset", "int_stream", "x_alone", "dict_targets"])
def test_two_workers_end_with_plain_keras_weights(form, tmp_path, launches):  # noqa: F811
    """An integer-label dataset, a stream, inputs alone and dict targets (by dotted name) on
    2 worker processes (`strategy=multi_worker`, the custom loop, 8 examples each per step)
    end with plain Keras's weights on one device at the global batch."""
    from tests import data_contract_task as task

    builder, loader, extra, (x, y) = task.SLICE[form]
    run_dir = tmp_path / "run"
    launch = launches(2, f"model._target_=tests.data_contract_task.{builder}",
                      f"dataset._target_=tests.data_contract_task.{loader}",
                      "strategy=multi_worker", "loop=custom", "devices=1", *QUIET, *extra,
                      f"batch.global_size={BATCH}", "batch.per_replica=null",
                      f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=400) == 0, launch.output[-3000:]
    want = reference(("workers", form), getattr(task, builder), x, y)
    got = keras.models.load_model(run_dir / "checkpoints" / "last.keras").get_weights()
    assert_close(got, want)
