"""scikit-learn's bundled handwritten digits: 1797 8x8 grey images of 0-9, no download."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.data.pipeline import Source

# The split is fixed, whatever the run's seed, so every run validates on the same images.
SPLIT_SEED = 0


def load(image_size: int = 32, validation_fraction: float = 0.2, seed: int | None = None) -> Source:
    """Loads the digits, split into train and validation, resized to `image_size`.

    Args:
        image_size: side of the square images the model sees (the originals are 8x8).
        validation_fraction: share of the examples held out for validation, per class.
        seed: unused; the split is fixed so runs compare.

    Returns:
        A `Source` of 8x8 images (values 0..16), resized and scaled to [0, 1] in the pipeline.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    del seed
    digits = load_digits()
    images = digits.images.astype(np.uint8)[..., None]  # values 0..16
    x_train, x_val, y_train, y_val = train_test_split(
        images, digits.target.astype(np.int32), test_size=validation_fraction,
        random_state=SPLIT_SEED, stratify=digits.target)
    return Source(
        train=tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        validation=tf.data.Dataset.from_tensor_slices((x_val, y_val)),
        train_size=len(x_train), validation_size=len(x_val),
        input_shape=(image_size, image_size, 1), num_classes=10,
        preprocess=_resize(image_size), scale=1.0 / 16.0)


def _resize(image_size: int):
    def resize(image, label):
        if image_size == 8:
            return image, label
        return tf.image.resize(tf.cast(image, tf.float32), (image_size, image_size)), label

    return resize
