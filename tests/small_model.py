"""A small network for the tests that check what the framework does around a model (scaling,
resume, run directory, loops), not what the default network learns.

The default `model=cnn` (619k parameters, three conv blocks) costs a tiny run on 8x8 digits
about 2.5-3 s on one replica, most of it tracing, saving and loading; this one about 1.2 s,
and it learns digits about as well: validation accuracy 0.58 and 0.76 after one and two
epochs on one replica (the cnn: 0.63 and 0.75).
`tiny_config` picks it as `model=small` where a test chooses no model itself; the default
network is trained by the tests that name `model=cnn`, the command-line runs and the README's.
"""

from __future__ import annotations

import keras


def build(input_shape: tuple[int, ...], num_classes: int, dropout: float = 0.25) -> keras.Model:
    """Conv 16 (3x3, ReLU), 2x2 max-pool, dropout (0.25 like the cnn's, so resumes still
    restore a dropout generator), softmax; outputs float32 like the cnn's."""
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D(2, padding="same")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(dropout)(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="small")
