"""`optimizer.reference_batch: auto`: `optimizer.lr` is the rate of the user's one-device
script (the per-replica batch, or a fixed global batch) and scales with the replicas in sync
and the accumulated micro-batches; a number keeps Goyal et al.'s meaning; an older run saved
with the number `auto` stands for resumes unchanged."""

from __future__ import annotations

import pytest

from tests.conftest import make_config
from trainer.config.schema import LrPlan
from trainer.run.prepare.resolve import resolve
from trainer.run.train import train
from trainer.rundir.resume import check_resume


def test_auto_is_one_devices_batch_and_a_number_stays():
    auto = LrPlan()
    assert auto.reference_batch == "auto"
    assert auto.reference_for(32, None) == 32  # batch.per_replica
    assert auto.reference_for(None, 256) == 256  # a fixed batch.global_size: any device count
    assert LrPlan(reference_batch=64).reference_for(32, None) == 64
    resolved = auto.resolved(32, None)
    assert (resolved.reference_batch, resolved.reference_auto) == (32, True)
    assert LrPlan(reference_batch=64).resolved(32, None).reference_auto is False
    assert "reference_auto" not in LrPlan.keys()


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd", "rmsprop", "lion"])
def test_the_optimizers_default_to_auto(optimizer):
    spec = resolve(make_config(f"optimizer={optimizer}", "batch.per_replica=32"))
    assert (spec.lr.reference_batch, spec.lr.reference_auto) == (32, True)


def test_a_bad_reference_batch_is_one_line():
    from trainer.config.errors import ConfigError
    from trainer.config.validate import validate

    for bad in ("big", 0, -64, True):
        with pytest.raises(ConfigError, match=r"optimizer.reference_batch must be auto .* "
                                              f"received: {bad!r}"):
            validate(make_config(f"optimizer.reference_batch={bad}"))


@pytest.mark.parametrize("replicas, scaled", [(1, 0.001), (2, 0.002)])
def test_the_rate_written_is_the_rate_on_one_device_and_scales_with_replicas(
        tiny_config, tmp_path, replicas, scaled):
    summary = train(tiny_config("accelerator=cpu", f"devices={replicas}",
                                "batch.per_replica=32", "optimizer.lr=0.001"), run_dir=tmp_path)
    rate = summary["learning_rate"]
    assert (rate["base"], rate["reference_batch"], rate["reference"]) == (0.001, 32, "auto")
    assert rate["scaled"] == pytest.approx(scaled)


def test_an_older_run_saved_with_the_number_auto_stands_for_resumes(tmp_path):
    def state(**optimizer):
        return {"epoch": 1, "step": 0, "config": {
            "epochs": 2, "batch": {"per_replica": 64, "global_size": None},
            "optimizer": {"lr": 0.001, **optimizer}}}

    now = {"epochs": 3, "batch": {"per_replica": 64, "global_size": None},
           "optimizer": {"lr": 0.001, "reference_batch": "auto"}}
    assert check_resume(tmp_path, state(reference_batch=64), now) == {"epochs": [2, 3]}
    from trainer.config.errors import ConfigError

    with pytest.raises(ConfigError, match="optimizer.reference_batch from 256 to 'auto'"):
        check_resume(tmp_path, state(reference_batch=256), now)
