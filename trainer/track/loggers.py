"""Experiment trackers (`logger=[tensorboard,csv,mlflow,wandb]`): which exist, and whether
they can start. The trackers themselves are Keras callbacks in `trainer.track.trackers`.

Each tracker gets every epoch's logs (loss, metrics, `val_` ones, learning rate); MLflow and
Weights & Biases also get the flattened composed config as parameters and the summary at
the end. Only the chief of a multi-worker run logs (TensorBoard excepted: every worker
writes it, the others into a scratch directory, as they do checkpoints).

`check_loggers` runs before TensorFlow starts (nothing here imports it): an unknown logger, a
missing package or an unreachable tracking server is one line naming the logger and how to
install or drop it.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Mapping
from urllib.parse import urlparse

from trainer.config.errors import ConfigError

LOGGERS = ("tensorboard", "csv", "mlflow", "wandb")
# What builds each built-in logger (`conf/logger/NAME.yaml` names the same `_target_`); a
# logger of the user's own is any node whose `_target_` builds a Keras callback.
BUILT_IN = {name: f"trainer.track.trackers.{name}" for name in LOGGERS}
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}


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
        if target is None and name not in LOGGERS:
            raise ConfigError(f"unknown logger {name!r}; available: {', '.join(LOGGERS)}, or "
                              "a node with _target_ (a builder of a Keras callback)")
        if target is not None and importlib.util.find_spec(str(target).split(".")[0]) is None:
            raise ConfigError(f"logger {name}: cannot import {target!r}; is its module in the "
                              "working directory or installed?")
        package = PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logger {name} needs the {package} package, which is not "
                              f"installed: pip install 'trainer[{name}]' (or drop it: "
                              f"{_drop(name, loggers)})")
    uri = (loggers.get("mlflow") or {}).get("tracking_uri") if "mlflow" in loggers else None
    if reach and uri and urlparse(str(uri)).scheme in ("http", "https"):
        _check_server(str(uri), loggers)
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
