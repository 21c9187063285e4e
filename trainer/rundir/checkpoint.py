"""A checkpoint read back is first checked against the hash written beside it."""

from __future__ import annotations

from pathlib import Path

from trainer.config.errors import ConfigError
from trainer.rundir.checksum import verify_beside


def verified(path: Path) -> Path:
    """Returns `path` once it matches the `NAME.sha256` beside it (where there is one).

    Raises:
        ConfigError: the file does not match the checksum written with it.
    """
    try:
        verify_beside(Path(path))
    except ValueError as error:
        raise ConfigError(f"{error}; use the other checkpoint (checkpoint=best|last) or "
                          "retrain") from None
    except OSError as error:
        raise ConfigError(f"{path} cannot be read ({error.strerror or error}); use the other "
                          "checkpoint (checkpoint=best|last) or retrain") from None
    return path
