"""A model taking strings through a `StringLookup` alone (no lower-casing or splitting):
TFLite's built-in hash tables convert it; ONNX Runtime has no string table."""

from __future__ import annotations

import keras
from parity_task import WORDS


def lookup_model(**_: object) -> keras.Model:
    inputs = keras.Input((), dtype="string", name="sentence")
    ids = keras.layers.StringLookup(vocabulary=list(WORDS))(inputs)
    x = keras.layers.Embedding(len(WORDS) + 1, 8)(ids)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))
