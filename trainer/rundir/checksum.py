"""SHA-256 checksums of what a run writes, so a damaged file is found on load, not by a NaN.

A weights file with garbage bytes in the middle still loads (HDF5 checks its structure, not
its data) and then trains to NaN; a checksum written with it and verified on load turns
that into a message naming the file. Backups keep theirs in `state.json`, checkpoints in a
`NAME.sha256` file beside them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SUFFIX = ".sha256"


def sha256(path: Path) -> str:
    """The file's SHA-256, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, expected: str | None) -> None:
    """Raises ValueError naming the file when its checksum is not `expected` (None: unknown)."""
    if expected is not None and sha256(path) != expected:
        raise ValueError(f"{path} is damaged (its SHA-256 does not match the one written "
                         "with it)")


def write_beside(path: Path) -> str:
    """Writes `path`'s checksum to `path.sha256` (atomically); returns it."""
    return write_checksum(path, sha256(path))


def write_checksum(path: Path, digest: str) -> str:
    """Writes a known checksum of `path` to `path.sha256` (atomically); returns it."""
    side = Path(f"{path}{SUFFIX}")
    tmp = side.with_name(f".tmp-{side.name}")
    tmp.write_text(digest + "\n")
    tmp.replace(side)
    return digest


def read_beside(path: Path) -> str | None:
    """The checksum written beside `path`, None where there is none."""
    side = Path(f"{path}{SUFFIX}")
    try:
        return side.read_text().strip() or None
    except OSError:
        return None


def verify_beside(path: Path) -> None:
    """Checks `path` against `path.sha256` where that exists."""
    side = Path(f"{path}{SUFFIX}")
    if side.is_file():
        verify(path, side.read_text().strip())
