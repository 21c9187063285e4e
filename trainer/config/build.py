"""Config nodes to objects: Hydra's `instantiate`, its failures turned into one line."""

from __future__ import annotations

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
        raise ConfigError(f"{what}: cannot build {node.get('_target_')!r}: "
                          f"{describe(cause or error)}") from None


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
