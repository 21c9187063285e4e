"""The exact training step both loops run (`trainer.run.assembly.step`, or the micro-batch step of
`trainer.run.assembly.accumulate`), or the model's own step where its class defines one."""

from __future__ import annotations

from typing import Any

from trainer.config.errors import ConfigError
from trainer.internals.keras_step import build_from_one_replica, evaluate_one_step_per_call
from trainer.run.assembly.accumulate import accumulating_train_step
from trainer.run.assembly.step import (
    as_keras_passes,
    exact_test_step,
    exact_train_step,
    keeps_own_step,
    steps_in_chunks,
)


def install_step(model: Any, loop: str, accumulate: int,
                 steps_per_execution: int) -> tuple[tuple, bool]:
    """Installs the exact training and test steps (`trainer.run.assembly.step`) that `fit` and the
    custom loop both run per replica (a model's own `compute_loss` is called by them); a
    model whose class defines its own `train_step` keeps it (its author decided what a step
    is), unless micro-batches would replace it (refused).

    Returns:
        (callbacks `fit` needs for the installed step (several steps per call), or ();
        whether the model runs its own `train_step`).
    """
    own = keeps_own_step(model)
    name = type(model).__name__
    if own and accumulate > 1:
        raise ConfigError(f"model class {name} defines its own train_step; batch.accumulate="
                          f"{accumulate} would replace it with trainer's micro-batch step; "
                          "use batch.accumulate=1")
    if not own:
        model.train_step = (accumulating_train_step(model, accumulate) if accumulate > 1
                            else exact_train_step(model))
    else:
        model.train_step = as_keras_passes(model.train_step)
    model.test_step = exact_test_step(model)
    if loop != "fit":
        return (), own
    build_from_one_replica(model)
    if steps_per_execution == 1:
        return (), own
    evaluate_one_step_per_call(model)
    return (steps_in_chunks(model, steps_per_execution),), own
