"""The sweeper's config, `hydra/sweeper=trainer_optuna`, and its samplers and pruners as
groups (`hydra/sweeper/sampler=random`, `hydra/sweeper/pruner=median`).

The search space is written as Hydra's Optuna sweeper took it (`params:` of overrides:
`interval(a, b)`, `tag(log, interval(a, b))`, `choice(...)`, `range(a, b, step)`); samplers and
pruners are `_target_` nodes of Optuna's classes, any of their arguments beside it.
"""

# No `from __future__ import annotations`: Hydra's scan runs this module before it is in
# sys.modules, where dataclasses would look up string annotations.
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore


class Direction(Enum):
    """Whether the study minimizes or maximizes the number each trial returns."""

    minimize = 1
    maximize = 2


@dataclass
class TrainerOptunaSweeperConf:
    """`hydra.sweeper`: what the study searches and how (see docs/sweeps-and-trackers.md)."""

    _target_: str = "hydra_plugins.trainer_optuna_sweeper.sweeper.TrainerOptunaSweeper"
    # The sampler and pruner nodes reach the sweeper as nodes: it builds them, a failure as
    # one line, and hands the pruner's node to the jobs.
    _recursive_: bool = False
    # _self_ first: the chosen sampler and pruner fill the nodes below.
    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"},
                                                         {"pruner": None}])
    # An Optuna sampler: `_target_: optuna.samplers.TPESampler` and its arguments.
    sampler: Any = None
    # An Optuna pruner (`_target_: optuna.pruners.MedianPruner`, ...); null: no trial is pruned
    # (each still reports its metric per epoch to the study).
    pruner: Any = None
    direction: Direction = Direction.minimize
    # An Optuna storage URL (sqlite:///path.db, postgresql://...); null: optuna.db in the
    # sweep directory. Sweeps naming the same storage and study_name share one study.
    storage: str | None = None
    # null: the sweep directory's path (a study of its own per sweep).
    study_name: str | None = None
    n_trials: int = 20
    # Trials launched at a time (a parallel launcher runs them together).
    n_jobs: int = 1
    # The share of failed trials in a launch above which the sweep stops.
    max_failure_rate: float = 0.0
    # The search space: `key: interval(0, 1)` and the like, as command-line sweeps are written.
    params: dict[str, str] | None = None


def _register() -> None:
    store = ConfigStore.instance()
    store.store(group="hydra/sweeper", name="trainer_optuna", node=TrainerOptunaSweeperConf,
                provider="trainer")
    samplers = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler",
                "nsgaii": "NSGAIISampler", "qmc": "QMCSampler", "gp": "GPSampler"}
    for name, sampler in samplers.items():
        store.store(group="hydra/sweeper/sampler", name=name, provider="trainer",
                    node={"_target_": f"optuna.samplers.{sampler}", "seed": None})
    # The grid is made of the search space's values (discrete ones only) when the sweep starts.
    store.store(group="hydra/sweeper/sampler", name="grid", provider="trainer",
                node={"_target_": "optuna.samplers.GridSampler", "_partial_": True,
                      "seed": None})
    pruners = {"median": "MedianPruner", "percentile": "PercentilePruner",
               "hyperband": "HyperbandPruner", "successive_halving": "SuccessiveHalvingPruner",
               "threshold": "ThresholdPruner", "nop": "NopPruner"}
    for name, pruner in pruners.items():
        store.store(group="hydra/sweeper/pruner", name=name, provider="trainer",
                    node={"_target_": f"optuna.pruners.{pruner}"})


_register()
