"""Whether the file system can hold a run directory's name, checked before anything looks at
the directory (a `stat` of a name it cannot hold fails with `File name too long`)."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.config.errors import ConfigError
from trainer.rundir.remote import check_url, is_url

# Bytes in one name (a path component) and in a whole path on Linux and macOS file systems
# (ext4, XFS, btrfs, APFS: 255; PATH_MAX: 4096 on Linux, 1024 on macOS).
NAME_MAX = 255
PATH_MAX = 1024 if os.uname().sysname == "Darwin" else 4096
# Room left in the path for what trainer writes inside the run directory
# (`checkpoints/.tmp-<pid>-best.keras.sha256`, `backup/ckpt-<epoch>-<step>/...`).
INSIDE = 128
# The operating system's own trees: a run directory there is a mistake, never a run's place.
SYSTEM = ("/proc", "/sys", "/dev", "/boot", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32",
          "/lib64", "/libx32", "/run", "/var/lib", "/var/run", "/System", "/Library")


def check_name(run_dir: str | Path, option: str = "hydra.run.dir") -> None:
    """Refuses an empty run directory name (`hydra.run.dir=`: `Path('')` is the working
    directory, which the run would fill), a name with a component the file system cannot
    hold, or a path that leaves no room for the files a run writes inside it.

    Args:
        run_dir: the run directory, as given: the raw string where there is one, since an
            empty one is `.` once made a `Path`.
        option: the option that named it, for the remedy.

    Raises:
        ConfigError: naming the empty value, or the component (shortened), its length and
            the limit.
    """
    if isinstance(run_dir, str) and not run_dir.strip():
        raise ConfigError(f"{option} is empty ({run_dir!r}): the run would write into the "
                          f"working directory; give a directory, e.g. {option}=runs/NAME, or "
                          f"leave {option} out for outputs/DATE/TIME")
    if isinstance(run_dir, str):
        check_url(run_dir, option)  # `s3:/one-slash` would be a local folder `s3:`
    if isinstance(run_dir, str) and is_url(run_dir):
        raise ConfigError(f"{option}={run_dir} is a URL where a local directory is needed; a "
                          "run directory at a URL is given to python -m trainer or "
                          "trainer.fit as hydra.run.dir=URL or resume=URL")
    for part in Path(run_dir).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            shown = part if len(part) <= 40 else f"{part[:20]}...{part[-12:]}"
            raise ConfigError(f"run directory name {shown!r} is {size} bytes long; a file "
                              f"system holds at most {NAME_MAX} per name: choose a shorter "
                              f"{option}")
    size = len(os.fsencode(os.path.abspath(run_dir)))
    if size > PATH_MAX - INSIDE:
        raise ConfigError(f"run directory path is {size} bytes long; with the files a run "
                          f"writes inside it, it must stay under {PATH_MAX - INSIDE}: choose a "
                          f"shorter {option}")
    check_place(Path(run_dir), option)


def check_place(run_dir: Path, option: str = "hydra.run.dir") -> None:
    """Refuses a run directory that cannot be a run's: the file system's root, a folder of
    the operating system's (`/etc`, `/proc`, `/usr/...`) or a top-level one itself (`/tmp`,
    `/home`), and a path under a file.

    Raises:
        ConfigError: naming the path and what to give instead.
    """
    path = Path(os.path.realpath(os.path.abspath(run_dir)))
    what = None
    if path == Path(path.anchor):
        what = "is the file system's root"
    elif any(path == Path(top) or Path(top) in path.parents for top in SYSTEM):
        what = "is in a folder of the operating system's"
    elif path.parent == Path(path.anchor) and path.is_dir():
        what = "is a top-level folder of the file system, not a run's own"
    else:
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            what = f"is under {above}, which is a file, not a folder"
    if what is not None:
        raise ConfigError(f"{option}={run_dir} {what}; give a directory of the run's own, "
                          f"e.g. {option}=runs/NAME, or leave {option} out for "
                          "outputs/DATE/TIME")
