"""What a run trained on, in a few bytes: a fingerprint of each role's examples.

A run's backups and summary keep it, so a rerun (or `trainer.evaluate`) on data that changed
meanwhile is refused in one line naming the role that changed, instead of resuming on other
files (an image folder that gained files moves some former training files into validation)
or scoring training examples as validation.

- files (an image folder): `sha256` over each file's path relative to the dataset folder,
  its size and its class (all a backup from before content hashes has), and `content` over
  the same with the SHA-256 of each file's bytes: a file rewritten at the same size, or two
  files of one name and size swapped between class folders, changes `content`;
- arrays: a SHA-256 of the arrays' bytes, shapes and dtypes (arrays over `FULL_BYTES` are
  sampled: 1 MiB at each of 64 evenly spaced places, so a fingerprint costs at most ~0.1 s);
- any other source: the number of examples of each role (and the split it names).

Two fingerprints are compared on the keys both have, so a backup written before `content`
existed resumes on the same names, sizes and classes.

What hashing the files costs, and what the cache of it misses: reading every file of a
folder costs about a fifth of an epoch of small images (scripts/bench_fingerprint.py: 0.18 s
for 10,000 32x32 PNGs, against 0.98 s for an epoch; 0.026 s warm). So each file's hash is
kept in a cache file per dataset folder (`fingerprints/` under `TRAINER_CACHE_DIR`, by
default `~/.cache/trainer`; never in the run directory, which a refused resume must leave
byte for byte as it was, nor in the dataset folder), with the file's size, mtime_ns,
ctime_ns and inode, and a file is read again only where one of them changed. A rename
(a swap) changes the inode, and any write changes the ctime, which no program can set back;
so a change the cache misses is one that keeps all four: a same-size rewrite that keeps the
mtime, on a file system that keeps no ctime or inode of its own (some FUSE and network
mounts). A file changed within `RACY_NS` of being hashed is not cached (its timestamps may
not have moved yet). Delete the cache (or set `TRAINER_CACHE_DIR` elsewhere) to hash every
file again; where the cache cannot be written, every file is hashed each time.

Pure Python and NumPy: no TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config.errors import ConfigError

FULL_BYTES = 64 << 20
SAMPLES, SAMPLE_BYTES = 64, 1 << 20


CACHE_ENV = "TRAINER_CACHE_DIR"
# A file whose mtime or ctime is this close to the moment it was hashed is not cached: a
# write in the same clock tick may not move them (2 s: FAT's and ext3's granularity).
RACY_NS = 2_000_000_000
READ_BYTES = 1 << 20


def of_files(files: Iterable[tuple[str, int]], root: str) -> dict[str, Any]:
    """A role's fingerprint from `(path, class index)` pairs."""
    return of_folder({"role": list(files)}, root)["role"]


def of_folder(roles: Mapping[str, Iterable[tuple[str, int]]], root: str,
              cache: HashCache | None = None,
              stats: Mapping[str, os.stat_result] | None = None) -> dict[str, dict[str, Any]]:
    """Each role's fingerprint from its `(path, class index)` pairs (paths as strings),
    under one folder: one read and one write of the folder's hash cache (or of `cache`).

    Args:
        stats: the files' `os.stat` results where the caller has them (the folder's
            listing took them): each file is then not stat'ed again.

    On a warm cache the cost is a lean loop over the files (and their `stat`, where not
    given); see scripts/bench_fingerprint.py.
    """
    cache = cache if cache is not None else HashCache(root)
    prefix = os.path.join(root, "") if root not in ("", ".") else None
    cut = len(prefix or "")
    stat, kept, fresh = os.stat, cache.kept, cache.fresh
    given = stats or {}
    settled = cache.started - RACY_NS
    found = {}
    hashed = 0
    for role, files in roles.items():
        lines, digests = [], []
        for path, label in files:
            relative = (path[cut:] if prefix is not None and path.startswith(prefix)
                        else os.path.relpath(path, root))
            now = given.get(path) or stat(path)
            size, mtime, ctime = now.st_size, now.st_mtime_ns, now.st_ctime_ns
            entry = kept.get(relative)
            try:
                same = (entry[0] == size and entry[1] == mtime and entry[2] == ctime
                        and entry[3] == now.st_ino)
                digest = entry[4]
            except (TypeError, IndexError, KeyError):  # none cached, or a damaged entry
                same = False
            if not same:
                digest = file_hash(path)
                hashed += 1
                entry = [size, mtime, ctime, now.st_ino, digest]
            if mtime < settled and ctime < settled:
                fresh[relative] = entry
            lines.append(f"{relative}\t{size}\t{label}")
            digests.append(digest)
        # each line ends in a newline (the content's with its file's hash before it)
        names = "".join(line + "\n" for line in lines)
        content = "".join(map("{}\t{}\n".format, lines, digests))
        found[role] = {"examples": len(lines),
                       "sha256": hashlib.sha256(names.encode()).hexdigest()[:32],
                       "content": hashlib.sha256(content.encode()).hexdigest()[:32]}
        cache.reused += len(lines)
    cache.hashed += hashed
    cache.reused -= hashed
    cache.save()
    return found


class Deferred:
    """A folder's fingerprint hashed only where it is asked for (called: the run's record,
    on the chief), with its `listing`: each role's files, sizes and classes (`of_folder`'s
    `sha256`, from the listing's `stat`s alone), which every worker of a cluster compares
    without reading a file (each then decodes only its share)."""

    def __init__(self, compute: Any, roles: Mapping[str, Iterable[tuple[str, int]]],
                 root: str, stats: Mapping[str, os.stat_result] | None = None) -> None:
        self._compute, self._found = compute, None
        self.listing = of_listing(roles, root, stats)

    def __call__(self) -> dict[str, Any]:
        if self._found is None:
            self._found = self._compute()
        return self._found


def of_listing(roles: Mapping[str, Iterable[tuple[str, int]]], root: str,
               stats: Mapping[str, os.stat_result] | None = None) -> dict[str, dict[str, Any]]:
    """Each role's `examples` and `sha256` as `of_folder` gives them (paths relative to
    `root`, sizes, classes), without reading or hashing a file."""
    given = stats or {}
    found = {}
    for role, files in roles.items():
        names = "".join(f"{os.path.relpath(path, root)}\t"
                        f"{(given.get(path) or os.stat(path)).st_size}\t{label}\n"
                        for path, label in files)
        found[role] = {"examples": names.count("\n"),
                       "sha256": hashlib.sha256(names.encode()).hexdigest()[:32]}
    return found


def cache_dir() -> Path:
    """Where trainer keeps what it may recompute: `TRAINER_CACHE_DIR`, else
    `$XDG_CACHE_HOME/trainer`, else `~/.cache/trainer`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trainer"


def file_hash(path: str) -> str:
    """The SHA-256 of a file's bytes (32 hex digits)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()[:32]


class HashCache:
    """The files' hashes of one dataset folder, by relative path, with the size, mtime_ns,
    ctime_ns and inode each was hashed at (see the module's docstring for what it misses).

    Attributes:
        kept: what the cache file held, `{relative path: [size, mtime_ns, ctime_ns, inode,
            hash]}`; `fresh`: the same for this time's files, written by `save`.
        hashed: files read this time (a cache miss); `reused`: files whose hash was kept.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        key = hashlib.sha256(self.root.encode()).hexdigest()[:24]
        self.path = cache_dir() / "fingerprints" / f"{key}.json"
        self.started = time.time_ns()
        self.hashed = self.reused = 0
        self.kept: dict[str, list] = {}
        self.fresh: dict[str, list] = {}
        try:
            held = json.loads(self.path.read_text())
            if held.get("root") == self.root and isinstance(held.get("files"), dict):
                self.kept = held["files"]  # each entry checked where it is read
        except (OSError, ValueError, AttributeError):
            pass  # no cache yet, or a damaged one: every file is hashed

    def save(self) -> None:
        """Writes the hashes of this time's files (none of others') where they differ from
        the file's; a cache that cannot be written is left out (the next time hashes again)."""
        if not self.hashed and len(self.fresh) == len(self.kept):
            return  # every file reused and kept again: the file holds exactly these
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}-{threading.get_ident()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"root": self.root, "files": self.fresh},
                                      separators=(",", ":")))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()


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
        if _same(before, after):
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


def _same(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether two fingerprints of a role agree on what both have (an older one may lack
    the content hash); two with nothing in common differ unless both are empty."""
    common = set(before) & set(after)
    if not common:
        return not before and not after
    return all(before[key] == after[key] for key in common)


def of_source(source: Any) -> dict[str, Any]:
    """A `Source`'s fingerprint (computed now where it is a function), or its roles' counts
    where it gives none."""
    found = source.fingerprint() if callable(source.fingerprint) else source.fingerprint
    if found:
        return dict(found)
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
