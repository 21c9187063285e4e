"""Keras 3.15's callbacks with their private steps as hooks of trainer's: the step the
progress bar shows, and the path and the act of one checkpoint save."""

from __future__ import annotations

from typing import Any

import keras

from trainer.internals import check_version

check_version("keras", keras.__version__)


class ProgbarAt(keras.callbacks.ProgbarLogger):
    """Keras's progress bar, showing each step at `shown_step(step)` (a resumed epoch's
    steps where the epoch began before the resume)."""

    def shown_step(self, step: int) -> int:
        """The step the bar shows for Keras's `step` of this epoch."""
        return step

    def _update_progbar(self, batch, logs=None):
        super()._update_progbar(self.shown_step(batch), logs)


class CheckpointHooks(keras.callbacks.ModelCheckpoint):
    """Keras's ModelCheckpoint with its private steps as hooks: `writing_path` (the file a
    save writes, from Keras's formatted path) and `save_checkpoint` (one save; Keras's own
    is `keras_save`)."""

    def writing_path(self, path: str) -> str:
        """The file a save writes to, given the path Keras formatted for it."""
        return path

    def save_checkpoint(self, epoch: int, batch: Any, logs: Any) -> None:
        """One save, where Keras decided to save (at an epoch's end, or every N batches)."""
        self.keras_save(epoch, batch, logs)

    def keras_save(self, epoch: int, batch: Any, logs: Any) -> None:
        """Keras's own save (its choice of best, its file format by suffix)."""
        super()._save_model(epoch, batch, logs)

    def _get_file_path(self, epoch, batch, logs):
        return self.writing_path(super()._get_file_path(epoch, batch, logs))

    def _save_model(self, epoch, batch, logs):
        self.save_checkpoint(epoch, batch, logs)
