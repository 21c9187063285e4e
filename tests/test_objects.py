"""Python objects in the API (`trainer.fit(model=..., data=...)`) and Keras's `fit` data
contract: batched or unbatched datasets, arrays, no validation set, inputs alone (`x`, no
`y`), `dataset.shuffle=false`, on 1 and 2 replicas and under `loop=custom`.

The builders here are closures (no dotted name reaches them), so they take the object path
a notebook's `__main__` functions take; `tests/objects_task.py` holds the same by dotted name
for the runs in other processes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import trainer
from tests.objects_task import VAE, Reconstructing, regression
from tests.test_multiworker import launches  # noqa: F401
from tests.test_readme_examples import examples
from trainer.config.given import dotted_name, overrides

QUIET = ["verbose=0", "logger=[]", "accelerator=cpu"]


def _builder(lr: float = 0.05):
    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
        return model

    return build


def _max_diff(a: list, b: list) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_batched_dataset_without_validation_ends_where_plain_keras_fit_does(tmp_path, loop):
    """A function returning `Dataset.batch(32)`, no validation, no shuffling: 2 replicas
    train at the dataset's batch (32, 16 per replica) and end with the weights Keras's `fit`
    reaches on one device; the summary says the data was rebatched and that the training
    loss chose the checkpoint."""
    build = _builder()

    def load():
        return tf.data.Dataset.from_tensor_slices(regression(200)).batch(32)

    result = trainer.fit([*QUIET, "devices=2", "epochs=2", "dataset.shuffle=false",
                          f"loop={loop}"], model=build, data=load, run_dir=tmp_path / "run")
    summary = result.summary
    assert summary["batch"]["global"] == 32 and summary["batch"]["per_replica"] == 16
    assert summary["validation_examples"] == 0 and summary["validation_metrics"] == {}
    assert any("came in batches of 32" in n for n in summary["data_notes"])
    assert any("no validation set: the training loss" in n for n in summary["data_notes"])
    assert "a Python object" in summary["model"] and "a Python object" in summary["dataset"]
    assert sorted(result.history) == ["loss"] and set(result.checkpoints) == {"best", "last"}
    reference = build()
    reference.fit(load(), epochs=2, verbose=0, shuffle=False)
    trained = keras.models.load_model(result.checkpoints["last"]).get_weights()
    assert _max_diff(trained, reference.get_weights()) < 1e-5


def test_the_run_records_an_object_and_evaluate_without_it_is_one_line(tmp_path):
    """The run directory says the data was an object; evaluating without it is one
    `TrainerError` line naming what to pass, and with it evaluation runs."""
    x, y = regression(96)
    splits = {"train": (x[:64], y[:64]), "validation": (x[64:], y[64:])}
    result = trainer.fit([*QUIET, "devices=1", "epochs=1"], model=_builder(), data=splits,
                         run_dir=tmp_path / "run")
    assert result.summary["data_notes"] == [
        "no accuracy is logged: val_loss chose the best checkpoint (checkpoint.monitor's "
        "default is val_accuracy)"]
    config = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "trainer.data.given.load" in config and "given: a dict" in config
    assert result.summary["validation_examples"] == 32 and "val_loss" in result.history
    with pytest.raises(trainer.TrainerError) as error:
        trainer.evaluate(result.run_dir)
    assert "\n" not in str(error.value)
    assert "data was a Python object (a dict)" in str(error.value)
    assert "pass it again" in str(error.value)
    found = trainer.evaluate(result.run_dir, model=_builder(), data=splits)
    assert found["examples"] == 32
    assert found["metrics"]["loss"] == pytest.approx(result.summary["validation_metrics"]
                                                     ["loss"], rel=1e-5)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_model_with_its_own_train_step_trains_on_inputs_alone(tmp_path, loop):
    """A VAE-like model (its own `train_step`, compiled without a loss) on `x` alone, on 2
    replicas: it trains, both loops alike, and no loss of the config is asked for."""
    x = np.random.default_rng(0).normal(size=(96, 6)).astype("float32")

    def build():
        keras.utils.set_random_seed(2)
        model = VAE()
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
        return model

    result = trainer.fit([*QUIET, "devices=2", "epochs=2", "batch.per_replica=16",
                          f"loop={loop}"], model=build, data=lambda: x,
                         run_dir=tmp_path / "run")
    loss = result.history["loss"]
    assert len(loss) == 2 and all(np.isfinite(loss)) and loss[1] < loss[0]
    assert result.summary["loss"].startswith("none compiled")
    assert result.summary["train_step"].startswith("the model's own train_step")


def test_add_loss_on_inputs_alone_runs_trainers_exact_step_on_one_and_two_replicas(tmp_path):
    """An uncompiled model whose loss is its `add_loss`, on `x` alone (an unbatched
    dataset of single examples): 1 and 2 replicas end with the same weights."""
    x = np.random.default_rng(1).normal(size=(64, 4)).astype("float32")

    def build(input_shape):
        keras.utils.set_random_seed(3)
        inputs = keras.Input(input_shape)
        return keras.Model(inputs, Reconstructing()(inputs))

    weights = []
    for devices in (1, 2):
        result = trainer.fit([*QUIET, f"devices={devices}", "epochs=1", "batch.per_replica=null",
                              "batch.global_size=16",
                              "dataset.shuffle=false", "optimizer.lr=0.01"], model=build,
                             data=lambda: tf.data.Dataset.from_tensor_slices(x),
                             run_dir=tmp_path / f"run{devices}")
        assert result.summary["data_notes"] == [
            "no validation set: the training loss chose the best checkpoint"]
        weights.append(keras.models.load_model(result.checkpoints["last"]).get_weights())
    assert _max_diff(*weights) < 1e-5


def test_what_is_given_is_named_by_its_dotted_name_where_one_reaches_it():
    """A function of an importable module is named as the command line would name it; a
    closure, a lambda or an array is recorded as an object."""
    assert dotted_name(regression) == "tests.objects_task.regression"
    assert overrides("model", regression) == ["model._target_=tests.objects_task.regression"]
    assert dotted_name(_builder()) is None and dotted_name(lambda: 1) is None
    assert overrides("data", np.zeros(3)) == ["dataset._target_=trainer.data.given.load",
                                              "+dataset.given='a ndarray'"]


@pytest.mark.parametrize("given, message", [
    (lambda: {"a": 1}, "returned int in its train split"),
    ({"validation": (np.zeros((4, 2)), np.zeros(4))}, "a dict of splits needs `train`"),
    (lambda: tf.data.Dataset.from_tensor_slices(np.zeros((4, 2))).repeat(),
     "repeats for ever"),
])
def test_data_it_cannot_take_is_one_line(tmp_path, given, message):
    with pytest.raises(trainer.TrainerError) as error:
        trainer.fit([*QUIET, "devices=1"], model=_builder(), data=given,
                    run_dir=tmp_path / "run")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_readmes_objects_example_runs_as_a_notebooks_main(tmp_path, monkeypatch):
    """The README's block as written, as a notebook's `__main__`: the compiled model and the
    arrays are recorded as objects, the run trains on 2 replicas at Keras's batch 32, and
    the trained weights come back into the model."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    exec(compile(examples()["objects.py"], "objects.py", "exec"), namespace)  # noqa: S102
    summary = namespace["result"].summary
    assert summary["model"] == (f"{namespace['model'].name}, a Sequential given as a model "
                                "(a Python object)")
    assert summary["dataset"] == "a dict (a Python object)"
    assert summary["replicas"] == 2 and len(summary["history"]["loss"]) == 2
    assert (summary["batch"]["global"], summary["batch"]["per_replica"]) == (32, 16)
    last = keras.saving.load_model(namespace["result"].checkpoints["last"])
    for mine, saved in zip(namespace["model"].get_weights(), last.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, saved)
    assert summary["data_notes"] == [
        "no validation set: the training loss chose the best checkpoint"]


NOTEBOOK = """
import keras, numpy as np, tensorflow as tf
import trainer

def regression(n):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 5)).astype("float32")
    return x, (x @ np.arange(1, 6, dtype="float32") / 5)[:, None] + 0.1

def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model

def load():
    return tf.data.Dataset.from_tensor_slices(regression(200)).batch(32)

result = trainer.fit(["accelerator=cpu", "devices=2", "epochs=2", "dataset.shuffle=false",
                      "logger=[]"], model=build, data=load)
reference = build()
reference.fit(load(), epochs=2, verbose=0, shuffle=False)
trained = keras.models.load_model(result.checkpoints["last"]).get_weights()
diff = max(float(np.abs(a - b).max()) for a, b in zip(trained, reference.get_weights()))
print(json.dumps({"diff": diff, "batch": result.summary["batch"]["global"],
                  "model": result.summary["model"]}))
"""


@pytest.mark.long
def test_a_notebook_style_script_trains_its_main_functions(tmp_path):
    """Functions defined in `__main__` (a script, a notebook), `trainer.fit` on 2 logical
    CPUs: the weights plain Keras's `fit` reaches on one device at the same global batch."""
    script = tmp_path / "notebook.py"
    script.write_text("import json\n" + NOTEBOOK)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["diff"] < 1e-5 and found["batch"] == 32
    assert found["model"] == "build, defined in __main__ (a Python object)"


@pytest.mark.multiworker
def test_a_model_with_its_own_train_step_trains_on_inputs_alone_on_two_workers(
        tmp_path, launches):  # noqa: F811
    """The VAE on `x` alone (a loader returning an array, by dotted name) on 2 workers: the
    custom loop runs its `train_step`, and the loss falls."""
    run_dir = tmp_path / "run"
    launch = launches(2, "model._target_=tests.objects_task.build_vae",
                      "dataset._target_=tests.objects_task.load_x", "batch.per_replica=16",
                      "epochs=2", "logger=[]", "verbose=0", f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=400) == 0, launch.output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["loop"] == "custom"
    loss = summary["history"]["loss"]
    assert len(loss) == 2 and all(np.isfinite(loss)) and loss[1] < loss[0]
    assert summary["data_notes"] == [
        "no validation set: the training loss chose the best checkpoint"]


def test_predict_and_resume_take_the_objects_again(tmp_path):
    """A run started from objects: `predict` with them gives the model's outputs, and
    `resume=` with them trains on from the finished run."""
    x, y = regression(64)
    build = _builder()
    run_dir = tmp_path / "run"
    trainer.fit([*QUIET, "devices=1", "epochs=1"], model=build, data=(x, y), run_dir=run_dir)
    found = trainer.predict(run_dir, x[:5], tmp_path / "out.npy", model=build, data=(x, y))
    expected = keras.models.load_model(run_dir / "checkpoints" / "best.keras").predict(
        x[:5], verbose=0)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-5)
    assert found["rows"] == 5
    resumed = trainer.fit([*QUIET, "devices=1", "epochs=2", f"resume={run_dir}"],
                          model=build, data=(x, y))
    assert len(resumed.history["loss"]) == 2


def test_validation_split_holds_out_the_last_examples_as_keras_does(tmp_path):
    """`validation_split=0.25` of 64 examples: the last 16, in the data's order, validate
    (the final validation loss is the checkpoint's loss on exactly those rows); a dataset
    with a validation split already is one line."""
    x, y = regression(64)
    build = _builder()
    result = trainer.fit([*QUIET, "devices=2", "epochs=1", "validation_split=0.25",
                          "checkpoint.monitor=val_loss"], model=build, data=(x, y),
                         run_dir=tmp_path / "run")
    assert result.summary["train_examples"] == 48
    assert result.summary["validation_examples"] == 16
    last = keras.models.load_model(result.checkpoints["last"])
    expected = last.evaluate(x[48:], y[48:], verbose=0, return_dict=True)["loss"]
    assert result.summary["validation_metrics"]["loss"] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(trainer.TrainerError, match="has a validation split already"):
        trainer.fit([*QUIET, "devices=1", "validation_split=0.25"], model=build,
                    data={"train": (x, y), "validation": (x[:8], y[:8])},
                    run_dir=tmp_path / "again")


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_sample_weights_in_arrays_train_as_keras_fit_weighs_them(tmp_path, loop):
    """`(x, y, sample_weight)` arrays, unshuffled, on 2 replicas: the weights Keras's `fit`
    reaches with the same sample weights on one device at the same global batch."""
    x, y = regression(80)
    w = np.linspace(0.2, 2.0, 80).astype("float32")
    build = _builder(0.02)
    result = trainer.fit([*QUIET, "devices=2", "epochs=2", "batch.per_replica=null",
                          "batch.global_size=32", "dataset.shuffle=false", f"loop={loop}"],
                         model=build, data=(x, y, w), run_dir=tmp_path / "run")
    reference = build()
    reference.fit(x, y, sample_weight=w, batch_size=32, epochs=2, shuffle=False, verbose=0)
    trained = keras.models.load_model(result.checkpoints["last"]).get_weights()
    assert _max_diff(trained, reference.get_weights()) < 1e-5
