"""Python objects a run was given in place of a dotted name: `trainer.fit(model=..., data=...)`.

A config holds only data, so an object (a model builder defined in a notebook's `__main__`,
a `tf.data.Dataset`, arrays) cannot be its `_target_`. The API puts each object here, under
its role, for the length of the call, and names a marker `_target_` in the config
(`MARKERS`) with a `given` key saying what the object was (`build, defined in __main__`): the
run directory records that the run was started from an object, and `resume`, `evaluate` and
`predict` of that run take the same object again (`lookup` says so in one line when it is
missing). An object that an importable dotted name reaches (`build` in a module of the
user's) is named by that name instead (`dotted_name`), as a command line would name it.

Held per thread (a `contextvars` variable): two `trainer.fit` calls in two threads each see
their own objects. A decide module: no TensorFlow.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from trainer.config.errors import ConfigError

# The `_target_` each role names when its object was given (importable: the config's check
# finds the module; the builder behind it reads the object from here).
MARKERS = {"model": "trainer.models.given.build", "data": "trainer.data.given.load"}
# The config node of each role.
NODES = {"model": "model", "data": "dataset"}

_OBJECTS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "trainer_given_objects", default=None)


@contextlib.contextmanager
def holding(**objects: Any) -> Iterator[None]:
    """The objects (by role: `model`, `data`) visible to `lookup` inside the block; None
    values are left out."""
    token = _OBJECTS.set({k: v for k, v in objects.items() if v is not None})
    try:
        yield
    finally:
        _OBJECTS.reset(token)


def lookup(role: str, given: Any = None) -> Any:
    """The object given for `role` in this call.

    Args:
        role: `model` or `data`.
        given: what the run's config says the object was (its `given` key), for the
            message when it is missing.

    Raises:
        ConfigError: no object was given for `role` (a run started from one, evaluated,
            resumed or predicted without it).
    """
    found = _OBJECTS.get() or {}
    if role not in found:
        what = f" ({given})" if given else ""
        raise ConfigError(f"this run's {role} was a Python object{what}, which a config "
                          f"cannot name: pass it again ({role}=... to trainer.fit, "
                          "trainer.evaluate or trainer.predict), or name an importable "
                          f"function with {NODES[role]}._target_=module.function")
    return found[role]


def flag(name: str) -> bool:
    """A flag this call holds (`batch_from_data`: a batched dataset's own batch is the
    global batch; `cache_from_data`: a given dataset is not cached); False outside a call
    that set it. Read once a run, into its `Spec` (`trainer.run.prepare.resolve`)."""
    return bool((_OBJECTS.get() or {}).get(name, False))


def is_marker(target: Any) -> bool:
    """Whether a `_target_` is the marker of a given object."""
    return target in MARKERS.values()


def dotted_name(obj: Any) -> str | None:
    """The importable dotted name that reaches `obj` (`my_task.build`), or None: defined in
    `__main__` (a notebook, a script run as `python file.py`), nested, a lambda, or not a
    function or class."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not name or module == "__main__" or "<" in name:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - not reachable by name: given as an object
        return None
    return f"{module}.{name}" if found is obj else None


def described(obj: Any) -> str:
    """What an object was, in a few words, for the run's record (`build, defined in
    __main__`, `a Dataset`)."""
    if getattr(obj, "described", None):  # what made it says what it is
        return str(obj.described)
    name = getattr(obj, "__qualname__", None)
    if callable(obj) and name:
        return f"{name}, defined in {getattr(obj, '__module__', None) or 'an unknown module'}"
    kind = type(obj).__name__
    return f"a {kind}" if kind[:1].lower() not in "aeiou" else f"an {kind}"


def overrides(role: str, obj: Any) -> list[str]:
    """The config overrides that name `obj` for `role`: its dotted name, or the marker and
    what it was (a `given` key). Nothing for None."""
    if obj is None:
        return []
    node = NODES[role]
    name = dotted_name(obj) if callable(obj) else None
    if name is not None:
        return [f"{node}._target_={name}"]
    text = described(obj).replace("'", "")
    return [f"{node}._target_={MARKERS[role]}", f"+{node}.given='{text}'"]
