"""Recovery from a loss blow-up (`checkpoint.recover`): the last backup restored, the batches
that led there skipped, up to `max_trials` times; then one line naming the step."""

from __future__ import annotations

import inspect
import json
import math
import re

import keras
import numpy as np
import pytest

from tests.test_multiworker import COMMON, assert_same_weights, launches
from trainer.config.errors import ConfigError, Diverged
from trainer.config.validate import validate
from trainer.run.train import train
from trainer.rundir.recover import Recovery

RECOVER = ["checkpoint.backup_every=4", "checkpoint.nan_check_every=1", "deterministic=true",
           "batch.per_replica=32"]


class BlowUpAt(keras.callbacks.Callback):
    """Sends the weights to infinity after the given steps (1-based) of the first epoch, as a
    bad batch or a huge rate would: the next step's loss is NaN."""

    def __init__(self, *steps: int) -> None:
        super().__init__()
        self.steps, self.epoch = set(steps), 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 0 and batch + 1 in self.steps:
            self.steps.discard(batch + 1)
            for variable in self.model.trainable_variables:
                variable.assign(variable * np.inf)


def test_a_blown_up_loss_restores_the_last_backup_skips_its_batches_and_finishes(
        tiny_config, tmp_path):
    summary = train(tiny_config(*RECOVER, "checkpoint.recover.max_trials=2"),
                    run_dir=tmp_path, callbacks=[BlowUpAt(6)])
    [found] = summary["recovered"]
    assert math.isnan(found.pop("loss"))
    assert found == {"epoch": 1, "step": 7, "restored": "ckpt-000000-000000004",
                     "skipped": [5, 7]}
    assert math.isfinite(summary["train_metrics"]["loss"])
    assert summary["epochs_done"] == 1 and math.isfinite(summary["validation_metrics"]["loss"])
    # every file is strict JSON (Python's json writes NaN, which other parsers refuse): the
    # blown-up loss is null, and the note says what it was
    written = _strict(tmp_path / "summary.json")
    assert written["recovered"][0]["loss"] is None
    assert written["non_finite"] == {"recovered/0/loss": "NaN"}
    for state in tmp_path.glob("backup/*/state.json"):
        _strict(state)


def _strict(path):
    def refused(constant):
        raise AssertionError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refused)


def test_a_recovery_is_still_named_after_a_stop_and_a_resume(tiny_config, tmp_path):
    from tests.test_preemption import NoticeAt
    from trainer.config.errors import Interrupted

    config = tiny_config(*RECOVER, "checkpoint.recover.max_trials=2")
    with pytest.raises(Interrupted):
        train(config, run_dir=tmp_path, callbacks=[BlowUpAt(6), NoticeAt(9)])
    summary = train(config, run_dir=tmp_path)
    assert summary["resumed_from"]["step"] == 10  # the notice is read at the next step
    assert [found["step"] for found in summary["recovered"]] == [7]


def test_blow_ups_past_max_trials_stop_in_one_line_naming_the_step(tiny_config, tmp_path):
    with pytest.raises(Diverged) as stopped:
        train(tiny_config(*RECOVER, "checkpoint.recover.max_trials=1"), run_dir=tmp_path,
              callbacks=[BlowUpAt(6, 10)])
    line = str(stopped.value)
    assert "\n" not in line
    assert line.startswith("loss became nan at epoch 1, step 11, after 1 recovery (epoch 1 "
                           "step 7; checkpoint.recover.max_trials=1)"), line


def test_without_recovery_a_blow_up_still_stops_the_run(tiny_config, tmp_path):
    with pytest.raises(Diverged, match="loss became nan at epoch 1, step 7"):
        train(tiny_config(*RECOVER), run_dir=tmp_path, callbacks=[BlowUpAt(6)])


def test_what_counts_as_a_blow_up():
    off, bounded = Recovery(10.0, 0), Recovery(10.0, 3)
    assert off.blown_up(float("nan")) and not off.blown_up(11.0)  # the bound needs recovery
    assert bounded.blown_up(11.0) and bounded.blown_up(float("inf"))
    assert not bounded.blown_up(9.5) and not Recovery(None, 3).blown_up(1e6)
    assert bounded.trials_left()
    for step in (5, 9, 13):
        bounded.record(1, step, 12.0, "ckpt-000000-000000004", 4)
    assert not bounded.trials_left()
    assert bounded.recovered[-1]["skipped"] == [5, 13]


@pytest.mark.parametrize(("override", "named"), [
    ("checkpoint.recover.max_trials=-1", "checkpoint.recover.max_trials must be a whole number"),
    ("checkpoint.recover.loss_upper_bound=inf", "checkpoint.recover.loss_upper_bound must be "
                                                "a finite number")])
def test_bad_recover_settings_are_one_line(tiny_config, override, named):
    with pytest.raises(ConfigError, match=named):
        validate(tiny_config(override))


def blow_up_module() -> str:
    """A worker's callback module: `BlowUpAt`'s own source, built from the config
    (`+callbacks.blowup.*`)."""
    return ("import keras\nimport numpy as np\n\n\n" + inspect.getsource(BlowUpAt)
            + "\n\nclass BlowUp(BlowUpAt):\n    def __init__(self, step):\n"
            "        super().__init__(step)\n")


@pytest.mark.multiworker
def test_two_workers_recover_from_a_blow_up_together_as_one_device_does(
        tmp_path, launches, tiny_config):
    """Both workers see the loss blow up at one step, restore the same backup and skip the
    same batches: the run ends with exit 0 and one device's weights (1e-5), and the chief's
    summary names the recovery."""
    (tmp_path / "blowup.py").write_text(blow_up_module())
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=1", "optimizer.lr=0.01",
             "deterministic=true", "checkpoint.backup_every=4", "checkpoint.nan_check_every=1",
             "checkpoint.recover.max_trials=2"]
    run_dir = tmp_path / "run"
    launch = launches(2, *COMMON, *batch, "+callbacks.blowup._target_=blowup.BlowUp",
                      "+callbacks.blowup.step=6", f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    written = _strict(run_dir / "summary.json")
    [found] = written["recovered"]
    assert found.pop("loss") is None and written["non_finite"] == {"recovered/0/loss": "NaN"}
    assert found == {"epoch": 1, "step": 7, "restored": "ckpt-000000-000000004",
                     "skipped": [5, 7]}
    one = tmp_path / "one"
    alone = train(tiny_config(*COMMON, "devices=1", "loop=custom", *batch),
                  run_dir=one, callbacks=[BlowUpAt(6)])
    assert [r["skipped"] for r in alone["recovered"]] == [[5, 7]]
    assert_same_weights(run_dir, one, atol=1e-5)


__all__ = ["launches"]  # the fixture, imported for the test above


@pytest.mark.parametrize("overrides, said", [
    (["checkpoint.recover.loss_upper_bound=0", "checkpoint.recover.max_trials=2"],
     "checkpoint.recover.loss_upper_bound must be a positive loss"),
    (["checkpoint.recover.loss_upper_bound=-1", "checkpoint.recover.max_trials=2"],
     "checkpoint.recover.loss_upper_bound must be a positive loss"),
    (["checkpoint.recover.loss_upper_bound=5"],
     "checkpoint.recover.loss_upper_bound=5.0 is a bound for recovery, which "
     "checkpoint.recover.max_trials=0 turns off"),
    (["callbacks=[terminate_on_nan]", "checkpoint.recover.max_trials=2"],
     "callbacks terminate_on_nan stops training at the first non-finite loss, before "
     "checkpoint.recover can restore a backup"),
])
def test_recovery_settings_that_cannot_work_are_one_line(tiny_config, tmp_path, overrides,
                                                         said):
    """A bound of 0 or below, a bound with recovery off (silently ignored), and Keras's own
    NaN stop beside recovery (which ended the run after one recovery, exit 0, unsaid)."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        train(tiny_config(*overrides), run_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_terminate_on_nan_object_beside_recovery_is_one_line(tmp_path):
    import trainer

    x = np.random.default_rng(0).random((32, 8, 8, 1), "float32")
    with pytest.raises(trainer.TrainerError, match="TerminateOnNaN"):
        trainer.fit(["model=small", "epochs=1", "logger=[]", "checkpoint.recover.max_trials=2"],
                    data=(x, np.arange(32) % 3), run_dir=tmp_path / "run",
                    callbacks=[keras.callbacks.TerminateOnNaN()])


def test_a_finite_loss_above_the_bound_names_the_bound(tiny_config, tmp_path):
    """A bound below the loss a normal step reaches: the stop names the bound, not the
    rate."""
    with pytest.raises(Diverged) as stopped:
        train(tiny_config(*RECOVER, "checkpoint.recover.max_trials=1",
                          "checkpoint.recover.loss_upper_bound=1e-3"), run_dir=tmp_path)
    line = str(stopped.value)
    assert "above checkpoint.recover.loss_upper_bound=0.001" in line
    assert "raise checkpoint.recover.loss_upper_bound" in line
