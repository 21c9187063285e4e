"""Atomic writes: a file is written to a temporary name and renamed, never half-written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str) -> None:
    """Writes `text` to a temporary name and renames it, so a crash never leaves half a
    file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes JSON whole (`write_text`)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
