"""A sweep job's Optuna trial, from its training process: the optimized metric reported
after every epoch, and training stopped once the study's pruner prunes the trial.

trainer's Optuna sweeper (`hydra_plugins/trainer_optuna_sweeper`) names each job's trial in
its environment and the job hands its process the study (`trainer.track.sweep.STUDY_ENV`):
the storage both open, the study's name and the pruner's node. The trial's value at each
epoch is the epoch's log of the metric (`val_accuracy`: the epoch's validation); the step is
the number of epochs done. A build module: a Keras callback.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import keras

from trainer.config.build import build_object
from trainer.track.sweep import STUDY_ENV, TRIAL_ENV


class OptunaTrial(keras.callbacks.Callback):
    """Reports `metric` to the trial after each epoch; stops training where the pruner
    prunes it, `pruned` then saying where (`trial`, `epoch`, `value`) for the summary."""

    def __init__(self, trial: Any, metric: str) -> None:
        super().__init__()
        self.trial, self.metric = trial, metric
        self.pruned: dict[str, Any] | None = None

    def on_epoch_end(self, epoch: int, logs: Mapping | None = None) -> None:
        value = (logs or {}).get(self.metric)
        if value is None:
            return
        value, step = float(value), epoch + 1
        self.trial.report(value, step)
        if self.pruned is None and self.trial.should_prune():
            self.pruned = {"trial": self.trial.number, "epoch": step,
                           "value": value if math.isfinite(value) else None}
            self.model.stop_training = True


def optuna_trial(metric: str | None, logged: tuple[str, ...], workers: int,
                 environ: Mapping[str, str] = os.environ) -> OptunaTrial | None:
    """The callback of a job of trainer's Optuna sweeper; None for any other run, and for a
    metric no epoch logs (a summary key, a `test_` one: nothing to prune on) or a job of
    several workers (they would have to agree on each stop).

    Args:
        metric: the run's `optimized_metric`.
        logged: what the run logs per epoch.
        workers: the run's workers.
        environ: where the sweep job's process finds its trial and study.
    """
    number, study = environ.get(TRIAL_ENV), environ.get(STUDY_ENV)
    if number is None or study is None or metric not in logged or workers > 1:
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    where = json.loads(study)
    # none is none: Optuna's default would be the median pruner
    pruner = (build_object(where["pruner"], "hydra.sweeper.pruner") if where["pruner"]
              else optuna.pruners.NopPruner())
    storage = optuna.storages.RDBStorage(where["storage"])
    loaded = optuna.load_study(study_name=where["study_name"], storage=storage, pruner=pruner)
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(where["study_name"]), int(number))
    # Optuna's Trial over a trial another process asked for: the sweeper tells how it ended
    return OptunaTrial(optuna.trial.Trial(loaded, trial_id), metric)
