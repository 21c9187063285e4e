"""Sharded TFRecord files of `tf.train.Example`s: `dataset=tfrecord dataset.path=DIR`.

DIR holds the shards of each role: `train-*`, `validation-*` (or `val-*`) and, optionally,
`test-*`. Image records use the ImageNet / Model Garden feature names: `image/encoded` (PNG
or JPEG bytes) and `image/class/label`; the class names, where known, are in `classes.txt`
beside the shards (one per line, in index order) and the records of each role in
`counts.json` (else they are counted once, by reading every record). Other records are read
with a feature spec of names, dtypes and shapes (`dataset.features`), given to the model as
`dataset.inputs` and trained to predict `dataset.outputs`: one name each, or several (a dict
by name).

Every role is read as a stream: the shards interleaved in parallel (one fixed order),
prefetched. The cheap part of a record (its bytes and its target) is what workers share by
position (`trainer.data.shares`); parsing and decoding the rest happens in `preprocess`, on
each worker's share alone. A damaged record is one line naming its file and its place.

`python -m trainer.data.tfrecords IMAGES OUT --shards N` writes an image folder (the image
folder's split rules) into this layout.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.data.fingerprint import of_folder
from trainer.data.image_folder import split_files
from trainer.data.pipeline import DataError, Source

IMAGE, LABEL = "image/encoded", "image/class/label"
CLASSES, COUNTS = "classes.txt", "counts.json"
PREFIXES = {"train": ("train",), "validation": ("validation", "val"), "test": ("test",)}
DTYPES = {"float32": tf.float32, "float64": tf.float64, "int64": tf.int64, "int32": tf.int32,
          "string": tf.string}
# Files read in parallel, in one fixed order (the same on any number of workers).
CYCLE = 16
# Parsing every record to find the damaged one stops after this long.
SEARCH_S = 30.0


def load(path: str, image_size: int | None = 64, channels: int = 3, features: Any = None,
         inputs: Any = None, outputs: Any = None, num_classes: int | None = None,
         label_offset: int = 0, seed: int | None = None) -> Source:
    """Reads each role's shards as a stream of records, parsed and decoded in `preprocess`.

    Args:
        path: the folder of shards.
        image_size: image records: the side they are resized to (None: their own, which
            must then be one size).
        channels: image records: 1, 3 or 4.
        features: other records: `{name: {dtype: float32|float64|int64|int32|string,
            shape: [...]}}`; None: image records.
        inputs, outputs: with `features`: the feature name(s) the model takes and the
            one(s) it predicts (several: a dict by name).
        num_classes: class targets: how many classes (image records: `classes.txt`'s
            count, else this); None for regression.
        label_offset: subtracted from `image/class/label` (1 for the Model Garden's
            ImageNet records, whose labels start at 1).
        seed: unused; the order is the files' and the records'.

    Returns:
        A `Source` whose elements are `(record, target)` until `preprocess`.
    """
    del seed
    root = Path(path).expanduser()
    shards = _shards(root, path)
    counts = _counts(root, shards)
    classes = _class_names(root)
    if features is None:
        spec = _ImageRecords(image_size, channels, label_offset, root)
        shape, classes_count = spec.input_shape(shards["train"]), len(classes or []) or num_classes
    else:
        spec = _FeatureRecords(features, inputs, outputs)
        shape, classes_count = spec.input_shape(), num_classes
    datasets = {role: _stream(files).map(spec.target, num_parallel_calls=tf.data.AUTOTUNE)
                for role, files in shards.items()}
    return Source(train=datasets["train"], validation=datasets["validation"],
                  train_size=counts["train"], validation_size=counts["validation"],
                  test=datasets.get("test"), test_size=counts.get("test", 0),
                  input_shape=shape, num_classes=classes_count, preprocess=spec.parse,
                  scale=spec.scale, class_names=classes,
                  num_outputs=None if classes_count else spec.outputs(),
                  explain=_explainer(shards, spec.parse, path), reads_in_preprocess=True,
                  fingerprint=functools.cache(lambda: of_folder(
                      {role: [(str(f), 0) for f in files] for role, files in shards.items()},
                      str(root))))


def _shards(root: Path, path: str) -> dict[str, list[Path]]:
    """Each role's shard files, sorted; train and validation must have some."""
    if not root.is_dir():
        raise DataError(f"dataset=tfrecord: dataset.path={path} is not a folder; expected "
                        "train-*, validation-* (or val-*) and test-* TFRecord files")
    found = {}
    for role, prefixes in PREFIXES.items():
        for prefix in prefixes:
            files = sorted(f for f in root.glob(f"{prefix}-*") if f.is_file())
            if files:
                found[role] = files
                break
    for role in ("train", "validation"):
        if role not in found:
            named = " or ".join(f"{p}-*" for p in PREFIXES[role])
            raise DataError(f"dataset=tfrecord: {path} holds no {named} files; expected "
                            "train-*, validation-* (or val-*) and test-* TFRecord files")
    return found


def _counts(root: Path, shards: dict[str, list[Path]]) -> dict[str, int]:
    """Records per role: `counts.json`'s, else counted by reading every record."""
    try:
        kept = json.loads((root / COUNTS).read_text())
    except (OSError, ValueError):
        kept = {}
    counts = {}
    for role, files in shards.items():
        value = kept.get(role)
        if not isinstance(value, int):
            value = int(_stream(files).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
        counts[role] = value
    return counts


def _class_names(root: Path) -> list[str] | None:
    try:
        names = [line.strip() for line in (root / CLASSES).read_text().splitlines()]
    except OSError:
        return None
    return [n for n in names if n] or None


def _stream(files: list[Path]) -> tf.data.Dataset:
    """The records of these files: read in parallel, interleaved in one fixed order."""
    names = tf.data.Dataset.from_tensor_slices([str(f) for f in files])
    return names.interleave(tf.data.TFRecordDataset, cycle_length=min(CYCLE, len(files)),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class _ImageRecords:
    """ImageNet / Model Garden image records: `image/encoded` and `image/class/label`."""

    scale = 1.0 / 255.0

    def __init__(self, image_size: int | None, channels: int, offset: int, root: Path):
        self.size, self.channels, self.offset, self.root = image_size, channels, offset, root

    def input_shape(self, train: list[Path]) -> tuple[int, ...]:
        if self.size:
            return (self.size, self.size, self.channels)
        first = next(iter(_stream(train).map(self.parse_image).take(1)), None)
        if first is None:
            raise DataError(f"dataset=tfrecord: the train-* files under {self.root} hold "
                            "no record")
        return tuple(first.shape)

    def target(self, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        label = tf.io.parse_single_example(record, {LABEL: tf.io.FixedLenFeature([], tf.int64)})
        return record, tf.cast(label[LABEL] - self.offset, tf.int32)

    def parse_image(self, record: tf.Tensor) -> tf.Tensor:
        found = tf.io.parse_single_example(record, {IMAGE: tf.io.FixedLenFeature([], tf.string)})
        image = tf.io.decode_image(found[IMAGE], channels=self.channels,
                                   expand_animations=False)
        if self.size:
            image = tf.image.resize(image, (self.size, self.size))
            image.set_shape((self.size, self.size, self.channels))
        return image

    def parse(self, record: tf.Tensor, label: Any, *rest: Any) -> tuple:
        return (self.parse_image(record), label, *rest)

    def outputs(self) -> int | None:
        return 1


class _FeatureRecords:
    """Records of a feature spec: the named inputs and outputs, each its dtype and shape."""

    scale = None

    def __init__(self, features: Any, inputs: Any, outputs: Any) -> None:
        self.spec = {}
        for name, about in dict(features).items():
            dtype = str((about or {}).get("dtype", "float32"))
            if dtype not in DTYPES:
                raise ConfigError(f"dataset.features.{name}.dtype={dtype!r}: use one of "
                                  f"{', '.join(DTYPES)}")
            self.spec[str(name)] = (DTYPES[dtype], [int(d) for d in (about or {}).get(
                "shape", [])])
        self.inputs, self.outputs_ = _names("inputs", inputs, self.spec), _names(
            "outputs", outputs, self.spec)

    def _parse(self, record: tf.Tensor, names: list[str]) -> dict[str, tf.Tensor]:
        def stored(dtype):  # what a tf.train.Example holds
            return tf.int64 if dtype.is_integer else tf.float32 if dtype.is_floating else dtype

        found = tf.io.parse_single_example(record, {
            n: tf.io.FixedLenFeature(self.spec[n][1], stored(self.spec[n][0])) for n in names})
        return {n: tf.cast(v, self.spec[n][0]) for n, v in found.items()}

    def _one_or_dict(self, found: dict[str, tf.Tensor], names: list[str]) -> Any:
        return found[names[0]] if len(names) == 1 else {n: found[n] for n in names}

    def target(self, record: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return record, self._one_or_dict(self._parse(record, self.outputs_), self.outputs_)

    def parse(self, record: tf.Tensor, target: Any, *rest: Any) -> tuple:
        return (self._one_or_dict(self._parse(record, self.inputs), self.inputs), target, *rest)

    def input_shape(self) -> Any:
        shapes = {n: tuple(self.spec[n][1]) for n in self.inputs}
        return shapes[self.inputs[0]] if len(self.inputs) == 1 else shapes

    def outputs(self) -> int | None:
        """Outputs of one target (None: several targets, each its own)."""
        if len(self.outputs_) > 1:
            return None
        return math.prod(self.spec[self.outputs_[0]][1]) or 1


def _names(key: str, value: Any, spec: dict[str, Any]) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    unknown = [n for n in names if n not in spec]
    if not names or unknown:
        raise ConfigError(f"dataset.{key} must name one or more of dataset.features "
                          f"({', '.join(spec)}); received: {value!r}")
    return [str(n) for n in names]


def _explainer(shards: dict[str, list[Path]], parse: Callable, path: str):
    """`Source.explain`: names the file and record that failed to read, parse or decode.

    TensorFlow's error names neither; the records are read again, one by one, until one
    fails (for up to `SEARCH_S` seconds).
    """
    def explain(error: BaseException) -> str | None:
        if not isinstance(error, (tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
            return None
        reason = str(error).strip().splitlines()[0][:200]
        found = _first_damaged([f for files in shards.values() for f in files], parse)
        if found is None:
            return (f"dataset=tfrecord: a record under {path} does not read ({reason}); "
                    "write the shards again")
        file, index, why = found
        return (f"dataset=tfrecord: record {index} of {file} is damaged ({why}); write that "
                "shard again, or remove it")

    return explain


def _first_damaged(files: list[Path], parse: Callable) -> tuple[Path, int, str] | None:
    """(file, record index, why) of the first record that does not read, parse or decode."""
    deadline = time.monotonic() + SEARCH_S
    for file in files:
        index = 0
        try:
            for record in tf.data.TFRecordDataset(str(file)):
                if time.monotonic() > deadline:
                    return None
                parse(record, tf.constant(0))
                index += 1
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
            return file, index, str(error).strip().splitlines()[0][:120]
    return None


def write(images: str, out: str, shards: int, validation_fraction: float = 0.1,
          test_fraction: float = 0.1) -> dict[str, int]:
    """Writes an image folder as TFRecord shards (`train-00000-of-00004`, ...), with
    `classes.txt` and `counts.json` beside them.

    Args:
        images: the image folder (split as `dataset=image_folder` splits it).
        out: the folder to write; it must not hold TFRecord files yet.
        shards: files per role (fewer where a role has fewer images).
        validation_fraction, test_fraction: as the image folder's.

    Returns:
        The records written per role.
    """
    if shards < 1:
        raise ConfigError(f"--shards must be a positive integer; received: {shards}")
    classes, files = split_files(images, validation_fraction, test_fraction)
    target = Path(out).expanduser()
    taken = [f.name for f in target.glob("*-of-*")] if target.is_dir() else []
    if taken:
        raise ConfigError(f"{out} already holds TFRecord shards ({taken[0]}); write into a "
                          "new folder")
    target.mkdir(parents=True, exist_ok=True)
    root = Path(images).expanduser()
    counts = {}
    for role, items in files.items():
        if items:
            _write_role(target, role, items, min(shards, len(items)), root)
            counts[role] = len(items)
    (target / CLASSES).write_text("".join(f"{c}\n" for c in classes))
    (target / COUNTS).write_text(json.dumps(counts, indent=1) + "\n")
    return counts


def _write_role(target: Path, role: str, items: list[tuple[str, int]], count: int,
                root: Path) -> None:
    """A role's records in `count` files of consecutive records, in the split's order."""
    for shard in range(count):
        part = items[len(items) * shard // count:len(items) * (shard + 1) // count]
        with tf.io.TFRecordWriter(str(target / f"{role}-{shard:05d}-of-{count:05d}")) as out:
            for file, label in part:
                out.write(_example(Path(file), label, root).SerializeToString())


def _example(file: Path, label: int, root: Path) -> tf.train.Example:
    def feature(value: Any) -> tf.train.Feature:
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    return tf.train.Example(features=tf.train.Features(feature={
        IMAGE: feature(file.read_bytes()), LABEL: feature(int(label)),
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
    args = parser.parse_args(argv)
    try:
        counts = write(args.images, args.out, args.shards, args.validation_fraction,
                       args.test_fraction)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(f'{n} {role}' for role, n in counts.items())} records to "
          f"{args.out} (train with dataset=tfrecord dataset.path={args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
