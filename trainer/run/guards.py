"""The guards of a run: the disk space it needs checked before it writes, and a failure
turned into the error a user reads: a full disk (with what the run needed), an image that
does not decode (the file named), a damaged disk cache (its file named), a lost worker of a
cluster (with where the backup is)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainer.config.errors import EXIT_INTERRUPTED, ConfigError, WorkerLost
from trainer.data.caching import damaged_cache
from trainer.data.pipeline import data_failure
from trainer.distribute.cluster import Cluster
from trainer.distribute.multiworker import backup_place, lost_message, peer_failure
from trainer.distribute.restarts import PROGRESS, requeue_left, write_progress
from trainer.internals.keras_optimizer import uses_ema
from trainer.rundir.space import check_free_space, disk_full, full_message, needed_bytes


def check_space(run: Any, run_dir: Path, export: tuple[str, ...], saving: Any = None) -> int:
    """The bytes the run will write at its peak, checked against the free space (the
    chief's, which writes the run directory), the k best checkpoints and the averaged
    model of `saving` (the checkpoint config) counted; the optimizer must be built."""
    needed = needed_bytes(run.model, export=export,
                          checkpoints=more_checkpoints(saving, run.model.optimizer))
    if run.is_chief:
        check_free_space(run_dir, needed)
    return needed


def more_checkpoints(saving: Any, optimizer: Any) -> int:
    """Checkpoints beyond best and last at the peak: the k best and a new one's temporary
    file before the worst is dropped; `averaged.keras` and its temporary file."""
    if saving is None:
        return 0
    kept = saving.keep_best + 1 if saving.keep_best else 0
    averaged = saving.average_best or (optimizer is not None and uses_ema(optimizer))
    return kept + (2 if averaged else 0)


def say_progress(backup: Any, steps_per_epoch: int, cluster: Cluster | None) -> None:
    """A failing chief under a restarting launcher (`trainer.launch --max-restarts`) tells
    it the step it reached, from which it counts the steps a restart trains again.

    Args:
        backup: the run's `Backup` callback (its epoch and the last step it saw).
        steps_per_epoch: the run's steps per epoch.
        cluster: the multi-worker cluster, or None.
    """
    path = os.environ.get(PROGRESS)
    if not path or not (cluster is None or cluster.is_chief):
        return
    try:
        write_progress(path, backup.epoch, backup.reached, steps_per_epoch)
    except OSError:
        pass  # the count is a report; the failure itself is what the user must read


def translate(error: Exception, run: Any, run_dir: Path, needed: int,
              cluster: Cluster | None, epoch: int | None) -> None:
    """Raises the error a user reads where the failure has one; returns otherwise.

    Args:
        error: what the run raised.
        run: the assembled run (None: it failed before).
        run_dir: where the run writes.
        needed: the bytes `check_space` asked for.
        cluster: the multi-worker cluster, or None.
        epoch: the epoch the backup holds (None: no callbacks yet).
    """
    chief = cluster is None or cluster.is_chief
    damaged = damaged_cache(error, run_dir)  # before the source's own reading of its files
    if damaged is not None:
        raise damaged from None
    if run is not None:
        if chief and not isinstance(error, ConfigError) and disk_full(error):
            raise ConfigError(full_message(run_dir, needed)) from error
        bad_data = data_failure(run.data.source, error)  # an image that does not decode
        if bad_data is not None:
            raise bad_data from None
    if cluster is not None and cluster.num_workers > 1 and peer_failure(error):
        lost = WorkerLost(lost_message(error, cluster, epoch, backup_place(run_dir, chief)))
        if requeue_left(cluster.max_restarts, dict(os.environ)):
            lost = WorkerLost(f"{lost}; exit 75 (cluster.max_restarts="
                              f"{cluster.max_restarts}): the scheduler starts every worker "
                              "again from the last backup")
            lost.exit_code = EXIT_INTERRUPTED
        raise lost from error
