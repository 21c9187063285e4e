"""Any TensorFlow Datasets image-classification dataset: mnist, cifar10, cats_vs_dogs, ..."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainer.data.pipeline import DataError, Source
from trainer.errors import ConfigError


def load(name: str, train_split: str = "train", validation_split: str = "test",
         data_dir: str | None = None, download: bool = True, image_size: int | None = None,
         seed: int | None = None) -> Source:
    """Loads a TFDS dataset with `(image, label)` features as a `Source`.

    Args:
        name: the TFDS name, e.g. `mnist` or `cats_vs_dogs`.
        train_split: split (or slice, e.g. `train[:80%]`) to train on.
        validation_split: split (or slice, e.g. `train[80%:]`) to validate on.
        data_dir: where TFDS keeps prepared data; None for TFDS's own default.
        download: download and prepare when missing; False never touches the network.
        image_size: resize images to this square side (needed where sizes vary).
        seed: seed for the order in which TFDS reads its files.

    Returns:
        A `Source` of uint8 images, resized in the pipeline where asked.
    """
    import tensorflow_datasets as tfds

    builder = _builder(tfds, name, data_dir)
    if not builder.is_prepared():
        if not download:
            raise DataError(
                f"dataset {name} is not prepared in {builder.data_dir_root} and "
                "dataset.download=false; prepare it with `tfds build "
                f"{name} --data_dir {builder.data_dir_root}` or set dataset.download=true")
        builder.download_and_prepare()
    train, validation = builder.as_dataset(
        split=[train_split, validation_split], as_supervised=True, shuffle_files=True,
        read_config=tfds.ReadConfig(shuffle_seed=seed))
    shape = _input_shape(name, builder.info.features["image"].shape, image_size)
    return Source(
        train=train, validation=validation,
        train_size=_size(builder.info, train_split, train),
        validation_size=_size(builder.info, validation_split, validation),
        input_shape=shape, num_classes=builder.info.features["label"].num_classes,
        preprocess=_resize(image_size) if image_size else None, scale=1.0 / 255.0)


def _builder(tfds: Any, name: str, data_dir: str | None) -> Any:
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise ConfigError(f"unknown TFDS dataset {name!r}; see `tfds.list_builders()` for "
                          f"the names ({str(error).splitlines()[0]})") from None


def _input_shape(name: str, shape: tuple, image_size: int | None) -> tuple[int, ...]:
    if image_size:
        return (image_size, image_size, shape[-1])
    if None in shape:
        raise ConfigError(f"dataset {name} has images of varying size {shape}; set "
                          "dataset.image_size to resize them")
    return tuple(shape)


def _size(info: Any, split: str, dataset: tf.data.Dataset) -> int:
    """Examples in a split (or slice): TFDS's metadata, else the dataset's own count."""
    try:
        count = info.splits[split].num_examples
    except (KeyError, ValueError):
        count = 0
    if count:
        return int(count)
    cardinality = int(dataset.cardinality())
    if cardinality >= 0:
        return cardinality
    return int(dataset.reduce(0, lambda n, _: n + 1))


def _resize(image_size: int):
    def resize(image, label):
        return tf.image.resize(image, (image_size, image_size)), label

    return resize
