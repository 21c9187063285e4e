"""The run directory's layout: every name trainer writes in a run directory, in one place.

```
RUN_DIR/
  .hydra/config.yaml    the composed config (Hydra's)
  .lock                 held by the one process that runs here
  checkpoints/          last.keras, best.keras (+ NAME.sha256 beside each, and
                        best.keras.best.json: the value it holds); with
                        checkpoint.keep_best=k the k best, best-epoch003-val_loss0.1234.keras,
                        listed in kept_best.json; averaged.keras (EMA or the best k's mean)
  backup/ckpt-*/        the newest backups: model.weights.h5 (or model.keras, a copy of the
                        checkpoint written at the same point), rng.npz, metrics.npz,
                        state.json (written last)
  tensorboard/          TensorBoard's logs (logger=[tensorboard])
  saved_model/          export=true or export=[saved_model,...]
  model.tflite          export=[tflite] (TFLite / LiteRT)
  model.onnx            export=[onnx]
  curves.png            loss and metrics per epoch (each epoch's end, and the run's end)
  model_inputs.json     what the model takes and its classes' names (trainer.run.prepare.inputs)
  input_cache/          dataset.cache=disk: worker-W/SPLIT[-lane-L].* (tf.data's files)
  summary.json          written last: the run finished
  trial.json            a sweep job's outcome
  mlflow_run.json       logger=[mlflow]: the MLflow run a resumed run continues
  evaluator/            an evaluator beside the workers: what the chief and it hand each
                        other (`EvaluatorDir`; `trainer.run.prepare.sidecar`)
  lease.json            at a URL only: the one writer's lease (`trainer.rundir.lease`)
```

No two names share storage (`trainer.rundir.atomic`, their one writer): every file is its
own, written under a temporary name `.tmp-<pid>-NAME` and renamed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from trainer.rundir.atomic import temporary, write_json

LOCK = ".lock"
LEASE = "lease.json"  # at a URL: the one writer's lease
MLFLOW_RUN = "mlflow_run.json"  # logger=[mlflow]: the MLflow run a resumed run continues
SUMMARY = "summary.json"  # written last: the run finished
STATE = "state.json"  # a backup's: written after its other files
# A backup's files besides `STATE`: the weights, or a copy of the checkpoint written at the
# same point; the dropout layers' random states; a mid-epoch backup's training metrics.
WEIGHTS, CHECKPOINT, RNG, METRICS = "model.weights.h5", "model.keras", "rng.npz", "metrics.npz"
RANKED = "best-epoch"  # the k best checkpoints' names begin so
# Where each export format goes, inside the run directory.
EXPORTS = {"saved_model": "saved_model", "tflite": "model.tflite", "onnx": "model.onnx"}


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, which: str) -> Path:
        """`checkpoints/best.keras`, `last.keras` or `averaged.keras`."""
        return self.checkpoints / f"{which}.keras"

    @staticmethod
    def best_record(checkpoint: Path) -> Path:
        """`NAME.best.json` beside a best checkpoint: the monitor and the value it holds,
        read back by a resumed run so its first epoch does not replace a better one."""
        return Path(f"{checkpoint}.best.json")

    def ranked(self, epoch: int, monitor: str, value: float) -> Path:
        """One of the k best checkpoints (`checkpoint.keep_best`), named by its epoch
        (counted from 1) and its value: `checkpoints/best-epoch003-val_loss0.1234.keras`."""
        return self.checkpoints / f"{RANKED}{epoch:03d}-{monitor}{value:.4f}.keras"

    def all_ranked(self, monitor: str | None = None) -> list[Path]:
        """Every file named as one of the k best (by `monitor`, where given), listed or
        not."""
        found = sorted(self.checkpoints.glob(f"{RANKED}*.keras"))
        if monitor is None:
            return found
        named = re.compile(rf"{RANKED}\d+-{re.escape(monitor)}-?\d+\.\d+\.keras")
        return [path for path in found if named.fullmatch(path.name)]

    @property
    def kept_best(self) -> Path:
        """Which of the k best checkpoints are kept, with their epochs and values: written
        after a new one and before a dropped one is removed, so it is the truth."""
        return self.checkpoints / "kept_best.json"

    @property
    def backup(self) -> Path:
        return self.root / "backup"

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def curves(self) -> Path:
        """Loss and metrics per epoch, best epoch marked (`trainer.track.curves`)."""
        return self.root / "curves.png"

    @property
    def inputs(self) -> Path:
        """One example's shape and dtype, and the classes' names (`trainer.run.prepare.inputs`)."""
        return self.root / "model_inputs.json"

    def input_cache(self, worker: int, split: str, lane: int | None = None) -> Path:
        """The prefix of a disk cache's files (`dataset.cache=disk`): one per worker, split
        and lane of the training order (`trainer.data.shares`)."""
        name = split if lane is None else f"{split}-lane-{lane}"
        return self.root / "input_cache" / f"worker-{worker}" / name

    @property
    def lock(self) -> Path:
        return self.root / LOCK

    @property
    def config(self) -> Path:
        """The composed config Hydra saved for the run."""
        return self.root / ".hydra" / "config.yaml"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def saved_model(self) -> Path:
        return self.export("saved_model")

    def export(self, format: str) -> Path:
        """Where `export=[format]` writes: `saved_model/`, `model.tflite` or `model.onnx`."""
        return self.root / EXPORTS[format]

    def export_tmp(self, format: str) -> Path:
        """The temporary name an export is written and checked under before it is renamed
        (`.tmp-*`: removed by `trainer.rundir.backup.tidy` where a kill left one)."""
        return temporary(self.export(format))

    @property
    def trial(self) -> Path:
        return self.root / "trial.json"

    @property
    def evaluator(self) -> EvaluatorDir:
        """What the chief and an evaluator beside the workers hand each other."""
        return EvaluatorDir(self.root / "evaluator")

    def holds_run(self) -> bool:
        """Whether a run of trainer's wrote here (a backup, checkpoints or a summary); an
        empty `checkpoints/` or `backup/` (a run that failed in its first epoch) holds
        nothing."""
        return self.summary.is_file() or any(
            place.is_dir() and any(place.iterdir()) for place in (self.backup, self.checkpoints))

    def lost_backups(self) -> bool:
        """Whether checkpoints are here but `backup/` is gone (removed by hand): what the
        run's state was cannot be restored exactly. A run makes `backup/` before it writes
        any checkpoint."""
        return not self.backup.is_dir() and self.checkpoints.is_dir() and any(
            self.checkpoints.glob("*.keras"))

    def finished(self) -> bool:
        """Whether a run finished here (its summary is written last)."""
        return self.summary.is_file()


@dataclass(frozen=True)
class EvaluatorDir:
    """The paths of `RUN_DIR/evaluator/`."""

    root: Path

    @classmethod
    def of(cls, run_dir: Path) -> EvaluatorDir:
        return RunDir(Path(run_dir)).evaluator

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    def weights(self, epoch: int, suffix: str = ".weights.h5") -> Path:
        """An epoch's weights in the inbox (`.keras` where the backup copied a checkpoint)."""
        return self.inbox / f"epoch-{epoch:06d}{suffix}"

    def logs(self, epoch: int) -> Path:
        return self.inbox / f"epoch-{epoch:06d}.json"

    @property
    def history(self) -> Path:
        return self.root / "history.jsonl"

    @property
    def trained(self) -> Path:
        return self.root / "trained.json"

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def alive(self) -> Path:
        return self.root / "alive"


# Set by a restarting launcher (`trainer.launch --max-restarts`) in its chief's environment:
# the file the chief tells where it got to when it fails (`trainer.run.guards`), and beside
# it (`BACKUP_NOTE`) the name of each backup once complete (uploaded, at a URL), where the
# launcher cannot list them itself (a URL, a script's run directory).
PROGRESS = "TRAINER_PROGRESS_FILE"
BACKUP_NOTE = "backup.json"


def note_backup(name: str) -> None:
    """Tells a restarting launcher the newest complete backup (nothing without one)."""
    path = os.environ.get(PROGRESS)
    if path:
        try:
            write_json(Path(path).with_name(BACKUP_NOTE), {"backup": name})
        except OSError:
            pass  # a report to the launcher; the run goes on


def noted_backup(progress: Path) -> str | None:
    """The newest complete backup the chief noted beside `progress`; None for none."""
    try:
        return json.loads(progress.with_name(BACKUP_NOTE).read_text())["backup"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
