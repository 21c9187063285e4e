"""What a run trained on, in a few bytes: a fingerprint of each role's examples.

A run's backups and summary keep it, so a rerun (or `trainer.evaluate`) on data that changed
meanwhile is refused in one line naming the role that changed, instead of resuming on other
files (an image folder that gained files moves some former training files into validation)
or scoring training examples as validation.

- files: each file's path relative to the dataset folder, its size and its class;
- arrays: a SHA-256 of the arrays' bytes, shapes and dtypes (arrays over `FULL_BYTES` are
  sampled: 1 MiB at each of 64 evenly spaced places, so a fingerprint costs at most ~0.1 s);
- any other source: the number of examples of each role (and the split it names).

Pure Python and NumPy: no TensorFlow.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from trainer.config.errors import ConfigError

FULL_BYTES = 64 << 20
SAMPLES, SAMPLE_BYTES = 64, 1 << 20


def of_files(files: Iterable[tuple[str, int]], root: str) -> dict[str, Any]:
    """A role's fingerprint from `(path, class index)` pairs."""
    digest, count = hashlib.sha256(), 0
    for path, label in files:
        size = os.stat(path).st_size
        digest.update(f"{os.path.relpath(path, root)}\t{size}\t{label}\n".encode())
        count += 1
    return {"examples": count, "sha256": digest.hexdigest()[:32]}


def of_arrays(*structures: Any) -> dict[str, Any]:
    """A role's fingerprint from its arrays (features, targets, weights: any structure)."""
    digest, count = hashlib.sha256(), None
    for structure in structures:
        for leaf in _leaves(structure):
            array = np.asarray(leaf)
            count = int(array.shape[0]) if count is None and array.ndim else count
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            _update(digest, array)
    return {"examples": count or 0, "sha256": digest.hexdigest()[:32]}


def _leaves(structure: Any) -> list:
    if structure is None:
        return []
    if isinstance(structure, Mapping):
        return [leaf for key in sorted(structure, key=str) for leaf in _leaves(structure[key])]
    if isinstance(structure, (tuple, list)) and structure and not np.isscalar(structure[0]):
        return [leaf for item in structure for leaf in _leaves(item)]
    return [structure]


def _update(digest: Any, array: np.ndarray) -> None:
    if array.dtype == object:  # strings: their text
        for item in array.reshape(-1):
            digest.update(item if isinstance(item, bytes) else str(item).encode())
        return
    data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    if data.size <= FULL_BYTES:
        digest.update(data)
        return
    step = (data.size - SAMPLE_BYTES) // (SAMPLES - 1)
    for i in range(SAMPLES):
        digest.update(data[i * step:i * step + SAMPLE_BYTES])


def of_counts(sizes: Mapping[str, int], splits: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fallback where a source gives no fingerprint: each role's count and split."""
    return {role: {"examples": int(n), **({"split": str(splits[role])}
                                         if splits and splits.get(role) else {})}
            for role, n in sizes.items() if n}


def changes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints, one phrase per role ([] where nothing does, or
    where `old` is unknown: a run from before fingerprints)."""
    if not old:
        return []
    found = []
    order = ("train", "validation", "test")
    for role in sorted(set(old) | set(new), key=lambda r: (order + (r,)).index(r)):
        before, after = old.get(role) or {}, new.get(role) or {}
        if before == after:
            continue
        if not before or not after:
            found.append(f"{role} {'appeared' if after else 'is gone'}")
        elif before.get("examples") != after.get("examples"):
            found.append(f"{role} had {before.get('examples')} examples, now "
                         f"{after.get('examples')}")
        else:
            found.append(f"{role} has the same number of examples ({after.get('examples')}) "
                         "with other contents")
    return found


def of_source(source: Any) -> dict[str, Any]:
    """A `Source`'s fingerprint, or its roles' counts where it gives none."""
    if source.fingerprint:
        return dict(source.fingerprint)
    return of_counts({"train": source.train_size, "validation": source.validation_size,
                      "test": source.test_size}, source.splits)


def check_same_data(run_dir: Any, kept: dict | None, now: dict) -> None:
    """Refuses to continue (or evaluate) a run on data other than it trained on.

    Raises:
        ConfigError: naming each role that changed.
    """
    found = changes(kept, now)
    if found:
        raise ConfigError(f"the data of {run_dir} changed since it trained: "
                          f"{'; '.join(found)}; restore the data it was trained on, or "
                          "start a new run directory")
