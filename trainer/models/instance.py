"""A Keras model instance given to `trainer.fit(model, ...)`, rebuilt inside the strategy's
scope.

A model made before `trainer.fit` (as a Keras script makes it, then calls `model.fit`) has
its variables on the one device it was made on; a strategy mirrors only variables made in
its scope. So the instance is taken by value, in Keras's own format: a `.keras` snapshot
(its architecture, weights, compile arguments: loss, metrics, optimizer, `jit_compile`,
`steps_per_execution`) and the objects its config names that a fresh process could not
import (classes and functions of the script's `__main__`, found by the names the snapshot
records). `builder_of` returns a function that loads that snapshot, called by trainer inside
the strategy's scope like any model builder, the same way in this process and in a fresh
one (the function and its objects travel by value). `write_back` puts the trained weights
into the caller's instance afterwards, as `model.fit` leaves them in it.

What cannot be taken is one line before any training: a subclassed model without
`get_config` (Keras cannot rebuild it), naming what to pass instead.
"""

from __future__ import annotations

import json
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras

from trainer.config.errors import ConfigError

# The snapshot's file name inside its temporary folder (Keras takes a `.keras` path).
NAME = "model.keras"


def is_model(obj: Any) -> bool:
    """Whether `obj` is a Keras model instance (not a function or class making one)."""
    return isinstance(obj, keras.Model)


def builder_of(model: keras.Model) -> Callable[[], keras.Model]:
    """A builder (no arguments) that rebuilds `model` with its weights and compile arguments,
    from a `.keras` snapshot taken now.

    Raises:
        ConfigError: the model cannot be saved and rebuilt by Keras (one line).
    """
    with tempfile.TemporaryDirectory(prefix="trainer-model-") as folder:
        path = Path(folder) / NAME
        try:
            model.save(path)
        except Exception as error:  # noqa: BLE001 - Keras's reasons vary; one line
            raise ConfigError(_unsavable(model, error)) from None
        snapshot = path.read_bytes()
        custom = custom_objects(path)
    name = model.name

    def rebuild() -> keras.Model:
        """The model given to trainer.fit, rebuilt (weights and compile arguments)."""
        with tempfile.TemporaryDirectory(prefix="trainer-model-") as there:
            saved = Path(there) / NAME
            saved.write_bytes(snapshot)
            return keras.saving.load_model(saved, custom_objects=custom, compile=True,
                                           safe_mode=False)

    rebuild.__qualname__ = rebuild.__name__ = f"rebuild_{name}"
    rebuild.described = f"{name}, a {type(model).__name__} given as a model"
    _check_loads(rebuild, model)
    return rebuild


def custom_objects(path: Path) -> dict[str, Any]:
    """The objects a saved model's config names in `__main__` (the script's own classes and
    functions), which a fresh process cannot import by name: `{registered name: object}`,
    taken from this process's `__main__`."""
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
    main = sys.modules.get("__main__")
    found = {}
    for node in _nodes(config):
        if node.get("module") != "__main__" or main is None:
            continue
        name = node.get("registered_name") or node.get("class_name")
        attr = node.get("config") if node.get("class_name") == "function" else node.get(
            "class_name")
        obj = getattr(main, str(attr), None)
        if obj is not None and name:
            found[str(name)] = obj
    return found


def _nodes(config: Any) -> Iterator[dict[str, Any]]:
    """Every dict of a saved config, depth first."""
    if isinstance(config, dict):
        yield config
        for value in config.values():
            yield from _nodes(value)
    elif isinstance(config, list):
        for value in config:
            yield from _nodes(value)


def _check_loads(rebuild: Callable[[], keras.Model], model: keras.Model) -> None:
    """Refuses, before any training, a model Keras saves but cannot rebuild (a subclassed
    model whose `get_config` does not give its constructor's arguments)."""
    try:
        rebuild()
    except Exception as error:  # noqa: BLE001 - Keras's reasons vary; one line
        raise ConfigError(_unsavable(model, error)) from None


def _unsavable(model: keras.Model, error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (f"trainer.fit cannot rebuild the model {model.name} ({type(model).__name__}) "
            f"inside the strategy's scope: Keras cannot save and load it ({text[:200]}); "
            "give the class a get_config() returning its constructor's arguments, or pass "
            "a function that builds the model (model=build)")


def write_back(model: keras.Model, checkpoint: str | Path) -> None:
    """The trained weights (a run's `last.keras`) into the caller's instance, as
    `model.fit` leaves them in it."""
    model.load_weights(str(checkpoint))
