"""Disk space: checked before training, and a full disk mid-run as one line.

A run keeps up to three weight files with optimizer state in `backup/` (two backups and one
being written; a backup that links the best checkpoint takes no space of its own) and three
in `checkpoints/` (last, best, and one being written), so it needs at most six times the
size of the model's and optimizer's variables. Without the check, a
full disk at start ended in a segfault after pages of HDF5 errors.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError
from trainer.rundir.lock import nearest_existing

COPIES = 6
MARGIN = 1.2  # file formats' own overhead, logs, TensorBoard events


def state_bytes(model: Any) -> int:
    """Bytes of the model's variables and its optimizer's."""
    variables = list(model.weights)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    total = 0
    for v in variables:
        size = 1
        for dim in v.shape:
            size *= int(dim)
        total += size * _itemsize(v.dtype)
    return total


def _itemsize(dtype: Any) -> int:
    import numpy as np

    try:
        return np.dtype(str(dtype)).itemsize
    except TypeError:
        return 4


def needed_bytes(model: Any) -> int:
    """What a run's backups and checkpoints take at most."""
    return int(state_bytes(model) * COPIES * MARGIN)


def check_free_space(run_dir: Path, needed: int) -> None:
    """Refuses to start when the run directory's disk has less than `needed` bytes free."""
    free = shutil.disk_usage(nearest_existing(run_dir)).free
    if free < needed:
        raise ConfigError(f"the disk of {run_dir} has {free:,} bytes free; this run's backups "
                          f"and checkpoints need about {needed:,}; free some space or choose "
                          "another hydra.run.dir")


def disk_full(error: BaseException) -> bool:
    """Whether an error (or what caused it) is a full disk."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def full_message(run_dir: Path, needed: int) -> str:
    """The one line for a disk that filled during the run."""
    return (f"the disk of {run_dir} filled up while the run wrote a backup or checkpoint; it "
            f"needs about {needed:,} bytes free; the last good backup is kept: free space "
            "and rerun the same command to resume")
