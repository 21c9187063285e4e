"""The chief's hand-off to an evaluator beside the workers: each epoch's backup weights, and
that epoch's training logs, put in `evaluator/inbox/` (`trainer.run.sidecar`).

The weights are hard-linked from the backup the epoch's end just wrote (no second copy
while the backup lives; the link keeps them once the rotation removes the backup), then the
logs are written, atomically: an entry whose `.json` is there is whole. Nothing here waits
for the evaluator. A build module (Keras's callback class).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import keras
import numpy as np

from trainer.run.sidecar import EvaluatorDir
from trainer.rundir.atomic import write_json


class HandOff(keras.callbacks.Callback):
    """Puts every epoch's backup in the evaluator's inbox; called after `Backup`.

    Args:
        backup: the run's `Backup` callback (its store's directory, whether it stopped).
        place: the run's `evaluator/` directory.
    """

    def __init__(self, backup: keras.callbacks.Callback, place: EvaluatorDir) -> None:
        super().__init__()
        self.backup, self.place = backup, place

    def on_epoch_end(self, epoch, logs=None):
        if self.backup.interrupted:
            return
        saved = self.backup.store.directory / f"ckpt-{epoch + 1:06d}-{0:09d}"
        source = next((saved / n for n in ("model.keras", "model.weights.h5")
                       if (saved / n).is_file()), None)
        if source is None:
            return
        self.place.inbox.mkdir(parents=True, exist_ok=True)
        suffix = ".keras" if source.name.endswith(".keras") else ".weights.h5"
        target = self.place.weights(epoch + 1, suffix)
        _link_or_copy(source, target)
        write_json(self.place.logs(epoch + 1),
                   {k: float(v) for k, v in (logs or {}).items()
                    if isinstance(v, (int, float, np.number)) or np.ndim(v) == 0})


def _link_or_copy(source: Path, target: Path) -> None:
    """`target` is `source`'s content, whole: a hard link, or a copy renamed into place."""
    tmp = target.with_name(f".tmp-{target.name}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
