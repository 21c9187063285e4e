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

What the folder says of itself is checked against the records before training: the shard
sizes `counts.json` keeps (a shard cut short is named), `classes.txt` (missing, or of one
class, is one line), a feature spec against the first record (the features it lacks named);
a count `counts.json` claims that the records do not hold is named when the records run out.
`python -m trainer.data.tfrecords IMAGES OUT --shards N` (`trainer.data.tfrecords.writer`)
writes an image folder into this layout.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.data.fingerprint import of_folder
from trainer.data.pipeline import DataError, Source

IMAGE, LABEL = "image/encoded", "image/class/label"
CLASSES, COUNTS = "classes.txt", "counts.json"
# counts.json's record of each shard the writer wrote: {name: {"records": n, "bytes": n}}.
FILES = "files"
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
    if features is None:
        classes = _class_names(root, num_classes)
        spec = _ImageRecords(image_size, channels, label_offset, root)
        classes_count = len(classes or []) or num_classes
    else:
        classes, spec, classes_count = None, _FeatureRecords(features, inputs, outputs), num_classes
    first = _check_first_record(shards["train"][0], spec.required())
    if features is None:
        _check_label(first, shards["train"][0], label_offset, classes_count, root)
    shape = spec.input_shape(shards["train"])
    # the counts kept are asserted: a role that holds fewer records fails when they run out,
    # named by `_explainer` (tf.data's words name neither the files nor counts.json)
    datasets = {role: _stream(files).apply(tf.data.experimental.assert_cardinality(
                    counts[role])).map(spec.target, num_parallel_calls=tf.data.AUTOTUNE)
                for role, files in shards.items()}
    return Source(train=datasets["train"], validation=datasets["validation"],
                  train_size=counts["train"], validation_size=counts["validation"],
                  test=datasets.get("test"), test_size=counts.get("test", 0),
                  input_shape=shape, num_classes=classes_count, preprocess=spec.parse,
                  scale=spec.scale, class_names=classes,
                  num_outputs=None if classes_count else spec.outputs(),
                  explain=_explainer(shards, spec.parse, path, counts), reads_in_preprocess=True,
                  fingerprint=functools.cache(lambda: _fingerprint(root, shards, counts)))


def _fingerprint(root: Path, shards: dict[str, list[Path]],
                 counts: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The shards' files hashed, each role counted in records (not in files)."""
    found = of_folder({role: [(str(f), 0) for f in files] for role, files in shards.items()},
                      str(root))
    return {role: {**about, "examples": counts[role]} for role, about in found.items()}


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
    """Records per role: `counts.json`'s (its shards' sizes checked), else counted by
    reading every record."""
    try:
        kept = json.loads((root / COUNTS).read_text())
    except OSError:
        kept = {}
    except ValueError as error:
        raise DataError(f"dataset=tfrecord: {root / COUNTS} is not JSON ({error}); write the "
                        "shards again, or delete it (the records are then counted)") from None
    if not isinstance(kept, dict):
        kept = {}
    _check_sizes(root, shards, kept.get(FILES))
    counts = {}
    for role, files in shards.items():
        value = kept.get(role)
        if not isinstance(value, int):
            value = int(_stream(files).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
        counts[role] = value
    return counts


def _check_sizes(root: Path, shards: dict[str, list[Path]], written: Any) -> None:
    """Refuses a shard whose size is not the one the writer recorded in `counts.json`."""
    if not isinstance(written, dict):
        return  # a counts.json of the user's, or from before the writer kept sizes
    for file in (f for files in shards.values() for f in files):
        about = written.get(file.name)
        size = file.stat().st_size
        if isinstance(about, dict) and about.get("bytes") not in (None, size):
            raise DataError(
                f"dataset=tfrecord: {file} is {size} bytes, but {root / COUNTS} says "
                f"{about['bytes']} were written ({about.get('records')} records): the shard "
                "was cut short or changed; write the shards again")


def _class_names(root: Path, num_classes: int | None) -> list[str] | None:
    """`classes.txt`'s names: image records are classes, so a missing file needs
    `dataset.num_classes`, and one class is refused as a classifier's."""
    file = root / CLASSES
    try:
        names = [line.strip() for line in file.read_text(encoding="utf-8").splitlines()]
    except FileNotFoundError:
        if num_classes is None:
            raise DataError(f"dataset=tfrecord: {file} is missing: image records need their "
                            "class names, one per line in label order (the writer writes it), "
                            "or dataset.num_classes") from None
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"dataset=tfrecord: {file} cannot be read ({error}); write it again, "
                        "one UTF-8 class name per line") from None
    names = [n for n in names if n]
    if len(names) < 2:
        raise DataError(f"dataset=tfrecord: {file} names {len(names) or 'no'} class"
                        f"{'' if len(names) == 1 else 'es'}{f' ({names[0]})' if names else ''}"
                        "; a classifier needs at least 2, one name per line in label order")
    return names


def _check_first_record(file: Path, required: dict[str, str]) -> Any:
    """Refuses records that lack (or hold another kind of) a feature the spec needs, from
    the first record, before training.

    Args:
        file: the first training shard.
        required: feature name -> the kind of list it holds (`bytes_list`, ...).

    Returns:
        The first record as a `tf.train.Example` (None: the shard holds none).
    """
    try:
        first = next(iter(tf.data.TFRecordDataset(str(file)).take(1)), None)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise DataError(f"dataset=tfrecord: record 0 of {file} is damaged "
                        f"({tf_reason(error)}); write that shard again, or remove it") from None
    if first is None:
        return None
    try:
        example = tf.train.Example.FromString(first.numpy())
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError: not an Example
        raise DataError(f"dataset=tfrecord: record 0 of {file} is not a tf.train.Example "
                        f"({error}); write the records with tf.train.Example") from None
    held = {name: feature.WhichOneof("kind") for name, feature in example.features.feature.items()}
    missing = sorted(n for n in required if n not in held)
    if missing:
        raise DataError(f"dataset=tfrecord: record 0 of {file} has no feature "
                        f"{', '.join(missing)} (it has {', '.join(sorted(held)) or 'none'}); "
                        "name the records' features in dataset.features")
    other = sorted(f"{n} holds a {held[n]}, not a {k}" for n, k in required.items()
                   if held[n] is not None and held[n] != k)
    if other:
        raise DataError(f"dataset=tfrecord: record 0 of {file}: {'; '.join(other)}; give each "
                        "its dtype in dataset.features (string, int64/int32, float32/float64)")
    return example


def _check_label(example: Any, file: Path, offset: int, classes: int | None,
                 root: Path) -> None:
    """Refuses image records whose first label is outside the classes `classes.txt` (or
    `dataset.num_classes`) counts: the loss would fail mid-run, naming neither."""
    if example is None or not classes:
        return
    label = int(example.features.feature[LABEL].int64_list.value[0]) - offset
    if not 0 <= label < classes:
        raise DataError(f"dataset=tfrecord: record 0 of {file} has label {label} (after "
                        f"dataset.label_offset={offset}), but {root / CLASSES} (or "
                        f"dataset.num_classes) counts {classes} classes, labels 0-{classes - 1};"
                        " list every class in classes.txt, in label order, or set "
                        "dataset.label_offset")


def tf_reason(error: BaseException) -> str:
    """TensorFlow's message in a few words: its first line, without the op's decorations."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\].*", "", text)[:200]


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

    def required(self) -> dict[str, str]:
        """The features every record must hold, and the kind of list each is."""
        return {IMAGE: "bytes_list", LABEL: "int64_list"}


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

    def required(self) -> dict[str, str]:
        """The features every record must hold, and the kind of list each is."""
        return {n: "int64_list" if dtype.is_integer else "float_list" if dtype.is_floating
                else "bytes_list" for n, (dtype, _) in self.spec.items()
                if n in self.inputs or n in self.outputs_}

    def input_shape(self, train: list[Path] | None = None) -> Any:
        del train  # the spec says it
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


def _explainer(shards: dict[str, list[Path]], parse: Callable, path: str,
               counts: dict[str, int]):
    """`Source.explain`: names the file and record that failed to read, parse or decode,
    or the role whose records are fewer than `counts.json` says.

    TensorFlow's error names neither; the records are read again, one by one, until one
    fails (for up to `SEARCH_S` seconds).
    """
    def explain(error: BaseException) -> str | None:
        short = _fewer(error, shards, counts, path)
        if short is not None:
            return short
        beyond = LABEL_RANGE.search(str(error))
        if beyond is not None:
            return (f"dataset=tfrecord: a record under {path} has label {beyond.group(1)}, "
                    f"but the run has {beyond.group(2)} classes ({CLASSES} or "
                    "dataset.num_classes); list every class in classes.txt, in label order, "
                    "or set dataset.label_offset")
        if not isinstance(error, (tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
            return None
        found = _first_damaged([f for files in shards.values() for f in files], parse)
        if found is None:
            return (f"dataset=tfrecord: a record under {path} does not read "
                    f"({tf_reason(error)}); write the shards again")
        file, index, why = found
        return (f"dataset=tfrecord: record {index} of {file} is damaged ({why}); write the "
                "shards again from the images (a bad image is refused by the writer), or "
                "remove that shard")

    return explain


# The loss's words for a label beyond the classes (sparse categorical cross-entropy).
LABEL_RANGE = re.compile(r"label value of (-?\d+) which is outside the valid range of "
                         r"\[0, (\d+)\)")
# tf.data's words where a role holds fewer (or more) records than asserted.
COUNT_MISMATCH = re.compile(r"expected to contain (\d+) elements? but contained "
                            r"(only|at least) (\d+)")


def _fewer(error: BaseException, shards: dict[str, list[Path]], counts: dict[str, int],
           path: str) -> str | None:
    """The line for a role whose records disagree with `counts.json`, else None."""
    found = COUNT_MISMATCH.search(str(error))
    if found is None:
        return None
    expected, bound, actual = int(found.group(1)), found.group(2), found.group(3)
    roles = [r for r in shards if counts[r] == expected] or list(shards)
    files = shards[roles[0]]
    held = f"{'only ' if bound == 'only' else 'at least '}{actual}"
    return (f"dataset=tfrecord: the {roles[0]} shards ({files[0].name}..., {len(files)} "
            f"files) hold {held} records, but {Path(path).expanduser() / COUNTS} says "
            f"{expected}: a shard was cut short, or counts.json is wrong; write the shards "
            "again, or delete counts.json (the records are then counted)")


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
            return file, index, tf_reason(error)[:120]
    return None
