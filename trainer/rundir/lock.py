"""One run at a time in a run directory: an exclusive lock, released on any exit.

The lock is an `flock` on `RUN_DIR/.lock`, which the operating system drops when the
process ends however it ends, so a crash never leaves a stale lock; the file holds the last
holder's pid for the message a second run gets. The file stays (removing it would let two
processes lock two different files of the same name).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer.config.errors import ConfigError
from trainer.rundir.layout import LOCK


def _refuse(run_dir: Path, fd: int) -> None:
    try:
        holder = os.pread(fd, 32, 0).decode().strip() or "unknown"
    except OSError:
        holder = "unknown"
    raise ConfigError(f"run directory {run_dir} is in use by another run (pid {holder}); wait "
                      "for it to end, or choose another hydra.run.dir")


def nearest_existing(path: Path) -> Path:
    """`path` itself, or its closest ancestor that exists (where it would be created)."""
    place = Path(path)
    while not place.exists() and place != place.parent:
        place = place.parent
    return place


def check_writable(run_dir: Path) -> None:
    """Refuses a run directory that is a file, or that cannot be written."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} is a file, not a directory; choose another "
                          "hydra.run.dir")
    place = nearest_existing(run_dir)
    if not os.access(place, os.W_OK | os.X_OK):
        raise ConfigError(f"run directory {run_dir} cannot be written ({place} is read-only "
                          "for this user); choose another hydra.run.dir")


def check_unlocked(run_dir: Path) -> None:
    """Refuses at once when another process holds the run directory's lock."""
    path = Path(run_dir) / LOCK
    if not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        _refuse(run_dir, fd)
    finally:
        os.close(fd)


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Holds the run directory's lock while the block runs.

    Raises:
        ConfigError: another process holds it, naming that process's pid.
    """
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _refuse(run_dir, fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    except BaseException:
        # A run that failed before writing anything leaves no directory it created.
        if created and [p.name for p in run_dir.iterdir()] == [LOCK]:
            path.unlink(missing_ok=True)
            run_dir.rmdir()
        raise
    finally:
        os.close(fd)
