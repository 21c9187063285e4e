"""A folder of images with one sub-folder per class, JPEG, PNG, GIF or BMP."""

from __future__ import annotations

from pathlib import Path

import keras

from trainer.data.pipeline import DataError, Source

EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
SPLIT_SEED = 0  # the validation split is the same for every run, whatever its seed
LAYOUT = "expected one sub-folder per class holding JPEG/PNG files"


def load(path: str, image_size: int = 64, channels: int = 3, validation_fraction: float = 0.2,
         seed: int | None = None) -> Source:
    """Reads `path/<class>/<image>` files, decoding and resizing them in parallel.

    Args:
        path: the folder; class names are its sub-folders, in sorted order.
        image_size: side of the square images the model sees.
        channels: 1 (grey), 3 (RGB) or 4 (RGBA).
        validation_fraction: share of the files held out, the same files on every run.
        seed: unused; the split is fixed so runs compare.

    Returns:
        A `Source`; class indices follow the sorted sub-folder names.
    """
    del seed
    root = Path(path).expanduser()
    classes = _classes(root, path)
    _check_files(root, classes)
    color = {1: "grayscale", 3: "rgb", 4: "rgba"}[channels]
    train, validation = keras.utils.image_dataset_from_directory(
        str(root), labels="inferred", label_mode="int", class_names=classes,
        color_mode=color, batch_size=None, image_size=(image_size, image_size),
        shuffle=True, seed=SPLIT_SEED, validation_split=validation_fraction, subset="both",
        verbose=False)
    return Source(train=train, validation=validation,
                  train_size=int(train.cardinality()),
                  validation_size=int(validation.cardinality()),
                  input_shape=(image_size, image_size, channels), num_classes=len(classes),
                  scale=1.0 / 255.0)


def _classes(root: Path, path: str) -> list[str]:
    """Class sub-folders that hold images; the errors name the folder and what was expected."""
    if not root.is_dir():
        raise DataError(f"dataset=image_folder: dataset.path={path} does not exist; {LAYOUT}")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and _has_images(d))
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


def _check_files(root: Path, classes: list[str]) -> None:
    """Refuses an empty, non-image or truncated file before training, naming it.

    Decoding happens inside tf.data once training has started, where a bad file is a long
    traceback that does not name it; reading each file's first bytes here is cheap (a few
    milliseconds per thousand files).
    """
    for name in classes:
        for file in sorted((root / name).rglob("*")):
            suffix = file.suffix.lower()
            if suffix not in SIGNATURES or not file.is_file():
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

