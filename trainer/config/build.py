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
        detail = str(cause or error).strip().splitlines()
        raise ConfigError(f"{what}: cannot build {node.get('_target_')!r}: "
                          f"{detail[-1] if detail else type(cause).__name__}") from None
