"""Config nodes to objects: Hydra's `instantiate`, its failures turned into one line."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from hydra.utils import instantiate

from trainer.config.errors import ConfigError


def build_object(node: Any, what: str, **kwargs: Any) -> Any:
    """Instantiates a `_target_` node; a failure is one line naming `what` and the cause."""
    from hydra.errors import InstantiationException

    try:
        return instantiate(node, **kwargs, _convert_="all")
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        if _loading(cause):  # the target's module did not import
            raise ConfigError(f"{what}._target_={node.get('_target_')!r} cannot be imported: "
                              f"{import_failure(cause)}") from None
        raise ConfigError(f"{what}: cannot build {node.get('_target_')!r}: "
                          f"{describe(cause or error)}") from None


def load_target(path: str) -> Any:
    """What a dotted `_target_` path names (Hydra's `get_object`), without the three-line
    report Hydra logs on a failure: the caller's one line (`import_failure`) says it."""
    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")
    disabled = hydra_log.disabled
    hydra_log.disabled = True
    try:
        return get_object(path)
    finally:
        hydra_log.disabled = disabled


def _loading(error: BaseException | None) -> bool:
    """Whether Hydra's `_target_` lookup raised it (its module, or the name in it, did not
    import)."""
    return isinstance(error, ImportError) and str(error).startswith("Error loading")


def import_failure(error: BaseException) -> str:
    """Why a `_target_` did not import, as its author reads it: the module's own exception
    with the file and line it points at (a `SyntaxError` in the user's module, a
    `NameError` at its top, a dependency it imports that is missing), or the module that
    is nowhere, with where Python looks.

    Args:
        error: what Hydra's lookup (`load_target`, `instantiate`) raised.
    """
    cause = error.__cause__ if _loading(error) and error.__cause__ is not None else error
    if isinstance(cause, SyntaxError):
        return f"SyntaxError in {cause.filename}, line {cause.lineno}: {cause.msg}"
    import traceback

    frames = [f for f in traceback.extract_tb(cause.__traceback__)
              if not f.filename.startswith("<frozen") and "importlib" not in f.filename
              and f"{os.sep}hydra{os.sep}" not in f.filename]
    if isinstance(cause, ModuleNotFoundError) and not frames:
        return (f"{describe(cause)} (is it installed, or its module in the working "
                "directory?)")
    where = (f", raised at {frames[-1].filename}, line {frames[-1].lineno} as the module was "
             "imported") if frames else ""
    return f"{describe(cause)}{where}"


def describe(error: BaseException) -> str:
    """An exception as `Type: its message's first line` (a message may end in a long repr
    whose last line says nothing: the first line is the author's sentence)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    name = type(error).__name__
    if not lines:
        return name
    if lines[0].startswith("Error loading") and len(lines) > 1:
        return " ".join(lines[1:])  # Hydra's import failure: what is missing, and a hint
    text = lines[0] if len(lines[0]) <= 300 else f"{lines[0][:297]}..."
    return f"{name}: {text}"


def group_defaults(schema: Any, raw: dict[str, Any]) -> tuple[str, ...]:
    """The keys of a `model` or `dataset` node that are its default group's own, not the
    user's: where `_target_` replaces the group's builder, every schema key still at the
    group's value (its default, or the group file's `${...}` interpolation).

    Args:
        schema: the chosen group's schema dataclass (`SCHEMAS`; `OmegaConf.get_type` of the
            node), or anything else for a group file without one (a user's own, whose keys
            are the user's).
        raw: the composed node, interpolations unresolved.

    Returns:
        The keys a builder receives only where its signature takes them.
    """
    if not dataclasses.is_dataclass(schema):
        return ()
    defaults = {f.name: f.default for f in dataclasses.fields(schema)}
    if raw.get("_target_") == defaults.get("_target_"):
        return ()
    return tuple(key for key, default in defaults.items() if key != "_target_" and key in raw
                 and (raw[key] == default or _interpolated(raw[key])))


def _interpolated(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${")


def options_for(node: dict[str, Any], optional: tuple[str, ...]) -> dict[str, Any]:
    """`node` as its `_target_`'s builder takes it (`taken_by`); unchanged where the target
    does not import (`build_object` then says why, in one line)."""
    if not optional:
        return dict(node)
    try:
        target = load_target(node["_target_"])
    except Exception:  # noqa: BLE001 - reported by build_object
        return dict(node)
    return taken_by(target, node, optional)


def taken_by(target: Callable, node: dict[str, Any], optional: tuple[str, ...]) -> dict:
    """`node` without the `optional` keys (`group_defaults`) that `target` does not take;
    a target with `**kwargs`, or whose signature cannot be read, keeps them all."""
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return dict(node)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(node)
    return {k: v for k, v in node.items() if k not in optional or k in parameters}
