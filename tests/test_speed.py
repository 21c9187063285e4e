"""Precision, XLA and steps per execution: the decision table, and each option applied."""

from __future__ import annotations

import keras
import pytest

from trainer.config.errors import ConfigError
from trainer.plan.speed import choose_speed
from trainer.run.train import train


@pytest.mark.parametrize("kind, cc, precision, jit", [
    ("cpu", None, "float32", False),
    ("gpu", (8, 0), "mixed_float16", "auto"),
    ("gpu", (7, 0), "mixed_float16", "auto"),
    ("gpu", (6, 1), "float32", "auto"),
])
def test_auto_decision_table(kind, cc, precision, jit):
    plan = choose_speed("auto", "auto", "auto", kind, 2, "custom", cc)
    assert (plan.precision, plan.jit_compile, plan.steps_per_execution) == (precision, jit, 1)
    assert len(plan.reasons) == 3 and all(plan.reasons)


def test_explicit_choices_win_and_are_explained():
    plan = choose_speed("mixed_bfloat16", True, 8, "cpu", 1, "fit")
    assert (plan.precision, plan.jit_compile, plan.steps_per_execution) == ("mixed_bfloat16",
                                                                           True, 8)
    assert "asked for" in plan.reasons[0]


def test_auto_steps_per_execution_says_why_it_is_one():
    plan = choose_speed("auto", "auto", "auto", "cpu", 4, "fit")
    assert plan.steps_per_execution == 1 and "no measured gain" in plan.reasons[2]


def test_xla_on_several_cpu_replicas_is_one_line_in_both_loops():
    """Each replica's whole step compiled by XLA (Keras's fit, and the custom loop that runs
    the same step) fails at its first step on 2 logical CPUs; on GPUs, or one CPU, it runs."""
    for loop in ("fit", "custom"):
        with pytest.raises(ConfigError, match="^jit_compile=true cannot run on 2 CPU replicas"):
            choose_speed("auto", True, "auto", "cpu", 2, loop)
        assert choose_speed("auto", True, "auto", "cpu", 1, loop).jit_compile is True
        assert choose_speed("auto", True, "auto", "gpu", 2, loop).jit_compile is True


@pytest.mark.parametrize("args, message", [
    (("fp8", "auto", "auto"), "precision must be one of"),
    (("auto", "maybe", "auto"), "jit_compile must be auto, true or false"),
    (("auto", "auto", 0), "steps_per_execution must be auto or a positive integer"),
])
def test_bad_speed_options(args, message):
    with pytest.raises(ConfigError, match=message):
        choose_speed(*args, "cpu", 1, "fit")


class Capture(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.seen = self.model


@pytest.mark.parametrize("loop, overrides", [
    ("fit", ["precision=mixed_bfloat16", "jit_compile=true", "steps_per_execution=3",
             "devices=1"]),
    pytest.param("custom", ["precision=mixed_float16", "jit_compile=true",
                            "steps_per_execution=3", "devices=1"],
                 marks=pytest.mark.long),  # a second XLA compile, on 2 replicas
])
def test_options_are_applied_to_the_model(tiny_config, tmp_path, loop, overrides):
    capture = Capture()
    try:
        summary = train(tiny_config("accelerator=cpu", f"loop={loop}", *overrides),
                        run_dir=tmp_path, callbacks=[capture])
    finally:
        keras.config.set_dtype_policy("float32")
    precision = overrides[0].split("=")[1]
    assert summary["precision"] == precision and summary["jit_compile"] is True
    assert summary["steps_per_execution"] == 3 and len(summary["speed_reasons"]) == 3
    model = capture.seen
    assert model.dtype_policy.name == precision
    if loop == "fit":
        assert model.jit_compile is True and model.steps_per_execution == 3
    else:
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert summary["validation_metrics"]["accuracy"] >= 0.0


def test_the_default_network_keeps_float32_outputs_under_mixed_precision():
    from trainer.models.cnn import build

    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = build((8, 8, 1), 10)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.layers[1].dtype_policy.name == "mixed_bfloat16"
    assert model.layers[-1].dtype_policy.name == "float32"  # a stable loss


def test_auto_on_cpu_is_float32_without_xla(tiny_config, tmp_path):
    summary = train(tiny_config("accelerator=cpu", "devices=1"), run_dir=tmp_path)
    assert (summary["precision"], summary["jit_compile"]) == ("float32", False)
    assert "XLA measured" in summary["speed_reasons"][1]
