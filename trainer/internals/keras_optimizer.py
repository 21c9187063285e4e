"""Keras 3.15's optimizer's moving average of the weights (`use_ema`): kept beside the model's
own weights during a run, swapped in only where trainer asks.

Keras's `fit` ends by overwriting the model's trainable variables with their moving average
(`finalize_variable_values`). trainer trains in several `fit` calls (a resumed epoch's rest,
each fine-tuning phase), checkpoints and backs up the raw weights and evaluates the average
once, at the end, as a model of its own: so `fit`'s overwrite is held off
(`raw_weights_kept`), and `swap_in_ema` does it where the averaged model is wanted, over the
variables the optimizer was built over (a frozen backbone's among them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import keras

from trainer.internals import check_version

check_version("keras", keras.__version__)


def _inner(optimizer: Any) -> Any:
    """The optimizer that keeps the average (a loss-scale optimizer's inner one)."""
    return getattr(optimizer, "inner_optimizer", None) or optimizer


def uses_ema(optimizer: Any) -> bool:
    """Whether the optimizer keeps a moving average of the weights (`use_ema=True`)."""
    return bool(getattr(_inner(optimizer), "use_ema", False))


def ema_momentum(optimizer: Any) -> float | None:
    """The average's momentum, None without one."""
    return float(_inner(optimizer).ema_momentum) if uses_ema(optimizer) else None


@contextmanager
def raw_weights_kept(optimizer: Any) -> Iterator[None]:
    """Within it, `fit`'s end leaves the model's weights as trained (no moving average
    swapped in); an optimizer without an average is left alone."""
    if optimizer is None or not uses_ema(optimizer):
        yield
        return
    optimizer.finalize_variable_values = lambda var_list: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values  # the class's own again


def swap_in_ema(optimizer: Any) -> None:
    """Overwrites the variables the optimizer trains with their moving averages, on every
    replica (Keras's own overwrite, across a strategy's replicas)."""
    inner = _inner(optimizer)
    inner.finalize_variable_values(list(inner._trainable_variables))
