"""Disk space: checked before training, and a full disk mid-run as one line.

What a run directory holds at its peak, counted in copies of the model's and optimizer's
variables (`state_bytes`; a weights file or `.keras` checkpoint of them is under 1% more):

- `backup/`: the newest two backups, plus the next one being written before the oldest is
  removed: 3 (a backup that copies `best.keras` holds a copy of its own).
- `checkpoints/best.keras`: 1, plus its temporary `.tmp-<pid>-best.keras` while a new best
  is written (at an epoch end, before that epoch's backup: never beside a third backup).
- `checkpoints/last.keras`: written at the end under a temporary name (or copied from
  `best.keras`); a resumed finished run keeps its old `last.keras` all along: 1.

- `checkpoint.keep_best=k`: k more, plus a new one's temporary file before the list drops
  the worst; an averaged model (`optimizer.ema`, `checkpoint.average_best`) 2 more, its
  `averaged.keras` and the temporary file it is written as (the EMA's own slots are part of
  the optimizer's variables).
So 5 copies at most without them (measured on the default model, Adam: 3.0x for a fresh 3-epoch run,
3.7x for one resumed to 5 epochs, 4.0x with mid-epoch backups, 4.7x for the run of
tests/test_fault_tolerance.py, which checks the estimate against its measured peak). With
`export=true`, `saved_model/` holds the model's weights twice (measured: 2.0x, optimizer
left out), and a rerun writes a new one beside the old: 4 copies of the weights. `MARGIN`
covers file-format overhead, TensorBoard's events and logs; `OVERHEAD` a tiny model's files
(each HDF5 file has about 50 KB of its own). Without the check, a full disk at start ended
in a segfault after pages of HDF5 errors.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError
from trainer.rundir.lock import nearest_existing

COPIES = 5  # of the model's and optimizer's variables
EXPORT_COPIES = 4  # of the model's weights, with export=true
MARGIN = 1.2  # file formats' own overhead, logs, TensorBoard events
OVERHEAD = 2 * 2**20  # headers of a tiny model's files, .hydra/, logs, summary, graph


def state_bytes(model: Any) -> int:
    """Bytes of the model's variables and its optimizer's (build the optimizer first: an
    unbuilt one has no slots yet, and the state counts as the weights alone)."""
    variables = list(model.weights)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    return _bytes(variables)


def weights_bytes(model: Any) -> int:
    """Bytes of the model's own variables (what an export holds)."""
    return _bytes(model.weights)


def _bytes(variables: list) -> int:
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


def needed_bytes(model: Any, export: bool = False, checkpoints: int = 0) -> int:
    """An upper bound of what a run directory holds at its peak (see the module's notes).

    Args:
        model: the compiled model, its optimizer built.
        export: whether the run writes a SavedModel (`export=true`).
        checkpoints: checkpoints beyond best and last (the k best, the averaged model).
    """
    copies = (COPIES + checkpoints) * state_bytes(model)
    if export:
        copies += EXPORT_COPIES * weights_bytes(model)
    return int(copies * MARGIN) + OVERHEAD


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
