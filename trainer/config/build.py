"""Config nodes to objects: Hydra's `instantiate`, its failures turned into one line."""

from __future__ import annotations

import logging
import os
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
