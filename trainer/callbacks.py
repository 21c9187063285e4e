"""Callbacks Keras does not ship: time to first step and steady throughput."""

from __future__ import annotations

import time

import keras


class Throughput(keras.callbacks.Callback):
    """Measures time to the first training step and steady examples per second.

    The first step of a run traces and optimises the step function (one copy per replica),
    so it is reported apart and left out of the steady rate. Steady time runs from the end
    of the first step to the end of each epoch's last step, excluding validation.

    Args:
        train_examples: training examples per epoch.
        global_batch: examples per step over all replicas.
        started: `time.perf_counter()` at the start of the run, for time to first step.
    """

    def __init__(self, train_examples: int, global_batch: int, started: float) -> None:
        super().__init__()
        self.train_examples = train_examples
        self.global_batch = global_batch
        self.started = started
        self.first_step_s: float | None = None
        self.steady_s = 0.0
        self.steady_examples = 0
        self.epoch_rates: list[float] = []
        self._mark = 0.0
        self._marked_examples = 0
        self._epoch_examples = 0
        self._last: float | None = None

    def on_epoch_begin(self, epoch, logs=None):
        self._mark = time.perf_counter()
        self._marked_examples = 0
        self._epoch_examples = 0
        self._last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self._epoch_examples = min((batch + 1) * self.global_batch, self.train_examples)
        if self.first_step_s is None:
            self.first_step_s = now - self.started
            self._mark, self._marked_examples = now, self._epoch_examples
        self._last = now

    def on_epoch_end(self, epoch, logs=None):
        seconds = (self._last or self._mark) - self._mark
        examples = self._epoch_examples - self._marked_examples
        if seconds > 0 and examples > 0:
            self.steady_s += seconds
            self.steady_examples += examples
            self.epoch_rates.append(examples / seconds)

    @property
    def examples_per_sec(self) -> float | None:
        """Steady training examples per second over the run, None before any steady step."""
        return self.steady_examples / self.steady_s if self.steady_s > 0 else None
