"""scikit-learn's bundled handwritten digits: 1797 8x8 grey images of 0-9, no download.

scikit-learn splits them (`train_test_split`, stratified, a fixed seed) the first time a
split is asked for; the split's arrays are then kept in trainer's cache (`digits/` under
`TRAINER_CACHE_DIR`, else `~/.cache/trainer`), by scikit-learn's version and the fractions,
written whole (`trainer.rundir.atomic.written`), and read from there: importing
scikit-learn costs about 0.9 CPU s, paid otherwise by every run, sweep job and worker that
trains on the digits. A cache file that cannot be read is split again and written again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import zipfile

import numpy as np
import tensorflow as tf

from trainer.data.fingerprint import cache_dir
from trainer.data.pipeline import Source
from trainer.rundir.atomic import written

# The split is fixed, whatever the run's seed, so every run validates on the same images.
SPLIT_SEED = 0


def load(image_size: int = 32, validation_fraction: float = 0.1, test_fraction: float = 0.1,
         seed: int | None = None) -> Source:
    """Loads the digits, split into train, validation and test, resized to `image_size`.

    Args:
        image_size: side of the square images the model sees (the originals are 8x8).
        validation_fraction: share of the examples for validation, per class.
        test_fraction: share of the examples for the test split, per class; 0: none.
        seed: unused; the split is fixed so runs compare.

    Returns:
        A `Source` of 8x8 images (values 0..16), resized and scaled to [0, 1] in the pipeline.
    """
    del seed
    held = split(validation_fraction, test_fraction)
    x_test, y_test = (held["x_test"], held["y_test"]) if test_fraction > 0 else (None, None)
    return Source.from_arrays(held["x_train"], held["y_train"], held["x_val"], held["y_val"],
                              num_classes=10, x_test=x_test,
                              y_test=y_test, preprocess=_resize(image_size), scale=1.0 / 16.0,
                              input_shape=(image_size, image_size, 1))


def _resize(image_size: int):
    def resize(image, label):
        if image_size == 8:
            return image, label
        return tf.image.resize(tf.cast(image, tf.float32), (image_size, image_size)), label

    return resize


SPLITS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


def split(validation_fraction: float, test_fraction: float) -> dict[str, np.ndarray]:
    """The digits split into train, validation and test (empty without a test share): from
    the cache where it holds this split, else by scikit-learn (then kept)."""
    key = repr(("digits", importlib.metadata.version("scikit-learn"), SPLIT_SEED,
                float(validation_fraction), float(test_fraction)))
    path = cache_dir() / "digits" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"
    try:
        with np.load(path, allow_pickle=False) as kept:
            if str(kept["key"]) == key:
                return {name: kept[name] for name in SPLITS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # not kept yet, or damaged: split again
    held = _split_by_sklearn(validation_fraction, test_fraction)
    # a cache that cannot be written is left out: the next run splits again
    with contextlib.suppress(OSError), written(path) as tmp, open(tmp, "wb") as file:
        np.savez(file, key=np.array(key), **held)
    return held


def _split_by_sklearn(validation_fraction: float,
                      test_fraction: float) -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.uint8)[..., None]  # values 0..16
    labels = digits.target.astype(np.int32)
    held = validation_fraction + test_fraction
    # Held-out examples first (the training examples do not depend on the test share), then
    # they are divided into validation and test, both stratified and fixed.
    x_train, x_held, y_train, y_held = train_test_split(
        images, labels, test_size=held, random_state=SPLIT_SEED, stratify=labels)
    x_test, y_test = images[:0], labels[:0]
    x_val, y_val = x_held, y_held
    if test_fraction > 0:
        x_val, x_test, y_val, y_test = train_test_split(
            x_held, y_held, test_size=test_fraction / held, random_state=SPLIT_SEED,
            stratify=y_held)
    return {"x_train": x_train, "y_train": y_train, "x_val": x_val, "y_val": y_val,
            "x_test": x_test, "y_test": y_test}
