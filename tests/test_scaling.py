"""Batch sizes, the learning-rate rule and warm-up: exact values."""

from __future__ import annotations

import math

import pytest

from trainer.config.errors import ConfigError
from trainer.plan.scaling import (
    BatchPlan,
    plan_batch,
    scaled_learning_rate,
    steps_per_epoch,
    warmup_steps,
)
from trainer.plan.schedule import WarmupSchedule, keras_schedule


def test_per_replica_is_weak_scaling():
    assert plan_batch(64, None, 1) == BatchPlan(64, 64, 1)
    assert plan_batch(64, None, 4) == BatchPlan(64, 256, 4)


def test_global_size_is_strong_scaling():
    assert plan_batch(None, 256, 4) == BatchPlan(64, 256, 4)
    assert plan_batch(None, 256, 1) == BatchPlan(256, 256, 1)


def test_global_size_must_divide_evenly():
    with pytest.raises(ConfigError, match="batch.global_size=100 does not divide evenly over 3 "
                                          "replicas; use a multiple of 3: 99 or 102"):
        plan_batch(None, 100, 3)


def test_accumulation_multiplies_the_global_batch_of_per_replica():
    assert plan_batch(32, None, 2, accumulate=4) == BatchPlan(32, 256, 2, 4)
    assert plan_batch(32, None, 2, accumulate=4).shards == 8
    assert plan_batch(32, None, 2, accumulate="auto", max_per_replica=32) == BatchPlan(32, 64, 2)


def test_accumulation_splits_a_global_size():
    assert plan_batch(None, 128, 1, accumulate=4) == BatchPlan(32, 128, 1, 4)
    assert plan_batch(None, 128, 2, accumulate=2) == BatchPlan(32, 128, 2, 2)
    assert plan_batch(None, 128, 4, accumulate=1) == BatchPlan(32, 128, 4, 1)


@pytest.mark.parametrize("global_size, replicas, cap, expected", [
    (2048, 8, 256, BatchPlan(256, 2048, 8, 1)),   # fits: no accumulation
    (2048, 2, 256, BatchPlan(256, 2048, 2, 4)),   # the same recipe on 2 devices
    (2048, 2, 300, BatchPlan(256, 2048, 2, 4)),   # 512 > 300, 341.3 is not whole, 256 is
    (96, 2, 20, BatchPlan(16, 96, 2, 3)),         # smallest N: 48 -> 24 -> 16
    (96, 3, 5, BatchPlan(4, 96, 3, 8)),           # 32 per replica: 16, 8 too big; 32/8 = 4
    (7, 7, 1, BatchPlan(1, 7, 7, 1)),
    (126, 2, 1, BatchPlan(1, 126, 2, 63)),        # a prime split still has micro-batch 1
    (128, 4, None, BatchPlan(32, 128, 4, 1)),     # auto without a cap: no accumulation
])
def test_accumulate_auto_picks_the_smallest_whole_split(global_size, replicas, cap, expected):
    assert plan_batch(None, global_size, replicas, "auto", cap) == expected


def test_accumulate_auto_without_a_whole_split_names_the_nearest_sizes():
    with pytest.raises(ConfigError, match=r"batch.global_size=2050 has no whole split over 8 "
                                          r"replicas; the nearest valid global sizes are 2048 "
                                          r"or 2056"):
        plan_batch(None, 2050, 8, "auto", 256)
    with pytest.raises(ConfigError, match="nearest valid global sizes are 3$"):
        plan_batch(None, 2, 3, "auto", 4)


def test_explicit_accumulation_checks_the_cap_and_the_split():
    with pytest.raises(ConfigError, match="64 per replica, above batch.max_per_replica=32; "
                                          "use batch.accumulate=auto"):
        plan_batch(None, 256, 2, 2, 32)
    with pytest.raises(ConfigError, match="over 3 replicas x 4 micro-batches; use a multiple of "
                                          "12: 96 or 108"):
        plan_batch(None, 100, 3, 4)
    with pytest.raises(ConfigError, match="batch.per_replica=64 is above batch.max_per_replica=32"):
        plan_batch(64, None, 2, "auto", 32)


@pytest.mark.parametrize("per_replica, global_size", [(None, None), (32, 128)])
def test_exactly_one_batch_option(per_replica, global_size):
    with pytest.raises(ConfigError, match="exactly one of"):
        plan_batch(per_replica, global_size, 2)


@pytest.mark.parametrize("rule, global_batch, expected", [
    ("linear", 256, 0.1), ("linear", 1024, 0.4), ("linear", 64, 0.025),
    ("sqrt", 1024, 0.2), ("sqrt", 64, 0.05), ("none", 1024, 0.1),
])
def test_scaled_learning_rate(rule, global_batch, expected):
    assert scaled_learning_rate(0.1, global_batch, 256, rule) == pytest.approx(expected, rel=1e-12)


def test_unknown_scaling_rule():
    with pytest.raises(ConfigError, match="received: 'cubic'"):
        scaled_learning_rate(0.1, 256, 256, "cubic")


def test_steps_per_epoch_counts_the_partial_batch_unless_dropped():
    assert steps_per_epoch(1437, 64) == 23
    assert steps_per_epoch(1437, 64, drop_remainder=True) == 22
    assert steps_per_epoch(1280, 64) == 20
    with pytest.raises(ConfigError, match="larger than the 10 training examples"):
        steps_per_epoch(10, 64, drop_remainder=True)


def test_warmup_steps():
    assert warmup_steps(0, 23) == 0
    assert warmup_steps(2, 23) == 46
    assert warmup_steps(0.5, 20) == 10


def lr(schedule, step):
    return float(schedule(step))


def test_warmup_ramps_per_step_from_base_to_scaled():
    schedule = WarmupSchedule(base_lr=0.1, scaled_lr=0.4, warmup_steps=10, total_steps=100)
    assert lr(schedule, 0) == pytest.approx(0.1)
    assert lr(schedule, 1) == pytest.approx(0.13)
    assert lr(schedule, 5) == pytest.approx(0.25)
    assert lr(schedule, 9) == pytest.approx(0.37)
    assert lr(schedule, 10) == pytest.approx(0.4)
    assert lr(schedule, 99) == pytest.approx(0.4)


def test_cosine_decay_after_warmup():
    schedule = WarmupSchedule(0.1, 0.4, warmup_steps=10, total_steps=110, decay="cosine")
    assert lr(schedule, 10) == pytest.approx(0.4)
    assert lr(schedule, 35) == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert lr(schedule, 60) == pytest.approx(0.2)
    assert lr(schedule, 110) == pytest.approx(0.0, abs=1e-7)
    assert lr(schedule, 500) == pytest.approx(0.0, abs=1e-7)


def test_no_warmup_no_decay_is_constant():
    schedule = WarmupSchedule(0.1, 0.2, warmup_steps=0, total_steps=50)
    assert [lr(schedule, s) for s in (0, 7, 49)] == pytest.approx([0.2, 0.2, 0.2])


def test_schedule_round_trips_through_its_config():
    schedule = WarmupSchedule(0.1, 0.4, 10, 110, "cosine")
    again = WarmupSchedule.from_config(schedule.get_config())
    steps = (0, 5, 40)
    assert [lr(again, s) for s in steps] == pytest.approx([lr(schedule, s) for s in steps])


@pytest.mark.parametrize("arguments, kind", [
    ((0.1, 0.2, 0, 120, "none"), "float"),
    ((0.1, 0.4, 10, 120, "none"), "CosineDecay"),
    ((0.1, 0.4, 10, 120, "cosine"), "CosineDecay"),
    ((0.1, 0.4, 0, 120, "cosine"), "CosineDecay"),
    ((0.4, 0.1, 30, 20, "cosine"), "CosineDecay"),  # warm-up longer than the run, downwards
    ((0.1, 0.4, 0, 120, "exponential", 0.5, 7, True), "ExponentialDecay"),
    ((0.1, 0.4, 0, 120, "exponential", 0.5, 7, False), "ExponentialDecay"),
    ((0.1, 0.4, 10, 120, "exponential", 0.5, 7, True), "WarmupSchedule"),
])
def test_the_optimizers_schedule_is_kerass_own_where_keras_has_it(arguments, kind):
    """A run's optimizer gets Keras's built-in schedule (so its checkpoint loads with Keras
    alone) wherever one gives WarmupSchedule's rate at every step: only an exponential decay
    after a warm-up keeps trainer's."""
    reference, schedule = WarmupSchedule(*arguments), keras_schedule(*arguments)
    assert type(schedule).__name__ == kind
    if kind != "WarmupSchedule":
        assert type(schedule).__module__.split(".")[0] in ("keras", "builtins")
    steps = range(0, 3 * arguments[3])
    found = [schedule if isinstance(schedule, float) else lr(schedule, s) for s in steps]
    assert found == pytest.approx([lr(reference, s) for s in steps], rel=1e-6, abs=1e-9)


def test_balanced_batch_sizes():
    from trainer.plan.scaling import balanced_batch_sizes

    assert balanced_batch_sizes(48, 24, 3) is None  # no partial batch
    assert balanced_batch_sizes(53, 24, 3) is None  # last batch of 5 >= 3 replicas
    # 50 = 24 + 24 + 2: two examples cannot feed three replicas; move one from the batch before.
    assert balanced_batch_sizes(50, 24, 3) == [24, 23, 3]
    assert balanced_batch_sizes(1437, 256, 4) is None
    assert sum(balanced_batch_sizes(1025, 256, 4)) == 1025
    with pytest.raises(ConfigError, match="2 examples cannot feed 4 replicas"):
        balanced_batch_sizes(2, 16, 4)


def test_exponential_staircase_decay_after_warmup():
    schedule = WarmupSchedule(0.1, 0.2, warmup_steps=4, total_steps=100, decay="exponential",
                              decay_rate=0.5, decay_steps=10, staircase=True)
    assert lr(schedule, 2) == pytest.approx(0.15)
    assert lr(schedule, 4) == pytest.approx(0.2)
    assert lr(schedule, 13) == pytest.approx(0.2)
    assert lr(schedule, 14) == pytest.approx(0.1)
    assert lr(schedule, 34) == pytest.approx(0.025)
    smooth = WarmupSchedule(0.2, 0.2, 0, 100, "exponential", 0.5, 10, staircase=False)
    assert lr(smooth, 5) == pytest.approx(0.2 * 0.5 ** 0.5)


def test_more_micro_batches_than_examples_is_one_line_speaking_of_micro_batches(tmp_path):
    """batch.accumulate=1000000 was a 105-line traceback ending in '1437 examples cannot feed
    1000000 replicas' (raised inside tf.data's tracing); refused before any batch is built,
    the run directory removed."""
    from tests.conftest import error_lines, run_main
    from trainer.plan.scaling import check_micro_batches

    out = run_main("batch.accumulate=1000000", "epochs=1", "verbose=0", "logger=[]",
                   "dataset.image_size=8", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2 and error_lines(out.stderr) == [
        "error: batch.accumulate=1000000 cuts each optimizer step into 1 replica x 1000000 "
        "micro-batches, more than the 1437 training examples (each micro-batch needs one); "
        "use batch.accumulate<=1437"]
    assert not (tmp_path / "run").exists()
    check_micro_batches(12, 3, 4)  # exactly one example each
    with pytest.raises(ConfigError, match=r"^batch.accumulate=5 cuts each optimizer step into 3 "
                                          r"replicas x 5 micro-batches, more than the 12 "
                                          r"training examples .*; use batch.accumulate<=4$"):
        check_micro_batches(12, 3, 5)
    with pytest.raises(ConfigError, match="^2 training examples cannot feed 4 replicas"):
        check_micro_batches(2, 4, 3)
