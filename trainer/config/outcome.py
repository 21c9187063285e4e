"""What the Python API raises: every failure as one `TrainerError` with the command line's
line (`trainer.fit`, `trainer.evaluate`, `trainer.predict`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from trainer.config.compose import KNOWN_ERRORS
from trainer.config.errors import ConfigError, Diverged, Interrupted, WorkerLost
from trainer.config.messages import one_line


class TrainerError(Exception):
    """Any failure of `fit`, `evaluate` or `predict`: one line, and the exit code the command
    line would have ended with (2: bad input; 3: the loss diverged; 4: a worker was lost;
    75: stopped by a signal, rerun to resume)."""

    def __init__(self, message: str, exit_code: int = ConfigError.exit_code) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextmanager
def one_error() -> Iterator[None]:
    """Every known failure as a `TrainerError` carrying the command line's line."""
    try:
        yield
    except TrainerError:
        raise
    except (Interrupted, Diverged, WorkerLost) as error:
        raise TrainerError(str(error), error.exit_code) from None
    except KNOWN_ERRORS as error:
        raise TrainerError(one_line(error)) from None
