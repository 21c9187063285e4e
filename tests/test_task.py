"""Bring your own task: loss, metrics, optimizer, callbacks and code from the user's project.

The regression task is the README's own-project example, read from the README itself, so the
documented example is the tested one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from tests.conftest import REPO, error_lines, make_config, run_main
from trainer.config.errors import ConfigError
from trainer.evaluate import evaluate_run
from trainer.run.train import train

QUIET = ["verbose=0", "logger=[]"]


def readme_project() -> tuple[dict[str, str], str]:
    """The files and the command of the own-project example in docs/own-task.md, verbatim."""
    text = (REPO / "docs" / "own-task.md").read_text()
    blocks = re.findall(r"<!-- own-project: (\S+) -->\n```\w*\n(.*?)```", text, re.S)
    files = {name: body for name, body in blocks if name != "command"}
    command = next(body for name, body in blocks if name == "command").strip()
    assert {"my_task.py", "conf/model/mlp.yaml", "conf/dataset/diabetes.yaml",
            "conf/experiment/diabetes.yaml"} <= set(files)
    return files, command


def write_project(root: Path, files: dict[str, str]) -> Path:
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    return root


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The README's project in a temporary directory, importable, its conf/ on the path."""
    root = write_project(tmp_path / "project", readme_project()[0])
    monkeypatch.syspath_prepend(str(root))
    return root


def own_config(root: Path, *overrides: str):
    return make_config(f"hydra.searchpath=[file://{root}/conf]", *QUIET, *overrides)


class Recorder(keras.callbacks.Callback):
    """Keeps every epoch's logs."""

    def __init__(self):
        super().__init__()
        self.epochs: list[dict] = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs or {}))


def diabetes_baseline() -> float:
    """Validation MSE of predicting the training mean (0 after standardising)."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    x, y = load_diabetes(return_X_y=True)
    _, _, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0)
    return float(np.mean(((y_val - y_train.mean()) / y_train.std()) ** 2))


def source_copy(into: Path) -> Path:
    """The checkout without .git, .venv, build/, egg-info, caches or run outputs, copied: the
    wheel is built from it, so building never writes into the checkout other tests import
    from."""
    skip = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                  "outputs", "multirun", ".pytest_cache", ".ruff_cache")
    return Path(shutil.copytree(REPO, into, ignore=skip))


def run_or_fail(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode:
        pytest.fail(f"{' '.join(command[2:5])} failed ({done.returncode}):\n"
                    f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """trainer built as a wheel and installed non-editable into a folder of its own."""
    out = tmp_path_factory.mktemp("wheel")
    source = source_copy(out / "source")
    run_or_fail([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                 "--no-build-isolation", "-w", str(out / "dist"), str(source)])
    site = out / "site"
    run_or_fail([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                 str(site), *map(str, (out / "dist").glob("*.whl"))])
    return site


@pytest.mark.long  # builds and installs a wheel; the same project trains in-process by default
def test_readme_project_trains_outside_the_repository_from_an_installed_trainer(tmp_path,
                                                                                wheel):
    files, command = readme_project()
    root = write_project(tmp_path / "elsewhere", files)
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
           "PYTHONPATH": str(wheel), "TF_CPP_MIN_LOG_LEVEL": "2"}
    where = subprocess.run([sys.executable, "-c", "import trainer; print(trainer.__file__)"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(wheel)), where.stdout  # not this checkout
    args = command.split()
    assert args[:3] == ["python", "-m", "trainer"]
    # 8 of its 40 epochs (the rest of the command as written): the installed trainer, the
    # project's conf/ and module are what is tested, and 8 epochs already learn (0.53 of the
    # 0.67 bound; 40 epochs were 30 CPU s of a 37 s test)
    out = subprocess.run([sys.executable, *args[1:], "epochs=8"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    (summary_path,) = root.glob("outputs/*/*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["replicas"] == 2 and summary["model"] == "mlp"
    assert summary["loss"] == "mean_squared_error" and summary["metrics"] == ["mae"]
    assert summary["optimizer"] == "SGD" and summary["epochs_done"] == 8
    assert summary["validation_metrics"]["loss"] < 0.8 * diabetes_baseline()
    assert set(summary["validation_metrics"]) == {"loss", "mae"}
    assert (summary_path.parent / "checkpoints" / "best.keras").is_file()


@pytest.mark.long  # builds and installs a wheel
def test_the_wheel_ships_the_optuna_sweeper_where_hydra_finds_it(tmp_path, wheel):
    """Hydra's own scan of the `hydra_plugins` namespace finds trainer's sweeper in the
    installed wheel, and the command line composes its config from there."""
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
           "PYTHONPATH": str(wheel)}
    code = ("from hydra.core.plugins import Plugins\n"
            "from hydra.plugins.sweeper import Sweeper\n"
            "import hydra_plugins.trainer_optuna_sweeper as plugin\n"
            "print(plugin.__file__)\n"
            "print(' '.join(c.__name__ for c in Plugins.instance().discover(Sweeper)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    where, found = out.stdout.strip().splitlines()
    assert where.startswith(str(wheel)), where  # not this checkout
    assert "TrainerOptunaSweeper" in found.split(), found
    out = subprocess.run([sys.executable, "-m", "trainer", "hparams_search=digits_optuna",
                          "--cfg", "hydra", "-p", "hydra.sweeper"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    sweeper = yaml.safe_load(out.stdout)
    assert sweeper["sampler"]["_target_"] == "optuna.samplers.TPESampler"
    assert sweeper["pruner"]["_target_"] == "optuna.pruners.MedianPruner"


# The regression's run as the README's project trains it, made exact: a global batch of 64
# whatever the replicas, no partial batch, no momentum, the last weights.
REGRESSION = ("experiment=diabetes", "accelerator=cpu", "epochs=3", "batch.per_replica=null",
              "batch.global_size=64", "batch.drop_remainder=true", "optimizer.momentum=0.0",
              "checkpoint.save_best=false")


def train_regression(root: Path, run_dir: Path, loop: str, replicas: int) -> list:
    """The regression trained with `loop` on `replicas` replicas: its last weights."""
    summary = train(own_config(root, *REGRESSION, f"loop={loop}", f"devices={replicas}"),
                    run_dir=run_dir)
    assert summary["replicas"] == replicas and summary["loss"] == "mean_squared_error"
    assert summary["validation_metrics"]["loss"] < diabetes_baseline()
    return keras.models.load_model(run_dir / "checkpoints" / "last.keras",
                                   compile=False).get_weights()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The regression's one-replica reference, trained once by Keras's fit: its weights."""
    root = write_project(tmp_path_factory.mktemp("project"), readme_project()[0])
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        return train_regression(root, root / "run", "fit", 1)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_regression_gives_the_same_weights_on_1_and_4_replicas(project, tmp_path, finished,
                                                               loop):
    """Any loss, not only cross-entropy, is averaged over the global batch (4 replicas:
    what 2 would show, with a quarter of the batch each): each loop on 4 replicas ends with
    the weights Keras's fit gives on one."""
    found = train_regression(project, tmp_path / loop, loop, 4)
    for a, b in zip(finished, found, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


BINARY_TASK = '''
import keras
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

from trainer.data import Source


def load(seed=None):
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.25, random_state=0)
    mean, std = x_train.mean(0), x_train.std(0)
    return Source.from_arrays(((x_train - mean) / std).astype("float32"),
                              y_train[:, None].astype("float32"),
                              ((x_val - mean) / std).astype("float32"),
                              y_val[:, None].astype("float32"))


def build(input_shape, num_outputs):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, activation="sigmoid")(x))
'''


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_binary_task_keeps_the_checkpoint_with_the_highest_auc(tmp_path, monkeypatch, loop):
    write_project(tmp_path, {"binary_task.py": BINARY_TASK,
                             "conf/model/binary.yaml": "_target_: binary_task.build\n",
                             "conf/dataset/cancer.yaml": "_target_: binary_task.load\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = own_config(tmp_path, "model=binary", "dataset=cancer", "loss=binary_crossentropy",
                     "metrics=[accuracy,auc]", "checkpoint.monitor=val_auc", f"loop={loop}",
                     "accelerator=cpu", "devices=2", "epochs=6", "optimizer.lr=0.0005")
    recorder = Recorder()
    summary = train(cfg, run_dir=tmp_path / "run", callbacks=[recorder])
    assert summary["loss"] == "binary_crossentropy" and summary["replicas"] == 2
    assert set(summary["validation_metrics"]) == {"loss", "accuracy", "auc"}
    aucs = [logs["val_auc"] for logs in recorder.epochs]
    assert len(set(np.round(aucs, 6))) > 1  # the metric moved, so the choice matters
    best = keras.models.load_model(tmp_path / "run" / "checkpoints" / "best.keras")
    data = __import__("binary_task").load()
    x, y = (np.stack([a for a, _ in data.validation.as_numpy_iterator()]),
            np.stack([b for _, b in data.validation.as_numpy_iterator()]))
    auc = keras.metrics.AUC()
    auc.update_state(y, best.predict(x, verbose=0))
    assert float(auc.result()) == pytest.approx(max(aucs), abs=1e-5)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_early_stopping_ends_the_run_and_the_summary_says_when(tmp_path, loop):
    # A rate too small to move the validation loss by min_delta: it stops improving at once.
    cfg = make_config(*QUIET, "dataset.image_size=8", "model=small", "accelerator=cpu",
                      "devices=2", f"loop={loop}", "epochs=10", "optimizer.lr=1e-9",
                      "callbacks=[early_stopping,csv_logger]",
                      "callbacks.early_stopping.patience=1",
                      "callbacks.early_stopping.min_delta=0.0001")
    summary = train(cfg, run_dir=tmp_path)
    assert summary["stopped_early"] == {"epoch": 2, "of": 10}
    assert summary["epochs_done"] == 2
    assert summary["callbacks"] == ["EarlyStopping", "CSVLogger"]
    rows = (tmp_path / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 2 and "val_loss" in rows[0]  # inside the run directory
    model = keras.models.load_model(tmp_path / "checkpoints" / "last.keras")
    assert int(model.optimizer.iterations) == 2 * summary["steps_per_epoch"]
    from trainer.run.end.summary import format_summary

    assert "stopped early after epoch 2 of 10" in format_summary(summary)


def test_adamw_with_weight_decay_and_global_clipnorm_reaches_the_model(tmp_path):
    cfg = make_config(*QUIET, "dataset.image_size=8", "model=small", "epochs=1",
                      "accelerator=cpu",
                      "devices=2", "optimizer=adamw", "optimizer.weight_decay=0.02",
                      "optimizer.global_clipnorm=0.5")
    summary = train(cfg, run_dir=tmp_path)
    assert summary["optimizer"] == "AdamW"
    optimizer = keras.models.load_model(tmp_path / "checkpoints" / "last.keras").optimizer
    assert isinstance(optimizer, keras.optimizers.AdamW)
    assert optimizer.weight_decay == pytest.approx(0.02)
    assert optimizer.global_clipnorm == pytest.approx(0.5)
    assert float(optimizer.learning_rate) == pytest.approx(0.001 * 128 / 64)


@pytest.mark.parametrize("name, cls", [("sgd", "SGD"), ("sgd_momentum_cosine", "SGD"),
                                        ("rmsprop", "RMSprop"), ("lion", "Lion"),
                                        ("adam", "Adam")])
def test_every_shipped_optimizer_builds(name, cls):
    from trainer.task.build import build_optimizer

    optimizer = build_optimizer(make_config(f"optimizer={name}").optimizer, 0.01)
    assert type(optimizer).__name__ == cls
    assert float(optimizer.learning_rate) == pytest.approx(0.01)


def test_sgd_is_keras_sgd_and_momentum_with_cosine_decay_has_its_own_name():
    """`optimizer=sgd` builds what `keras.optimizers.SGD()` is (no momentum, no warm-up, no
    decay); the summary names an optimizer's settings that are not Keras's defaults."""
    from trainer.config.schema import LrPlan
    from trainer.task.build import build_optimizer, optimizer_settings

    node = make_config("optimizer=sgd").optimizer
    plain = build_optimizer(node, 0.01)
    keras_sgd = keras.optimizers.SGD().get_config()
    assert {**plain.get_config(), "name": None} == {**keras_sgd, "name": None}
    plan = LrPlan.of(node)
    assert (plan.lr, plan.warmup_epochs, plan.decay) == (0.01, 0, "none")
    assert optimizer_settings(plain) == {}
    node = make_config("optimizer=sgd_momentum_cosine").optimizer
    assert optimizer_settings(build_optimizer(node, 0.1)) == {"momentum": 0.9}
    plan = LrPlan.of(node)
    assert (plan.lr, plan.reference_batch, plan.warmup_epochs, plan.decay) == (
        0.1, 256, 1, "cosine")


def test_a_misspelt_optimizer_argument_is_one_error(tmp_path):
    cfg = make_config(*QUIET, "optimizer=sgd", "+optimizer.momentun=0.9")
    with pytest.raises(ConfigError, match="keras.optimizers.SGD does not take.*momentun"):
        train(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, message", [
    (["loss=mean_squared_eror"], "unknown loss 'mean_squared_eror'; valid: a Keras loss name"),
    (["metrics=[acuracy]"], "unknown metric 'acuracy'; valid: a Keras metric name"),
    (["checkpoint.monitor=val_auc"],
     "checkpoint.monitor='val_auc' is not logged by this run; valid: loss, accuracy, val_loss"),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.monitor=val_los"],
     "callbacks.early_stopping.monitor='val_los' is not logged"),
    # the top-level package exists, so the pre-flight lets them by: built, they are refused
    (["+callbacks.mine._target_=keras.callbacks.EarlyStoping"],
     "callbacks.mine._target_='keras.callbacks.EarlyStoping' cannot be imported: "),
    (["+callbacks.mine._target_=trainer.nonexistent.Cb"],
     "callbacks.mine._target_='trainer.nonexistent.Cb' cannot be imported: "
     "ModuleNotFoundError: No module named 'trainer.nonexistent' (is it installed"),
])
def test_task_errors_are_one_line_and_write_nothing(tmp_path, overrides, message):
    cfg = make_config(*QUIET, "dataset.image_size=8", *overrides)
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_unknown_optimizer_on_the_command_line(tmp_path):
    out = run_main("optimizer=adamx", cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        "error: unknown optimizer 'adamx'; available: adam, adamw, lion, rmsprop, sgd, "
        "sgd_momentum_cosine"]


def test_loss_with_arguments_and_a_metric_node(tmp_path):
    cfg = make_config(*QUIET, "dataset.image_size=8", "model=small", "epochs=1",
                      "accelerator=cpu", "devices=2", "loop=custom",
                      "loss={_target_: keras.losses.SparseCategoricalCrossentropy, "
                      "ignore_class: null}",
                      "metrics=[accuracy,{_target_: keras.metrics.SparseTopKCategoricalAccuracy,"
                      " k: 3, name: top3}]")
    summary = train(cfg, run_dir=tmp_path)
    metrics = summary["validation_metrics"]
    assert set(metrics) == {"loss", "accuracy", "top3"}
    assert metrics["top3"] >= metrics["accuracy"]


def test_evaluate_on_2_replicas_gives_the_metrics_of_a_run_trained_on_1(project, tmp_path):
    cfg = own_config(project, "experiment=diabetes", "accelerator=cpu", "devices=1",
                     "epochs=2")
    run_dir = tmp_path / "run"
    summary = train(cfg, run_dir=run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    result = evaluate_run(run_dir, ["devices=2", "checkpoint=last"])
    assert result["replicas"] == 2
    assert set(result["metrics"]) == {"loss", "mae"}
    for name, value in summary["validation_metrics"].items():
        assert result["metrics"][name] == pytest.approx(value, rel=1e-5)


@pytest.mark.parametrize("override, message", [
    ("devcies=2", "Could not override 'devcies': Key 'devcies' not in 'Config'"),
    ("fooo=1", "Could not override 'fooo'"),
    ("epochs=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
])
def test_evaluate_refuses_a_bad_override_in_one_line(tmp_path, override, message, capsys):
    """In this process (the entry's own function); the first also from a fresh process."""
    from trainer.evaluate import main

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(make_config(*QUIET), run_dir / ".hydra" / "config.yaml")
    if override.startswith("devcies"):
        env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
        out = subprocess.run([sys.executable, "-m", "trainer.evaluate", str(run_dir), override],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        code, stderr = out.returncode, out.stderr
    else:
        code, stderr = main([str(run_dir), override]), capsys.readouterr().err
    assert code == 2
    lines = error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_no_string_keyed_run_state_or_callbacks_by_position():
    code = "\n".join(p.read_text() for p in (REPO / "trainer").rglob("*.py"))
    assert 'run["' not in code and "builtin[" not in code and "callbacks[1]" not in code


def test_a_hydra_job_names_its_model_and_dataset_by_their_config_choices(project, tmp_path):
    """`mlp / diabetes` (the config files chosen), not the module both come from
    (`my_task / my_task`); outside a Hydra job (`train(cfg, run_dir)`) the module it is."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from trainer.config.schema import config_dir
    from trainer.run.end.summary import format_summary
    from trainer.run.prepare.resolve import resolve

    overrides = ("experiment=diabetes", "accelerator=cpu", "devices=1", "epochs=1")
    assert resolve(own_config(project, *overrides)).choices == {}
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        job = compose("config", return_hydra_config=True, overrides=[
            f"hydra.searchpath=[file://{project}/conf]", *QUIET, *overrides])
    HydraConfig.instance().set_config(job)  # as Hydra does for the job it runs
    try:
        summary = train(own_config(project, *overrides), run_dir=tmp_path / "run")
    finally:
        HydraConfig.instance().cfg = None
    assert (summary["model"], summary["dataset"]) == ("mlp", "diabetes")
    model = keras.models.load_model(tmp_path / "run" / "checkpoints" / "last.keras",
                                    compile=False)
    assert summary["parameters"] == {"trainable": model.count_params(), "frozen": 0}
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1)
                for line in format_summary(summary).splitlines()[1:])
    assert rows["model / dataset"] == "mlp / diabetes"
    assert rows["parameters"] == f"{model.count_params():,} trainable, 0 frozen"


def test_frozen_parameters_are_every_weight_not_trained():
    from trainer.run.end.summary import _parameters

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    model.layers[-1].trainable = False
    # trainable: 4x8+8 and batch norm's scale and offset; frozen: its moving mean and
    # variance, and the last layer's 8+1
    assert _parameters(model) == {"trainable": 40 + 16, "frozen": 16 + 9}
