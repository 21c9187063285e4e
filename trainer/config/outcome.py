"""What the Python API raises: every failure as one `TrainerError` with the command line's
line (`trainer.fit`, `trainer.evaluate`, `trainer.predict`)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

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


def as_overrides(value: Any, call: str) -> list[str]:
    """The API's `overrides` argument as the command line's list of `key=value` strings.

    Raises:
        ConfigError: `value` is one string (each of its characters would be an override),
            None, or holds something that is not a string; one line naming what to pass.
    """
    example = "['epochs=3', 'devices=2']"
    if isinstance(value, (str, bytes)):
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        try:
            split = shlex.split(text)
        except ValueError:
            split = text.split()
        raise ConfigError(f"{call}: overrides are a list of strings, one key=value each: "
                          f"{split!r}; received the one string {text!r}")
    if value is None or not isinstance(value, Iterable) or isinstance(value, dict):
        raise ConfigError(f"{call}: overrides are a list of strings, one key=value each "
                          f"(e.g. {example}; () for none); received {kind_of(value)}")
    items = list(value)
    for number, item in enumerate(items, 1):
        if not isinstance(item, str):
            raise ConfigError(f"{call}: overrides are a list of strings, one key=value each "
                              f"(e.g. {example}); item {number} is {kind_of(item)}")
    return items


def kind_of(value: Any) -> str:
    """`list [1, 2, 3]`: a value's type and (shortened) repr, for a one-line refusal."""
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return "None" if value is None else f"{type(value).__name__} {shown}"
