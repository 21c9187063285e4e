"""The Keras contract's scenarios: every test of Keras's `keras/src/models/model_test.py`
and `keras/src/trainers/trainer_test.py` that trains, brought to trainer as a user would,
and the others, each with why it does not apply to training under tf.distribute.

A scenario is a model builder (compiled as its Keras test compiles it, SGD at a fixed rate,
or left uncompiled with its loss, metrics and weights as config overrides: the YAML path),
arrays of the shapes the test uses and, where the test has them, sample or class weights,
a callback (by `_target_` in the config) or a source of unknown length. Keras's test-only
models (`Trainer` mixed into a layer: `ExampleModel`, `StructModel`, `ListInputModel`, ...)
are written as a user writes them: `keras.Model` subclasses holding the same layers.

Imported by `scripts/keras_contract.py` and, through the config's `_target_`s
(`keras_scenarios.NAME`), by trainer's run.
"""

from __future__ import annotations

import ast
import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLES, VALIDATION, LR = 251, 29, 0.1
# Where each listed test lives, relative to the installed `keras/src`.
FILES = {"model_test": "models/model_test.py", "trainer_test": "trainers/trainer_test.py"}


@dataclass(frozen=True)
class Scenario:
    """One scenario: what trains, on what, and from which of Keras's tests.

    Attributes:
        build: the model builder (`build(**_)`), compiled or not.
        data: `data(rng, rows) -> (x, y)`, the arrays.
        tests: the Keras tests it brings (`model_test.test_...`).
        compile: for an uncompiled builder, what plain Keras compiles it with (besides SGD);
            trainer gets the same from `overrides`.
        overrides: the config's overrides (the YAML path: loss, metrics, weights, ...).
        sample_weight: the training examples carry weights.
        class_weight: Keras's `class_weight` (also given to trainer by `overrides`).
        callbacks: callback classes plain Keras's fit gets (trainer's by `overrides`).
        classes: the targets are class indices (the Source's `num_classes=2`).
        source: builds the Source itself (a tf.data source of unknown length).
        epochs: how many epochs both sides train: one crosses the uneven last batch and
            validates; two where what the scenario tests happens in the second.
    """

    build: Callable[..., Any]
    data: Callable[[Any, int], tuple[Any, Any]]
    tests: tuple[str, ...] = ()
    compile: dict[str, Any] | None = None
    overrides: tuple[str, ...] = ()
    sample_weight: bool = False
    class_weight: dict[int, float] | None = None
    callbacks: tuple[Callable[[], Any], ...] = ()
    classes: bool = False
    source: Callable[..., Any] | None = None
    notes: str = field(default="")
    epochs: int = 1


def _keras():
    import keras

    return keras


def _dense(units: int, name: str | None = None, activation: str | None = None, seed: int = 1,
           **kwargs: Any):
    keras = _keras()
    return keras.layers.Dense(units, name=name, activation=activation,
                              kernel_initializer=keras.initializers.GlorotUniform(seed=seed),
                              **kwargs)


def _ones(units: int):
    """The Dense layer Keras's test models use: no bias, weights of ones."""
    return _keras().layers.Dense(units, use_bias=False, kernel_initializer="ones")


def _sgd():
    return _keras().optimizers.SGD(LR)


# -- data ---------------------------------------------------------------------------------

def _base(rng, rows):
    x = rng.normal(size=(rows, 3)).astype("float32")
    label = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    score = (x[:, 2] + 0.1 * rng.normal(size=rows)).astype("float32")[:, None]
    return x, label, score, label[:, None].astype("float32")


def classes(rng, rows):
    x, label, _, _ = _base(rng, rows)
    return x, label


def score_binary(rng, rows):
    x, _, score, binary = _base(rng, rows)
    return x, (score, binary)


def score_binary_dict(rng, rows):
    x, _, score, binary = _base(rng, rows)
    return x, {"output_a": score, "output_b": binary}


def unit_score_binary(rng, rows):
    """Keras's own data for one output tensor under two names: inputs, a score and random
    labels all in [0, 1), so the one linear output stays well inside (0, 1), where the
    binary cross-entropy's gradient (1/p) is bounded. On `score_binary`'s scores and labels
    the output crosses 0 and 1, and one example near p = 0.002 multiplies the gradient's
    rounding by 500 in one step: plain Keras on one device, only each batch's examples
    reversed, ends 3e-3 from itself (`tests/test_keras_contract.py`)."""
    x = _unit(rng, rows, 3)
    return x, (_unit(rng, rows), rng.integers(0, 2, size=(rows, 1)).astype("float32"))


def score_only(rng, rows):
    x, _, score, _ = _base(rng, rows)
    return x, score


def binary_pair(rng, rows):
    x, _, _, binary = _base(rng, rows)
    return x, (binary, binary)


def _unit(rng, rows, width=1):
    return rng.uniform(size=(rows, width)).astype("float32")


def unit_pair(rng, rows):
    x, _, _, _ = _base(rng, rows)
    return x, (_unit(rng, rows), _unit(rng, rows))


def unit_dict(rng, rows):
    x, _, _, _ = _base(rng, rows)
    return x, {"a": _unit(rng, rows), "b": _unit(rng, rows)}


def unit_named(rng, rows):
    x, _, _, _ = _base(rng, rows)
    return x, Y(_unit(rng, rows), _unit(rng, rows))


def unit_deep(rng, rows):
    x, _, _, _ = _base(rng, rows)
    y1, y2, y3 = _unit(rng, rows), _unit(rng, rows), _unit(rng, rows)
    return x, {"a": (y1, y2), "b": {"b1": y1, "b2": y2}, "c": {"c1": (y1, y2), "c2": y2},
               "d": y3}


def four_to_three(rng, rows):
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (0.3 * x[:, :3] + 0.1 * rng.normal(size=(rows, 3))).astype("float32")


def four_to_one(rng, rows):
    x, y = four_to_three(rng, rows)
    return x, y[:, :1]


def four_to_pair(rng, rows):
    x, y = four_to_three(rng, rows)
    return x, (y, y[:, ::-1].copy())


def four_to_struct(rng, rows):
    x, y = four_to_three(rng, rows)
    return {"x_one": x, "x_two": x[:, ::-1].copy()}, {"y_one": y, "y_two": -y}


def optional_none(rng, rows):
    x = rng.normal(size=(rows, 2)).astype("float32")
    return {"x": x, "o": None}, (0.5 * x).astype("float32")


def optional_tensor(rng, rows):
    x, y = optional_none(rng, rows)
    return {"x": x["x"], "o": rng.normal(size=(rows, 2)).astype("float32")}, y


def two_inputs(rng, rows):
    x, y = four_to_three(rng, rows)
    return (x[:, :2].copy(), x[:, 1:].copy()), y[:, :2]


def tuple_inputs(rng, rows):
    x, _, _, _ = _base(rng, rows)
    return (x, x[:, 1:].copy()), np.concatenate(
        [x, x[:, :1], 0.5 * x[:, 1:]], axis=1).astype("float32")


def one_column(rng, rows):
    return rng.normal(size=(rows, 1)).astype("float32"), np.zeros((rows, 1), "float32")


def two_columns(rng, rows):
    x, y = four_to_three(rng, rows)
    return x[:, :2].copy(), y[:, :1] + 1.0


def three_to_three(rng, rows):
    x, y = four_to_three(rng, rows)
    return x[:, :3].copy(), y


def three_to_two(rng, rows):
    x, y = three_to_three(rng, rows)
    return x, y[:, :2] + 0.5


def four_to_two(rng, rows):
    x, y = four_to_three(rng, rows)
    return x, y[:, :2] + 2.0


# -- models ---------------------------------------------------------------------------------

Y = collections.namedtuple("Y", ["y1", "y2"])
_classes: dict[str, Any] = {}


def _once(name: str, make: Callable[[], Any]) -> Any:
    """A class made on first use (it needs Keras imported), the same one after."""
    if name not in _classes:
        _classes[name] = make()
    return _classes[name]


def sequential(**_):
    """A single output of classes (`test_functional_single_output`'s shape, as classes)."""
    keras = _keras()
    model = keras.Sequential([keras.Input((3,)), _dense(8, activation="relu"),
                              _dense(2, activation="softmax", seed=2)])
    model.compile(_sgd(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def single_output(kind: str = "tensor", loss: str = "plain", weighted: bool = True, **_):
    """`test_functional_single_output`: one output as a tensor, a list or a dict; the loss as
    it is, a list, a dict or a dict of a list."""
    keras = _keras()
    x = keras.Input((3,), name="input_a")
    out = _dense(1, "output_a")(x)
    model = keras.Model(x, {"tensor": out, "list": [out], "dict": {"output_a": out}}[kind])
    if loss == "none":
        return model
    named = "mean_squared_error"
    named = {"plain": named, "list": [named], "dict": {"output_a": named},
             "dict_list": {"output_a": [named]}}[loss]
    model.compile(_sgd(), loss=named,
                  metrics={"output_a": ["mean_squared_error", "mean_absolute_error"]},
                  weighted_metrics={"output_a": "mean_squared_error"} if weighted else None)
    return model


def _list_model(names: bool = True):
    keras = _keras()
    x = keras.Input((3,), name="input_a")
    return keras.Model(x, [_dense(1, "output_a" if names else None)(x),
                           _dense(1, "output_b" if names else None, "sigmoid", seed=2)(x)])


def _dict_model():
    keras = _keras()
    x = keras.Input((3,), name="input_a")
    return keras.Model(x, {"output_a": _dense(1, "output_a")(x),
                           "output_b": _dense(1, "output_b", "sigmoid", seed=2)(x)})


def list_outputs(**_):
    """`test_functional_list_outputs_list_losses`."""
    model = _list_model()
    model.compile(_sgd(), loss=["mean_squared_error", "binary_crossentropy"],
                  metrics=["mean_squared_error", ["mean_squared_error", "accuracy"]],
                  loss_weights=[0.1, 2])
    return model


def list_outputs_plain(**_):
    """The list-output model uncompiled: its loss and metrics come from the config."""
    return _list_model()


def list_nested_losses(**_):
    """`test_functional_list_outputs_nested_list_losses`."""
    model = _list_model()
    model.compile(_sgd(), loss=["mean_squared_error", ["binary_crossentropy"]],
                  metrics=["mean_squared_error", ["mean_squared_error", "accuracy"]],
                  loss_weights=[0.1, 2])
    return model


def list_two_losses_one_output(**_):
    """`test_functional_list_outputs_invalid_nested_list_losses` (it trains: two losses
    on output_b, summed)."""
    model = _list_model()
    model.compile(_sgd(), loss=["mean_squared_error",
                                ["mean_squared_error", "binary_crossentropy"]])
    return model


_BOTH = {"output_a": ["mean_squared_error"], "output_b": ["mean_squared_error", "accuracy"]}


def dict_outputs(**_):
    """`test_functional_dict_outputs_dict_losses`."""
    model = _dict_model()
    model.compile(_sgd(), loss={"output_a": "mean_squared_error",
                                "output_b": ["binary_crossentropy"]},
                  metrics=_BOTH, weighted_metrics=_BOTH)
    return model


def partial_loss(**_):
    """`test_functional_dict_outputs_dict_losses_with_undefined_loss`."""
    model = _dict_model()
    model.compile(_sgd(), loss={"output_b": ["binary_crossentropy"]},
                  metrics={"output_b": ["mean_squared_error", "accuracy"]},
                  weighted_metrics={"output_b": ["mean_squared_error", "accuracy"]})
    return model


_DICT_LOSS = {"output_a": "mean_squared_error", "output_b": "binary_crossentropy"}


def list_dict_losses(**_):
    """`test_functional_list_outputs_dict_losses_metrics`."""
    model = _list_model()
    model.compile(_sgd(), loss=dict(_DICT_LOSS), metrics=_BOTH, weighted_metrics=_BOTH)
    return model


def list_uniq_weighted(**_):
    """`test_functional_list_outputs_dict_losses_metrics_uniq_weighted`."""
    model = _list_model()
    model.compile(_sgd(), loss=dict(_DICT_LOSS),
                  metrics={"output_a": ["mean_squared_error"],
                           "output_b": ["mean_squared_error"]},
                  weighted_metrics={"output_a": ["mean_squared_error"],
                                    "output_b": ["accuracy"]})
    return model


def dict_single_tensor(**_):
    """`test_functional_dict_outputs_with_single_tensor`: two names, one tensor."""
    keras = _keras()
    x = keras.Input((3,), name="input_a")
    out = _dense(1, "output_a")(x)
    model = keras.Model(x, {"output_a": out, "output_b": out})
    model.compile(_sgd(), loss=dict(_DICT_LOSS))
    return model


def own_compute_loss(**_):
    """`test_functional_list_outputs_with_custom_compute_loss`."""
    keras = _keras()

    def make():
        class OwnLoss(keras.Model):
            def compute_loss(self, x, y, y_pred, sample_weight=None, **kwargs):
                return super().compute_loss(x=x, y=y, y_pred=[y_pred, y_pred],
                                            sample_weight=sample_weight, **kwargs)
        return OwnLoss

    x = keras.Input((3,), name="inputs")
    model = _once("OwnLoss", make)(x, _dense(1, "a", "sigmoid")(x))
    model.compile(_sgd(), loss=["mean_squared_error", "binary_crossentropy"])
    return model


def struct_loss(y_true, y_pred):
    """`model_test.get_struct_loss`'s loss: the mean absolute errors of a structure, summed."""
    keras = _keras()
    total = 0
    for t, p in zip(keras.tree.flatten(y_true), keras.tree.flatten(y_pred), strict=True):
        total += keras.losses.mean_absolute_error(t, p)
    return total


def _struct_outputs(x):
    return (_dense(1, "y1", "sigmoid")(x), _dense(1, "y2", "sigmoid", seed=2)(x))


def struct_outputs(outer: str = "tuple", weighted: bool = False, **_):
    """`test_functional_struct_outputs_struct_losses`: outputs a tuple (or list), the loss
    the other type: one loss of the whole structure, then one per output."""
    keras = _keras()
    x = keras.Input((3,), name="x")
    kind, other = (tuple, list) if outer == "tuple" else (list, tuple)
    model = keras.Model(x, kind(_struct_outputs(x)))
    loss = other([struct_loss, kind([struct_loss, struct_loss])])
    weights = other([0.3, kind([0.6, 0.9])]) if weighted else None
    model.compile(_sgd(), loss=loss, loss_weights=weights)
    return model


def struct_dict(weighted: bool = False, **_):
    """`test_functional_struct_outputs_dict_struct_losses`."""
    keras = _keras()
    x = keras.Input((3,), name="x")
    y1, y2 = _struct_outputs(x)
    model = keras.Model(x, {"a": y1, "b": y2})
    loss = [struct_loss, {"a": struct_loss, "b": struct_loss}]
    model.compile(_sgd(), loss=loss,
                  loss_weights=[0.3, {"a": 0.6, "b": 0.9}] if weighted else None)
    return model


def struct_namedtuple(**_):
    """`test_functional_struct_outputs_namedtuple_struct_losses`."""
    keras = _keras()
    x = keras.Input((3,), name="x")
    model = keras.Model(x, Y(*_struct_outputs(x)))
    model.compile(_sgd(), loss=[struct_loss, Y(struct_loss, struct_loss)])
    return model


def struct_deep(**_):
    """`test_functional_deeply_nested_outputs_struct_losses`."""
    keras = _keras()
    x = keras.Input((3,), name="x")
    y1, y2 = _struct_outputs(x)
    y3 = _dense(1, "y3", "sigmoid", seed=3)(x)
    model = keras.Model(x, {"a": (y1, y2), "b": {"b1": y1, "b2": y2},
                            "c": {"c1": (y1, y2), "c2": y2}, "d": y3})
    model.compile(_sgd(), loss={"a": [struct_loss, (None, struct_loss)],
                                "b": [struct_loss, {"b1": struct_loss}],
                                "c": [struct_loss, {"c1": struct_loss}], "d": struct_loss})
    return model


def optional_inputs(**_):
    """`test_functional_optional_inputs`: an input that may be None (Adam, as the test)."""
    keras = _keras()

    def make():
        class OptionalInputLayer(keras.layers.Layer):
            def __init__(self):
                super().__init__()
                self.dense = _dense(2)

            def call(self, x, o=None):
                return self.dense(x if o is None else x + o)
        return OptionalInputLayer

    x = keras.Input((2,), name="x")
    o = keras.Input((2,), name="o", optional=True)
    model = keras.Model({"x": x, "o": o}, _once("OptionalInputLayer", make)()(x, o))
    model.compile(keras.optimizers.Adam(0.01), loss="mse")
    return model


def subclassed_tuple_inputs(**_):
    """`test_tuple_input_model_subclass`: a subclassed model unpacking a tuple of inputs."""
    keras = _keras()

    def make():
        class MultiInputModel(keras.Model):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.dense1 = _dense(4)

            def call(self, inputs):
                a, b = inputs
                return keras.layers.concatenate([self.dense1(a), b])
        return MultiInputModel

    model = _once("MultiInputModel", make)()
    model.compile(_sgd(), loss="mse")
    return model


def _example_class():
    """`trainer_test.ExampleModel` as a user writes it: a model of one bias-free Dense."""
    keras = _keras()

    def make():
        class ExampleModel(keras.Model):
            def __init__(self, units=3, **kwargs):
                super().__init__(**kwargs)
                self.dense = _ones(units)

            def call(self, x):
                return self.dense(x)
        return ExampleModel

    return _once("ExampleModel", make)


def example(units: int = 3, loss: bool = True, **_):
    """`test_fit_flow` (and the tests on `ExampleModel`): SGD, mse, the mse metric."""
    keras = _keras()
    model = _example_class()(units)
    if loss:
        model.compile(_sgd(), loss=keras.losses.MeanSquaredError(),
                      metrics=[keras.metrics.MeanSquaredError()])
    return model


def metric_tracking(weighted: bool = False, **_):
    """`test_metric_tracking`: a model holding a metric of its own (never updated), and a
    compiled metric, weighted where the examples carry weights."""
    keras = _keras()

    def make():
        class ModelWithMetric(_example_class()):
            def __init__(self, units=3, **kwargs):
                super().__init__(units, **kwargs)
                self.my_metric = keras.metrics.MeanSquaredError(name="my_metric")
        return ModelWithMetric

    model = _once("ModelWithMetric", make)(3)
    metrics = [keras.metrics.MeanSquaredError()]
    model.compile(_sgd(), loss=keras.losses.MeanSquaredError(),
                  **({"weighted_metrics": metrics} if weighted else {"metrics": metrics}))
    return model


def own_train_step(**_):
    """`test_fit_with_custom_train_step`: `CustomTrainTestStepModel`, its own train_step and
    test_step each logging an extra number."""
    keras = _keras()

    def make():
        class CustomTrainTestStepModel(_example_class()):
            def train_step(self, data):
                logs = super().train_step(data)
                logs["my_custom_metric"] = 10.0
                return logs

            def test_step(self, data):
                logs = super().test_step(data)
                logs["my_custom_metric"] = 5.0
                return logs
        return CustomTrainTestStepModel

    model = _once("CustomTrainTestStepModel", make)(3)
    model.compile(_sgd(), loss=keras.losses.MeanSquaredError(),
                  metrics=[keras.metrics.MeanSquaredError()])
    return model


def classifier(**_):
    """A classifier left uncompiled (its loss, optimizer and class weights from the config:
    `test_fit_with_data_adapter`'s `_cw` cases train with Adagrad and class weights)."""
    keras = _keras()
    return keras.Sequential([keras.Input((3,)), _dense(8, activation="relu"),
                             _dense(2, activation="softmax", seed=2)])


def frozen(**_):
    """`test_fit_with_different_batch_size_same_loss`: a model not trainable, compiled with a
    loss alone (Keras's default optimizer)."""
    model = _example_class()(1)
    model.trainable = False
    model.compile(loss="mse")
    return model


def loss_scaling(**_):
    """`test_adds_loss_scaling_optimizer`: a mixed_float16 model (Keras wraps RMSprop in a
    LossScaleOptimizer)."""
    keras = _keras()
    model = keras.Sequential([keras.Input((3,)),
                              _dense(4, activation="relu", dtype="mixed_float16"),
                              _dense(3, seed=2, dtype="mixed_float16")])
    model.compile(optimizer=keras.optimizers.RMSprop(0.01), loss="mse")
    return model


def training_arg(**_):
    """`test_training_arg`: a model with no weights whose output depends on `training`."""
    keras = _keras()

    def make():
        class TrainingTestingModel(keras.Model):
            def call(self, x, training=False):
                return x if training else x * 0
        return TrainingTestingModel

    model = _once("TrainingTestingModel", make)()
    model.compile(optimizer="rmsprop", loss="mse")
    return model


def _loss_layer(scale: float | None = None):
    keras = _keras()

    def make():
        class LossLayer(keras.layers.Layer):
            def __init__(self, scale=None, **kwargs):
                super().__init__(**kwargs)
                self.scale = scale

            def call(self, x):
                self.add_loss(keras.ops.sum(x) if self.scale is None
                              else self.scale * keras.ops.mean(keras.ops.square(x)))
                return x
        return LossLayer

    return _once("LossLayer", make)(scale)


def internal_only_loss(**_):
    """`test_internal_only_loss`: `add_loss` alone, compiled with no loss (Adam)."""
    keras = _keras()
    model = keras.Sequential([keras.Input((2,)), _dense(2), _loss_layer(), _dense(1, seed=2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def add_loss_plain(**_):
    """An activity penalty by `add_loss`, uncompiled: `loss: null` in the config."""
    keras = _keras()
    return keras.Sequential([keras.Input((2,)), _dense(2), _loss_layer(0.5),
                             _dense(1, seed=2)])


def add_loss(**_):
    """A layer's `add_loss` (an activity penalty) beside the compiled loss."""
    keras = _keras()
    x = keras.Input((3,))
    model = keras.Model(x, _dense(2, activation="softmax", seed=2)(
        _loss_layer(0.01)(_dense(8, activation="relu")(x))))
    model.compile(_sgd(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def subclassed(**_):
    """A subclassed model (its own `call`, built on the first batch)."""
    keras = _keras()

    def make():
        class Subclassed(keras.Model):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.hidden = _dense(8, activation="relu")
                self.head = _dense(2, activation="softmax", seed=2)

            def call(self, x):
                return self.head(self.hidden(x))
        return Subclassed

    model = _once("Subclassed", make)()
    model.compile(_sgd(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def list_inputs(**_):
    """`test_nested_inputs`: `ListInputModel`, a list of two inputs of different widths."""
    keras = _keras()

    def make():
        class ListInputModel(keras.Model):
            def __init__(self, units=2, **kwargs):
                super().__init__(**kwargs)
                self.dense_1 = _ones(units)
                self.dense_2 = _ones(units)

            def call(self, x):
                if not isinstance(x, (list, tuple)):
                    raise ValueError("x must be a list or tuple")
                return self.dense_1(x[0]) + self.dense_2(x[1])
        return ListInputModel

    model = _once("ListInputModel", make)()
    model.compile(optimizer=_sgd(), loss="mse", metrics=["mse"])
    return model


def constraints(**_):
    """`test_constraints_are_applied`: a non-negative kernel constraint (RMSprop)."""
    keras = _keras()
    model = keras.Sequential([keras.Input((3,)), _dense(2, kernel_constraint="non_neg")])
    model.compile(optimizer=keras.optimizers.RMSprop(0.01), loss="mse")
    return model


def counter_model(**_):
    """`test_callbacks_can_update_state_at_batch_boundary`: counters a callback updates
    between batches, compiled to run eagerly."""
    keras = _keras()

    def make():
        class CounterModel(keras.Model):
            def __init__(self):
                super().__init__()
                self.train_counter = self.add_weight(shape=(), initializer="zeros",
                                                     trainable=False)
                self.test_counter = self.add_weight(shape=(), initializer="zeros",
                                                    trainable=False)
                self.dense = _dense(3)

            def call(self, x):
                return self.dense(x)
        return CounterModel

    model = _once("CounterModel", make)()
    model.compile(optimizer=_sgd(), loss="mse", metrics=["mse"], run_eagerly=True)
    return model


def Counter():  # noqa: N802 - a callback class's name, for `_target_`
    """`CounterCallback`: counts batches into the model's counters."""
    keras = _keras()

    def make():
        class CounterCallback(keras.callbacks.Callback):
            def on_train_batch_end(self, *args, **kwargs):
                self.model.train_counter.assign_add(1)

            def on_test_batch_end(self, *args, **kwargs):
                self.model.test_counter.assign_add(1)
        return CounterCallback

    return _once("CounterCallback", make)()


def Stopper(stop_count: int = 5):  # noqa: N802 - a callback class's name, for `_target_`
    """`test_stop_loop`'s `Stopper`: stops fit after `stop_count` batches."""
    keras = _keras()

    def make():
        class StopperCallback(keras.callbacks.Callback):
            def __init__(self, stop_count):
                super().__init__()
                self.stop_count, self.counter = stop_count, 0

            def on_train_batch_end(self, *args, **kwargs):
                self.counter += 1
                if self.counter == self.stop_count:
                    self.model.stop_training = True
        return StopperCallback

    return _once("StopperCallback", make)(stop_count)


def compute_loss_metric(variant: str = "metric", **_):
    """`test_metric_update_in_compute_loss` (`metric`), `test_fwd_pass_loss_presence_in_
    compute_loss` (`forward`: the layers' losses) and `test_compute_loss_no_training_
    backwards_compatibility` (`no_training`: compute_loss without `training`)."""
    keras = _keras()

    def make():
        class MyModel(keras.Model):
            def __init__(self, variant="metric"):
                super().__init__()
                self.variant = variant
                self.custom_metric = keras.metrics.Mean(name="custom")
                self.dense = _dense(2, activity_regularizer="l2" if variant == "forward"
                                    else None)

            def call(self, x):
                return self.dense(x)

            def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                             training=True):
                loss = super().compute_loss(x, y, y_pred, sample_weight, training)
                self.custom_metric.update_state(
                    sum(self.losses) if self.variant == "forward" else loss * 4)
                return loss

        class OldModel(MyModel):
            def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
                loss = keras.Model.compute_loss(self, x, y, y_pred, sample_weight)
                self.custom_metric.update_state(loss * 4)
                return loss
        return {"metric": MyModel, "forward": MyModel, "no_training": OldModel}

    model = _once("ComputeLossModels", make)[variant](variant)
    model.compile(optimizer=_sgd(), loss="mse")
    return model


def struct_model(**_):
    """`test_loss_weights`'s `StructModel`: dict inputs and outputs, a weight per output."""
    keras = _keras()

    def make():
        class StructModel(keras.Model):
            def __init__(self, units=3, **kwargs):
                super().__init__(**kwargs)
                self.dense_1 = _ones(units)
                self.dense_2 = _ones(units)

            def call(self, x):
                return {"y_one": self.dense_1(x["x_one"]), "y_two": self.dense_2(x["x_two"])}
        return StructModel

    model = _once("StructModel", make)()
    model.compile(optimizer=_sgd(),
                  loss={"y_one": keras.losses.MeanSquaredError(),
                        "y_two": keras.losses.MeanSquaredError()},
                  metrics={"y_one": keras.metrics.MeanSquaredError(),
                           "y_two": keras.metrics.MeanSquaredError()},
                  loss_weights={"y_one": 0.1, "y_two": 0.2})
    return model


def list_output_model(**_):
    """`test_loss_weights`'s `ListOutputModel`: a list of two outputs, a weight each."""
    keras = _keras()

    def make():
        class ListOutputModel(keras.Model):
            def __init__(self, units=3, **kwargs):
                super().__init__(**kwargs)
                self.dense_1 = _ones(units)
                self.dense_2 = _ones(units)

            def call(self, x):
                return [self.dense_1(x), self.dense_2(x)]
        return ListOutputModel

    model = _once("ListOutputModel", make)()
    model.compile(optimizer=_sgd(),
                  loss=[keras.losses.MeanSquaredError(), keras.losses.MeanSquaredError()],
                  metrics=[keras.metrics.MeanSquaredError(), keras.metrics.MeanSquaredError()],
                  loss_weights=[0.1, 0.2])
    return model


def partial_label(**_):
    """`test_partial_loss_partial_label`: three outputs, a loss on the first alone, one
    label."""
    keras = _keras()
    inputs = keras.Input((2,))
    x = keras.layers.Dense(3, kernel_initializer="ones")(inputs)
    model = keras.Model(inputs, [x, x, x])
    model.compile(optimizer=_sgd(), loss=["mse", None, None])
    return model


def unknown_size_source(scenario: Scenario, seed: int):
    """A tf.data source whose length tf.data does not know (a generator), its size declared
    (`test_steps_per_execution_steps_count_unknown_dataset_size`)."""
    import tensorflow as tf

    from trainer.data import Source

    def split(rows, seed):
        x, y = scenario.data(np.random.default_rng(seed), rows)
        spec = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((1,), tf.float32))
        return tf.data.Dataset.from_generator(lambda: zip(x, y, strict=True), output_signature=spec)

    return Source(train=split(EXAMPLES, 0), validation=split(VALIDATION, 1),
                  train_size=EXAMPLES, validation_size=VALIDATION, input_shape=(4,))


def _bind(function: Callable, **kwargs: Any) -> Callable:
    def build(**_):
        return function(**kwargs)

    build.__doc__ = function.__doc__
    return build


MT, TT = "model_test.", "trainer_test."
_LIST_CFG = ("loss=[mse,bce]", "metrics=[[bce,mse,mae],[mse,acc]]", "loss_weights=[0.1,2]")
_MSE = ("loss=mean_squared_error", "metrics=[mean_squared_error]")
_SGD = ("optimizer=sgd", f"optimizer.lr={LR}")

SCENARIOS: dict[str, Scenario] = {
    # model_test.py
    "single_output": Scenario(single_output, score_only, (MT + "test_functional_single_output",)),
    "single_list_output_list_loss": Scenario(_bind(single_output, kind="list", loss="list"),
                                             score_only, (MT + "test_functional_single_output",)),
    "single_dict_output_dict_loss": Scenario(_bind(single_output, kind="dict", loss="dict"),
                                             score_only, (MT + "test_functional_single_output",)),
    "single_output_dict_list_loss_yaml": Scenario(
        _bind(single_output, loss="none"), score_only, (MT + "test_functional_single_output",),
        compile={"loss": {"output_a": ["mean_squared_error"]},
                 "metrics": {"output_a": ["mean_squared_error", "mean_absolute_error"]}},
        overrides=("loss={output_a:[mean_squared_error]}",
                   "metrics={output_a:[mean_squared_error,mean_absolute_error]}", *_SGD)),
    "list_outputs": Scenario(list_outputs, score_binary,
                             (MT + "test_functional_list_outputs_list_losses",)),
    "list_outputs_abbr_yaml": Scenario(
        list_outputs_plain, score_binary, (MT + "test_functional_list_outputs_list_losses_abbr",),
        compile={"loss": ["mse", "bce"], "metrics": [["bce", "mse", "mae"], ["mse", "acc"]],
                 "loss_weights": [0.1, 2]}, overrides=(*_LIST_CFG, *_SGD)),
    "list_nested_losses": Scenario(list_nested_losses, score_binary,
                                   (MT + "test_functional_list_outputs_nested_list_losses",)),
    "list_two_losses_one_output": Scenario(
        list_two_losses_one_output, score_binary,
        (MT + "test_functional_list_outputs_invalid_nested_list_losses",)),
    "dict_outputs": Scenario(dict_outputs, score_binary_dict,
                             (MT + "test_functional_dict_outputs_dict_losses",)),
    "partial_loss": Scenario(
        partial_loss, score_binary_dict,
        (MT + "test_functional_dict_outputs_dict_losses_with_undefined_loss",)),
    "partial_loss_yaml": Scenario(
        _bind(_dict_model), score_binary_dict,
        compile={"loss": {"output_a": None, "output_b": ["binary_crossentropy"]},
                 "metrics": {"output_b": ["mean_squared_error", "accuracy"]}},
        overrides=("loss={output_a:null,output_b:[binary_crossentropy]}",
                   "metrics={output_b:[mean_squared_error,accuracy]}", *_SGD)),
    "list_dict_losses": Scenario(list_dict_losses, score_binary,
                                 (MT + "test_functional_list_outputs_dict_losses_metrics",)),
    "list_uniq_weighted": Scenario(
        list_uniq_weighted, score_binary,
        (MT + "test_functional_list_outputs_dict_losses_metrics_uniq_weighted",)),
    "list_partial_metrics_yaml": Scenario(
        list_outputs_plain, score_binary,
        (MT + "test_functional_list_outputs_dict_losses_partial_metrics",),
        compile={"loss": dict(_DICT_LOSS),
                 "metrics": {"output_b": ["mean_squared_error", "accuracy"]}},
        overrides=("loss={output_a:mean_squared_error,output_b:binary_crossentropy}",
                   "metrics={output_b:[mean_squared_error,accuracy]}", *_SGD)),
    "dict_single_tensor": Scenario(dict_single_tensor, unit_score_binary,
                                   (MT + "test_functional_dict_outputs_with_single_tensor",)),
    "own_compute_loss": Scenario(own_compute_loss, binary_pair,
                                 (MT + "test_functional_list_outputs_with_custom_compute_loss",)),
    "struct_tuple_list_loss": Scenario(struct_outputs, unit_pair,
                                       (MT + "test_functional_struct_outputs_struct_losses",)),
    "struct_list_tuple_loss_weighted": Scenario(
        _bind(struct_outputs, outer="list", weighted=True), unit_pair,
        (MT + "test_functional_struct_outputs_struct_losses",)),
    "struct_dict": Scenario(struct_dict, unit_dict,
                            (MT + "test_functional_struct_outputs_dict_struct_losses",)),
    "struct_dict_weighted": Scenario(_bind(struct_dict, weighted=True), unit_dict,
                                     (MT + "test_functional_struct_outputs_dict_struct_losses",)),
    "struct_namedtuple": Scenario(
        struct_namedtuple, unit_named,
        (MT + "test_functional_struct_outputs_namedtuple_struct_losses",)),
    "struct_deep": Scenario(struct_deep, unit_deep,
                            (MT + "test_functional_deeply_nested_outputs_struct_losses",)),
    "optional_input_none": Scenario(optional_inputs, optional_none,
                                    (MT + "test_functional_optional_inputs",)),
    "optional_input_tensor": Scenario(optional_inputs, optional_tensor,
                                      (MT + "test_functional_optional_inputs",)),
    "subclassed_tuple_inputs": Scenario(subclassed_tuple_inputs, tuple_inputs,
                                        (MT + "test_tuple_input_model_subclass",)),
    # trainer_test.py
    "fit_flow": Scenario(example, four_to_three, (TT + "test_fit_flow",)),
    "metric_tracking": Scenario(metric_tracking, four_to_three, (TT + "test_metric_tracking",)),
    "weighted_metrics_sample_weights": Scenario(_bind(metric_tracking, weighted=True),
                                                four_to_three, (TT + "test_metric_tracking",),
                                                sample_weight=True),
    "own_train_step": Scenario(own_train_step, four_to_three,
                               (TT + "test_fit_with_custom_train_step",)),
    "class_weight_yaml": Scenario(
        classifier, classes, (TT + "test_fit_with_data_adapter",),
        compile={"loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
                 "optimizer": "adagrad"},
        overrides=("loss=sparse_categorical_crossentropy", "metrics=[accuracy]",
                   "class_weight={0:1,1:2}", "optimizer._target_=keras.optimizers.Adagrad",
                   f"optimizer.lr={LR}"),
        class_weight={0: 1, 1: 2}, classes=True),
    "steps_per_execution_yaml": Scenario(
        _bind(example, units=1, loss=False), four_to_one,
        (TT + "test_steps_per_execution_steps_count",),
        compile={"loss": "mse", "steps_per_execution": 3},
        overrides=("loss=mse", "steps_per_execution=3", *_SGD)),
    "unknown_size": Scenario(
        _bind(example, units=1), four_to_one,
        (TT + "test_steps_per_execution_steps_count_unknown_dataset_size",),
        source=unknown_size_source),
    "frozen": Scenario(frozen, four_to_one,
                       (TT + "test_fit_with_different_batch_size_same_loss",)),
    "loss_scaling": Scenario(loss_scaling, three_to_three,
                             (TT + "test_adds_loss_scaling_optimizer",)),
    "training_arg": Scenario(training_arg, one_column, (TT + "test_training_arg",)),
    "internal_only_loss": Scenario(internal_only_loss, two_columns,
                                   (TT + "test_internal_only_loss",)),
    "add_loss_loss_null_yaml": Scenario(add_loss_plain, two_columns, compile={"loss": None},
                                        overrides=("loss=null", *_SGD)),
    "add_loss": Scenario(add_loss, classes, classes=True),
    "list_inputs": Scenario(list_inputs, two_inputs, (TT + "test_nested_inputs",)),
    # Stopper stops after 5 batches: in the second epoch, after its first step
    "stop_training": Scenario(example, four_to_three, (TT + "test_stop_loop",),
                              callbacks=(Stopper,), epochs=2,
                              overrides=("+callbacks.stopper._target_=keras_scenarios.Stopper",)),
    "constraints": Scenario(constraints, three_to_two, (TT + "test_constraints_are_applied",)),
    "callback_state": Scenario(
        counter_model, three_to_three, (TT + "test_callbacks_can_update_state_at_batch_boundary",),
        callbacks=(Counter,),
        overrides=("+callbacks.counter._target_=keras_scenarios.Counter",)),
    "metric_in_compute_loss": Scenario(compute_loss_metric, four_to_two,
                                       (TT + "test_metric_update_in_compute_loss",)),
    "layer_losses_in_compute_loss": Scenario(
        _bind(compute_loss_metric, variant="forward"), four_to_two,
        (TT + "test_fwd_pass_loss_presence_in_compute_loss",)),
    "compute_loss_without_training": Scenario(
        _bind(compute_loss_metric, variant="no_training"), four_to_two,
        (TT + "test_compute_loss_no_training_backwards_compatibility",)),
    "loss_weights_scalar_yaml": Scenario(
        _bind(example, loss=False), four_to_three, (TT + "test_loss_weights",),
        compile={"loss": "mean_squared_error", "metrics": ["mean_squared_error"],
                 "loss_weights": 0.2}, overrides=(*_MSE, "loss_weights=0.2", *_SGD)),
    "loss_weights_dict": Scenario(struct_model, four_to_struct, (TT + "test_loss_weights",)),
    "loss_weights_list": Scenario(list_output_model, four_to_pair, (TT + "test_loss_weights",)),
    "partial_label": Scenario(partial_label, two_columns,
                              (TT + "test_partial_loss_partial_label",)),
    # trainer's own
    "sequential": Scenario(sequential, classes, classes=True),
    "subclassed": Scenario(subclassed, classes, classes=True),
    "sample_weights": Scenario(sequential, classes, sample_weight=True, classes=True),
}

# fit's steps_per_epoch is trainer's too (one stream across epochs, as Keras's one
# iterator), but these scenarios compare whole passes built by the harness.
STEPS_ELSEWHERE = ("fit's steps_per_epoch: tested against Keras's fit in "
                   "tests/test_streams.py (a stream, a finite dataset, 2 replicas, 2 workers); "
                   "the scenarios compare whole passes")

# Every other test of the two files, and why it does not apply to training under
# tf.distribute.
NOT_APPLICABLE = {
    MT + "test_functional_rerouting": "no training: the class a Model(...) call returns",
    MT + "test_json_serialization": "no training: JSON serialization",
    MT + "test_reviving_functional_from_config_custom_layer": "no training: from_config",
    MT + "test_reviving_functional_from_config_custom_model": "no training: from_config",
    MT + "test_functional_pickling": "predict-only: pickling",
    MT + "test_functional_list_outputs_dict_losses_invalid_keys":
        "error path: Keras refuses the loss before training (trainer: build_compiled's line)",
    MT + "test_functional_list_outputs_dict_losses_no_output_names":
        "error path: Keras refuses the loss before training",
    MT + "test_functional_list_outputs_dict_metrics_invalid_keys":
        "error path: Keras refuses the metrics before training",
    MT + "test_functional_dict_outputs_dict_losses_invalid_keys":
        "error path: Keras refuses the loss before training",
    MT + "test_functional_dict_outputs_dict_metrics_invalid_keys":
        "error path: Keras refuses the metrics before training",
    MT + "test_quantize": "no training: quantization",
    MT + "test_quantize_with_filters": "no training: quantization",
    MT + "test_quantize_unbuilt": "no training: quantization",
    MT + "test_quantize_invalid_args": "no training: quantization",
    MT + "test_quantize_nested_model": "no training: quantization",
    MT + "test_get_state_tree": "no training: the state-tree API (JAX-style state)",
    MT + "test_set_state_tree": "no training: the state-tree API (JAX-style state)",
    MT + "test_get_state_tree_with_duplicate_path": "no training: the state-tree API",
    MT + "test_layers_setter": "no training: a reserved attribute",
    MT + "test_functional_optional_inputs_generator":
        "a Python generator as fit's data (trainer's data are a Source); its model and "
        "loss are test_functional_optional_inputs's",
    MT + "test_export_error": "no training: export's errors",
    TT + "test_nested_trainer_metrics": "no training: model.metrics after compile",
    TT + "test_nested_trainer_metrics_without_compile": "no training: model.metrics",
    TT + "test_multiple_compiles": "no training: model.metrics after compiles",
    TT + "test_compile_eager_vs_jit_torch": "torch-only",
    TT + "test_fit_with_val_split": "fit's validation_split: a Source names its validation "
                                    "split (every scenario compares the val_ logs)",
    TT + "test_fit_sparse": "sparse inputs (tf.SparseTensor from generators): a Source holds "
                            "dense arrays or tf.data of them",
    TT + "test_evaluate_flow": "evaluate-only",
    TT + "test_evaluate_with_custom_test_step": "evaluate-only (own_train_step's test_step "
                                                "runs in every validation)",
    TT + "test_evaluate_sparse": "evaluate-only, sparse inputs",
    TT + "test_predict_flow": "predict-only",
    TT + "test_predict_flow_struct": "predict-only",
    TT + "test_predict_sparse": "predict-only, sparse inputs",
    TT + "test_fit_eval_flow_for_jax_model_weights": "JAX-only",
    TT + "test_steps_per_execution_unrolled_steps_steps_count":
        "an XLA-unrolling attribute of the TF trainer (unrolled_steps_per_execution): no "
        "numbers change",
    TT + "test_predict_preserve_order": "predict-only",
    TT + "test_predict_generator": "predict-only",
    TT + "test_steps_per_execution_steps_per_epoch": STEPS_ELSEWHERE,
    TT + "test_steps_per_epoch": STEPS_ELSEWHERE,
    TT + "test_max_epochs_and_steps": "keras.config.set_max_epochs/steps: a debugging cap",
    TT + "test_steps_per_execution_steps_per_epoch_unknown_data_size": STEPS_ELSEWHERE,
    TT + "test_steps_per_execution_steps_count_without_training": "predict/evaluate-only",
    TT + "test_evaluate_with_different_batch_size_same_loss": "evaluate-only",
    TT + "test_loss_scaling_prevents_underflow": "a one-example float16 underflow check at "
                                                 "rate 1e9; loss scaling is loss_scaling's",
    TT + "test_on_batch_methods": "train_on_batch and friends: not fit",
    TT + "test_on_batch_methods_without_training": "test_on_batch/predict_on_batch",
    TT + "test_nested_input_predict": "predict-only (list_inputs trains nested inputs)",
    TT + "test_for_eval_epoch_iterator": "no training: an evaluation iterator's internals",
    TT + "test_callback_methods_keys": "callback hook names, no numbers",
    TT + "test_trainer_with_raggeds": "ragged tensors with a loss of 0: nothing trains",
    TT + "test_predict_dropout": "predict-only",
    TT + "test_recompile": "compile twice in one process: a run compiles once",
    TT + "test_evaluate_return_list_respect_metrics_order": "evaluate-only",
    TT + "test_validation_data_infinite_generator": "a Python generator (trainer takes "
                                                    "arrays and tf.data); a validation "
                                                    "dataset that repeats for ever with "
                                                    "validation_steps: tests/test_streams.py",
    TT + "test_rng_updated_during_predict": "predict-only",
    TT + "test_evaluate_with_custom_compute_loss": "evaluate-only (compute_loss's training "
                                                   "flag; the scenarios validate each epoch)",
    TT + "test_symbolic_build": "no training: an internal method (trainer builds with it)",
    TT + "test_jit_compile_with_tf_determinism": "no training: a compile flag",
    TT + "test_retracing": "counts traces of train_step: no numbers change",
    TT + "test_retracing_predict": "predict-only",
    TT + "test_jit_fit_with_out_shardings_logic": "JAX-only",
}


def keras_tests(root: Path | None = None) -> list[str]:
    """Every test function of the two files, as `model_test.test_...`."""
    if root is None:  # found without importing Keras (and TensorFlow with it)
        import importlib.util

        root = Path(importlib.util.find_spec("keras").origin).parent / "src"
    found = []
    for short, path in FILES.items():
        tree = ast.parse((root / path).read_text())
        found += [f"{short}.{node.name}" for cls in tree.body
                  if isinstance(cls, ast.ClassDef)
                  and (cls.name.startswith("Test") or cls.name.endswith("Test"))
                  for node in cls.body
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.name.startswith("test_")]
    return found


def listing() -> list[tuple[str, str]]:
    """Each Keras test and what became of it: its scenarios, or `n/a: why`."""
    covered: dict[str, list[str]] = {}
    for name, scenario in SCENARIOS.items():
        for test in scenario.tests:
            covered.setdefault(test, []).append(name)
    rows = []
    for test in keras_tests():
        if test in covered:
            rows.append((test, "scenario: " + ", ".join(covered[test])))
        else:
            rows.append((test, "n/a: " + NOT_APPLICABLE.get(test, "UNLISTED (a new test?)")))
    return rows


def make_source(name: str, seed: int | None = None):
    """The Source of scenario `name`: its arrays (251 training examples, 29 validation)."""
    from trainer.data import Source

    scenario = SCENARIOS[name]
    if scenario.source is not None:
        return scenario.source(scenario, seed)
    x, y = scenario.data(np.random.default_rng(0), EXAMPLES)
    vx, vy = scenario.data(np.random.default_rng(1), VALIDATION)
    weights = (np.random.default_rng(2).uniform(0.5, 2.0, EXAMPLES).astype("float32")
               if scenario.sample_weight else None)
    return Source.from_arrays(x, y, vx, vy, num_classes=2 if scenario.classes else None,
                              sample_weight=weights)


def _loader(name: str) -> Callable[..., Any]:
    def load(seed=None, **_):
        return make_source(name, seed)

    return load


for _name, _scenario in SCENARIOS.items():  # `keras_scenarios.data_NAME` / `model_NAME`
    globals()[f"data_{_name}"] = _loader(_name)
    globals()[f"model_{_name}"] = _scenario.build


SAVED_WEIGHTS = "contract_weights.npz"


def SaveWeights(filename: str = SAVED_WEIGHTS):  # noqa: N802 - a callback, for `_target_`
    """Writes the model's weights at the end of training (`filename` inside the run
    directory): how the 2-workers column reads the chief's weights."""
    keras = _keras()

    def make():
        class SaveWeightsCallback(keras.callbacks.Callback):
            def __init__(self, filename):
                super().__init__()
                self.filename = filename

            def on_train_end(self, logs=None):
                np.savez(self.filename, **{f"w{i}": w
                                           for i, w in enumerate(self.model.get_weights())})
        return SaveWeightsCallback

    return _once("SaveWeightsCallback", make)(filename)
