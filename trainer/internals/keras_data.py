"""Keras 3.15's data adapter, where trainer applies class weights as Keras's `fit` does."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import keras
from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn

from trainer.internals import check_version

check_version("keras", keras.__version__)


def class_weight_map_fn(class_weight: Mapping[int, float]) -> Callable:
    """The function Keras's `fit` maps over a dataset to turn `class_weight` into sample
    weights (one output; a missing class weighs as Keras decides)."""
    return make_class_weight_map_fn(class_weight)
