"""trainer: multi-device data-parallel training for Keras 3 on tf.distribute, with Hydra."""

__version__ = "0.1.0"
