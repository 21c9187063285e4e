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

A subclassed model Keras cannot save because its constructor takes Keras objects and the
class has no `get_config` (keras.io's `VAE(encoder, decoder)`) is rebuilt from its
constructor's parts instead (`_constructor_parts`): each argument read back from the model's
attribute of the same name, each Keras part taken by value. What cannot be taken either way
is one line before any training, naming what to pass instead.
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
    _built_by_parts(model)
    with tempfile.TemporaryDirectory(prefix="trainer-model-") as folder:
        path = Path(folder) / NAME
        try:
            model.save(path)
        except Exception as error:  # noqa: BLE001 - Keras's reasons vary; one line
            parts = _constructor_parts(model)
            if parts is None:
                raise ConfigError(_unsavable(model, error)) from None
            return _builder_of_parts(model, parts)
        snapshot = path.read_bytes()
        custom = {**classes_of_main(model), **custom_objects(path)}
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


def _constructor_parts(model: keras.Model) -> dict[str, Any] | None:
    """A subclassed model Keras cannot configure because its constructor takes Keras objects
    (keras.io's `VAE(encoder, decoder)`): each of the constructor's arguments read back from
    the model's attribute of the same name, where every required one is there as a Keras
    layer or model, or a number, string, bool or None; else None."""
    import inspect

    parts = {}
    for name, param in inspect.signature(type(model).__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        value = getattr(model, name, param.default)
        if value is param.empty:
            return None
        if not isinstance(value, keras.layers.Layer | str | int | float | bool | type(None)):
            return None
        parts[name] = value
    return parts if any(isinstance(v, keras.layers.Layer) for v in parts.values()) else None


def _builder_of_parts(model: keras.Model, parts: dict[str, Any]) -> Callable[[], keras.Model]:
    """A builder for a model of `_constructor_parts`: each Keras part taken by value as its
    own `.keras` snapshot (its weights with it), the class called with them, compiled as the
    model was (its compile arguments; the optimizer's state starts afresh)."""
    snapshots, custom = {}, {}
    with tempfile.TemporaryDirectory(prefix="trainer-model-") as folder:
        for name, value in parts.items():
            if isinstance(value, keras.layers.Layer):
                path = Path(folder) / f"{name}.keras"
                try:
                    keras.Sequential([value]).save(path) if not isinstance(
                        value, keras.Model) else value.save(path)
                except Exception as error:  # noqa: BLE001 - Keras's reasons vary; one line
                    raise ConfigError(_unsavable(model, error)) from None
                snapshots[name] = path.read_bytes()
                custom.update({**classes_of_main(value), **custom_objects(path)})
    plain = {k: v for k, v in parts.items() if k not in snapshots}
    cls, compiled = type(model), model.get_compile_config() if model.compiled else None
    name = model.name

    def rebuild() -> keras.Model:
        """The model given to trainer.fit, rebuilt from its constructor's parts."""
        with tempfile.TemporaryDirectory(prefix="trainer-model-") as there:
            loaded = {}
            for part, snapshot in snapshots.items():
                saved = Path(there) / f"{part}.keras"
                saved.write_bytes(snapshot)
                loaded[part] = keras.saving.load_model(saved, custom_objects=custom,
                                                       compile=False, safe_mode=False)
        rebuilt = cls(**plain, **loaded, name=name)
        _built_by_parts(rebuilt)
        if compiled is not None:
            rebuilt.compile_from_config(compiled)
        return rebuilt

    rebuild.__qualname__ = rebuild.__name__ = f"rebuild_{name}"
    rebuild.described = f"{name}, a {cls.__name__} given as a model (rebuilt from its parts)"
    _check_loads(rebuild, model)
    return rebuild


def classes_of_main(layer: keras.layers.Layer) -> dict[str, Any]:
    """The classes of a script's `__main__` (`__module__` "__main__") among a model's and
    its layers', nested models' included, by their registered names: found on the objects
    themselves, so also where the script's namespace is not `sys.modules["__main__"]` (code
    run by `exec`, a notebook's kernel)."""
    found: dict[str, Any] = {}
    stack = [layer]
    while stack:
        item = stack.pop()
        cls = type(item)
        if cls.__module__ == "__main__":
            found[keras.saving.get_registered_name(cls)] = cls
        stack.extend(getattr(item, "layers", None) or [])
    return found


def custom_objects(path: Path) -> dict[str, Any]:
    """The objects a saved model's config names in `__main__` (the script's own classes and
    functions), which a fresh process cannot import by name: `{registered name: object}`,
    taken from this process's `__main__`."""
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
    main = sys.modules.get("__main__")
    found = {}
    for node in _nodes(config):
        # Keras records a class of `__main__` with module None (serialization_lib's
        # `record_object_after_serialization`), a function with `__main__`
        if node.get("module", "") not in ("__main__", None) or main is None:
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
    `model.fit` leaves them in it. A model without `call` whose parts are built (keras.io's
    VAE) is never built itself, and Keras loads no weights into an unbuilt model: its
    variables are its parts', so it is marked built first."""
    _built_by_parts(model)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.trainable_variables:
        # its state after training comes back too, as `model.fit` leaves it
        optimizer.build(model.trainable_variables)
    model.load_weights(str(checkpoint))


def _built_by_parts(model: keras.Model) -> None:
    """Marks built a model whose variables are all its built parts' (see `write_back`)."""
    if not model.built and model.layers and all(layer.built for layer in model.layers):
        model.built = True
