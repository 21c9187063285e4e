"""The trackers `logger=[...]` selects, as Keras callbacks (see `trainer.track.loggers`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
from hydra.utils import instantiate

from trainer.config.errors import ConfigError
from trainer.rundir.atomic import write_json
from trainer.rundir.layout import MLFLOW_RUN, RunDir
from trainer.rundir.resume import flatten
from trainer.track.loggers import _drop, built_in, local_path, sqlite_path


def _numbers(logs: Mapping | None) -> dict[str, float]:
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class Tracker(keras.callbacks.Callback):
    """A tracker: per-epoch logs through Keras's callback calls, plus the run's end.

    The protocol a tracker (built-in or a user's own Keras callback) may follow, each part
    optional: `finish(summary, status)` once at the run's end, and `logged_at(run_dir)`,
    `(name, how to look at it)` for the summary.
    """

    def finish(self, summary: dict[str, Any] | None, status: str) -> None:
        """Called once when the run ends: `status` is FINISHED, FAILED or KILLED."""

    def logged_at(self, run_dir: Path) -> tuple[str, str] | None:
        """(name, where it logged) for the summary; None where there is nothing to say."""
        return None


class TensorBoardTracker(keras.callbacks.TensorBoard):
    """Keras's TensorBoard callback, saying where it wrote."""

    def logged_at(self, run_dir: Path) -> tuple[str, str]:
        return "tensorboard", f"tensorboard --logdir {RunDir(run_dir).tensorboard}"


class CsvTracker(keras.callbacks.CSVLogger):
    """Keras's CSVLogger, saying where it wrote."""

    def logged_at(self, run_dir: Path) -> tuple[str, str]:
        return "csv", str(self.filename)


class MlflowTracker(Tracker):
    """Logs to MLflow through its client (no global active run: safe in a notebook).

    A resumed run (same run directory) continues the same MLflow run: its id is kept in
    `RUN_DIR/mlflow_run.json`.
    """

    def __init__(self, options: Mapping, run_dir: Path, params: dict[str, Any]) -> None:
        super().__init__()
        from mlflow.tracking import MlflowClient

        # After the import: importing mlflow sets its logger to INFO, and a new SQLite
        # store's "Creating initial MLflow database tables" lines then reached stderr.
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)

        self.run_dir = Path(run_dir)
        uri = options.get("tracking_uri")
        store = None
        if not uri:
            store = self.run_dir.resolve().parent
            uri = f"sqlite:///{store / 'mlflow.db'}"
        self.uri = str(uri)
        # Where a new experiment keeps its artifacts: the option, else beside a local SQLite
        # store (MLflow's own default is ./mlruns in whatever the working directory is).
        artifacts = options.get("artifact_location")
        database = sqlite_path(self.uri)
        if not artifacts and database is not None:
            artifacts = (database.resolve().parent / "mlartifacts").as_uri()
        elif artifacts and local_path(str(artifacts)) is not None:
            artifacts = local_path(str(artifacts)).resolve().as_uri()
        # A sweep's parallel jobs share the local store: one at a time creates its tables
        # and the experiment.
        with _store_lock(store):
            self.client = MlflowClient(self.uri)
            name = options.get("experiment") or "trainer"
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = (experiment.experiment_id if experiment is not None else
                             self.client.create_experiment(
                                 name, artifact_location=str(artifacts) if artifacts
                                 else None))
        kept = self.run_dir / MLFLOW_RUN
        self.run_id = self._continued(kept)
        if self.run_id is None:
            run = self.client.create_run(
                experiment_id, run_name=options.get("run_name") or self.run_dir.name,
                tags={str(k): str(v) for k, v in (options.get("tags") or {}).items()})
            self.run_id = run.info.run_id
            write_json(kept, {"run_id": self.run_id, "tracking_uri": self.uri})
            self._log_params(params)
        self.log_checkpoint = bool(options.get("log_checkpoint", True))
        # The run's own folder of artifacts (an existing experiment keeps its location).
        self.artifact_uri = self.client.get_run(self.run_id).info.artifact_uri

    def _continued(self, kept: Path) -> str | None:
        """The MLflow run a resumed run continues, when this store still has it."""
        if not kept.exists():
            return None
        try:
            saved = json.loads(kept.read_text())
            if saved.get("tracking_uri") != self.uri:
                return None  # logged elsewhere before: a new run in this store
            self.client.update_run(saved["run_id"], status="RUNNING")
            return saved["run_id"]
        except Exception:  # gone from the store, or the file is damaged: start a new run
            return None

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def on_epoch_end(self, epoch, logs=None):
        try:
            self._log_metrics(_numbers(logs), epoch)
        except Exception as error:  # a server gone mid-run must not end the training
            logging.getLogger(__name__).warning("logger mlflow: epoch %d not logged: %s",
                                                epoch + 1, str(error).splitlines()[0][:200])

    def finish(self, summary, status):
        if summary is not None:
            final = {f"final_{k}": v for k, v in summary.get("validation_metrics", {}).items()}
            final.update({f"test_{k}": v for k, v in (summary.get("test_metrics") or {}).items()})
            averaged = summary.get("averaged") or {}
            final.update({f"{averaged['split']}_averaged_{k}": v
                          for k, v in averaged.get("metrics", {}).items()})
            if summary.get("examples_per_sec"):
                final["examples_per_sec"] = summary["examples_per_sec"]
            final["wall_s"] = summary["time"]["wall_s"]
            self._log_metrics(_numbers(final), summary.get("epochs_done", 0))
            path = RunDir(self.run_dir).summary
            if path.exists():
                self.client.log_artifact(self.run_id, str(path))
            if self.log_checkpoint:
                for name in ("best", "last"):
                    checkpoint = RunDir(self.run_dir).checkpoint(name)
                    if checkpoint.exists():
                        self.client.log_artifact(self.run_id, str(checkpoint), "checkpoints")
                        break
        self.client.set_terminated(self.run_id, status=status)

    def ui_command(self) -> str:
        return f"mlflow ui --backend-store-uri {self.uri}"

    def logged_at(self, run_dir: Path) -> tuple[str, str]:
        return "mlflow", (f"{self.ui_command()} (run {self.run_id}; artifacts in "
                          f"{self.artifacts()})")

    def artifacts(self) -> str:
        """Where this run's artifacts go: a local folder, or the URI of a remote store."""
        folder = local_path(str(self.artifact_uri)) if self.artifact_uri else None
        return str(folder) if folder is not None else str(self.artifact_uri)


@contextlib.contextmanager
def _store_lock(store: Path | None):
    if store is None:
        yield
        return
    with open(store / ".mlflow.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class WandbTracker(Tracker):
    """Logs to Weights & Biases (offline by default, into `RUN_DIR/wandb`)."""

    def __init__(self, options: Mapping, run_dir: Path, params: dict[str, Any]) -> None:
        super().__init__()
        import wandb

        self.run = wandb.init(
            project=options.get("project") or "trainer", entity=options.get("entity"),
            mode=options.get("mode") or "offline", name=options.get("name") or Path(run_dir).name,
            tags=list(options.get("tags") or []), dir=str(run_dir), config=params,
            settings=wandb.Settings(silent=True, console="off"), reinit="finish_previous")
        self.place = Path(self.run.dir).parent  # wandb/offline-run-<time>-<id>

    def logged_at(self, run_dir: Path) -> tuple[str, str]:
        return "wandb", f"{self.place} (upload: wandb sync {self.place})"

    def on_epoch_end(self, epoch, logs=None):
        self.run.log({**_numbers(logs), "epoch": epoch}, step=epoch)

    def finish(self, summary, status):
        if summary is not None:
            self.run.summary.update({f"final_{k}": v for k, v in
                                     summary.get("validation_metrics", {}).items()})
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        import wandb

        # Stops wandb's service process, which first writes out everything it holds (once,
        # under heavy load, an offline run's file held only its header after finish alone).
        wandb.teardown()


def tensorboard(run_dir: Path, params: dict[str, Any], chief: bool,
                update_freq: Any = "epoch", profile: Any = None) -> keras.callbacks.Callback:
    """`logger=[tensorboard]`: Keras's TensorBoard callback, in `RUN_DIR/tensorboard`."""
    return TensorBoardTracker(
        str(RunDir(run_dir).tensorboard), update_freq=update_freq,
        profile_batch=tuple(profile) if profile is not None and chief else 0)


def csv(run_dir: Path, params: dict[str, Any], chief: bool,
        filename: str = "metrics.csv") -> keras.callbacks.Callback | None:
    """`logger=[csv]`: one row per epoch in `RUN_DIR/metrics.csv` (the chief's only)."""
    return CsvTracker(str(run_dir / filename), append=True) if chief else None


def mlflow(run_dir: Path, params: dict[str, Any], chief: bool,
           **options: Any) -> Tracker | None:
    """`logger=[mlflow]`: an `MlflowTracker` on the chief."""
    return MlflowTracker(options, run_dir, params) if chief else None


def wandb(run_dir: Path, params: dict[str, Any], chief: bool, **options: Any) -> Tracker | None:
    """`logger=[wandb]`: a `WandbTracker` on the chief, offline by default."""
    if not chief:
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    return WandbTracker(options, run_dir, params)


def build_trackers(loggers: Mapping | None, run_dir: Path, config: dict[str, Any],
                   chief: bool, profile: Any = None) -> list[keras.callbacks.Callback]:
    """The run's tracker callbacks, in the order of the `logger` node.

    Each logger is a node whose `_target_` builds it (the built-in ones' files in
    `conf/logger/` name the builders above; a node without one is a built-in by its name),
    called with `run_dir`, `params` (the flattened config), `chief` and the node's other
    keys; it returns a Keras callback, or None where it logs nothing (on other workers).

    Args:
        loggers: the config's `logger` node.
        run_dir: this process's run directory (a scratch one on other workers).
        config: the resolved config, logged flattened as parameters.
        chief: whether this process logs for the run (only TensorBoard runs elsewhere too).
        profile: `[first, last]` training steps to profile into the TensorBoard directory.
    """
    loggers = {name: dict(node or {}) for name, node in (loggers or {}).items()}
    if profile is not None and chief:
        loggers = {"tensorboard": {}, **loggers}  # first, as the profile's home
        loggers["tensorboard"]["profile"] = profile
    params = flatten(config)
    trackers: list[keras.callbacks.Callback] = []
    for name, options in loggers.items():
        target = options.pop("_target_", None) or built_in()[name]
        try:
            # Partial: the flattened config is handed over as it is, not instantiated.
            build = instantiate({"_target_": target, "_partial_": True, **options},
                                _convert_="all")
            tracker = build(run_dir=run_dir, params=params, chief=chief)
        except Exception as error:
            cause = getattr(error, "__cause__", None) or error
            raise ConfigError(f"logger {name} could not start ({_in_one_line(cause)}); fix "
                              f"its logger.{name} options, or drop it: "
                              f"{_drop(name, loggers)}") from None
        if tracker is not None:
            trackers.append(tracker)
    return trackers


# A tracker's message is shown whole (its remedy is often its last sentence), up to this.
MESSAGE_LIMIT = 2000


def _in_one_line(error: BaseException) -> str:
    """A tracker's error message with its lines joined: the whole of it, remedy included."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if not text:
        return type(error).__name__
    return text if len(text) <= MESSAGE_LIMIT else f"{text[:MESSAGE_LIMIT - 3]}..."


def finish_trackers(trackers: list, summary: dict[str, Any] | None, status: str) -> None:
    """Ends every tracker's run; a tracker's own failure at the end is one warning."""
    for tracker in trackers:
        finish = getattr(tracker, "finish", None)
        if finish is None:
            continue
        try:
            finish(summary, status)
        except Exception as error:  # the run itself is done and saved
            logging.getLogger(__name__).warning("logger %s could not finish: %s",
                                                type(tracker).__name__, error)


def logged_to(trackers: Any, run_dir: Path) -> dict[str, str]:
    """Where each tracker wrote, for the summary (how to look at it)."""
    found = [getattr(t, "logged_at", lambda _: None)(run_dir) for t in trackers]
    return dict(item for item in found if item is not None)
