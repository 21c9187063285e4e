"""Where preprocessed elements stay between epochs: `dataset.cache: memory | disk | none`.

`memory` is tf.data's in-memory cache, `disk` its file cache (`Dataset.cache(filename)`) in
files the run names, one set per worker, split and lane (`RunDir.input_cache`), and `none`
reads and decodes every epoch. A worker's cache holds its share (see `trainer.data.shares`).
`memory` is refused before training where a worker's share would not fit
`dataset.memory_limit_mb` (default: half of the machine's memory, over the workers it runs).

A build module: TensorFlow is imported at the top.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import tensorflow as tf

from trainer.config.errors import ConfigError

# The share of the machine's memory a run may cache by default (the rest: the model, the
# shuffle buffers, TensorFlow, the other processes).
MEMORY_SHARE = 0.5


def cached(dataset: tf.data.Dataset, mode: str, file: Path | None = None) -> tf.data.Dataset:
    """`dataset` cached as `mode` says (`disk`: in the files starting with `file`)."""
    if mode == "none":
        return dataset
    if mode == "memory":
        return dataset.cache()
    if file is None:
        raise ConfigError("dataset.cache=disk needs a directory for its files (a run's "
                          "directory); use dataset.cache=memory or none here")
    file.parent.mkdir(parents=True, exist_ok=True)
    clear_unfinished(file)
    return dataset.cache(str(file))


def clear_unfinished(file: Path) -> None:
    """Removes the files of a disk cache that was never finished (a run stopped in its
    first pass): TensorFlow would refuse its lock file, or read a part as the whole. A
    finished cache (its `.index` file written at the end of the first pass) is kept and
    read: a resumed run decodes nothing again."""
    if file.with_name(file.name + ".index").exists():
        return
    for stale in file.parent.glob(file.name + "*"):
        if stale.is_file():
            stale.unlink()


def damaged_cache(error: BaseException, run_dir: Path | None) -> ConfigError | None:
    """The one line for a disk cache's file that does not read back (a checksum that does
    not match, a file cut short), naming the file and the remedy; None for another error.

    tf.data names the cache's files in its message (`TensorBundle at DIR/input_cache/...`),
    and nothing else of the run lives there.
    """
    if run_dir is None or not isinstance(error, tf.errors.OpError):
        return None
    folder = Path(run_dir) / "input_cache"
    text = str(error)
    found = re.search(rf"{re.escape(str(folder))}/[^\s:]+", text)
    if found is None:
        return None
    line = next((x for x in text.splitlines() if found.group(0) in x), "")
    why = re.sub(r"\s*\[\[.*", "", line.split(": ", 1)[-1]).strip()[:160]
    return ConfigError(f"the input cache {found.group(0)} (dataset.cache=disk) is damaged "
                       f"({why}); delete {folder} and run again: the data is then read and "
                       "cached anew")


def element_bytes(spec: Any) -> int | None:
    """Bytes of one element of this spec, None where a shape or size is not known
    (strings, ragged sizes)."""
    total = 0
    for part in tf.nest.flatten(spec):
        shape = getattr(part, "shape", None)
        dtype = getattr(part, "dtype", None)
        if shape is None or dtype is None or dtype == tf.string or not shape.is_fully_defined():
            return None
        total += math.prod(shape.as_list()) * dtype.size
    return total


def machine_memory_mb() -> int | None:
    """The machine's physical memory in MiB, None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError, AttributeError):
        return None


def worker_memory_limit_mb(configured: int | None, local_workers: int = 1) -> int | None:
    """What a worker may cache in memory: the configured limit, else its part of half of the
    machine's memory (None: unknown, no limit)."""
    if configured is not None:
        return int(configured)
    total = machine_memory_mb()
    return None if total is None else int(total * MEMORY_SHARE / max(1, local_workers))


def check_memory(mode: str, shares: dict[str, tuple[int, int | None]],
                 limit_mb: int | None) -> None:
    """Refuses `cache=memory` where a worker's share would not fit its memory limit.

    Args:
        mode: `dataset.cache` as the run read it: `memory`, `disk` or `none`.
        shares: per cached split, `(examples this worker caches, bytes of one)`; an
            unknown size (None) is not counted.
        limit_mb: the limit (None: none).

    Raises:
        ConfigError: one line naming the share's size, the limit and the other choices.
    """
    if mode != "memory" or limit_mb is None:
        return
    needed = sum(count * size for count, size in shares.values() if size is not None)
    if needed <= limit_mb * 2**20:
        return
    parts = " and ".join(f"{count} {split}" for split, (count, size) in shares.items()
                         if size is not None)
    raise ConfigError(f"dataset.cache=memory would keep {parts} examples of this worker "
                      f"({needed / 2**20:,.1f} MiB decoded) in memory, over "
                      f"dataset.memory_limit_mb={limit_mb}; use dataset.cache=disk (files "
                      "under the run directory) or dataset.cache=none (read and decode every "
                      "epoch), or raise dataset.memory_limit_mb")
