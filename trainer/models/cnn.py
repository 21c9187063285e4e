"""The classic multi-GPU MNIST tutorial network."""

from __future__ import annotations

import keras
from keras import layers


def build(input_shape: tuple[int, ...], num_classes: int, dropout: float = 0.25) -> keras.Model:
    """Builds three conv blocks (64, 128, 128 filters; 3x3, 2x2 max-pool, dropout), then
    dense 1024 and 256 with ReLU, then a softmax over the classes.

    Args:
        input_shape: `(height, width, channels)`.
        num_classes: outputs of the last layer.
        dropout: dropout rate after each block.

    Returns:
        An uncompiled `keras.Model`.
    """
    inputs = keras.Input(shape=tuple(input_shape))
    x = inputs
    for filters in (64, 128, 128):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D(2, padding="same")(x)
        x = layers.Dropout(dropout)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(1024, activation="relu")(x)
    x = layers.Dense(256, activation="relu")(x)
    # float32 outputs keep the loss stable under mixed precision.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="cnn")
