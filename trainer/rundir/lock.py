"""One run at a time in a run directory: an exclusive lock, released on any exit.

The lock is an `flock` on `RUN_DIR/.lock`, which the operating system drops when the
process ends however it ends, so a crash never leaves a stale lock; the file holds the last
holder's pid for the message a second run gets. The file stays (removing it would let two
processes lock two different files of the same name).

The command line takes the lock (`hold`) before it checks anything about the directory or
lets Hydra write into it, and keeps it until the process ends; `run_lock` in the same
process then finds it held. Whether a process created the directory is decided by
`os.mkdir` itself (create-or-fail): of two starts at once, only the one whose `mkdir`
succeeded may ever remove it, and only while it holds the lock.
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


# Run directories this process holds the lock of, for the rest of the process: path -> fd.
_held: dict[str, int] = {}


def _key(run_dir: Path) -> str:
    return os.path.realpath(run_dir)


def make_dirs(run_dir: Path) -> Path | None:
    """Creates `run_dir` and its missing parents; returns the topmost directory this call
    created (None: `run_dir` existed, or another process created it first)."""
    run_dir = Path(run_dir)
    missing = []
    place = run_dir
    while not place.exists() and place != place.parent:
        missing.append(place)
        place = place.parent
    top, ours = None, False
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            continue  # made by someone else meanwhile: not ours to remove
        top = top or path
        ours = path == run_dir
    return top if ours else None


def _chain(run_dir: Path, top: Path) -> list[Path]:
    """`run_dir`, then its parents up to and including `top`."""
    chain = [run_dir]
    while chain[-1] != top and chain[-1] != chain[-1].parent:
        chain.append(chain[-1].parent)
    return chain


def _acquire(run_dir: Path) -> int:
    fd = os.open(Path(run_dir) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            _refuse(run_dir, fd)
        finally:
            os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def hold(run_dir: Path) -> Path | None:
    """Takes the run directory's lock for the rest of this process (creating the directory
    first); returns the topmost directory it created (None where all existed).

    Raises:
        ConfigError: another process holds it, naming that process's pid; nothing was
            created or changed then.
    """
    run_dir = Path(run_dir)
    if _key(run_dir) in _held:
        return None
    created = make_dirs(run_dir)
    try:
        fd = _acquire(run_dir)
    except BaseException:
        if created is not None:  # ours, and empty but for the lock file we opened
            remove_created(run_dir, created)
        raise
    _held[_key(run_dir)] = fd
    return created


def holds(run_dir: Path) -> bool:
    """Whether this process holds the run directory's lock."""
    return _key(Path(run_dir)) in _held


def release_all() -> None:
    """Releases every lock `hold` took (the end of a command-line run in a longer process)."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)


def remove_created(run_dir: Path, top: Path) -> None:
    """Removes `run_dir`, which this process created, where it holds nothing but the lock
    file, and the empty parents up to `top` that this process created too."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or [p.name for p in run_dir.iterdir()] not in ([], [LOCK]):
        return
    (run_dir / LOCK).unlink(missing_ok=True)
    for path in _chain(run_dir, Path(top)):
        try:
            path.rmdir()
        except OSError:
            return


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Holds the run directory's lock while the block runs (already held by this process's
    command line: nothing to take).

    Raises:
        ConfigError: another process holds it, naming that process's pid.
    """
    run_dir = Path(run_dir)
    if holds(run_dir):
        yield
        return
    created = make_dirs(run_dir)
    try:
        fd = _acquire(run_dir)
    except BaseException:
        if created is not None:
            remove_created(run_dir, created)
        raise
    path = run_dir / LOCK
    try:
        yield
    except BaseException:
        # A run that failed before writing anything leaves no directory it created.
        if created is not None and [p.name for p in run_dir.iterdir()] == [LOCK]:
            path.unlink(missing_ok=True)
            remove_created(run_dir, created)
        raise
    finally:
        os.close(fd)
