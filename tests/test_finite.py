"""No silent NaN, no absurd value: non-finite inputs, rates and weights are one line each."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import error_lines, make_config, run_main
from trainer.config.errors import ConfigError, Diverged
from trainer.config.validate import validate
from trainer.data.pipeline import Prep, non_finite_found, prepare
from trainer.plan.scaling import scaled_learning_rate, warmup_steps
from trainer.rundir.backup import Backup, BackupStore, StopRequest

QUIET = ["epochs=1", "verbose=0", "logger=[]", "model=small"]


@pytest.mark.parametrize("overrides, message", [
    (["optimizer.lr=inf"], "optimizer.lr must be a finite number; received: inf"),
    (["optimizer.lr=1e400"], "optimizer.lr must be a finite number; received: inf"),
    (["optimizer.warmup_epochs=nan"], "optimizer.warmup_epochs must be a finite number"),
    (["strategy.timeout_s=inf"], "strategy.timeout_s must be a finite number"),
    (["class_weight={0: 1, 1: inf}"], "class_weight.1 must be a finite number"),
    (["tune=lr", "tuner.lr_max=inf"], "tuner.lr_max must be a finite number"),
    (["tune=lr", "tuner.lr_min=1e-320", "tuner.lr_max=1e300"],
     "tuner.lr_max / tuner.lr_min must be a finite ratio"),
    (["loss_weights=-1.0"], "loss_weights must be non-negative"),
    (["loss_weights={a: 1, b: -0.5}"], "received: {'a': 1, 'b': -0.5}"),
])
def test_infinite_rates_and_negative_loss_weights_are_refused(overrides, message):
    with pytest.raises(ConfigError) as info:
        validate(make_config(*overrides))
    assert message in str(info.value)


def test_zero_loss_weights_stay_valid():
    validate(make_config("loss_weights={a: 1, b: 0}"))


def test_a_scaled_rate_or_a_warm_up_that_overflows_is_refused():
    with pytest.raises(ConfigError, match=r"optimizer.lr=1e\+308 scaled to the global batch "
                                          r"512 .*overflows a float"):
        scaled_learning_rate(1e308, 512, 256, "linear")
    with pytest.raises(ConfigError, match=r"optimizer.warmup_epochs=1e\+300 is 1e\+301 steps"):
        warmup_steps(1e300, 10)
    assert warmup_steps(1.5, 10) == 15


def read_failure(dataset: tf.data.Dataset) -> tuple[str, int, str] | None:
    try:
        for _ in dataset:
            pass
    except tf.errors.InvalidArgumentError as error:
        return non_finite_found(error)
    return None


def test_a_non_finite_value_is_named_by_split_row_and_part_as_it_is_read():
    x = np.zeros((8, 3), "float32")
    x[5, 1], x[6, 0] = np.nan, np.inf
    y = np.arange(8)
    found = read_failure(prepare(tf.data.Dataset.from_tensor_slices((x, y)),
                                 Prep(role="validation")))
    assert found == ("validation", 5, "features")
    targets = np.ones(8, "float32")
    targets[2] = -np.inf
    named = {"num": np.zeros((8, 2), "float32"), "cat": np.zeros((8, 1), "int32")}
    named["num"][7, 0] = np.nan
    assert read_failure(prepare(tf.data.Dataset.from_tensor_slices((named, targets)),
                                Prep(cache="none", role="train"))) == ("train", 2, "targets")
    targets[2] = 1
    assert read_failure(prepare(tf.data.Dataset.from_tensor_slices((named, targets)),
                                Prep(cache="none", role="train"))) == ("train", 7, "features num")


def test_finite_inputs_pass_unchanged_and_integer_or_unnamed_splits_add_no_step():
    x = np.arange(12, dtype="float32").reshape(4, 3)
    dataset = prepare(tf.data.Dataset.from_tensor_slices((x, np.arange(4))), Prep(role="train"))
    first = [a.numpy() for a, _ in dataset]
    np.testing.assert_array_equal(np.stack(first), x)
    # Integer parts cannot be non-finite, and prediction's inputs (no role) are not checked:
    # neither adds a step.
    plain = tf.data.Dataset.from_tensor_slices((x.astype("int32"), np.arange(4)))
    assert prepare(plain, Prep(cache="none", role="train")) is plain
    floats = tf.data.Dataset.from_tensor_slices((x, np.arange(4)))
    assert prepare(floats, Prep(cache="none")) is floats


def test_the_nan_guard_reads_the_validation_loss_at_an_epochs_end(tmp_path):
    guard = Backup(BackupStore(tmp_path / "backup"), 0, 10, StopRequest())
    guard.on_epoch_begin(0)
    guard._check({"loss": 0.5, "val_loss": 0.4}, None)
    with pytest.raises(Diverged, match="val_loss became nan at epoch 1 end; no backup"):
        guard._check({"loss": 0.5, "val_loss": math.nan}, None)
    with pytest.raises(Diverged, match="val_label_loss became inf"):
        guard._check({"loss": 0.5, "val_label_loss": math.inf}, None)


NAN_DATA = """
import numpy as np

from trainer.data.pipeline import Source


def load(row=17, **_):
    rng = np.random.default_rng(0)
    x, y = rng.random((96, 8, 8, 1), dtype=np.float32), rng.integers(0, 3, 96)
    x[row, 2, 3, 0] = np.nan
    return Source.from_arrays(x[:64], y[:64], x[64:], y[64:], num_classes=3)
"""


@pytest.mark.parametrize("overrides, message", [
    (["dataset._target_=nan_data.load"], "error: dataset nan_data.load: its train split holds "
                                         "NaN or inf in its features, first at row 17"),
    # the first validation batch, read before training to check the loss on it, too
    (["dataset._target_=nan_data.load", "+dataset.row=64"], "error: dataset nan_data.load: "
     "its validation split holds NaN or inf in its features, first at row 0"),
    (["optimizer.lr=inf"], "error: optimizer.lr must be a finite number; received: inf"),
    (["loss_weights=-1.0"], "error: loss_weights must be non-negative"),
])
def test_nan_inputs_an_infinite_rate_and_a_negative_loss_weight_are_one_line(
        tmp_path, overrides, message):
    (tmp_path / "nan_data.py").write_text(NAN_DATA)
    run_dir = tmp_path / "run"
    out = run_main(*QUIET, *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert not run_dir.exists()
