"""The input pipeline all sources share: parallel preprocess, cache, shuffle, batch, prefetch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.data.augment import PRESETS, batch_layers, batch_mixer, check, element_augmenter
from trainer.data.augment import mixers as mixer_names
from trainer.plan.scaling import balanced_batch_sizes


@dataclass
class Source:
    """What a data source's `load` returns: examples for training and validation.

    Elements are `(features, target)` pairs: images and class indices, or any tensors (a
    row of tabular features and a regression target, say); nothing here assumes images.

    Three roles: `train` is trained on, `validation` chooses (best checkpoint, early
    stopping, learning-rate plateaus), `test` is read once, at the end, to evaluate the
    chosen checkpoint; a source without a test split leaves it None.

    Attributes:
        train: unbatched `(features, target)` elements for training.
        validation: unbatched `(features, target)` elements for model selection.
        train_size: number of training examples.
        validation_size: number of validation examples.
        input_shape: shape of one preprocessed input, e.g. `(32, 32, 1)` or `(10,)`.
        num_classes: number of classes where targets are class indices or one-hot vectors;
            None for a regression target.
        num_outputs: outputs the model needs: `num_classes` when None, else 1 per target.
        preprocess: per-element function applied in parallel before caching (decode,
            resize), or None.
        scale: inputs are cast to float32 and multiplied by it per batch, after the cache,
            so the cache holds the compact raw values (uint8 where the source has them);
            None leaves the inputs as they are.
        test: unbatched elements evaluated once at the end, or None.
        test_size: number of test examples (0 without a test split).
        splits: where each role comes from, for the summary (e.g. TFDS's split strings).
    """

    train: tf.data.Dataset
    validation: tf.data.Dataset
    train_size: int
    validation_size: int
    input_shape: tuple[int, ...]
    num_classes: int | None = None
    num_outputs: int | None = None
    preprocess: Callable[[Any, Any], tuple[Any, Any]] | None = None
    scale: float | None = None
    test: tf.data.Dataset | None = None
    test_size: int = 0
    splits: dict[str, str | None] | None = None

    def __post_init__(self) -> None:
        if self.num_outputs is None:
            self.num_outputs = self.num_classes if self.num_classes is not None else 1
        if self.test is not None and not self.test_size:
            count = int(self.test.cardinality())
            if count < 0:
                raise ConfigError("Source(test=...) of unknown length needs test_size (the "
                                  "number of test examples)")
            self.test_size = count

    @classmethod
    def from_arrays(cls, x_train: Any, y_train: Any, x_validation: Any, y_validation: Any,
                    num_classes: int | None = None, x_test: Any = None, y_test: Any = None,
                    **kwargs: Any) -> Source:
        """A source from in-memory arrays (NumPy or anything `from_tensor_slices` takes).

        Args:
            x_train, y_train: training features and targets, first axis the examples.
            x_validation, y_validation: the same for validation.
            num_classes: for class targets; None for regression, where the number of
                outputs is the size of a target (1 for scalar targets).
            x_test, y_test: the same for the test split, or None for none.
            **kwargs: other `Source` fields (`preprocess`, `scale`, `input_shape` where the
                preprocessing changes it).
        """
        import numpy as np

        y = np.asarray(y_train)
        outputs = None if num_classes is not None else (int(np.prod(y.shape[1:])) or 1)
        test = (None if x_test is None
                else tf.data.Dataset.from_tensor_slices((x_test, y_test)))
        return cls(train=tf.data.Dataset.from_tensor_slices((x_train, y_train)),
                   validation=tf.data.Dataset.from_tensor_slices((x_validation, y_validation)),
                   train_size=len(x_train), validation_size=len(x_validation),
                   input_shape=kwargs.pop("input_shape", tuple(np.asarray(x_train).shape[1:])),
                   num_classes=num_classes,
                   num_outputs=outputs, test=test,
                   test_size=0 if x_test is None else len(x_test), **kwargs)


class DataError(ConfigError):
    """Data that is not there (not prepared, not downloadable, an empty folder)."""


def build_pipeline(dataset: tf.data.Dataset, global_batch: int, *, training: bool,
                   preprocess: Callable | None = None, scale: float | None = None,
                   seed: int | None = None, cache: bool = True, shuffle_buffer: int = 2048,
                   drop_remainder: bool = False, replicas: int = 1,
                   examples: int | None = None) -> tf.data.Dataset:
    """Turns unbatched examples into one pass of global batches, ready for a strategy.

    Args:
        dataset: unbatched `(image, label)` elements.
        global_batch: examples per step over all replicas; the strategy splits each batch.
        training: shuffle (and maybe drop a last partial batch); evaluation never drops one.
        preprocess: per-element function, mapped in parallel.
        scale: factor that brings the inputs to [0, 1], applied per batch (vectorised);
            None leaves them as they are.
        seed: shuffle seed; with a seed the order is deterministic.
        cache: keep preprocessed elements in memory after the first pass.
        shuffle_buffer: examples in the shuffle buffer.
        drop_remainder: drop a last partial training batch.
        replicas: replicas the batches are split over.
        examples: examples in `dataset`, to keep every replica's share of the last batch
            non-empty (see `trainer.plan.scaling.balanced_batch_sizes`).

    Returns:
        A batched, prefetching `tf.data.Dataset`.
    """
    prepared = prepare(dataset, preprocess, cache, scale)
    batched = _batches(prepared, global_batch, training, scale, seed, shuffle_buffer,
                       drop_remainder, replicas, examples)
    return batched.prefetch(tf.data.AUTOTUNE).with_options(_options(seed))


def build_training_epochs(dataset: tf.data.Dataset, global_batch: int, *, first_epoch: int,
                          epochs: int, skip_steps: int = 0, preprocess: Callable | None = None,
                          scale: float | None = None, seed: int | None = None, cache: bool = True,
                          shuffle_buffer: int = 2048, drop_remainder: bool = False,
                          replicas: int = 1, examples: int | None = None,
                          augment: Any = None) -> tf.data.Dataset:
    """The training batches of epochs `first_epoch`..`epochs - 1` as one dataset.

    Each epoch's order comes from the seed and the epoch's number alone, not from how many
    passes the process made before, so a run resumed at epoch e, step k sees exactly the
    batches the interrupted run would have seen (`skip_steps` skips the k done ones).
    `augment` (the config's list, `trainer.data.augment`) transforms the training images after
    the cache, each with a seed from (seed, epoch, position). Other arguments as
    `build_pipeline`.
    """
    prepared = prepare(dataset, preprocess, cache, scale)
    items = check(augment)
    presets = [i for i in items if isinstance(i, str) and i in PRESETS]
    mix = batch_mixer(mixer_names(items)) if mixer_names(items) else None
    per_element = element_augmenter(presets) if presets else None
    layers = batch_layers(items, seed)
    # an unseeded run still needs seeds for the stateless ops: one drawn for this run
    base = seed if seed is not None else int(np.random.default_rng().integers(1, 2**31 - 1))

    def one_epoch(epoch):
        epoch_seed = None if seed is None else seed * 7919 + epoch
        source = prepared
        if per_element is not None:
            source = prepared.shuffle(shuffle_buffer, seed=epoch_seed,
                                      reshuffle_each_iteration=False).enumerate()
            key = tf.cast(base, tf.int64) * 7919 + epoch

            def augmented(position, element):
                return per_element(*element, tf.stack([key, position]))

            source = source.map(augmented, num_parallel_calls=tf.data.AUTOTUNE)
        batches = _batches(source, global_batch, True, scale, epoch_seed,
                           shuffle_buffer if per_element is None else 0, drop_remainder,
                           replicas, examples, reshuffle=False)
        for layer in layers:
            batches = batches.map(lambda x, y, layer=layer: (layer(x, training=True), y),
                                  num_parallel_calls=tf.data.AUTOTUNE)
        if mix is not None:
            key = tf.cast(base, tf.int64) * 7919 + epoch + 104729  # apart from the images'

            def mixed(position, batch):
                return mix(*batch, tf.stack([key, position]))

            batches = batches.enumerate().map(mixed, num_parallel_calls=tf.data.AUTOTUNE)
        return batches

    epochs_ds = tf.data.Dataset.range(first_epoch, epochs).flat_map(one_epoch)
    return epochs_ds.skip(skip_steps).prefetch(tf.data.AUTOTUNE).with_options(_options(seed))


def prepare(dataset: tf.data.Dataset, preprocess: Callable | None, cache: bool,
            scale: float | None = None) -> tf.data.Dataset:
    """Preprocesses elements in parallel and caches them (the part every pass shares).

    Images in the byte range (`scale` 1/255) that preprocessing turned into float32 (a
    resize does) are cached as uint8: a quarter of the memory (cats_vs_dogs at 224: 3.5 GB
    instead of 14 GB). Without a cache they stay float32: rounding every pixel costs more
    (`scripts/bench_input.py`: about 10-30%) than the smaller batch copies save.
    """
    if preprocess is not None:
        dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    if not cache:
        return dataset
    byte_range = scale is not None and abs(scale - 1 / 255) < 1e-12
    if byte_range and dataset.element_spec[0].dtype == tf.float32:
        dataset = dataset.map(_to_bytes, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.cache()


def _to_bytes(images, labels):
    return tf.saturate_cast(tf.round(images), tf.uint8), labels


def _batches(dataset, global_batch, training, scale, seed, shuffle_buffer, drop_remainder,
             replicas, examples, reshuffle=True) -> tf.data.Dataset:
    if training and shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=reshuffle)
    drop = training and drop_remainder
    dataset = dataset.batch(global_batch, drop_remainder=drop)
    sizes = None if drop or examples is None else balanced_batch_sizes(examples, global_batch,
                                                                       replicas)
    if sizes is not None:
        dataset = dataset.rebatch(tf.constant(sizes, tf.int64))
    if scale is None:
        return dataset
    return dataset.map(_scaler(scale), num_parallel_calls=tf.data.AUTOTUNE)


def _scaler(scale: float) -> Callable:
    def to_unit_range(images, labels):
        return tf.cast(images, tf.float32) * scale, labels

    return to_unit_range


def _options(seed: int | None) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = seed is not None
    # In-memory data cannot be sharded by file; DATA sharding is what AUTO falls back to,
    # set explicitly so no worker logs the fallback warning.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return options
