"""Random images and labels of a configurable shape, for benchmarks and smoke tests."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.data.pipeline import Source


def load(train_examples: int = 2048, validation_examples: int = 512, image_size: int = 32,
         channels: int = 3, num_classes: int = 10, seed: int | None = None) -> Source:
    """Makes uint8 noise images with uniform random labels.

    Args:
        train_examples: training examples.
        validation_examples: validation examples.
        image_size: side of the square images.
        channels: channels per image.
        num_classes: label range.
        seed: data seed (0 when None), so the same config gives the same data.

    Returns:
        A `Source`; images are scaled to [0, 1] in the pipeline.
    """
    rng = np.random.default_rng(0 if seed is None else seed)
    shape = (image_size, image_size, channels)

    def split(n: int) -> tf.data.Dataset:
        images = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        labels = rng.integers(0, num_classes, size=n, dtype=np.int32)
        return tf.data.Dataset.from_tensor_slices((images, labels))

    return Source(train=split(train_examples), validation=split(validation_examples),
                  train_size=train_examples, validation_size=validation_examples,
                  input_shape=shape, num_classes=num_classes, scale=1.0 / 255.0,
                  reads_in_preprocess=True)
