"""trainer: multi-device data-parallel training for Keras 3 on tf.distribute, configured with Hydra."""

__version__ = "0.1.0"
