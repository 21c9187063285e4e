"""Models and data for the 2-worker slice of `tests/test_data_contract.py`, by dotted name
(the workers are other processes): an integer-label dataset, a stream, inputs alone, dict
targets matched by output name."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

N, FEATURES, CLASSES, BATCH, LR = 64, 5, 3, 16, 0.1
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, FEATURES)).astype("float32")
LABELS = _rng.integers(0, CLASSES, N).astype("int64")
PRIORITY = (X @ np.arange(1, FEATURES + 1, dtype="float32") / 5)[:, None]


@keras.saving.register_keras_serializable(package="data_contract_task")
class SquaredOutput(keras.layers.Layer):
    """Its output's mean square as the model's loss (`add_loss`): trains on inputs alone."""

    def call(self, y):
        self.add_loss(keras.ops.mean(keras.ops.square(y)))
        return y


def _compiled(inputs, outputs, loss):
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=loss)
    return model


def build_classes(**_):
    """One seeded softmax layer, sparse categorical cross-entropy."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((FEATURES,))
    return _compiled(inputs, keras.layers.Dense(CLASSES, activation="softmax")(inputs),
                     "sparse_categorical_crossentropy")


def build_squared(**_):
    """One seeded linear layer whose loss is its own (`add_loss`), compiled without one."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((FEATURES,))
    return _compiled(inputs, SquaredOutput()(keras.layers.Dense(1)(inputs)), None)


def build_two_outputs(**_):
    """Outputs `priority` then `department`, a loss per output name."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((FEATURES,))
    priority = keras.layers.Dense(1, name="priority")(inputs)
    department = keras.layers.Dense(CLASSES, activation="softmax", name="department")(inputs)
    return _compiled(inputs, [priority, department],
                     {"priority": "mse", "department": "sparse_categorical_crossentropy"})


def int_batches(**_):
    """A batched dataset with integer class labels."""
    return tf.data.Dataset.from_tensor_slices((X, LABELS)).batch(BATCH)


def int_stream(**_):
    """The same, repeated for ever (trained with steps_per_epoch)."""
    return int_batches().repeat()


def x_alone(**_):
    """Inputs alone."""
    return X


def dict_targets(**_):
    """Targets by output name, in the other order than the outputs'."""
    return X, {"department": LABELS, "priority": PRIORITY}


# form: (builder, loader, extra overrides, plain Keras's fit arguments)
SLICE = {
    "int_dataset": ("build_classes", "int_batches", [], (X, LABELS)),
    "int_stream": ("build_classes", "int_stream", [f"steps_per_epoch={N // BATCH}"],
                   (X, LABELS)),
    "x_alone": ("build_squared", "x_alone", [], (X, None)),
    "dict_targets": ("build_two_outputs", "dict_targets", [],
                     (X, {"priority": PRIORITY, "department": LABELS})),
}
