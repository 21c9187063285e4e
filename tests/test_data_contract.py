"""The spec of `trainer.fit(data=...)`: every form Keras's `fit` takes, each trained by
trainer and by plain Keras's `model.fit` on one device at the same global batch.

A cell is a form of the data (arrays, structures of inputs and targets, tf.data datasets,
`keras.utils.PyDataset`, a generator, what Keras's dataset utilities return), a kind of
target (integer scalar, integer `(n, 1)`, float class indices, one-hot, regression, none),
a kind of weight (none, sample, class) and a placement (1 device; 2 replicas with
`loop=fit`; 2 replicas with `loop=custom`). Each ends within `TOLERANCE` of plain Keras's
weights, or is refused in one line naming the form and what to give instead. The axes are
paired, not crossed: every form, target, weight and placement appears, with each form on
every placement.

Tiny models (one Dense layer, seeded, no dropout or batch norm), 64 examples, 1 epoch, a
global batch of 16, no shuffling; the reference runs once per model and data.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import trainer

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
    ("none", "none", "custom2"), ("none", "none", "one"),
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
