"""A run's `.keras` checkpoint loaded as a Keras model, in any process:
`trainer.evaluate.load_checkpoint(path)`.

A default run's checkpoint holds only Keras's own objects, and plain
`keras.models.load_model` loads it. Some hold more, which Keras finds only once registered:
trainer's own (a cifar10_cnn layer, a Keras application's preprocessing, the warm-up before
an exponential decay), registered by the imports below, and the user's own, which the run's
config names: a loss function by its dotted name (`loss: my_task.my_loss`, saved as
`my_task>my_loss`) and the module of a model builder (`model._target_: my_task.build`, whose
custom layers register on import). Those are read from the run's `.hydra/config.yaml` beside
`checkpoints/` and registered as training registered them, so their modules must import as
they did for training (the working directory or `PYTHONPATH`). A class of the user's that
nothing registers (a custom layer without `@keras.saving.register_keras_serializable`, which
plain Keras cannot locate) is taken from the module the checkpoint records for it, and given
to Keras as `custom_objects`.
"""

from __future__ import annotations

import importlib
import json
import zipfile
from pathlib import Path
from typing import Any

import keras
from omegaconf import OmegaConf

import trainer.models.cifar10_cnn  # noqa: F401 - registers LocalResponseNormalization
import trainer.models.keras_app  # noqa: F401 - registers AppPreprocess
import trainer.plan.schedule  # noqa: F401 - registers WarmupSchedule
from trainer.config.build import describe
from trainer.config.errors import ConfigError
from trainer.rundir.checkpoint import verified
from trainer.rundir.layout import RunDir
from trainer.task.build import build_loss

OURS = ("keras", "trainer", "tensorflow")


def load_checkpoint(path: str | Path) -> Any:
    """Loads a `.keras` checkpoint written by trainer, checked against its hash, with the
    custom objects it may hold: trainer's, and the user's its run's config names.

    Raises:
        ConfigError: the file does not match the checksum written with it; a module the
            run's config names does not import here.
    """
    path = Path(path)
    verified(path)
    readable(path)
    register_run_objects(path)
    try:
        return keras.models.load_model(path, custom_objects=unregistered_classes(path))
    except (KeyError, OSError, EOFError, zipfile.BadZipFile) as error:
        # a zip archive that is not a Keras model file: Keras's raw KeyError ('config.json')
        raise ConfigError(f"{path} is a zip archive but not a Keras model file ("
                          f"{describe(error)}); give a .keras file a run wrote") from None


def readable(path: Path) -> None:
    """Refuses a path that is not a file, or not a zip archive as every `.keras` file is, in
    one line naming it (Keras says "File not found" for an empty or cut-off one)."""
    if not path.is_file():
        raise ConfigError(f"{path} does not exist or is not a file; give a run's "
                          "checkpoints/best.keras or last.keras")
    if not zipfile.is_zipfile(path):
        size = path.stat().st_size
        state = "empty (0 bytes)" if size == 0 else f"damaged or cut off ({size:,} bytes)"
        raise ConfigError(f"{path} is not a Keras model file: a .keras file is a zip "
                          f"archive, and this one is {state}; use the run's other checkpoint "
                          "(checkpoint=best|last), or copy it again")


def register_run_objects(checkpoint: Path) -> None:
    """Registers what the config of the run a checkpoint sits in names of the user's (none
    for a checkpoint outside a run directory, or a run whose config is unreadable)."""
    saved = RunDir(checkpoint.resolve().parent.parent).config
    if checkpoint.parent.name != "checkpoints" or not saved.is_file():
        return
    try:
        cfg = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
    except Exception:  # noqa: BLE001 - Keras's own error says what is missing
        return
    model = (cfg.get("model") or {}).get("_target_")
    if isinstance(model, str) and "." in model and model.split(".")[0] not in OURS:
        module = model.rsplit(".", 1)[0]
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - any import failure is the same line
            raise ConfigError(f"{checkpoint} was trained with model._target_={model!r}, whose "
                              f"module does not import here ({type(error).__name__}: {error}); "
                              "load it where the run trained, or put the module on "
                              "PYTHONPATH") from None
    for loss in _losses(cfg.get("loss")):
        build_loss(loss)  # registers a user's function as training did


def unregistered_classes(checkpoint: Path) -> dict[str, type]:
    """The user's classes a checkpoint holds that no registration names (a custom layer
    without `@keras.saving.register_keras_serializable`), by class name, as Keras's
    `custom_objects` takes them: read from the module its config records, which must import
    here as it did for training (the working directory or `PYTHONPATH`).

    Raises:
        ConfigError: such a module does not import, or no longer has the class.
    """
    try:
        with zipfile.ZipFile(checkpoint) as archive:
            config = json.loads(archive.read("config.json"))
    except (KeyError, OSError, ValueError, zipfile.BadZipFile):
        return {}  # Keras's loading says what is wrong with the file
    found: dict[str, type] = {}
    for module, name in _user_classes(config):
        try:
            found[name] = getattr(importlib.import_module(module), name)
        except Exception as error:  # noqa: BLE001 - any import failure is the same line
            raise ConfigError(f"{checkpoint} holds {module}.{name}, which does not import "
                              f"here ({type(error).__name__}: {error}); load it where the run "
                              "trained, or put its module on PYTHONPATH") from None
    return found


def _user_classes(node: Any) -> set[tuple[str, str]]:
    """(module, class name) of every serialized object whose module is not Keras's, Python's
    or trainer's and which no registration names (`registered_name` without a package)."""
    found: set[tuple[str, str]] = set()
    if isinstance(node, dict):
        module, name = node.get("module"), node.get("class_name")
        registered = str(node.get("registered_name") or "")
        if (isinstance(module, str) and isinstance(name, str) and ">" not in registered
                and module.split(".")[0] not in (*OURS, "builtins")):
            found.add((module, name))
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            found |= _user_classes(value)
    return found


def _losses(node: Any) -> list[Any]:
    """The config's loss specs: one, or one per output (a mapping or a list)."""
    if isinstance(node, dict) and "_target_" not in node:
        return [v for v in node.values() if v is not None]
    if isinstance(node, list):
        return [v for v in node if v is not None]
    return [] if node is None else [node]
