"""The writer: an image folder as TFRecord shards (`python -m trainer.data.tfrecords IMAGES
OUT --shards N`), split as `dataset=image_folder` splits it, with `classes.txt` and
`counts.json` (each role's records, and each shard's records and bytes) beside them.

Every image is decoded before it is written: a file TensorFlow cannot decode is refused in
one line naming it (`--on-bad fail`, the default), leaving no shard behind, or skipped and
counted (`--on-bad skip`). Training on records never meets an image the writer let through.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.data.image_folder import split_files
from trainer.data.pipeline import DataError
from trainer.data.tfrecords.reader import CLASSES, COUNTS, FILES, IMAGE, LABEL, tf_reason
from trainer.rundir import atomic

ON_BAD = ("fail", "skip")


@dataclass(frozen=True)
class Written:
    """What the writer wrote.

    Attributes:
        counts: records per role.
        skipped: the images that did not decode (`on_bad="skip"`), with TensorFlow's reason.
    """

    counts: dict[str, int]
    skipped: list[tuple[str, str]] = field(default_factory=list)


def write(images: str, out: str, shards: int, validation_fraction: float = 0.1,
          test_fraction: float = 0.1, on_bad: str = "fail") -> Written:
    """Writes an image folder as TFRecord shards (`train-00000-of-00004`, ...), with
    `classes.txt` and `counts.json` beside them.

    Args:
        images: the image folder (split as `dataset=image_folder` splits it).
        out: the folder to write; it must not hold TFRecord files yet.
        shards: files per role (fewer where a role has fewer images).
        validation_fraction, test_fraction: as the image folder's.
        on_bad: an image that does not decode: `fail` (refused, nothing written) or `skip`.

    Returns:
        The records written per role, and the images skipped.
    """
    if shards < 1:
        raise ConfigError(f"--shards must be a positive integer; received: {shards}")
    if on_bad not in ON_BAD:
        raise ConfigError(f"--on-bad must be one of {', '.join(ON_BAD)}; received: {on_bad!r}")
    classes, files = split_files(images, validation_fraction, test_fraction)
    target = Path(out).expanduser()
    created = _prepared(target, out)
    written, skipped = {}, []
    try:
        for role, items in files.items():
            if items:
                written.update(_write_role(target, role, items, min(shards, len(items)),
                                           Path(images).expanduser(), on_bad, skipped))
        counts = _counted(written, files, images)
    except BaseException:
        _remove(target, written, created)  # a refused write leaves no shard behind
        raise
    atomic.write_text(target / CLASSES, "".join(f"{c}\n" for c in classes))
    atomic.write_text(target / COUNTS, json.dumps({**counts, FILES: written}, indent=1) + "\n")
    return Written(counts, skipped)


def _prepared(target: Path, out: str) -> bool:
    """Makes the output folder (True where it made it); refuses a file, or a folder that
    holds shards already."""
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{out} is a file, not a folder; give a new folder for the shards")
    taken = [f.name for f in target.glob("*-of-*")] if target.is_dir() else []
    if taken:
        raise ConfigError(f"{out} already holds TFRecord shards ({taken[0]}); write into a "
                          "new folder")
    created = not target.exists()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{out} cannot be made ({error.strerror or error}); give a folder "
                          "you can write") from None
    return created


def _counted(written: dict[str, dict[str, int]], files: dict[str, list],
             images: str) -> dict[str, int]:
    """Records per role; a role every image of which was skipped is refused."""
    counts = {}
    for role, items in files.items():
        if items:
            counts[role] = sum(about["records"] for name, about in written.items()
                               if name.startswith(f"{role}-"))
            if counts[role] == 0 and role in ("train", "validation"):
                raise DataError(f"no {role} image under {images} decodes; nothing to write")
    return counts


def _remove(target: Path, written: dict[str, Any], created: bool) -> None:
    for name in written:
        (target / name).unlink(missing_ok=True)
    for name in target.glob(f"{atomic.TMP}*-of-*"):
        name.unlink(missing_ok=True)
    if created:
        shutil.rmtree(target, ignore_errors=True)


def _write_role(target: Path, role: str, items: list[tuple[str, int]], count: int,
                root: Path, on_bad: str, skipped: list[tuple[str, str]]
                ) -> dict[str, dict[str, int]]:
    """A role's records in `count` files of consecutive records, in the split's order.

    Returns:
        Each shard's name -> its records and bytes.
    """
    written = {}
    for shard in range(count):
        part = items[len(items) * shard // count:len(items) * (shard + 1) // count]
        name = f"{role}-{shard:05d}-of-{count:05d}"
        records = 0
        with atomic.written(target / name) as tmp, tf.io.TFRecordWriter(str(tmp)) as out:
            for file, label in part:
                data = _decoded(Path(file), on_bad, skipped)
                if data is not None:
                    out.write(_example(Path(file), data, label, root).SerializeToString())
                    records += 1
        written[name] = {"records": records, "bytes": (target / name).stat().st_size}
    return written


def _decoded(file: Path, on_bad: str, skipped: list[tuple[str, str]]) -> bytes | None:
    """The file's bytes where TensorFlow decodes them as an image; None for a skipped one."""
    data = file.read_bytes()
    try:
        tf.io.decode_image(data, expand_animations=False)
        return data
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        if on_bad == "skip":
            skipped.append((str(file), tf_reason(error)))
            return None
        raise DataError(f"{file} does not decode as an image ({tf_reason(error)}); remove it or "
                        "replace it with a good copy, or pass --on-bad skip") from None


def _example(file: Path, data: bytes, label: int, root: Path) -> tf.train.Example:
    def feature(value: Any) -> tf.train.Feature:
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    return tf.train.Example(features=tf.train.Features(feature={
        IMAGE: feature(data), LABEL: feature(int(label)),
        "image/format": feature(file.suffix.lower().lstrip(".").encode()),
        "image/filename": feature(str(file.relative_to(root)).encode())}))


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.data.tfrecords IMAGES OUT --shards N`: 0, or 2 with one line."""
    parser = argparse.ArgumentParser(prog="python -m trainer.data.tfrecords",
                                     description="Write an image folder as TFRecord shards.")
    parser.add_argument("images", help="the image folder (class folders, or train/ val/ test/)")
    parser.add_argument("out", help="the folder to write the shards into")
    parser.add_argument("--shards", type=int, default=4, help="files per role (default 4)")
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--on-bad", choices=ON_BAD, default="fail",
                        help="an image that does not decode: refuse it, naming it (fail, the "
                             "default), or leave it out and count it (skip)")
    args = parser.parse_args(argv)
    try:
        done = write(args.images, args.out, args.shards, args.validation_fraction,
                     args.test_fraction, args.on_bad)
    except ConfigError as error:  # DataError is one
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(f'{n} {role}' for role, n in done.counts.items())} records to "
          f"{args.out} (train with dataset=tfrecord dataset.path={args.out})")
    if done.skipped:
        first, why = done.skipped[0]
        print(f"skipped {len(done.skipped)} image{'s' if len(done.skipped) > 1 else ''} that "
              f"do{'es' if len(done.skipped) == 1 else ''} not decode (--on-bad skip), first "
              f"{first} ({why})")
    return 0
