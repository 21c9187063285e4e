"""Keras's MobileNetV2, trained from scratch."""

from __future__ import annotations

import keras

from trainer.config.errors import ConfigError

# The smallest side Keras's MobileNetV2 takes; conf/model/mobilenet.yaml states it as
# `min_image_size`, which the built-in datasets resize up to (trainer.config.image_size).
MIN_SIZE = 32


def build(input_shape: tuple[int, ...], num_classes: int, alpha: float = 0.35,
          min_image_size: int = MIN_SIZE) -> keras.Model:
    """Builds MobileNetV2 with `weights=None` (no download) for any input of at least 32x32.

    Args:
        input_shape: `(height, width, channels)`.
        num_classes: outputs of the classifier.
        alpha: width multiplier.
        min_image_size: the smallest side to accept (the config's; never below 32).

    Returns:
        An uncompiled `keras.Model`.
    """
    height, width = input_shape[0], input_shape[1]
    minimum = max(MIN_SIZE, min_image_size or 0)
    if min(height, width) < minimum:
        raise ConfigError(f"model=mobilenet needs images of at least {minimum}x{minimum}; "
                          f"received: {height}x{width} (set dataset.image_size>={minimum})")
    base = keras.applications.MobileNetV2(
        input_shape=tuple(input_shape), alpha=alpha, weights=None, classes=num_classes,
        classifier_activation=None)
    # The softmax in float32 keeps the loss stable under mixed precision.
    outputs = keras.layers.Activation("softmax", dtype="float32")(base.output)
    return keras.Model(base.input, outputs, name=base.name)
