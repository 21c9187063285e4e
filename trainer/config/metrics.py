"""Which way a metric improves: the one rule for checkpoints, early stopping and sweeps."""

from __future__ import annotations

from trainer.config.errors import ConfigError

# Words in metric names that say which way is better, for metrics that do not say it
# themselves (a Keras metric's `_direction`).
RISING = ("acc", "auc", "precision", "recall", "f1", "iou", "r2")
FALLING = ("loss", "error", "mae", "mse", "mape", "msle", "crossentropy", "hinge",
           "divergence", "poisson", "cosh")


def monitor_mode(monitor: str, mode: str = "auto",
                 directions: dict[str, str] | None = None) -> str:
    """Resolves whether the best checkpoint has the highest or the lowest `monitor`.

    Keras infers this from compiled metrics, which a custom loop never builds, so it is
    decided here: from the metric's own direction where known (`directions`, name to
    `up`/`down`), else from its name: accuracies and AUCs up, losses and errors down.

    Args:
        monitor: a logged metric name, e.g. `val_accuracy`.
        mode: `auto`, `min` or `max`.
        directions: the run's metrics' directions by name, where they declare one.

    Returns:
        `min` or `max`.
    """
    if mode != "auto":
        return mode
    name = monitor.removeprefix("val_")
    direction = (directions or {}).get(name)
    if direction in ("up", "down"):
        return "max" if direction == "up" else "min"
    if any(word in name for word in FALLING):
        return "min"
    if any(word in name for word in RISING):
        return "max"
    raise ConfigError(f"cannot tell whether checkpoint.monitor={monitor!r} should rise or fall; "
                      "set checkpoint.mode=max or checkpoint.mode=min")
