"""A checkpoint written whole with its hash beside it, and read back only once it matches
the hash; the k best checkpoints kept by a run (`checkpoint.keep_best`), listed atomically."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError
from trainer.rundir.atomic import write_json, written
from trainer.rundir.checksum import SUFFIX, verify_beside
from trainer.rundir.layout import RunDir


def verified(path: Path) -> Path:
    """Returns `path` once it matches the `NAME.sha256` beside it (where there is one).

    Raises:
        ConfigError: the file does not match the checksum written with it.
    """
    try:
        verify_beside(Path(path))
    except ValueError as error:
        raise ConfigError(f"{error}; use another checkpoint (checkpoint=best|last|averaged) "
                          "or retrain") from None
    except OSError as error:
        raise ConfigError(f"{path} cannot be read ({error.strerror or error}); use another "
                          "checkpoint (checkpoint=best|last|averaged) or retrain") from None
    return path


def save_checkpoint(model: Any, path: Path) -> None:
    """`model.save` to `path` through the one writer: a temporary name, renamed, its hash
    beside it (`trainer.rundir.atomic.written`)."""
    with written(Path(path), checksum=True) as tmp:
        model.save(tmp)


def intact(path: Path) -> bool:
    """Whether `path` is a file that matches the hash beside it (where there is one)."""
    try:
        verify_beside(Path(path))
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Ranked:
    """One of the k best checkpoints: its file, epoch (from 1) and monitored value."""

    path: Path
    epoch: int
    value: float


class KeptBest:
    """The k best checkpoints by a monitored metric (`checkpoint.keep_best`), as files.

    `kept_best.json` lists them and is the truth: a new file is written (under a temporary
    name, renamed, its hash beside it) before the list names it, and a file dropped from
    the list is removed after, so a kill at any point leaves the list naming whole files;
    a file the list does not name (written or dropped when the kill came) is removed when a
    run opens the directory again. Files ranked by another monitor (a resume that changed
    `checkpoint.monitor`) are left as they are, out of the list. A resumed run keeps the
    epochs its backup holds and drops the later ones, which it trains again. Ties keep the
    earlier epoch.

    Args:
        layout: the run directory.
        k: how many to keep.
        monitor: the metric they are ranked by.
        mode: `min` or `max`.
        done: epochs the run has done (the resumed backup's): later entries are dropped.
    """

    def __init__(self, layout: RunDir, k: int, monitor: str, mode: str, done: int) -> None:
        self.layout, self.k, self.monitor, self.mode = layout, k, monitor, mode
        self.kept = self._read(done)

    def _read(self, done: int) -> list[Ranked]:
        try:
            saved = json.loads(self.layout.kept_best.read_text())
        except (OSError, ValueError):
            saved = {}
        found = [Ranked(self.layout.checkpoints / e["file"], int(e["epoch"]),
                        float(e["value"])) for e in saved.get("kept", [])
                 if saved.get("monitor") == self.monitor]
        kept = self._ranked(r for r in found if r.epoch <= done and r.path.is_file())
        strays = {p.name for p in self.layout.all_ranked(self.monitor)} - {
            r.path.name for r in kept}
        # written only where it changes: a fresh run writes nothing before its first epoch
        # ends, and a resume of the list as it is leaves it byte for byte
        if kept != found or strays or (saved and saved.get("mode") != self.mode):
            self._commit(kept)
        return kept

    def _ranked(self, entries: Any) -> list[Ranked]:
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted(entries, key=lambda r: (sign * r.value, r.epoch))[:self.k]

    def _commit(self, kept: list[Ranked]) -> None:
        """Writes the list, then removes every ranked file it does not name."""
        self.layout.checkpoints.mkdir(parents=True, exist_ok=True)
        write_json(self.layout.kept_best, {"monitor": self.monitor, "mode": self.mode,
                                           "kept": [{"file": r.path.name, "epoch": r.epoch,
                                                     "value": r.value} for r in kept]})
        named = {r.path.name for r in kept}
        for path in self.layout.all_ranked(self.monitor):  # another monitor's: left alone
            if path.name not in named:
                path.unlink(missing_ok=True)
                Path(f"{path}{SUFFIX}").unlink(missing_ok=True)

    def place(self, epoch: int, value: float) -> Path | None:
        """Where epoch `epoch` (from 1) with `value` is to be written, None where it is not
        among the k best (or its value is not a finite number)."""
        if not math.isfinite(value):
            return None
        entry = Ranked(self.layout.ranked(epoch, self.monitor, value), epoch, value)
        others = [r for r in self.kept if r.epoch != epoch]
        return entry.path if entry in self._ranked([*others, entry]) else None

    def add(self, path: Path, epoch: int, value: float) -> None:
        """Lists a written (and hashed) checkpoint and drops what falls out of the k best."""
        others = [r for r in self.kept if r.epoch != epoch]
        self.kept = self._ranked([*others, Ranked(Path(path), epoch, value)])
        self._commit(self.kept)

    def report(self) -> list[dict[str, Any]]:
        """The kept checkpoints, best first, for the summary."""
        return [{"checkpoint": str(r.path), "epoch": r.epoch, self.monitor: r.value}
                for r in self.kept]
