"""A folder of images, one sub-folder per class (JPEG, PNG, GIF or BMP), in three roles.

Either `DIR/train/<class>/...`, `DIR/val/<class>/...` (or `validation/`) and, optionally,
`DIR/test/<class>/...`: each role from its own folder (without a validation folder, the
validation share of `train/` is held out); or one folder `DIR/<class>/...` split per class by
fixed fractions, the same files on every run whatever the seed. No file is in two roles.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer.data.fingerprint import Deferred, of_folder
from trainer.data.pipeline import DataError, Source

EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
SPLIT_SEED = 0  # the split is the same for every run, whatever its seed
LAYOUT = ("expected one sub-folder per class holding JPEG/PNG files, or train/, val/ and "
          "test/ folders each holding them")
VALIDATION_FOLDERS = ("val", "validation")


def load(path: str, image_size: int = 64, channels: int = 3, validation_fraction: float = 0.1,
         test_fraction: float = 0.1, seed: int | None = None) -> Source:
    """Reads the images of each role, decoding and resizing them in parallel.

    Args:
        path: the folder: `train/`, `val/` (or `validation/`), `test/` role folders, or
            class folders directly.
        image_size: side of the square images the model sees.
        channels: 1 (grey), 3 (RGB) or 4 (RGBA).
        validation_fraction: share of each class held out for validation where there is
            no validation folder.
        test_fraction: share of each class held out for the test split of a single folder
            (role folders: `test/`, if present, is the test split).
        seed: unused; the split is fixed so runs compare.

    Returns:
        A `Source`; class indices follow the sorted class folder names (of `train/`).
    """
    del seed
    root = Path(path).expanduser()
    stats: dict[str, os.stat_result] = {}  # the listing's, for the fingerprint
    classes, files = split_files(path, validation_fraction, test_fraction, stats)
    names = [name for role_files in files.values() for name, _ in role_files or []]
    datasets = {role: _dataset(items) for role, items in files.items() if items}
    listed = {role: items for role, items in files.items() if items}
    return Source(train=datasets["train"], validation=datasets["validation"],
                  train_size=len(files["train"]), validation_size=len(files["validation"]),
                  test=datasets.get("test"), test_size=len(files.get("test") or []),
                  input_shape=(image_size, image_size, channels), num_classes=len(classes),
                  preprocess=_decoder(image_size, channels), scale=1.0 / 255.0,
                  explain=_explainer(names, path, channels),
                  class_names=list(classes), reads_in_preprocess=True,
                  check=lambda workers, worker: _check_files(names[worker::workers]),
                  # hashed where the run keeps it (the chief), not by every worker
                  fingerprint=Deferred(lambda: of_folder(listed, str(root), stats=stats),
                                       listed, str(root), stats))


def split_files(path: str, validation_fraction: float = 0.1, test_fraction: float = 0.1,
                stats: dict[str, os.stat_result] | None = None
                ) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """The classes and each role's `(file, class index)`: the folder's split, the same on
    every run; the training files in one fixed order (shuffled: sorted by class, a shuffle
    buffer smaller than the folder would give batches of one class).

    Args:
        path: the folder (see `load`).
        validation_fraction, test_fraction: as `load`'s.
        stats: receives each file's `os.stat`.

    Raises:
        DataError: a folder that is missing, empty, of one class, or leaves a role no image.
    """
    root = Path(path).expanduser()
    roles = _role_folders(root)
    stats = {} if stats is None else stats
    if roles:
        classes = _classes(roles["train"], str(roles["train"]))
        files = {"train": _files(roles["train"], classes, stats=stats)}
        for role in ("validation", "test"):
            if roles.get(role) is not None:
                files[role] = _files(roles[role], classes, check_classes=True, stats=stats)
        if "validation" not in files:
            files["train"], files["validation"], _ = _split(files["train"],
                                                            validation_fraction, 0.0)
    else:
        classes = _classes(root, path)
        files = dict(zip(("train", "validation", "test"),
                         _split(_files(root, classes, stats=stats), validation_fraction,
                                test_fraction),
                         strict=True))
    for role in ("train", "validation"):
        if not files[role]:
            raise DataError(f"dataset=image_folder: {path} leaves no {role} images; add "
                            "images or change dataset.validation_fraction")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(files["train"]))
    files["train"] = [files["train"][i] for i in order]
    return classes, files


def _role_folders(root: Path) -> dict[str, Path | None] | None:
    """`train/`, the validation and test folders where `root` has a `train/` folder."""
    if not (root / "train").is_dir():
        return None
    found = [root / name for name in VALIDATION_FOLDERS if (root / name).is_dir()]
    return {"train": root / "train", "validation": found[0] if found else None,
            "test": root / "test" if (root / "test").is_dir() else None}


def _files(folder: Path, classes: list[str], check_classes: bool = False,
           stats: dict[str, os.stat_result] | None = None) -> list[tuple]:
    """`(path, class index)` of every image under `folder/<class>/`, in sorted order;
    `stats` receives each one's `os.stat` (taken to tell a file from a folder anyway)."""
    if check_classes:
        extra = sorted(d.name for d in folder.iterdir() if d.is_dir() and _has_images(d)
                       and d.name not in classes)
        if extra:
            raise DataError(f"dataset=image_folder: {folder} has classes train/ lacks: "
                            f"{', '.join(extra)}; train/ has {', '.join(classes)}")
    stats = {} if stats is None else stats
    found = []
    for index, name in enumerate(classes):
        if not (folder / name).is_dir():
            continue
        for file in sorted((folder / name).rglob("*")):
            if file.suffix.lower() not in EXTENSIONS:
                continue
            try:
                status = os.stat(file)
            except OSError:  # gone meanwhile, or a broken link: not a file (as is_file says)
                continue
            if stat.S_ISREG(status.st_mode):
                check_name(file, "file")
                stats[str(file)] = status
                found.append((str(file), index))
    return found


def check_name(path: Path, what: str) -> None:
    """Refuses a name that is not UTF-8 (TensorFlow takes file names as UTF-8 strings; its
    own error names no file), showing its undecodable bytes as `\\xNN`.

    Args:
        path: the file or folder.
        what: `file` or `class folder`.
    """
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise DataError(f"the {what} {shown} has a name that is not UTF-8, which TensorFlow "
                        "reads file names as; rename it (e.g. convmv, or mv with the name "
                        "in UTF-8)") from None


def _split(files: list[tuple], validation: float, test: float) -> tuple[list, list, list]:
    """Splits each class's files by the fractions, the same way on every run."""
    rng = np.random.default_rng(SPLIT_SEED)
    roles: tuple[list, list, list] = ([], [], [])
    for label in sorted({label for _, label in files}):
        mine = [item for item in files if item[1] == label]
        order = rng.permutation(len(mine))
        n_val, n_test = round(len(mine) * validation), round(len(mine) * test)
        # a share asked for is at least one file, while a training file is left
        if validation > 0 and n_val == 0 and len(mine) >= 2:
            n_val = 1
        if test > 0 and n_test == 0 and len(mine) - n_val >= 2:
            n_test = 1
        for rank, i in enumerate(order):
            role = 1 if rank < n_val else 2 if rank < n_val + n_test else 0
            roles[role].append(mine[i])
    return tuple(sorted(r) for r in roles)


def _dataset(items: list[tuple]) -> tf.data.Dataset:
    paths, labels = zip(*items, strict=True)
    return tf.data.Dataset.from_tensor_slices((list(paths), np.asarray(labels, np.int32)))


def _decoder(image_size: int, channels: int):
    """Reads, decodes (any of the formats, first frame of a GIF) and resizes one image."""
    def decode(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=channels,
                                   expand_animations=False)
        image = tf.image.resize(image, (image_size, image_size))
        image.set_shape((image_size, image_size, channels))
        return image, label

    return decode


# TensorFlow's decoders' messages (Invalid PNG data, size 197; Invalid JPEG data or crop
# window, data size 1234; Invalid GIF data (size 80), ...; Unknown image file format).
DECODE_ERRORS = re.compile(r"Invalid (PNG|JPEG|GIF|BMP) data|Unknown image file format|"
                           r"DecodeImage|decode_image")
SIZE = re.compile(r"size (\d+)")
# Decoding every file to find the bad one stops after this long (a large folder).
SEARCH_S = 30.0


def _explainer(files: list[str], path: str, channels: int):
    """`Source.explain`: names the image that did not decode mid-run.

    Checking that every file decodes before training would decode the folder twice; the
    signatures and endings `_check_files` reads are cheap but miss damage in between. So
    the file is found only once TensorFlow fails: first among the files of the byte size
    its message gives, then (for a while) among all of them.
    """
    def explain(error: BaseException) -> str | None:
        text = str(error)
        if not DECODE_ERRORS.search(text):
            return None
        # TensorFlow's own words, not the graph's "Detected at node decode_image/..." lines
        # (a failure inside a traced step carries those first)
        lines = [line for line in text.splitlines()
                 if not line.strip().startswith("Detected at node")]
        reason = next((line.split(": ")[-1].strip() for line in lines
                       if DECODE_ERRORS.search(line.split(": ")[-1])), "")
        reason = re.sub(r"\s*\[\[.*", "", reason) or "does not decode"
        size = SIZE.search(text)
        ordered = sorted(files, key=lambda f: 0 if size and _size(f) == int(size.group(1))
                         else 1)
        bad = _first_undecodable(ordered, channels)
        if bad is not None:
            return (f"dataset=image_folder: {bad} does not decode as an image ({reason}); "
                    "remove it or replace it with a good copy")
        return (f"dataset=image_folder: an image under {path} does not decode ({reason}); "
                "find it (e.g. open each with an image viewer) and remove or replace it")

    return explain


def undecodable(files: list[str], error: BaseException) -> str | None:
    """The first of `files` that does not decode where `error` is TensorFlow's decoding
    failure (its message names no file), or None: not a decoding failure, or no file found
    within `SEARCH_S`."""
    if not DECODE_ERRORS.search(str(error)):
        return None
    size = SIZE.search(str(error))
    ordered = sorted(files, key=lambda f: 0 if size and _size(f) == int(size.group(1)) else 1)
    return _first_undecodable(ordered, 0)


def _size(name: str) -> int:
    try:
        return Path(name).stat().st_size
    except OSError:
        return -1


def _first_undecodable(files: list[str], channels: int) -> str | None:
    """The first of `files` TensorFlow cannot decode, or None (none within SEARCH_S)."""
    import time

    deadline = time.monotonic() + SEARCH_S
    for name in files:
        if time.monotonic() > deadline:
            return None
        try:
            tf.io.decode_image(tf.io.read_file(name), channels=channels,
                               expand_animations=False)
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
            return name
    return None


def _classes(root: Path, path: str) -> list[str]:
    """Class sub-folders that hold images; the errors name the folder and what was expected."""
    if not root.is_dir():
        raise DataError(f"dataset=image_folder: dataset.path={path} does not exist; {LAYOUT}")
    folders = sorted((d for d in root.iterdir() if d.is_dir() and _has_images(d)),
                     key=lambda d: d.name)
    for folder in folders:
        check_name(folder, "class folder")
    classes = [d.name for d in folders]
    if not classes:
        raise DataError(f"dataset=image_folder: dataset.path={path} holds no images; {LAYOUT}")
    if len(classes) < 2:
        raise DataError(f"dataset=image_folder: dataset.path={path} holds one class folder "
                        f"({classes[0]}); a classifier needs at least 2, {LAYOUT}")
    return classes


# The first bytes of each format TensorFlow decodes here.
SIGNATURES = {".jpg": (b"\xff\xd8\xff",), ".jpeg": (b"\xff\xd8\xff",),
              ".png": (b"\x89PNG\r\n\x1a\n",), ".gif": (b"GIF87a", b"GIF89a"),
              ".bmp": (b"BM",)}


# ... and the marker their last bytes hold (JPEG's end of image, PNG's IEND chunk).
ENDINGS = {".jpg": b"\xff\xd9", ".jpeg": b"\xff\xd9", ".png": b"IEND"}


def _check_files(files: list[str]) -> None:
    """Refuses an empty, non-image or truncated file before training, naming it.

    Decoding happens inside tf.data once training has started, where a bad file is a long
    traceback that does not name it; reading each file's first bytes here is cheap (a few
    milliseconds per thousand files).
    """
    for name in files:
        file = Path(name)
        suffix = file.suffix.lower()
        if suffix not in SIGNATURES:
            continue
        with open(file, "rb") as f:
            head = f.read(8)
            f.seek(max(file.stat().st_size - 1024, 0))
            tail = f.read()
        if not head:
            raise DataError(f"dataset=image_folder: {file} is empty (0 bytes); remove it "
                            "or replace it with the image")
        if not head.startswith(SIGNATURES[suffix]):
            raise DataError(f"dataset=image_folder: {file} is not a {suffix[1:].upper()} "
                            "image (its first bytes say otherwise); remove or fix it")
        end = ENDINGS.get(suffix)
        if end is not None and end not in tail:
            raise DataError(f"dataset=image_folder: {file} is truncated (no end-of-image "
                            "marker); remove it or copy it again")


def _has_images(folder: Path) -> bool:
    return any(f.suffix.lower() in EXTENSIONS for f in folder.rglob("*") if f.is_file())

