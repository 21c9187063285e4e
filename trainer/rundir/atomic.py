"""The one writer of a run's artefacts: a temporary name, a rename, the checksum beside.

Every file or folder a run writes (checkpoints, backups, exports, the summary, curves,
predictions) goes through `written` (or `commit`, for a file a library wrote under
`temporary(path)` itself), so that:

- a reader never finds half a file: it is written under `.tmp-<pid>-NAME` beside its place
  and renamed over it whole (`trainer.rundir.backup.tidy` removes what a kill left);
- a checksum, where asked, is written beside it (`NAME.sha256`), the old one removed before
  the rename, so a kill between the two leaves a file without a checksum, never a file with
  another file's checksum;
- no two names share storage: `copy` makes a file of its own (a reflink where the file
  system has them, `os.copy_file_range`; bytes copied where it does not), never a hard link,
  so damage to one name, or a user's overwrite of it, changes no other.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from trainer.rundir.checksum import SUFFIX, sha256

TMP = ".tmp-"  # what every temporary name begins with


def temporary(path: Path) -> Path:
    """The temporary name `path` is written under: `.tmp-<pid>-NAME` beside it (the pid: two
    processes writing one name never share a temporary; the suffix a library dispatches
    on, `.keras`, `.weights.h5`, stays last)."""
    path = Path(path)
    return path.with_name(f"{TMP}{os.getpid()}-{path.name}")


def remove(path: Path) -> None:
    """Removes a file or a folder, where there is one."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with suppress(FileNotFoundError):
            path.unlink()


def commit(tmp: Path, path: Path, checksum: bool | str = False) -> str | None:
    """Renames a finished `tmp` over `path` (a folder in the way removed first).

    Args:
        tmp: the whole file or folder, written under `temporary(path)`.
        path: its place.
        checksum: True writes `path`'s SHA-256 beside it; a string is the digest, known
            already (a copy's: the source's as it was written); False writes none.

    Returns:
        The checksum written beside it, None where none was.
    """
    path = Path(path)
    digest = sha256(Path(tmp)) if checksum is True else (checksum or None)
    beside = Path(f"{path}{SUFFIX}")
    if checksum is not False:
        remove(beside)  # a kill before the new one is written: no checksum, not a wrong one
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # a folder is not replaced by a rename
    os.replace(tmp, path)
    if digest is not None:
        write_text(beside, digest + "\n")
    return digest


@contextmanager
def written(path: Path, checksum: bool | str = False) -> Iterator[Path]:
    """Yields the temporary name to write `path` under (a file, or a folder the block
    makes); once the block ends, renames it into place (`commit`). A block that fails
    leaves neither the temporary name nor a changed `path`.

    Args:
        path: where the file or folder goes (its parent is made).
        checksum: write its SHA-256 beside it (`NAME.sha256`), as `commit` takes it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary(path)
    remove(tmp)
    try:
        yield tmp
        commit(tmp, path, checksum)
    except BaseException:
        remove(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    """Writes `text` whole (`written`)."""
    with written(path) as tmp:
        tmp.write_text(text)


# The key under which `json_text` notes the non-finite numbers it wrote as null.
NON_FINITE = "non_finite"


def json_text(data: Any, indent: int | None = 2) -> str:
    """`data` as strict JSON: a non-finite number (a loss that blew up: `Infinity`, `NaN`,
    which Python writes but no other parser reads) is written as null, and a dict's
    `non_finite` entry notes each one by its path (`{"history/loss/2": "Infinity"}`), which
    `json_read` puts back."""
    found: dict[str, str] = {}
    clean = _finite(data, "", found)
    if found and isinstance(clean, dict):
        clean = {**clean, NON_FINITE: found}
    return json.dumps(clean, indent=indent, sort_keys=False, allow_nan=False)


def _finite(value: Any, path: str, found: dict[str, str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found[path.lstrip("/")] = json.dumps(value)  # Infinity, -Infinity, NaN
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{path}/{k}", found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, f"{path}/{i}", found) for i, v in enumerate(value)]
    return value


def json_read(text: str) -> Any:
    """JSON `json_text` wrote, its non-finite numbers put back where its note says."""
    data = json.loads(text)
    notes = data.pop(NON_FINITE, None) if isinstance(data, dict) else None
    for path, number in (notes or {}).items():
        *parents, last = path.split("/")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = float(json.loads(number))
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes JSON whole (`written`), strict (`json_text`)."""
    write_text(path, json_text(data) + "\n")


def write_checksum(path: Path, digest: str | None = None) -> str:
    """Writes `path`'s checksum beside it (`digest`, or computed); returns it."""
    digest = digest or sha256(Path(path))
    write_text(Path(f"{path}{SUFFIX}"), digest + "\n")
    return digest


def copy(source: Path, path: Path, checksum: bool | str = True) -> str | None:
    """Makes `path` a file of its own with `source`'s bytes (`copy_bytes`), renamed into
    place.

    Args:
        source: the file copied.
        path: the copy's place.
        checksum: `source`'s checksum as it was written (kept so, a source damaged since is
            found damaged in the copy too), True to compute it from the copy, False for none.

    Returns:
        The checksum written beside the copy, None where none was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary(path)
    remove(tmp)
    try:
        copy_bytes(Path(source), tmp)
        return commit(tmp, path, checksum)
    except BaseException:
        remove(tmp)
        raise


def copy_bytes(source: Path, target: Path) -> None:
    """`target` a new file with `source`'s bytes: `os.copy_file_range`, which a file system
    with reflinks (btrfs, XFS, APFS's clones aside) serves without copying, then
    `shutil.copyfile` where the call is missing or refused (another file system)."""
    with open(source, "rb") as src:
        copy_open(src, target)


def copy_open(src: BinaryIO, target: Path) -> None:
    """`target` a new file with the bytes of `src`, a file open for reading (from its
    start: a file renamed over its name since it was opened leaves these bytes as they
    were), as `copy_bytes` copies them."""
    src.seek(0)
    with open(target, "wb") as dst:
        left = os.fstat(src.fileno()).st_size
        try:
            while left > 0:
                done = os.copy_file_range(src.fileno(), dst.fileno(), left)
                if done == 0:
                    break
                left -= done
            if left == 0:
                return
        except (AttributeError, OSError):
            pass
        src.seek(0)
        dst.seek(0)
        dst.truncate()
        shutil.copyfileobj(src, dst, 1 << 20)
