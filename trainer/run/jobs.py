"""Sweeps from the command line's side: each job of a sweep re-run in a process of its own
(TensorFlow's devices are set once per process), the sweeper's direction checked against
the optimized metric before the first job. A decide module: no TensorFlow."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from trainer.config.compose import KNOWN_ERRORS, compose_from_args
from trainer.config.errors import ConfigError
from trainer.distribute.cluster import resolve_cluster
from trainer.track.sweep import CHILD_ENV, direction, in_sweep, run_job_in_subprocess


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
                                  cfg.cluster.port_base)
    except ConfigError:
        cluster = None  # the job itself says what is wrong, and fails this trial only
    return run_job_in_subprocess(cfg, full_error, cluster)


def check_sweep_direction(args: list[str]) -> None:
    """Refuses a sweeper direction against the optimized metric before the first job.

    Composed from the overrides every job shares (the swept ones left out): where those
    alone do not compose or resolve (`optimizer=sgd,rmsprop optimizer.momentum=0.9`), each
    job composes and checks its own config instead.
    """
    try:
        cfg = compose_from_args(args)
        metric = cfg.get("optimized_metric") if cfg is not None else None
    except (*KNOWN_ERRORS, ValueError):
        return
    if metric:
        direction(metric, cfg.hydra.sweeper)
