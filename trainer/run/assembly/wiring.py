"""The callbacks of a run, wired in one place: throughput, checkpoints, the backup, the
trackers, the learning curves, a sweep job's Optuna trial, the watchdog of a multi-worker
run, then the user's.

A build module (TensorFlow is imported at the top, through the callbacks themselves).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.data.fingerprint import of_source
from trainer.distribute.multiworker import on_stuck, stop_agreement
from trainer.run.assembly.assemble import Run
from trainer.run.assembly.callbacks import (
    AtomicModelCheckpoint,
    HandOff,
    KeepBestCheckpoints,
    LastValidation,
    StepWatchdog,
    Throughput,
)
from trainer.run.prepare.resolve import Spec
from trainer.rundir.backup import Backup, BackupStore
from trainer.rundir.layout import RunDir
from trainer.task.build import build_callbacks as build_user_callbacks
from trainer.task.build import check_given_callbacks
from trainer.track.curves import Curves
from trainer.track.pruning import optuna_trial
from trainer.track.sweep import check_metric_name
from trainer.track.trackers import build_trackers


@dataclass(frozen=True)
class Callbacks:
    """A run's callbacks by role; `all` is the order Keras calls them in."""

    throughput: Any
    backup: Any
    checkpoints: tuple
    trackers: tuple
    watchdog: Any
    user: tuple
    curves: Any = None  # draws curves.png (the chief's), after the backup
    kept: Any = None  # the k best checkpoints (checkpoint.keep_best), after best.keras
    trial: Any = None  # a job of trainer's Optuna sweeper: its trial (trainer.track.pruning)
    handoff: Any = None  # with an evaluator: each epoch's backup into its inbox (the chief's)
    validated: Any = None  # the last validation in training, which the final one may reuse

    def all(self) -> list:
        """Built-in ones first (the watchdog last of them), then the user's. The backup
        follows the checkpoints: at an epoch's end it copies the best one just written; the
        curves follow the backup, whose history then holds the epoch; the Optuna trial
        follows the trackers, which log a pruned trial's last epoch too."""
        found = [self.throughput, self.validated, *self.checkpoints, self.kept, self.backup,
                 self.handoff, self.curves,
                 *self.trackers, self.trial, self.watchdog, *self.user]
        return [c for c in found if c is not None]


def _backup_meta(spec: Spec, run: Run) -> dict:
    """What every backup's `state.json` keeps of the run: its config, batch and data."""
    return {"config": spec.record, "global_batch": run.batch.global_size,
            "replicas": run.batch.replicas, "accumulate": run.batch.accumulate,
            # the chief keeps the backups: another worker need not hash the data
            "data": of_source(run.data.source) if run.is_chief else None}


def build_callbacks(spec: Spec, run: Run, run_dir: Path, started: float,
                    start: tuple[int, int], request: Any, extra: tuple = (),
                    history: dict | None = None, evaluator: bool = False, place: Any = None
                    ) -> Callbacks:
    """Throughput, backup, checkpoints, trackers, the watchdog, then the user's callbacks.

    Args:
        spec: the run's resolved config.
        run: what `assemble` built.
        run_dir: where the run writes.
        started: `time.perf_counter()` at the start of the run.
        start: (epoch, step) the run starts from.
        request: the stop request signals set.
        extra: callbacks passed to `train()` in code, after the configured ones.
        history: per-epoch metrics of the epochs done before `start` (from the backup).
        evaluator: an evaluator validates: the chief hands it each epoch (`HandOff`).
        place: the run's place at a URL (`RunPlace`) each backup reaches; None: local.
    """
    check_metric_name(spec.optimized_metric, run.logged, tested=run.data.test is not None)
    saving = spec.checkpoint
    best_mode = (run.monitor_mode(saving.monitor, saving.mode)
                 if saving.save_best or saving.keep_best else None)
    user = build_user_callbacks(spec.callbacks, run_dir, run.monitor_mode)
    given = check_given_callbacks(extra, recovering=saving.recover.max_trials > 0)
    meta = _backup_meta(spec, run)
    # Before checkpoints/ exists: a tracker that cannot start leaves a fresh run directory
    # that holds no run, which the command line then removes.
    trackers = tuple(build_trackers(spec.loggers, run_dir, meta["config"], run.is_chief,
                                    spec.profile))
    layout = RunDir(run_dir)
    layout.checkpoints.mkdir(parents=True, exist_ok=True)
    # last.keras once, at the end (the backup holds that state during the run); best.keras
    # when it improves, the epoch's backup then a copy of it (trainer.rundir.backup)
    saved = [AtomicModelCheckpoint(str(layout.checkpoint("last")), at_end=True)]
    if saving.save_best:
        saved.append(AtomicModelCheckpoint(str(layout.checkpoint("best")), monitor=saving.monitor,
                                           save_best_only=True, mode=best_mode))
        saved[0].same_as = saved[1]  # a final epoch that was the best: last copies best
    kept = (KeepBestCheckpoints.of(layout, saving, best_mode, start[0],
                                   saved[1] if saving.save_best else None)
            if saving.keep_best else None)  # read back: the epochs the backup holds
    backup = Backup(BackupStore(layout.backup, meta=meta, place=place), saving.backup_every,
                    saving.nan_check_every, request, *start,
                    agree=stop_agreement(run.strategy) if run.workers > 1 else None,
                    best=saved[1] if saving.save_best else None, history=history)
    backup.recover_with(saving.recover.loss_upper_bound, saving.recover.max_trials)
    watchdog, timeout = None, spec.strategy.timeout_s
    if run.workers > 1 and timeout is not None:
        # Last of the built-in ones, so a step's time includes Backup's stop agreement.
        watchdog = StepWatchdog(timeout, on_stuck(timeout, run.is_chief, run_dir, backup))
    return Callbacks(
        throughput=Throughput(run.data.source.train_size, run.batch.global_size, started),
        validated=LastValidation(run.strategy), backup=backup, checkpoints=tuple(saved),
        trackers=trackers, watchdog=watchdog, user=(*user, *given),
        kept=kept, handoff=HandOff.of(backup, run_dir) if evaluator and run.is_chief else None,
        trial=optuna_trial(spec.optimized_metric, run.logged, run.workers),
        curves=Curves(run_dir, lambda: backup.history, saving.monitor if saving.save_best
                      else None, best_mode) if run.is_chief else None)
