"""Experiment trackers (`logger=[tensorboard,csv,mlflow,wandb]`): which exist, and whether
they can start. The trackers themselves are Keras callbacks in `trainer.track.trackers`;
the built-in ones are the files of `conf/logger/` (`built_in`), each naming its builder.

Each tracker gets every epoch's logs (loss, metrics, `val_` ones, learning rate); MLflow and
Weights & Biases also get the flattened composed config as parameters and the summary at
the end. Only the chief of a multi-worker run logs (TensorBoard excepted: every worker
writes it, the others into a scratch directory, as they do checkpoints).

`check_loggers` runs before TensorFlow starts (nothing here imports it): an unknown logger, a
missing package or an unreachable tracking server is one line naming the logger and how to
install or drop it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from omegaconf import DictConfig, OmegaConf

from trainer.config.errors import ConfigError
from trainer.config.schema import config_dir

# The package a built-in logger needs that is not installed with trainer, by logger.
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}


@functools.cache
def built_in() -> dict[str, str]:
    """The built-in loggers, `{name: the dotted name of its builder}`: the files of
    `conf/logger/` (`NAME.yaml` holds `NAME: {_target_: BUILDER, ...}`), the ones a run logs
    to by default (`conf/config.yaml`'s) first. A logger of the user's own is any node whose
    `_target_` builds a Keras callback."""
    folder = config_dir()
    found = {path.stem: str(OmegaConf.load(path)[path.stem]["_target_"])
             for path in sorted((folder / "logger").glob("*.yaml"))}
    defaults = OmegaConf.load(folder / "config.yaml").get("defaults") or []
    first = next((list(item["logger"]) for item in defaults
                  if isinstance(item, DictConfig) and "logger" in item), [])
    return {name: found[name] for name in sorted(found, key=lambda n: n not in first)}


def _drop(name: str, loggers: Mapping) -> str:
    rest = [n for n in loggers if n != name]
    return f"logger=[{','.join(rest)}]"


def check_loggers(loggers: Mapping | None, reach: bool = False) -> None:
    """Refuses loggers that cannot start, before anything runs.

    Args:
        loggers: the config's `logger` node (name -> options).
        reach: also connect to an MLflow tracking server (5 s at most).

    Raises:
        ConfigError: an unknown name, a package that is not installed, or an MLflow
            tracking server that does not answer.
    """
    loggers = loggers or {}
    for name, node in loggers.items():
        target = (node or {}).get("_target_")
        if target is None and name not in built_in():
            raise ConfigError(f"unknown logger {name!r}; available: {', '.join(built_in())}, or "
                              "a node with _target_ (a builder of a Keras callback)")
        if target is not None and importlib.util.find_spec(str(target).split(".")[0]) is None:
            raise ConfigError(f"logger {name}: cannot import {target!r}; is its module in the "
                              "working directory or installed?")
        package = PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logger {name} needs the {package} package, which is not "
                              f"installed: pip install 'trainer[{name}]' (or drop it: "
                              f"{_drop(name, loggers)})")
    mlflow = (loggers.get("mlflow") or {}) if "mlflow" in loggers else None
    uri = mlflow.get("tracking_uri") if mlflow is not None else None
    if reach and uri and urlparse(str(uri)).scheme in ("http", "https"):
        _check_server(str(uri), loggers)
    if reach and mlflow is not None:
        _check_store(str(uri) if uri else None, mlflow.get("artifact_location"), loggers)
    wandb = loggers.get("wandb") or {}
    mode = wandb.get("mode", "offline")
    if "wandb" in loggers and mode not in ("offline", "online", "disabled"):
        raise ConfigError(f"logger.wandb.mode must be offline, online or disabled; received: "
                          f"{mode!r}")
    if "wandb" in loggers and mode == "online" and not _wandb_key():
        raise ConfigError("logger wandb with logger.wandb.mode=online needs an API key "
                          "(WANDB_API_KEY, or `wandb login`); log offline "
                          "(logger.wandb.mode=offline, upload later with `wandb sync`) or "
                          f"drop it: {_drop('wandb', loggers)}")


def _wandb_key() -> bool:
    """Whether W&B would find an API key: the environment, or `wandb login`'s netrc."""
    import netrc
    import os

    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        hosts = netrc.netrc(os.environ.get("NETRC")).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    return any("wandb" in host for host in hosts)


def _check_server(uri: str, loggers: Mapping) -> None:
    parsed = urlparse(uri)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=5):
            pass
    except OSError as error:
        raise ConfigError(f"logger mlflow cannot reach its tracking server {uri} "
                          f"({error.strerror or error}); start it, set "
                          "logger.mlflow.tracking_uri=null for a local store, or drop it: "
                          f"{_drop('mlflow', loggers)}") from None


def sqlite_path(uri: str) -> Path | None:
    """The file of an `sqlite:///PATH` store (`sqlite:////abs` or `sqlite:///relative`);
    None for another scheme or an in-memory database."""
    if not uri.startswith("sqlite://"):
        return None
    path = uri[len("sqlite://"):].split("?", 1)[0]
    path = path[1:] if path.startswith("/") else path  # the third slash ends the empty host
    return Path(unquote(path)) if path and path != ":memory:" else None


def local_path(location: str) -> Path | None:
    """The folder of a local artifact location (a path or a `file:` URI); None for a
    remote one (s3://, gs://, mlflow-artifacts:, ...)."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(location) if not parsed.scheme or len(parsed.scheme) == 1 else None


def _unwritable(path: Path) -> str | None:
    """Why `path` (a file or folder to create or write) cannot be written, or None."""
    place = path
    while not place.exists() and place != place.parent:
        place = place.parent
    if place != path and not place.is_dir():
        return f"{place} is a file, not a directory"
    if place == path and path.is_file():
        folder = path.parent if str(path.parent) else Path(".")
        if not os.access(path, os.R_OK | os.W_OK):
            return f"{path} is read-only for this user"
        place = folder  # SQLite writes its journal beside the database
    if not os.access(place, os.W_OK | os.X_OK):
        return f"{place} is read-only for this user"
    return None


def _check_store(uri: str | None, artifacts: str | None, loggers: Mapping) -> None:
    """Refuses an MLflow store this process could not write, before anything starts (MLflow
    itself retries an unwritable SQLite file for two minutes, then fails mid-run).

    Args:
        uri: `logger.mlflow.tracking_uri`; None for the local store next to the run
            directory (the run directory's own checks cover its parent).
        artifacts: `logger.mlflow.artifact_location`, or None.
    """
    drop = _drop("mlflow", loggers)
    database = sqlite_path(uri) if uri else None
    if database is not None:
        why = _unwritable(database)
        if why is not None:
            raise ConfigError(f"logger mlflow cannot write its store {uri} ({why}); choose a "
                              "writable place (logger.mlflow.tracking_uri=sqlite:////PATH/"
                              "mlflow.db), logger.mlflow.tracking_uri=null for a local store "
                              f"next to the run directory, or drop it: {drop}")
    folder = local_path(str(artifacts)) if artifacts else None
    if folder is not None:
        why = _unwritable(folder)
        if why is not None:
            raise ConfigError(f"logger mlflow cannot write its artifacts into "
                              f"logger.mlflow.artifact_location={artifacts} ({why}); choose a "
                              f"writable folder, null for the default, or drop it: {drop}")
    scheme = urlparse(uri).scheme if uri else None
    if uri and (scheme in ("", "file") or len(scheme or "") == 1) and not _file_store_allowed():
        raise ConfigError(f"logger mlflow: tracking_uri={uri} is a file store, which this "
                          "MLflow refuses (it is in maintenance mode) unless "
                          "MLFLOW_ALLOW_FILE_STORE=true; use a database, e.g. "
                          "logger.mlflow.tracking_uri=sqlite:////PATH/mlflow.db (`mlflow "
                          "migrate-filestore` moves an existing store over), "
                          "logger.mlflow.tracking_uri=null for a local store next to the run "
                          f"directory, set MLFLOW_ALLOW_FILE_STORE=true, or drop it: {drop}")


def _file_store_allowed() -> bool:
    """Whether the installed MLflow opens file stores (recent ones refuse them unless
    MLFLOW_ALLOW_FILE_STORE is set; older ones have no such variable and open them)."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:
        return True
    return bool(MLFLOW_ALLOW_FILE_STORE.get())
