"""trainer: multi-device data-parallel training for Keras 3 on tf.distribute, with Hydra.

The Python API (see `trainer.api`):

    import trainer
    result = trainer.fit(["accelerator=cpu", "devices=2", "epochs=1"])
    result.history["val_accuracy"], result.run_dir
    trainer.evaluate(result.run_dir, ["split=test"])
    trainer.predict(result.run_dir, "new_images/")
    trainer.tune(["accelerator=cpu", "devices=2"], what="lr")

Nothing heavy is imported by `import trainer`: each name loads on first use. A script that
imports TensorFlow after trainer imports it quietly (`trainer.internals.tf_start`).
"""

from __future__ import annotations

import importlib
from typing import Any

from trainer.internals.tf_start import quiet_when_imported
from trainer.version import __version__

__all__ = ["Result", "TrainerError", "__version__", "evaluate", "fit", "predict", "tune"]


def __getattr__(name: str) -> Any:
    if name in ("fit", "Result", "tune"):
        return getattr(importlib.import_module("trainer.api"), name)
    if name == "TrainerError":
        return importlib.import_module("trainer.config.outcome").TrainerError
    if name in ("evaluate", "predict"):
        # the command-line modules, callable as the API's functions
        return importlib.import_module(f"trainer.{name}")
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")


quiet_when_imported()
