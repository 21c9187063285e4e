"""Any TensorFlow Datasets image-classification dataset: mnist, cifar10, cats_vs_dogs, ..."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.data.pipeline import DataError, Source


def load(name: str, train_split: str = "train", validation_split: str = "auto",
         test_split: str | None = "auto", validation_fraction: float = 0.1,
         data_dir: str | None = None, download: bool = True, image_size: int | None = None,
         seed: int | None = None) -> Source:
    """Loads a TFDS dataset with `(image, label)` features as a `Source`.

    Args:
        name: the TFDS name, e.g. `mnist` or `cats_vs_dogs`.
        train_split: split (or slice, e.g. `train[:80%]`) to train on.
        validation_split: split or slice for model selection; `auto`: the dataset's
            `validation` split, else the last `validation_fraction` of `train_split`
            (`train[90%:]`, the same examples on every run), trained on no more.
        test_split: split or slice evaluated once at the end; `auto`: the dataset's `test`
            split where it has one; null: none.
        validation_fraction: the share of `train_split` an `auto` validation carves off.
        data_dir: where TFDS keeps prepared data; None for TFDS's own default.
        download: download and prepare when missing; False never touches the network.
        image_size: resize images to this square side (needed where sizes vary); their own
            side reads them as they are.
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
    train_split, validation_split, test_split = resolve_splits(
        name, list(builder.info.splits.keys()), train_split, validation_split, test_split,
        validation_fraction)
    splits = [train_split, validation_split] + ([test_split] if test_split else [])
    # The images stay encoded until `preprocess`: several workers each decode only their
    # share of every global batch (trainer.data.shares).
    datasets = builder.as_dataset(
        split=splits, as_supervised=True, shuffle_files=True,
        read_config=tfds.ReadConfig(shuffle_seed=seed),
        decoders={"image": tfds.decode.SkipDecoding()})
    feature = builder.info.features["image"]
    own = tuple(feature.shape)
    shape = _input_shape(name, own, image_size)
    # mnist.yaml's image_size: 28 (its own side, stated so a model's minimum can raise it)
    # reads the images as they are
    resize = image_size and shape[:2] != own[:2]
    test = datasets[2] if test_split else None
    return Source(
        train=datasets[0], validation=datasets[1],
        train_size=_size(builder.info, train_split, datasets[0]),
        validation_size=_size(builder.info, validation_split, datasets[1]),
        input_shape=shape, num_classes=builder.info.features["label"].num_classes,
        preprocess=_decoder(feature, image_size if resize else None), scale=1.0 / 255.0,
        test=test, test_size=_size(builder.info, test_split, test) if test_split else 0,
        splits={"train": train_split, "validation": validation_split, "test": test_split},
        reads_in_preprocess=True)


def resolve_splits(name: str, available: list[str], train: str, validation: str,
                   test: str | None, fraction: float) -> tuple[str, str, str | None]:
    """The train, validation and test splits a config asks for, with `auto` decided.

    `auto` validation is the dataset's `validation` split, else the last `fraction` of the
    training split (TFDS slices are fixed: the same examples whatever the seed, and the
    two slices never share one); `auto` test is the `test` split where one exists and
    nothing else uses it.

    Raises:
        ConfigError: an `auto` carve of a training split that is already a slice, or a split
            that is not in the dataset.
    """
    def base(split: str) -> str:
        return split.split("[", 1)[0].strip()

    def unknown(split: str) -> list[str]:
        parts = [base(part) for part in split.split("+")]  # `train+validation` is one split
        return [p for p in parts if p not in available and p != "all"]

    known = bool(available)  # empty: the builder does not list its splits (TFDS's mocks)
    if not known:
        available = ["train", "test"]  # what most image datasets have; TFDS names a wrong one
    for role, split in (("train_split", train), ("validation_split", validation),
                        ("test_split", test)):
        if known and split and split != "auto" and unknown(split):
            raise ConfigError(f"dataset.{role}={split!r}: {name} has no split "
                              f"{unknown(split)[0]!r}; its splits: {', '.join(available)}")
    if validation == "auto":
        if "validation" in available and base(train) != "validation":
            validation = "validation"
        else:
            if "[" in train:
                raise ConfigError(f"dataset.validation_split=auto cannot carve from the slice "
                                  f"{train!r}; set dataset.validation_split (e.g. "
                                  f"{base(train)}[90%:]) and slice train_split to match")
            percent = round(100 * (1 - fraction))
            if not 1 <= percent <= 99:
                raise ConfigError(f"dataset.validation_fraction={fraction} leaves "
                                  f"{percent}% of {train} to train on; TFDS slices in whole "
                                  "percents: use 0.01 to 0.99")
            train, validation = f"{train}[:{percent}%]", f"{train}[{percent}%:]"
    if test == "auto":
        used = {base(train), base(validation)}
        test = "test" if "test" in available and "test" not in used else None
    return train, validation, test or None


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


def _decoder(feature: Any, image_size: int | None):
    """Decodes an image as TFDS's feature does, resized where asked."""
    def decode(encoded, label):
        image = feature.decode_example(encoded)
        if image_size:
            image = tf.image.resize(image, (image_size, image_size))
        return image, label

    return decode
