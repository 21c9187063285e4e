"""Sweeps from the command line's side: each job of a sweep re-run in a process of its own
(TensorFlow's devices are set once per process), the sweeper's direction checked against
the optimized metric before the first job. A decide module: no TensorFlow."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.config.compose import KNOWN_ERRORS, compose_from_args
from trainer.config.errors import ConfigError
from trainer.distribute.cluster import resolve_cluster
from trainer.rundir.remote import is_url
from trainer.track.sweep import (
    CHILD_ENV,
    check_optuna_search,
    direction,
    in_sweep,
    run_job_in_subprocess,
)


def register_sweeper() -> None:
    """Registers trainer's Optuna sweeper (`hydra/sweeper=trainer_optuna`) with Hydra where
    Hydra's scan of the `hydra_plugins` namespace did not find it: an editable install
    (`pip install -e`) maps the package through an import hook, which the scan does not
    walk. A no-op where the scan found it (a wheel's install, the source checkout)."""
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # the scan first: it re-runs a plugin module it finds
    import hydra_plugins.trainer_optuna_sweeper.config  # noqa: F401 (its configs, if unseen)
    from hydra_plugins.trainer_optuna_sweeper.sweeper import TrainerOptunaSweeper

    plugins.register(TrainerOptunaSweeper)


def is_sweep_job() -> bool:
    """Whether this process is one job of a sweep, started by `run_sweep_job`."""
    return os.environ.get(CHILD_ENV) is not None


def dispatches_jobs() -> bool:
    """Whether this Hydra job is a sweep's, to be run in a process of its own."""
    return in_sweep() and not is_sweep_job()


def run_sweep_job(cfg: DictConfig, full_error: bool) -> Any:
    """Runs this sweep job in a fresh process (`trainer.track.sweep.run_job_in_subprocess`):
    its value for the sweeper, or its summary."""
    try:
        cluster = resolve_cluster(list(cfg.cluster.workers), cfg.cluster.task_index,
                                  os.environ.get("TF_CONFIG"), os.environ,
                                  cfg.cluster.port_base, size=cfg.cluster.get("size", 0) or 0)
    except ConfigError:
        cluster = None  # the job itself says what is wrong, and fails this trial only
    return run_job_in_subprocess(cfg, full_error, cluster)


def check_sweep_direction(args: list[str]) -> None:
    """Refuses a sweeper direction against the optimized metric before the first job, a
    search by trainer's Optuna sweeper that cannot work (`check_optuna_search`), and a
    sweep's directory at a URL.

    Composed from the overrides every job shares (the swept ones left out): where those
    alone do not compose or resolve (`optimizer=sgd,rmsprop optimizer.momentum=0.9`), each
    job composes and checks its own config instead.
    """
    try:
        cfg = compose_from_args(args)
    except (*KNOWN_ERRORS, ValueError):
        return
    if cfg is None:  # --cfg, --help: no sweep runs
        return
    swept = OmegaConf.select(cfg, "hydra.sweep.dir")
    if swept is not None and is_url(swept):
        raise ConfigError(f"a sweep's directory cannot be a URL yet (hydra.sweep.dir={swept}); "
                          "sweep into a local directory, or run each job with "
                          "hydra.run.dir=URL")
    metric = cfg.get("optimized_metric")
    if metric:
        direction(metric, cfg.hydra.sweeper)
    check_optuna_search(metric, cfg.hydra.sweeper)
