"""A callback that holds a run at one moment, once, so a test can kill it there
(tests/test_healing.py): it writes `marker` when it gets there and sleeps; a run started
again (a restart, a relaunch) finds the marker and goes on.

Moments: `first_step` (before the first training step), `mid_epoch` (after step 8 of the
second epoch, a backup at step 5 behind it), `epoch_end` (the end of the first epoch, its
backup being written), `train_end` (after the last epoch and its backup, before the final
evaluation: on 2 workers the chief writes that backup in the background and worker 1 gets
here first, so with `backups` (the chief's `backup/` directory) it waits for the backup
to be in place, as a directory named `ckpt-*` is only once it is complete).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import keras


class PauseAt(keras.callbacks.Callback):
    def __init__(self, moment: str, marker: str, seconds: float = 120.0,
                 backups: str | None = None) -> None:
        super().__init__()
        self.moment, self.marker, self.seconds = moment, Path(marker), seconds
        self.backups = None if backups is None else Path(backups)
        self.epoch = 0

    def _pause(self) -> None:
        if self.marker.exists():
            return
        self.marker.write_text(str(os.getpid()))
        time.sleep(self.seconds)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.moment == "first_step" and self.epoch == 0 and batch == 0:
            self._pause()

    def on_train_batch_end(self, batch, logs=None):
        if self.moment == "mid_epoch" and self.epoch == 1 and batch == 7:
            self._pause()

    def on_epoch_end(self, epoch, logs=None):
        if self.moment == "epoch_end" and epoch == 0:
            self._pause()

    def on_train_end(self, logs=None):
        if self.moment == "train_end":
            if self.backups is not None and not self.marker.exists():
                last = f"ckpt-{self.params['epochs']:06d}-*"
                deadline = time.monotonic() + 120
                while not any(self.backups.glob(last)) and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._pause()
