"""Loading a run's `.keras` checkpoint: checked against its hash, custom objects registered."""

from __future__ import annotations

from pathlib import Path

import keras

from trainer.rundir.checkpoint import verified


def load_checkpoint(path: str | Path):
    """Loads a `.keras` checkpoint written by trainer, with the custom objects it may hold.

    Raises:
        ConfigError: the file does not match the checksum written with it.
    """
    verified(Path(path))
    import trainer.models.cifar10_cnn  # noqa: F401 - registers LocalResponseNormalization
    import trainer.models.keras_app  # noqa: F401 - registers AppPreprocess
    import trainer.plan.schedule  # noqa: F401 - registers WarmupSchedule

    return keras.models.load_model(path)
