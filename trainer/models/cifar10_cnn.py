"""The network of TensorFlow's classic CIFAR-10 multi-GPU tutorial (cifar10_multi_gpu_train)."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers


@keras.saving.register_keras_serializable(package="trainer")
class LocalResponseNormalization(layers.Layer):
    """`tf.nn.local_response_normalization` as a layer (Keras 3 has none), as in the tutorial."""

    def __init__(self, depth_radius: int = 4, bias: float = 1.0, alpha: float = 0.001 / 9.0,
                 beta: float = 0.75, **kwargs) -> None:
        super().__init__(**kwargs)
        self.depth_radius, self.bias, self.alpha, self.beta = depth_radius, bias, alpha, beta

    def call(self, inputs):
        return tf.nn.local_response_normalization(
            inputs, depth_radius=self.depth_radius, bias=self.bias, alpha=self.alpha,
            beta=self.beta)

    def get_config(self) -> dict:
        return {**super().get_config(), "depth_radius": self.depth_radius, "bias": self.bias,
                "alpha": self.alpha, "beta": self.beta}


def build(input_shape: tuple[int, ...], num_classes: int, weight_decay: float = 0.004
          ) -> keras.Model:
    """Builds conv 5x5/64, pool, LRN; conv 5x5/64, LRN, pool; dense 384 and 192; classes.

    Args:
        input_shape: `(height, width, channels)`.
        num_classes: outputs of the last layer.
        weight_decay: L2 factor on the two dense layers, as in the tutorial.

    Returns:
        An uncompiled `keras.Model`.
    """
    l2 = keras.regularizers.L2(weight_decay) if weight_decay else None
    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.Conv2D(64, 5, padding="same", activation="relu")(inputs)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = LocalResponseNormalization()(x)
    x = layers.Conv2D(64, 5, padding="same", activation="relu")(x)
    x = LocalResponseNormalization()(x)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(384, activation="relu", kernel_regularizer=l2)(x)
    x = layers.Dense(192, activation="relu", kernel_regularizer=l2)(x)
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="cifar10_cnn")
