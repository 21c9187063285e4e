"""The k best checkpoints and the averaged model (`checkpoint.keep_best`, `average_best`,
`optimizer.ema`).

`keep_best=3` leaves three checkpoints, the three best epochs by the monitored metric, named
by epoch and value and hashed like the others; `average_best=3` tests their element-wise
mean once and saves it as `averaged.keras`; `optimizer.ema=true` under two replicas, with
Keras's `fit` and with trainer's own loop, saves and tests the optimizer's moving average,
which is the average of the weights every step trained (recomputed here from them), not the
raw weights; a resumed run keeps the same ones as an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.conftest import make_config
from tests.test_resume import SigtermAt
from trainer.config.errors import ConfigError, Interrupted
from trainer.evaluate import evaluate_run, load_checkpoint
from trainer.run.end.summary import format_summary
from trainer.run.prepare.preflight import check_config
from trainer.run.prepare.reopen import checkpoint_of
from trainer.run.train import train
from trainer.rundir.checkpoint import KeptBest
from trainer.rundir.checksum import sha256
from trainer.rundir.layout import RunDir
from trainer.rundir.resume import check_resume

TINY = ["verbose=0", "dataset.image_size=8", "logger=[]", "model=small"]
BEST = [*TINY, "epochs=5", "checkpoint.monitor=val_loss", "checkpoint.keep_best=3",
        "checkpoint.average_best=3", "export=[saved_model]", "checkpoint.export_with=averaged"]


def _trained(run_dir: Path, *overrides: str, callbacks=()) -> dict:
    """A run in code, its config recorded as a command-line run's (for `trainer.evaluate`)."""
    cfg = make_config(*overrides)
    summary = train(cfg, run_dir, callbacks=callbacks)
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    return summary


def _kept(layout: RunDir, k: int = 2, done: int = 0, mode: str = "min") -> KeptBest:
    found = KeptBest(layout, k, "val_loss", mode, done)
    layout.checkpoints.mkdir(parents=True, exist_ok=True)  # as the run's callbacks do
    return found


def _write(kept: KeptBest, epoch: int, value: float) -> Path | None:
    path = kept.place(epoch, value)
    if path is not None:
        path.write_text(f"epoch {epoch}")
        kept.add(path, epoch, value)
    return path


def test_the_list_keeps_the_k_best_and_removes_the_rest(tmp_path):
    layout = RunDir(tmp_path)
    kept = _kept(layout)
    assert not layout.holds_run()  # nothing written before the first epoch ends
    for epoch, value in [(1, 0.5), (2, 0.4), (3, 0.7), (4, 0.4), (5, 0.1)]:
        _write(kept, epoch, value)
    assert [(r.epoch, r.value) for r in kept.kept] == [(5, 0.1), (2, 0.4)]  # a tie: the earlier
    assert sorted(p.name for p in layout.all_ranked()) == [
        "best-epoch002-val_loss0.4000.keras", "best-epoch005-val_loss0.1000.keras"]
    assert kept.place(6, float("nan")) is None
    listed = json.loads(layout.kept_best.read_text())
    assert [e["file"] for e in listed["kept"]] == ["best-epoch005-val_loss0.1000.keras",
                                                    "best-epoch002-val_loss0.4000.keras"]
    maxed = _kept(RunDir(tmp_path / "max"), mode="max")
    for epoch, value in [(1, 0.5), (2, 0.4), (3, 0.7)]:
        _write(maxed, epoch, value)
    assert [r.epoch for r in maxed.kept] == [3, 1]


def test_a_resume_keeps_the_epochs_its_backup_holds_and_removes_strays(tmp_path):
    """A kill after a new best was written, or after the list dropped one, leaves files the
    list does not name; a resume from an earlier backup drops the epochs it trains again."""
    layout = RunDir(tmp_path)
    kept = _kept(layout, k=3)
    for epoch, value in [(1, 0.5), (2, 0.4), (3, 0.3)]:
        _write(kept, epoch, value)
    listed = layout.kept_best.stat().st_mtime_ns
    assert [r.epoch for r in _kept(layout, k=3, done=3).kept] == [3, 2, 1]
    assert layout.kept_best.stat().st_mtime_ns == listed  # unchanged: not written again
    stray = layout.ranked(4, "val_loss", 0.2)
    stray.write_text("written when the kill came")
    resumed = _kept(layout, k=3, done=2)  # the backup holds epochs 1 and 2
    assert [r.epoch for r in resumed.kept] == [2, 1]
    assert sorted(p.name for p in layout.all_ranked()) == [
        "best-epoch001-val_loss0.5000.keras", "best-epoch002-val_loss0.4000.keras"]
    fewer = _kept(layout, k=1, done=2)  # keep_best lowered on the resume
    assert [r.epoch for r in fewer.kept] == [2]
    assert [p.name for p in layout.all_ranked()] == ["best-epoch002-val_loss0.4000.keras"]


@pytest.mark.parametrize("overrides, named", [
    (["checkpoint.keep_best=2", "checkpoint.average_best=3"],
     "checkpoint.average_best=3 averages the best checkpoints kept, and "
     "checkpoint.keep_best=2 keeps fewer"),
    (["checkpoint.keep_best=-1"], "checkpoint.keep_best must be a whole number >= 0"),
    (["checkpoint.keep_best=3", "checkpoint.average_best=3", "optimizer.ema=true"],
     "optimizer.ema=true and checkpoint.average_best=3 would make two averaged models"),
    (["optimizer.ema_momentum=1.5"], "optimizer.ema_momentum must be a number in [0, 1)"),
    (["optimizer.ema=maybe"], "optimizer.ema must be true or false"),
    (["checkpoint.export_with=averaged"], "checkpoint.export_with=averaged exports the "
     "averaged model, and this run keeps none"),
    (["checkpoint.export_with=best"], "checkpoint.export_with must be one of last, averaged"),
])
def test_averaging_settings_that_cannot_work_are_one_line(overrides, named):
    with pytest.raises(ConfigError) as refused:
        check_config(make_config(*TINY, *overrides))
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_checkpoint_averaged_of_a_run_without_one_names_the_way(tmp_path):
    layout = RunDir(tmp_path)
    layout.checkpoints.mkdir()
    for name in ("best", "last"):
        layout.checkpoint(name).write_text("a checkpoint")
    with pytest.raises(ConfigError, match=r"the run kept no averaged model: optimizer.ema=true "
                       r"or checkpoint.average_best=k make one\); valid: checkpoint=best or "
                       r"checkpoint=last$"):
        checkpoint_of(tmp_path, "averaged")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Five epochs keeping the three best by val_loss, their mean tested and exported."""
    run_dir = tmp_path_factory.mktemp("best") / "run"
    return run_dir, _trained(run_dir, *BEST)


def test_keep_best_3_leaves_the_best_three_named_by_epoch_and_value(finished):
    run_dir, summary = finished
    layout = RunDir(run_dir)
    losses = summary["history"]["val_loss"]
    best = sorted(range(1, len(losses) + 1), key=lambda e: (losses[e - 1], e))[:3]
    files = layout.all_ranked()
    assert [p.name for p in files] == sorted(
        f"best-epoch{e:03d}-val_loss{losses[e - 1]:.4f}.keras" for e in best)
    for path in files:  # hashed like best.keras and last.keras
        assert Path(f"{path}.sha256").read_text().strip() == sha256(path)
    assert [(k["epoch"], k["val_loss"]) for k in summary["best_checkpoints"]] == [
        (e, losses[e - 1]) for e in best]
    # best.keras is the best of them, the same bytes (a hard link, not a second write)
    assert sha256(layout.checkpoint("best")) == sha256(
        Path(summary["best_checkpoints"][0]["checkpoint"]))


def test_average_best_tests_the_mean_of_the_best_checkpoints_once(finished):
    run_dir, summary = finished
    averaged = summary["averaged"]
    assert averaged["kind"] == "best" and averaged["split"] == "test"
    assert averaged["of"] == [k["checkpoint"] for k in summary["best_checkpoints"]]
    models = [load_checkpoint(path) for path in averaged["of"]]
    mean = load_checkpoint(RunDir(run_dir).checkpoint("averaged"))
    for i, weight in enumerate(mean.get_weights()):
        expected = np.mean([m.get_weights()[i] for m in models], axis=0)
        np.testing.assert_allclose(weight, expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(mean.get_weights()[0], models[0].get_weights()[0])
    again = evaluate_run(run_dir, ["checkpoint=averaged", "split=test"])
    assert again["metrics"] == pytest.approx(averaged["metrics"], abs=1e-5)
    assert summary["test_metrics"] != averaged["metrics"]
    rows = dict(line.strip().split("  ", 1) for line in format_summary(summary).splitlines()[1:])
    assert float(rows["test (averaged) accuracy"]) == pytest.approx(
        averaged["metrics"]["accuracy"], abs=1e-5)
    assert rows["test (averaged) model"].strip() == (
        "averaged.keras (mean of the 3 best checkpoints, evaluated once)")
    assert rows["best checkpoints"].strip() == ", ".join(
        Path(k["checkpoint"]).name for k in summary["best_checkpoints"])
    assert json.loads((run_dir / "summary.json").read_text())["averaged"] == averaged


def test_export_with_averaged_serves_the_averaged_model(finished):
    import tensorflow as tf

    run_dir, summary = finished
    layout = RunDir(run_dir)
    assert summary["exported_model"] == str(layout.checkpoint("averaged"))
    x = np.random.default_rng(0).random((4, 8, 8, 1), np.float32)
    loaded = tf.saved_model.load(summary["exports"]["saved_model"])  # kept: its variables
    served = loaded.serve(x).numpy()
    averaged = load_checkpoint(layout.checkpoint("averaged")).predict(x, verbose=0)
    last = load_checkpoint(layout.checkpoint("last")).predict(x, verbose=0)
    np.testing.assert_allclose(served, averaged, atol=1e-5)
    assert not np.allclose(served, last, atol=1e-4)


class Trajectory(keras.callbacks.Callback):
    """The trainable weights after every training step (steps_per_execution=1)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[list[np.ndarray]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append([np.array(v) for v in self.model.trainable_weights])


# trainer's own loop is the heavier twin (its step traced anew): `-m long`
@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.long)])
def test_ema_under_two_replicas_is_the_average_of_every_step_and_is_what_was_tested(
        tmp_path, loop):
    momentum = 0.9
    trajectory = Trajectory()
    summary = _trained(tmp_path / "run", *TINY, "epochs=1", "accelerator=cpu", "devices=2",
                       f"loop={loop}", "steps_per_execution=1", "optimizer.ema=true",
                       f"optimizer.ema_momentum={momentum}",
                       # no best.keras to link: last.keras is written as fit ends
                       "checkpoint.save_best=false", callbacks=[trajectory])
    averaged = summary["averaged"]
    assert summary["replicas"] == 2
    assert averaged["kind"] == "ema" and averaged["momentum"] == momentum
    assert averaged["split"] == "test" and set(averaged["metrics"]) == {"accuracy", "loss"}
    # Keras's EMA: the first step's weights, then momentum * average + (1 - momentum) * new
    ema = trajectory.steps[0]
    for weights in trajectory.steps[1:]:
        ema = [momentum * a + (1 - momentum) * w for a, w in zip(ema, weights, strict=True)]
    layout = RunDir(tmp_path / "run")
    found = load_checkpoint(layout.checkpoint("averaged"))
    last = load_checkpoint(layout.checkpoint("last"))
    for saved, expected, raw, trained in zip(found.trainable_weights, ema,
                                             last.trainable_weights, trajectory.steps[-1],
                                             strict=True):
        np.testing.assert_allclose(np.array(saved), expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(np.array(raw), trained)  # last.keras: the raw weights
    assert not np.allclose(np.array(found.trainable_weights[0]), trajectory.steps[-1][0],
                           atol=1e-3)
    again = evaluate_run(tmp_path / "run", ["checkpoint=averaged", "split=test"])
    assert again["metrics"] == pytest.approx(averaged["metrics"], abs=1e-5)
    assert summary["test_metrics"] != averaged["metrics"]
    assert ("averaged.keras (EMA of the weights, momentum 0.9, evaluated once)"
            in format_summary(summary))


@pytest.mark.long  # three runs: an uninterrupted one, a stopped one and its resume
@pytest.mark.parametrize("averaging", [["checkpoint.keep_best=3", "checkpoint.average_best=3"],
                                       ["checkpoint.keep_best=2", "optimizer.ema=true"]])
def test_a_resumed_run_keeps_and_averages_what_the_uninterrupted_one_does(tmp_path,
                                                                          averaging):
    config = [*TINY, "epochs=4", "checkpoint.monitor=val_loss", "deterministic=true",
              "model.dropout=0.0", "checkpoint.backup_every=5", *averaging]
    reference = train(make_config(*config), tmp_path / "reference")
    with pytest.raises(Interrupted):
        train(make_config(*config), tmp_path / "run", callbacks=[SigtermAt(2, 7)])
    resumed = train(make_config(*config), tmp_path / "run")
    assert resumed["resumed_from"]["epoch"] == 3
    names = [Path(k["checkpoint"]).name for k in resumed["best_checkpoints"]]
    assert names == [Path(k["checkpoint"]).name for k in reference["best_checkpoints"]]
    assert sorted(p.name for p in RunDir(tmp_path / "run").all_ranked()) == sorted(names)
    expected = load_checkpoint(RunDir(tmp_path / "reference").checkpoint("averaged"))
    found = load_checkpoint(RunDir(tmp_path / "run").checkpoint("averaged"))
    for a, b in zip(expected.get_weights(), found.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert resumed["averaged"]["metrics"] == pytest.approx(reference["averaged"]["metrics"],
                                                           abs=1e-6)


def test_a_backup_from_before_weight_averaging_resumes_and_turning_it_on_is_refused():
    """A backup's config from before `optimizer.ema` was a key trained without an average;
    turning the average on (or off) on a resume would train something else."""
    old = {"optimizer": {"_target_": "keras.optimizers.Adam", "lr": 0.001}, "epochs": 2,
           "checkpoint": {"keep_best": 0}}
    state = {"epoch": 1, "step": 0, "global_batch": 64, "config": old}
    now = {**old, "epochs": 3, "checkpoint": {"keep_best": 3, "average_best": 2},
           "optimizer": {**old["optimizer"], "ema": False, "ema_momentum": 0.99}}
    assert check_resume(Path("r"), state, now) == {
        "checkpoint.average_best": [None, 2], "checkpoint.keep_best": [0, 3], "epochs": [2, 3]}
    now["optimizer"]["ema"] = True
    with pytest.raises(ConfigError, match=r"optimizer.ema from None to True"):
        check_resume(Path("r"), state, now)


def test_the_space_check_counts_the_kept_and_averaged_checkpoints():
    from types import SimpleNamespace

    from trainer.run.guards import more_checkpoints

    plain = SimpleNamespace(keep_best=0, average_best=0)
    assert more_checkpoints(plain, None) == 0
    assert more_checkpoints(SimpleNamespace(keep_best=3, average_best=2), None) == 4 + 2
    ema = keras.optimizers.Adam(use_ema=True)
    assert more_checkpoints(plain, ema) == 2
    assert more_checkpoints(plain, keras.optimizers.Adam()) == 0


def test_a_resume_with_another_monitor_leaves_the_old_ranking_alone(tmp_path):
    layout = RunDir(tmp_path)
    kept = _kept(layout)
    for epoch, value in [(1, 0.5), (2, 0.4)]:
        _write(kept, epoch, value)
    other = KeptBest(layout, 2, "val_accuracy", "max", 2)
    assert other.kept == []
    _write(other, 3, 0.9)
    assert sorted(p.name for p in layout.all_ranked()) == [
        "best-epoch001-val_loss0.5000.keras", "best-epoch002-val_loss0.4000.keras",
        "best-epoch003-val_accuracy0.9000.keras"]


def test_a_fit_result_names_the_averaged_checkpoint_and_metrics(tmp_path):
    from trainer.api import Result

    layout = RunDir(tmp_path)
    layout.checkpoints.mkdir()
    for name in ("best", "last", "averaged"):
        layout.checkpoint(name).write_text("a checkpoint")
    summary = {"validation_metrics": {"accuracy": 0.5}, "test_metrics": {"accuracy": 0.6},
               "averaged": {"split": "test", "metrics": {"accuracy": 0.7}}}
    result = Result(summary, tmp_path)
    assert sorted(result.checkpoints) == ["averaged", "best", "last"]
    assert result.metrics == {"val_accuracy": 0.5, "test_accuracy": 0.6,
                              "test_averaged_accuracy": 0.7}


def test_a_loss_scaled_optimizer_keeps_the_raw_weights_in_fit_and_swaps_in_its_average():
    """Mixed precision wraps the optimizer in Keras's LossScaleOptimizer: `fit` calls the
    wrapper, the average lives in the inner one."""
    from trainer.internals.keras_optimizer import raw_weights_kept, swap_in_ema, uses_ema

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5))
    model.compile(optimizer=optimizer, loss="mse")
    x, y = np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32)
    trajectory = Trajectory()
    with raw_weights_kept(optimizer):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[trajectory])
    assert uses_ema(optimizer) and "finalize_variable_values" not in vars(optimizer)
    for now, trained in zip(model.get_weights(), trajectory.steps[-1], strict=True):
        np.testing.assert_array_equal(now, trained)  # fit's end swapped nothing in
    swap_in_ema(optimizer)
    first, second = trajectory.steps
    for now, a, b in zip(model.get_weights(), first, second, strict=True):
        np.testing.assert_allclose(now, 0.5 * a + 0.5 * b, rtol=1e-6)
