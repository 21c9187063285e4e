"""The exact training step both loops run (`trainer.run.step`, or the micro-batch step of
`trainer.run.accumulate`), or the model's own step where its class defines one."""

from __future__ import annotations

from typing import Any

from trainer.config.errors import ConfigError
from trainer.run.accumulate import accumulating_train_step
from trainer.run.step import (
    build_from_one_replica,
    evaluate_one_step_per_call,
    exact_test_step,
    exact_train_step,
    keeps_own_step,
    steps_in_chunks,
)


def install_step(model: Any, loop: str, accumulate: int, steps_per_execution: int) -> tuple:
    """Installs the exact training and test steps (`trainer.run.step`) that `fit` and the
    custom loop both run per replica; a model whose class defines its own `train_step` or
    `compute_loss` keeps it (its author decided what a step is), unless micro-batches would
    replace it (refused).

    Returns:
        Callbacks `fit` needs for the installed step (several steps per call), or ().
    """
    own = keeps_own_step(model)
    name = type(model).__name__
    if own is not None and accumulate > 1:
        raise ConfigError(f"model class {name} defines its own {own}; batch.accumulate="
                          f"{accumulate} would replace it with trainer's micro-batch step; "
                          "use batch.accumulate=1")
    if own is None:
        model.train_step = (accumulating_train_step(model, accumulate) if accumulate > 1
                            else exact_train_step(model))
    model.test_step = exact_test_step(model)
    if loop != "fit":
        return ()
    build_from_one_replica(model)
    if steps_per_execution == 1:
        return ()
    evaluate_one_step_per_call(model)
    return (steps_in_chunks(model, steps_per_execution),)
