"""Keras models as Keras trains them (#35): a subclassed model, tuple structures, a model its
builder compiled, a loss function of the user's, a tf.data source's declared sizes, and the
scoreboard of Keras's own test scenarios (scripts/keras_contract.py). Each trains through
the whole run (`train`) and ends where plain Keras, or the same run on one replica, ends.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import error_lines, run_main
from tests.test_parity import (
    DICT,
    EXACT,
    SHARES_RUNS,
    Keep,
    run,
    same,
    trained,  # noqa: F401 - the fixture, used by name
)
from trainer.config.errors import ConfigError
from trainer.config.validate import runtime_seed
from trainer.evaluate import evaluate_run
from trainer.run.train import train

TINY_CLI = ["epochs=1", "verbose=0", "logger=[]"]
SUBCLASSED = ["model._target_=parity_task.subclassed_model",
              "dataset._target_=parity_task.dict_inputs"]


@SHARES_RUNS
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_subclassed_model_trains_on_two_replicas_like_one(tiny_config, tmp_path, trained,  # noqa: F811
                                                            loop):
    """Its variables exist only after a batch: trainer builds it from a symbolic batch (as
    fit does from its first), so metrics, the optimizer and checkpoints find them. The one
    replica under fit is made once, for both loops."""
    if loop == "fit":
        one, w1 = trained(1, *SUBCLASSED, "loop=fit")
    else:
        one, w1 = run(tiny_config, tmp_path, 1, *SUBCLASSED, f"loop={loop}")
    two, w2 = run(tiny_config, tmp_path, 2, *SUBCLASSED, f"loop={loop}")
    same(w1, w2)
    assert two["validation_metrics"]["accuracy"] > 0.75
    assert (tmp_path / "run2" / "checkpoints" / "best.keras").is_file()
    if loop == "custom":  # and the custom loop's weights are fit's
        fit, wf = trained(1, *SUBCLASSED, "loop=fit")
        same(wf, w1)
        return
    # Without get_config its checkpoints hold the weights (the summary says so), which
    # evaluation loads into the model its builder makes.
    assert "get_config" in two["checkpoints_hold"]
    run_dir = tmp_path / "run2"
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(tiny_config(*EXACT, "devices=2", *SUBCLASSED), run_dir / ".hydra" /
                   "config.yaml")
    result = evaluate_run(run_dir, ["devices=1", "checkpoint=last"])
    assert result["metrics"] == pytest.approx(two["validation_metrics"], rel=1e-5)


TUPLES = ["model._target_=parity_task.tuple_model", "dataset._target_=parity_task.tuple_targets",
          "loss=[sparse_categorical_crossentropy,mse]", "+loss_weights=[1.0,0.5]",
          "checkpoint.monitor=val_loss", "batch.global_size=66"]


def keras_history_keys(model_fn, source) -> set[str]:
    """The keys plain Keras's fit logs for this model and data, compiled as the run is."""
    import parity_task  # noqa: F401 - the tests' directory is on the import path

    model = model_fn()
    model.compile(optimizer="sgd", loss=["sparse_categorical_crossentropy", "mse"],
                  loss_weights=[1.0, 0.5])
    history = model.fit(source.train.batch(64), validation_data=source.validation.batch(64),
                        epochs=1, verbose=0)
    return set(history.history)


def test_tuple_inputs_and_targets_with_a_loss_per_output_train_on_three_replicas_like_one(
        tiny_config, tmp_path):
    """`keras.Model((a, b), [cls, reg])` on tuple inputs and (class, score) targets with
    sample weights, a loss per output as a YAML list, loss weights as a list: 3 replicas
    (29 validation examples: not a multiple of 3) end where 1 does, logging what Keras's
    fit logs; so does the custom loop (through the compiled loss) on 3 replicas of 2
    micro-batches each."""
    import parity_task

    one, w1 = run(tiny_config, tmp_path, 1, *TUPLES)
    three, w3 = run(tiny_config, tmp_path, 3, *TUPLES)
    same(w1, w3)
    assert three["validation_examples"] == 29
    assert three["validation_metrics"] == pytest.approx(one["validation_metrics"], rel=1e-4)
    keras_keys = keras_history_keys(parity_task.tuple_model, parity_task.tuple_targets())
    assert set(three["history"]) - {"learning_rate"} == keras_keys
    assert three["loss"] == "sparse_categorical_crossentropy, mse"
    custom, wc = run(tiny_config, tmp_path, 3, *TUPLES, "loop=custom", "batch.accumulate=2",
                     name="custom")
    same(w1, wc)
    assert custom["history"].keys() == one["history"].keys()
    assert custom["validation_metrics"] == pytest.approx(one["validation_metrics"], rel=1e-4)
    assert custom["train_metrics"] == pytest.approx(one["train_metrics"], rel=1e-4)


COMPILED = ["model._target_=parity_task.compiled_model",
            "dataset._target_=parity_task.dict_inputs", "deterministic=true", "epochs=2",
            "batch.global_size=64", "batch.per_replica=null", "accelerator=cpu", "devices=1"]


def plain_keras_fit(model, source, epochs: int, seed: int):
    """Keras's own fit on one device over the batches trainer makes (same order)."""
    from trainer.data.pipeline import (
        Batches,
        Epochs,
        Order,
        build_pipeline,
        build_training_epochs,
    )

    train = build_training_epochs(source.train, Batches(64, 1, source.train_size),
                                  Epochs(0, epochs), order=Order(seed))
    validation = build_pipeline(source.validation, Batches(64, 1, source.validation_size),
                                training=False, order=Order(seed))
    history = model.fit(train, epochs=epochs, steps_per_epoch=-(-source.train_size // 64),
                        validation_data=validation, verbose=0)
    return history.history


@pytest.fixture(scope="module")
def plain_compiled():
    """Keras's own fit of the compiled model on one device, once for both loops: (its
    weights, its history)."""
    import keras
    import parity_task

    # seeded as the run seeds itself (seed=42): the data's draws and Keras's seeds start
    # there, whichever test of the process ran before
    keras.utils.set_random_seed(runtime_seed(42))
    plain = parity_task.compiled_model()
    history = plain_keras_fit(plain, parity_task.dict_inputs(), 2, runtime_seed(42))
    return plain.get_weights(), history


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_model_its_builder_compiled_trains_as_plain_keras_fit_trains_it(tiny_config,
                                                                          tmp_path, loop,
                                                                          plain_compiled):
    """The builder's optimizer (SGD with momentum), loss, metrics and loss weight train: the
    same history keys and weights as Keras's fit on one device (the custom loop through
    the compiled loss, as its loss weight asks)."""
    keep = Keep()
    summary = train(tiny_config(*COMPILED, f"loop={loop}"), run_dir=tmp_path / "run",
                    callbacks=[keep])
    assert summary["compiled_by"] == "model builder"
    assert summary["optimizer"] == "SGD" and summary["optimizer_settings"] == {"momentum": 0.5}
    assert summary["learning_rate"]["scaled"] == pytest.approx(0.2)
    plain_weights, history = plain_compiled
    assert set(summary["history"]) - {"learning_rate"} == set(history)
    assert {"top1", "accuracy"} <= set(summary["validation_metrics"])
    same(plain_weights, keep.weights)
    assert summary["history"]["loss"] == pytest.approx(history["loss"], rel=1e-5)


def test_a_config_naming_another_loss_than_the_compiled_models_is_one_line(tiny_config,
                                                                          tmp_path):
    with pytest.raises(ConfigError, match=r"the model builder compiled the model with loss "
                                          r"sparse_categorical_crossentropy; the config also "
                                          r"names loss=mean_squared_error: keep one"):
        train(tiny_config(*COMPILED, "loss=mean_squared_error"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    done = run_main(*TINY_CLI, *COMPILED, "loss=mean_squared_error",
                    f"hydra.run.dir={tmp_path / 'cli'}", cwd=tmp_path)
    assert done.returncode == 2
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "also names loss=mean_squared_error" in lines[0], lines
    assert not (tmp_path / "cli").exists()


def test_a_class_loss_on_float_targets_is_one_line_before_training(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match=r"loss sparse_categorical_crossentropy takes class "
                                          r"indices, but output '\w+''s target is float32 of "
                                          r"shape \(None,\) \(a regression target\?\)"):
        train(tiny_config("model._target_=parity_task.dict_model",
                          "dataset._target_=parity_task.regression_targets"),
              run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("loss, kwargs", [
    ("loss=parity_task.scaled_crossentropy", {}),
    ("loss={_target_: parity_task.scaled_crossentropy, _partial_: true, scale: 2.0}",
     {"scale": 2.0}),
])
def test_a_loss_function_of_the_users_trains_and_its_checkpoints_load(tiny_config, tmp_path,
                                                                       loss, kwargs):
    """By its dotted name or as a `_partial_` node: the function is registered as a Keras
    serializable, so the checkpoints save it by name and load with it."""
    import keras
    import parity_task

    overrides = [*EXACT, "devices=1", "model._target_=parity_task.seeded_model",
                 "dataset._target_=parity_task.dict_inputs", "epochs=1", loss]
    run_dir = tmp_path / "run"
    summary = train(tiny_config(*overrides), run_dir=run_dir)
    assert summary["loss"] == "scaled_crossentropy"
    loaded = keras.models.load_model(run_dir / "checkpoints" / "last.keras")
    assert loaded.loss.fn is parity_task.scaled_crossentropy
    assert loaded.loss._fn_kwargs == kwargs
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(tiny_config(*overrides), run_dir / ".hydra" / "config.yaml")
    result = evaluate_run(run_dir, ["devices=2", "checkpoint=last"])
    assert result["metrics"]["loss"] == pytest.approx(summary["validation_metrics"]["loss"],
                                                      rel=1e-5)


def test_a_loss_by_a_dotted_name_that_does_not_import_is_one_line(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match=r"loss 'parity_task.nope' cannot be imported: "):
        train(tiny_config("loss=parity_task.nope"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_tf_data_source_declaring_another_size_than_it_holds_is_one_line(tiny_config,
                                                                          tmp_path):
    """Known to tf.data: refused before training. Unknown (a filter): refused at the first
    pass, instead of epochs of the wrong number of steps."""
    with pytest.raises(ConfigError, match=r"dataset parity_task.declares_300: its train split "
                                          r"holds 301 examples, but its Source declares "
                                          r"train_size=300"):
        train(tiny_config("model._target_=parity_task.dict_model",
                          "dataset._target_=parity_task.declares_300"),
              run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    done = run_main(*TINY_CLI, "model._target_=parity_task.dict_model",
                    "dataset._target_=parity_task.declares_400_filtered", "accelerator=cpu",
                    "devices=2", f"hydra.run.dir={tmp_path / 'cli'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert error_lines(done.stderr) == [
        "error: dataset parity_task.declares_400_filtered: its train split yields only 301 "
        "examples, but its Source declares train_size=400; the steps per epoch come from "
        "train_size: make it what the dataset yields"]


def test_the_keras_contract_scoreboard_scores_a_scenario(monkeypatch):
    """scripts/keras_contract.py: a Keras test's dict outputs with a loss for one output of
    two and weighted metrics, on 2 replicas, end where plain Keras's fit ends."""
    from tests.conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import keras_contract

    reference = keras_contract.plain_keras("partial_loss")
    assert keras_contract.cell(
        reference, lambda: keras_contract.with_trainer("partial_loss", "fit", 2)) == "pass"


def test_a_model_compiled_with_a_loss_alone_logs_the_loss_alone(tiny_config, tmp_path):
    """As Keras's fit: no accuracy added to a model its builder compiled without metrics."""
    summary = train(tiny_config(*COMPILED, "model._target_=parity_task.compiled_without_metrics",
                                "epochs=1", "checkpoint.monitor=val_loss"),
                    run_dir=tmp_path / "run")
    assert summary["metrics"] == [] and set(summary["history"]) - {"learning_rate"} == {
        "loss", "val_loss"}


def test_a_compiled_models_optimizer_gives_way_to_one_the_config_names(tiny_config, tmp_path):
    """`optimizer=adamw` names one: it trains the builder's loss and metrics. A rate for the
    kept optimizer (its own is the rate) is one line naming both."""
    summary = train(tiny_config(*COMPILED, "optimizer=adamw", "epochs=1"),
                    run_dir=tmp_path / "run")
    assert summary["optimizer"] == "AdamW" and summary["compiled_by"] == "model builder"
    assert "top1" in summary["metrics"]
    with pytest.raises(ConfigError, match=r"compiled the model with SGD at learning rate 0.2; "
                                          r"the config also names optimizer.lr=0.05"):
        train(tiny_config(*COMPILED, "optimizer.lr=0.05"), run_dir=tmp_path / "lr")
    assert not (tmp_path / "lr").exists()


@SHARES_RUNS
def test_losses_a_model_adds_in_its_forward_pass_are_named_on_several_replicas(tiny_config,
                                                                               tmp_path,
                                                                               trained):  # noqa: F811
    """Each replica's forward-pass losses are of its share of the batch, taken as Keras
    takes them under a strategy: the summary says so where it matters (several replicas)."""
    from trainer.run.end.summary import format_summary

    model = ["model._target_=parity_task.activity_model",
             "dataset._target_=parity_task.dict_inputs"]
    one, _ = run(tiny_config, tmp_path, 1, *model)
    two, _ = run(tiny_config, tmp_path, 2, *model)
    assert one["forward_losses"] is None
    assert "divided by 2, as Keras takes them under a strategy" in two["forward_losses"]
    assert "own losses" in format_summary(two)
    plain, _ = trained(2, *DICT)  # tests/test_parity.py's run, where it runs in this process
    assert plain["forward_losses"] is None
