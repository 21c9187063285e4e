"""scikit-learn's bundled handwritten digits: 1797 8x8 grey images of 0-9, no download."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.data.pipeline import Source

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
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    del seed
    digits = load_digits()
    images = digits.images.astype(np.uint8)[..., None]  # values 0..16
    labels = digits.target.astype(np.int32)
    held = validation_fraction + test_fraction
    # Held-out examples first (the training examples do not depend on the test share), then
    # they are divided into validation and test, both stratified and fixed.
    x_train, x_held, y_train, y_held = train_test_split(
        images, labels, test_size=held, random_state=SPLIT_SEED, stratify=labels)
    x_test = y_test = None
    x_val, y_val = x_held, y_held
    if test_fraction > 0:
        x_val, x_test, y_val, y_test = train_test_split(
            x_held, y_held, test_size=test_fraction / held, random_state=SPLIT_SEED,
            stratify=y_held)
    return Source.from_arrays(x_train, y_train, x_val, y_val, num_classes=10, x_test=x_test,
                              y_test=y_test, preprocess=_resize(image_size), scale=1.0 / 16.0,
                              input_shape=(image_size, image_size, 1))


def _resize(image_size: int):
    def resize(image, label):
        if image_size == 8:
            return image, label
        return tf.image.resize(tf.cast(image, tf.float32), (image_size, image_size)), label

    return resize
