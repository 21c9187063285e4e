"""The `Sweeper` Hydra finds (`hydra/sweeper=trainer_optuna`); the work is in `_impl`, imported
when a sweep starts, so Hydra's scan of its plugins imports no Optuna."""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class TrainerOptunaSweeper(Sweeper):
    """Searches `params` with an Optuna study, one launch of `n_jobs` trials at a time.

    Args are the keys of `hydra.sweeper` (`config.TrainerOptunaSweeperConf`).
    """

    def __init__(self, **options: Any) -> None:
        from ._impl import OptunaSearch

        self.search = OptunaSearch(**options)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.search.setup(hydra_context=hydra_context, task_function=task_function,
                          config=config)

    def sweep(self, arguments: list[str]) -> None:
        self.search.sweep(arguments)
