"""A run directory this start created is removed again if the run fails before it holds a
run: a bad config, a tracker that cannot start, a Ctrl-C at start-up leave nothing behind.

The run's owner (`trainer.run.prepare.owner.Owner`, the command line's and the Python API's alike)
calls `remove_fresh` when a run fails. A directory that holds a run
(a backup, checkpoints or a summary) is never touched, and neither is one another process
created (two starts at once: only the start whose `mkdir` created it lists it).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from trainer.rundir.layout import LOCK, RunDir
from trainer.rundir.lock import remove_created

# (directory, topmost directory this start created for it; None: a directory Hydra creates
# for its `.hydra/` and log, wholly this start's)
Fresh = tuple[Path, Path | None]


def remove_fresh(fresh: Sequence[Fresh]) -> None:
    """Removes the fresh directories that hold no run (Hydra's `.hydra/` and log only)."""
    for path, top in fresh:
        path = Path(path)
        if not path.is_dir() or RunDir(path).holds_run():
            continue
        close_logs_in(path)
        for inside in path.iterdir():  # .hydra/ and the log; the lock file last
            if inside.is_dir():
                shutil.rmtree(inside, ignore_errors=True)
            elif inside.name != LOCK:
                inside.unlink(missing_ok=True)
        if top is None:
            shutil.rmtree(path, ignore_errors=True)
        else:
            remove_created(path, top)


def close_logs_in(path: Path) -> None:
    """Closes the logging handlers writing into `path` (Hydra's job log), and only those."""
    root = os.path.realpath(path)
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in list(getattr(logger, "handlers", [])):
            name = getattr(handler, "baseFilename", None)
            if name and os.path.realpath(name).startswith(root + os.sep):
                handler.close()
                logger.removeHandler(handler)
