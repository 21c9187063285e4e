"""The Keras contract scoreboard: scenarios of Keras's own tests (`keras/src/models/
model_test.py`, `keras/src/trainers/trainer_test.py`) trained by trainer and by plain
Keras's `fit` on one device, side by side.

Each scenario is a model its builder compiles as the Keras test compiles it (loss, metrics,
loss weights, weighted metrics; SGD at a fixed rate) and arrays of 251 examples (a last
batch of 59, split unevenly over 2 replicas). Plain Keras's `fit` trains it on one device
over the batches trainer makes (same order); trainer trains it through the whole run
(`trainer.run.train.train`) with `loop=fit` on 1 and 2 replicas and `loop=custom` on 2.
A cell is `pass` (the weights within 1e-5 of plain Keras's and the same history keys),
`differs` (with the largest relative difference, or the keys that differ), `refused` (a
one-line `ConfigError`: trainer says why) or `traceback` (anything else: a bug).

    python scripts/keras_contract.py                 # every scenario
    python scripts/keras_contract.py --only subclassed,add_loss
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # `_target_: keras_contract.X`

EXAMPLES, VALIDATION, BATCH, EPOCHS, LR, SEED = 251, 29, 64, 2, 0.1, 42
COLUMNS = (("fit", 1), ("fit", 2), ("custom", 2))


def _keras():
    import keras

    return keras


def _dense(units: int, name: str | None = None, activation: str | None = None, seed: int = 1):
    keras = _keras()
    return keras.layers.Dense(units, name=name, activation=activation,
                              kernel_initializer=keras.initializers.GlorotUniform(seed=seed))


def _sgd():
    return _keras().optimizers.SGD(LR)


# -- the models, each compiled as its Keras test compiles it -------------------------------

def sequential(**_):
    """model_test: a single output (`test_functional_single_output`)."""
    keras = _keras()
    model = keras.Sequential([keras.Input((3,)), _dense(8, activation="relu"),
                              _dense(2, activation="softmax", seed=2)])
    model.compile(_sgd(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def list_outputs(**_):
    """model_test: `test_functional_list_outputs_list_losses` (a loss, metrics and a
    weight per output, as lists)."""
    keras = _keras()
    x = keras.Input((3,), name="input_a")
    model = keras.Model(x, [_dense(1, "output_a")(x),
                            _dense(1, "output_b", "sigmoid", seed=2)(x)])
    model.compile(_sgd(), loss=["mean_squared_error", "binary_crossentropy"],
                  metrics=["mean_squared_error", ["mean_squared_error", "accuracy"]],
                  loss_weights=[0.1, 2])
    return model


def dict_outputs(**_):
    """model_test: `test_functional_dict_outputs_dict_losses` (dicts per output name,
    weighted metrics)."""
    keras = _keras()
    x = keras.Input((3,), name="input_a")
    model = keras.Model(x, {"output_a": _dense(1, "output_a")(x),
                            "output_b": _dense(1, "output_b", "sigmoid", seed=2)(x)})
    model.compile(_sgd(), loss={"output_a": "mean_squared_error",
                                "output_b": ["binary_crossentropy"]},
                  metrics={"output_a": ["mean_squared_error"],
                           "output_b": ["mean_squared_error", "accuracy"]},
                  weighted_metrics={"output_a": ["mean_squared_error"],
                                    "output_b": ["mean_squared_error", "accuracy"]})
    return model


def partial_loss(**_):
    """model_test: `test_functional_dict_outputs_dict_losses_with_undefined_loss` (a loss
    for one output of two)."""
    keras = _keras()
    x = keras.Input((3,), name="input_a")
    model = keras.Model(x, {"output_a": _dense(1, "output_a")(x),
                            "output_b": _dense(1, "output_b", "sigmoid", seed=2)(x)})
    model.compile(_sgd(), loss={"output_b": ["binary_crossentropy"]},
                  metrics={"output_b": ["mean_squared_error", "accuracy"]})
    return model


class _Subclassed:
    """Made on first use: the class needs Keras imported."""

    cls = None

    @classmethod
    def get(cls):
        if cls.cls is None:
            keras = _keras()

            class Subclassed(keras.Model):
                def __init__(self, **kwargs):
                    super().__init__(**kwargs)
                    self.hidden = _dense(8, activation="relu")
                    self.head = _dense(2, activation="softmax", seed=2)

                def call(self, x):
                    return self.head(self.hidden(x))

            cls.cls = Subclassed
        return cls.cls


def subclassed(**_):
    """trainer_test: a subclassed model (its own `call`, built on the first batch)."""
    model = _Subclassed.get()()
    model.compile(_sgd(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def add_loss(**_):
    """trainer_test: a layer's `add_loss` (an activity penalty) beside the compiled loss."""
    keras = _keras()

    class Penalty(keras.layers.Layer):
        def call(self, x):
            self.add_loss(0.01 * keras.ops.mean(keras.ops.square(x)))
            return x

    x = keras.Input((3,))
    model = keras.Model(x, _dense(2, activation="softmax", seed=2)(
        Penalty()(_dense(8, activation="relu")(x))))
    model.compile(_sgd(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def own_train_step(**_):
    """trainer_test: `CustomTrainTestStepModel` (its own `train_step`, logging an extra
    metric)."""
    keras = _keras()

    class OwnStep(keras.Model):
        def train_step(self, data):
            logs = super().train_step(data)
            logs["my_custom_metric"] = 10.0
            return logs

    x = keras.Input((3,))
    model = OwnStep(x, _dense(2, activation="softmax", seed=2)(x))
    model.compile(_sgd(), "sparse_categorical_crossentropy")
    return model


def own_compute_loss(**_):
    """model_test: `test_functional_list_outputs_with_custom_compute_loss` (one output,
    split in two by the model's own `compute_loss`)."""
    keras = _keras()

    class OwnLoss(keras.Model):
        def compute_loss(self, x, y, y_pred, sample_weight=None, **kwargs):
            return super().compute_loss(x=x, y=y, y_pred=[y_pred, y_pred],
                                        sample_weight=sample_weight, **kwargs)

    x = keras.Input((3,), name="inputs")
    model = OwnLoss(x, _dense(1, "a", "sigmoid")(x))
    model.compile(_sgd(), loss=["mean_squared_error", "binary_crossentropy"])
    return model


def tuple_inputs(**_):
    """trainer_test: `test_nested_input_predict` (a model of a tuple of inputs)."""
    keras = _keras()
    a, b = keras.Input((3,)), keras.Input((3,))
    model = keras.Model((a, b), _dense(2, activation="softmax", seed=2)(
        keras.layers.Concatenate()([a, b])))
    model.compile(_sgd(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# -- the data -------------------------------------------------------------------------------

def _arrays(rows: int, seed: int, scenario: str):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype("float32")
    label = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    score = (x[:, 2] + 0.1 * rng.normal(size=rows)).astype("float32")[:, None]
    binary = label[:, None].astype("float32")
    if scenario in ("list_outputs",):
        return x, (score, binary)
    if scenario in ("dict_outputs", "partial_loss"):
        return x, {"output_a": score, "output_b": binary}
    if scenario == "own_compute_loss":
        return x, (binary, binary)
    if scenario == "tuple_inputs":
        return (x, x[:, ::-1].copy()), label
    return x, label


def _loader(scenario: str):
    def load(seed=None, **_):
        import numpy as np

        from trainer.data import Source

        x, y = _arrays(EXAMPLES, 0, scenario)
        vx, vy = _arrays(VALIDATION, 1, scenario)
        weights = (np.random.default_rng(2).uniform(0.5, 2.0, EXAMPLES).astype("float32")
                   if scenario == "sample_weights" else None)
        classes = 2 if scenario in CLASSES else None
        return Source.from_arrays(x, y, vx, vy, num_classes=classes, sample_weight=weights)

    return load


SCENARIOS = {
    "sequential": sequential, "list_outputs": list_outputs, "dict_outputs": dict_outputs,
    "partial_loss": partial_loss, "subclassed": subclassed, "add_loss": add_loss,
    "own_train_step": own_train_step, "own_compute_loss": own_compute_loss,
    "tuple_inputs": tuple_inputs, "sample_weights": sequential,
}
# What a cell that is not `pass` is expected to say, and why.
NOTES = {
    "own_train_step": "its own train_step runs under fit as written (Keras's per-replica mean "
                      "weighs the uneven last batch's shares unlike one device); loop=custom "
                      "refuses it",
    "own_compute_loss": "trainer keeps Keras's step for a model with its own compute_loss "
                        "(its author decides how it weighs), so 2 replicas differ on the "
                        "uneven last batch; loop=custom refuses it",
}
CLASSES = {"sequential", "subclassed", "add_loss", "own_train_step", "tuple_inputs",
           "sample_weights"}
for _name in SCENARIOS:  # `keras_contract.data_NAME`: each scenario's loader
    globals()[f"data_{_name}"] = _loader(_name)


# -- running them ---------------------------------------------------------------------------

def plain_keras(scenario: str) -> tuple[list, set[str]]:
    """Plain Keras's `fit` on one device over trainer's batches: (weights, history keys)."""
    import keras

    from trainer.config.validate import runtime_seed
    from trainer.data.pipeline import build_pipeline, build_training_epochs

    # trainer seeds TensorFlow's global seed too: tf.data's shuffle order depends on it
    keras.utils.set_random_seed(runtime_seed(SEED))
    source = globals()[f"data_{scenario}"]()
    model = SCENARIOS[scenario]()
    epochs = build_training_epochs(source.train, BATCH, first_epoch=0, epochs=EPOCHS,
                                   seed=runtime_seed(SEED), replicas=1, examples=EXAMPLES)
    validation = build_pipeline(source.validation, BATCH, training=False,
                                examples=VALIDATION)
    history = model.fit(epochs, epochs=EPOCHS, steps_per_epoch=-(-EXAMPLES // BATCH),
                        validation_data=validation, verbose=0)
    return model.get_weights(), set(history.history)


def with_trainer(scenario: str, loop: str, replicas: int) -> tuple[list, set[str]]:
    """trainer's run of the scenario: (weights, history keys)."""
    import keras
    from hydra import compose, initialize_config_dir

    from trainer.config.schema import config_dir
    from trainer.run.train import train

    class Keep(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.weights = self.model.get_weights()

    overrides = [f"model._target_=keras_contract.{SCENARIOS[scenario].__name__}",
                 f"dataset._target_=keras_contract.data_{scenario}", f"loop={loop}",
                 "accelerator=cpu", f"devices={replicas}", f"epochs={EPOCHS}", f"seed={SEED}",
                 "batch.per_replica=null", f"batch.global_size={BATCH}",
                 "optimizer.lr_scaling=none", "deterministic=true", "verbose=0",
                 "logger=[]", "checkpoint.monitor=val_loss"]
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    keep = Keep()
    with tempfile.TemporaryDirectory() as run_dir, open(os.devnull, "w") as quiet, \
            contextlib.redirect_stdout(quiet):  # the run's summary
        summary = train(cfg, run_dir=run_dir, callbacks=[keep])
    return keep.weights, set(summary["history"]) - {"learning_rate"}


def cell(reference: tuple[list, set[str]], scenario: str, loop: str, replicas: int) -> str:
    """One cell of the table: pass, differs, refused or traceback."""
    import numpy as np

    from trainer.config.errors import ConfigError

    try:
        weights, keys = with_trainer(scenario, loop, replicas)
    except ConfigError as error:
        return f"refused: {error}"
    except Exception as error:  # noqa: BLE001 - the scoreboard reports every failure
        return f"traceback: {type(error).__name__}: {str(error).strip().splitlines()[0][:80]}"
    want_weights, want_keys = reference
    if keys != want_keys:
        return f"differs: keys {sorted(keys ^ want_keys)}"
    worst = max(float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6)))
                for a, b in zip(weights, want_weights, strict=True))
    return "pass" if all(np.allclose(a, b, rtol=1e-5, atol=1e-6)
                         for a, b in zip(weights, want_weights, strict=True)) \
        else f"differs: weights {worst:.1e}"


def start(devices: int) -> None:
    """Splits the CPU into logical devices before TensorFlow's runtime starts."""
    import tensorflow as tf

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * devices)
    from trainer.config.schema import register_configs

    register_configs()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="scenarios, comma-separated")
    args = parser.parse_args()
    chosen = [s for s in (args.only.split(",") if args.only else SCENARIOS) if s]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    start(max(r for _, r in COLUMNS))
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    header = ["scenario", *(f"{loop} x{r}" for loop, r in COLUMNS)]
    rows = []
    for scenario in chosen:
        reference = plain_keras(scenario)
        rows.append([scenario, *(cell(reference, scenario, loop, r) for loop, r in COLUMNS)])
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for scenario in chosen:
        if scenario in NOTES:
            print(f"\n{scenario}: {NOTES[scenario]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
