"""One run at a time in a run directory: an exclusive lock, held by its run alone.

The lock is an `flock` on `RUN_DIR/.lock`, which the operating system drops when the
process ends however it ends, so a crash never leaves a stale lock. The file stays (removing
it would let two processes lock two different files of the same name).

Each hold belongs to its run. `acquire` returns a `RunLock` that its owner releases; `hold`
(the pre-flight's) keeps the lock for the calling thread until that thread's
`release_held` (the end of the command line's run, or of `trainer.fit`), and `run_lock` in
the same thread finds it held. One thread's run ending never releases another thread's: two
`trainer.fit` calls in two threads each keep their own. An `flock` belongs to the open file,
not to the process, so a second hold on the same directory from another thread of the same
process is refused just as one from another process is.

Who holds it: the kernel's lock table (`/proc/locks`) names the holder's pid, whatever
program it is; where there is none (not Linux), the pid the file holds. The file's pid is
written only into a new, empty lock file: a start that is refused (another holder, a changed
config, changed data) never rewrites it, so the directory stays byte for byte as it was.

The command line takes the lock (`hold`) before it checks anything about the directory or
lets Hydra write into it. Whether a process created the directory is decided by `os.mkdir`
itself (create-or-fail): of two starts at once, only the one whose `mkdir` succeeded may
ever remove it, and only while it holds the lock.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer.config.errors import ConfigError
from trainer.rundir.layout import LOCK

PROC_LOCKS = "/proc/locks"


def _kernel_holder(fd: int) -> int | None:
    """The pid the kernel's lock table gives for the `flock` on the open file `fd` (None
    where the table is not readable, or does not list it)."""
    stat = os.fstat(fd)
    file = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open(PROC_LOCKS) as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4027 fe:00:2147985 0 EOF"; waiters have "->" after "1:"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == file:
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


def _holder(fd: int) -> str:
    """The holder's pid: the kernel's, else the one the lock file holds, else unknown."""
    pid = _kernel_holder(fd)
    if pid is not None and pid > 0:
        return str(pid)
    try:
        written = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        written = ""
    return written if written.isdigit() else "unknown"


def _refuse(run_dir: Path, fd: int) -> None:
    holder = _holder(fd)
    where = " in this process" if holder == str(os.getpid()) else ""
    raise ConfigError(f"run directory {run_dir} is in use by another run{where} (pid "
                      f"{holder}); wait for it to end, or choose another hydra.run.dir")


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


def holder(run_dir: Path) -> str | None:
    """The pid (as text, "unknown" where it cannot be told) of whoever holds the run
    directory's lock, this process's other threads included; None where nobody does."""
    path = Path(run_dir) / LOCK
    if not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # a shared lock taken here goes with it
    return None


def check_unlocked(run_dir: Path) -> None:
    """Refuses at once when another run holds the run directory's lock."""
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


def _open(run_dir: Path) -> int:
    path = Path(run_dir) / LOCK
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except IsADirectoryError:
        raise ConfigError(f"run directory {run_dir} has a directory {LOCK} where its lock "
                          f"file goes; remove {path} (a run never makes it), or choose "
                          "another hydra.run.dir") from None
    except OSError as error:
        raise ConfigError(f"cannot open the lock file {path} ({error.strerror}); make it a "
                          "file this user can write, or choose another hydra.run.dir"
                          ) from None


def _acquire(run_dir: Path) -> int:
    fd = _open(run_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            _refuse(run_dir, fd)
        finally:
            os.close(fd)
    # The pid goes only into a new (empty) file: an existing one is never rewritten, so a
    # start refused after this (a changed config, changed data) changes no byte.
    if os.fstat(fd).st_size == 0:
        try:
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as error:  # a full disk: before the free-space check could say so
            os.close(fd)
            raise ConfigError(_unwritable(f"write the lock file of run directory {run_dir}",
                                          error)) from None
    return fd


def _unwritable(doing: str, error: OSError) -> str:
    """The one line for a run directory the disk refuses (full, over quota)."""
    return (f"cannot {doing}: {error.strerror or error}; free some space (or quota) on its "
            "disk, or choose another hydra.run.dir")


class RunLock:
    """One run's hold on its run directory's lock; only `release` (by its owner) ends it.

    Attributes:
        run_dir: the directory locked.
        created: the topmost directory this hold created (None where all existed): the
            owner's to remove if the run fails before writing anything.
    """

    def __init__(self, run_dir: Path, fd: int, created: Path | None) -> None:
        self.run_dir, self.created, self._fd = Path(run_dir), created, fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Ends this hold (again: nothing). Other holds, this process's included, stay."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        mine = _mine()
        if mine.get(_key(self.run_dir)) is self:
            del mine[_key(self.run_dir)]

    def __del__(self) -> None:
        # A hold nobody keeps (its thread ended without releasing it) does not outlive it.
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(run_dir: Path) -> RunLock:
    """Takes the run directory's lock (creating the directory first) for its caller.

    Raises:
        ConfigError: another run holds it (another process's, or another thread's of this
            one), naming its pid; nothing was created or changed then.
    """
    run_dir = Path(run_dir)
    try:
        created = make_dirs(run_dir)
    except OSError as error:  # a full disk has no block for a new directory either
        raise ConfigError(_unwritable(f"create run directory {run_dir}", error)) from None
    try:
        fd = _acquire(run_dir)
    except BaseException:
        if created is not None:  # ours, and empty but for the lock file we opened
            remove_created(run_dir, created)
        raise
    return RunLock(run_dir, fd, created)


# The holds `hold` took, per thread (a thread's run is its own): path -> RunLock.
_threads = threading.local()


def _mine() -> dict[str, RunLock]:
    held = getattr(_threads, "held", None)
    if held is None:
        held = _threads.held = {}
    return held


def hold(run_dir: Path) -> Path | None:
    """Takes the run directory's lock for the calling thread until its `release_held`
    (creating the directory first); returns the topmost directory it created (None where
    all existed, or where this thread holds it already).

    Raises:
        ConfigError: another run holds it (another process's, or another thread's of this
            one), naming its pid; nothing was created or changed then.
    """
    if holds(run_dir):
        return None
    lock = acquire(run_dir)
    _mine()[_key(lock.run_dir)] = lock
    return lock.created


def holds(run_dir: Path) -> bool:
    """Whether the calling thread holds the run directory's lock (by `hold`)."""
    lock = _mine().get(_key(Path(run_dir)))
    return lock is not None and lock.held


def release_held() -> None:
    """Releases the locks the calling thread's `hold` took, and only those (the end of a
    command-line run or of `trainer.fit`; another thread's run keeps its own)."""
    mine = _mine()
    while mine:
        _, lock = mine.popitem()
        lock.release()


# The old name, for callers not moved yet: it too releases the calling thread's holds only
# (every lock of the process, as it once did, let one `trainer.fit` end another's).
release_all = release_held


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
    """Holds the run directory's lock while the block runs (already held by this thread's
    command line or `trainer.fit`: nothing to take).

    Raises:
        ConfigError: another run holds it, naming its pid.
    """
    run_dir = Path(run_dir)
    if holds(run_dir):
        yield
        return
    lock = acquire(run_dir)
    try:
        yield
    except BaseException:
        # A run that failed before writing anything leaves no directory it created.
        if lock.created is not None and [p.name for p in run_dir.iterdir()] == [LOCK]:
            remove_created(run_dir, lock.created)
        raise
    finally:
        lock.release()
