"""Which way a metric improves: the one rule for checkpoints, early stopping and sweeps;
and which metric the best checkpoint follows where the config leaves the default."""

from __future__ import annotations

from trainer.config.errors import ConfigError
from trainer.config.schema import CheckpointConfig

# Words in metric names that say which way is better, for metrics that do not say it
# themselves (a Keras metric's `_direction`).
RISING = ("acc", "auc", "precision", "recall", "f1", "iou", "r2", "per_sec")
FALLING = ("loss", "error", "mae", "mse", "mape", "msle", "crossentropy", "hinge",
           "divergence", "poisson", "cosh")


def name_direction(metric: str) -> str | None:
    """`max` or `min` from a logged name alone, or None where the name does not say.

    Accuracies, AUCs and throughputs rise; losses, errors and times (`time.wall_s`) fall.
    """
    name = metric.lower().removeprefix("val_").removeprefix("test_")
    if name.startswith("time.") or any(word in name for word in FALLING):
        return "min"
    if any(word in name for word in RISING):
        return "max"
    return None


def monitor_mode(monitor: str, mode: str = "auto",
                 directions: dict[str, str] | None = None) -> str:
    """Resolves whether the best checkpoint has the highest or the lowest `monitor`.

    Keras infers this from compiled metrics, which a custom loop never builds, so it is
    decided here: from the metric's own direction where known (`directions`, name to
    `up`/`down`), else from its name (`name_direction`).

    Args:
        monitor: a logged metric name, e.g. `val_accuracy`.
        mode: `auto`, `min` or `max`.
        directions: the run's metrics' directions by name, where they declare one.

    Returns:
        `min` or `max`.
    """
    if mode != "auto":
        return mode
    direction = (directions or {}).get(monitor.removeprefix("val_"))
    if direction in ("up", "down"):
        return "max" if direction == "up" else "min"
    found = name_direction(monitor)
    if found is None:
        raise ConfigError(f"cannot tell whether checkpoint.monitor={monitor!r} should rise or "
                          "fall; set checkpoint.mode=max or checkpoint.mode=min")
    return found


def sweep_mode(metric: str, declared: str | None) -> str:
    """Which way a sweep ranks `metric`: the metric's own direction, where its name says it.

    Args:
        metric: the optimized (or monitored) metric, e.g. `val_mae`.
        declared: the sweeper's `direction` (`maximize`/`minimize`), or None.

    Returns:
        `max` or `min`.

    Raises:
        ConfigError: the sweeper's direction contradicts the metric's.
    """
    declared = str(declared or "").lower() or None
    wanted = {"maximize": "max", "minimize": "min"}.get(declared) if declared else None
    found = name_direction(metric)
    if wanted and found and wanted != found:
        fix = "minimize" if found == "min" else "maximize"
        raise ConfigError(f"optimized_metric={metric} {'falls' if found == 'min' else 'rises'} "
                          f"as it improves, but the sweeper's direction is {declared}; set "
                          f"hydra.sweeper.direction={fix}")
    return wanted or found or "max"


def checkpoint_monitor(monitor: str, validated: bool) -> str:
    """`checkpoint.monitor`, or for a run without a validation set its training form:
    `loss` for the default `val_accuracy`, `mae` for `val_mae`.

    Args:
        monitor: `checkpoint.monitor`.
        validated: whether the run has validation examples.
    """
    if validated:
        return monitor
    if monitor == CheckpointConfig.monitor:
        return "loss"
    return monitor.removeprefix("val_")


def default_monitor(monitor: str, metrics: tuple[str, ...], validated: bool) -> str:
    """The default `checkpoint.monitor` (`val_accuracy`) where the run validates but logs no
    accuracy (a regression, a model compiled with other metrics): `val_loss`, as Keras's
    `ModelCheckpoint` defaults to; any other monitor as it is (one not logged is refused in
    one line later).

    Args:
        monitor: `checkpoint.monitor` (as `checkpoint_monitor` made it).
        metrics: the names of the metrics the compiled model logs.
        validated: whether the run validates.
    """
    if validated and monitor == CheckpointConfig.monitor and "accuracy" not in metrics:
        return "val_loss"
    return monitor
