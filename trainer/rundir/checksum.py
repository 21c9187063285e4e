"""SHA-256 checksums of what a run writes, so a damaged file is found on load, not by a NaN.

A weights file with garbage bytes in the middle still loads (HDF5 checks its structure, not
its data) and then trains to NaN; a checksum written with it and verified on load turns
that into a message naming the file. Backups keep theirs in `state.json`, checkpoints in a
`NAME.sha256` file beside them (written by `trainer.rundir.atomic`); a checksum file that
holds no checksum is named as the damaged one, not the file it was written for.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SUFFIX = ".sha256"
DIGEST = re.compile(r"[0-9a-f]{64}")


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


def read_beside(path: Path) -> str | None:
    """The checksum written beside `path`, None where there is none or it is not one."""
    side = Path(f"{path}{SUFFIX}")
    try:
        text = side.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if DIGEST.fullmatch(text) else None


def verify_beside(path: Path) -> None:
    """Checks `path` against `path.sha256` where that exists.

    Raises:
        ValueError: `path` does not match; or the checksum file holds no checksum (it is the
            one damaged, named as such: `path` itself may be whole).
    """
    side = Path(f"{path}{SUFFIX}")
    if not side.is_file():
        return
    try:
        text = side.read_bytes().decode().strip()
    except UnicodeDecodeError:
        text = None
    if text is None or not DIGEST.fullmatch(text):
        raise ValueError(f"the checksum file {side} is damaged (it holds no SHA-256), so "
                         f"{Path(path).name} cannot be checked; remove {side.name} to load "
                         f"{Path(path).name} unchecked")
    verify(path, text)
