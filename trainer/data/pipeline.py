"""The input pipeline all sources share: parallel preprocess, cache, shuffle, batch, prefetch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from trainer.config import ConfigError
from trainer.scaling import balanced_batch_sizes


@dataclass
class Source:
    """What a data source module's `load` returns.

    Attributes:
        train: unbatched `(image, label)` elements for training.
        validation: unbatched `(image, label)` elements for evaluation.
        train_size: number of training examples.
        validation_size: number of validation examples.
        input_shape: shape of one preprocessed image, e.g. `(32, 32, 1)`.
        num_classes: number of classes (labels are sparse integers).
        preprocess: per-element function applied in parallel before caching (decode,
            resize), or None.
        scale: images are cast to float32 and multiplied by it per batch, after the cache,
            so the cache holds the compact raw values (uint8 where the source has them).
    """

    train: tf.data.Dataset
    validation: tf.data.Dataset
    train_size: int
    validation_size: int
    input_shape: tuple[int, ...]
    num_classes: int
    preprocess: Callable[[Any, Any], tuple[Any, Any]] | None = None
    scale: float = 1.0 / 255.0


class DataError(ConfigError):
    """Data that is not there (not prepared, not downloadable, an empty folder)."""


def build_pipeline(dataset: tf.data.Dataset, global_batch: int, *, training: bool,
                   preprocess: Callable | None = None, scale: float = 1.0,
                   seed: int | None = None, cache: bool = True, shuffle_buffer: int = 2048,
                   drop_remainder: bool = False, replicas: int = 1,
                   examples: int | None = None) -> tf.data.Dataset:
    """Turns unbatched examples into one pass of global batches, ready for a strategy.

    Args:
        dataset: unbatched `(image, label)` elements.
        global_batch: examples per step over all replicas; the strategy splits each batch.
        training: shuffle (and maybe drop a last partial batch); evaluation never drops one.
        preprocess: per-element function, mapped in parallel.
        scale: factor that brings the images to [0, 1], applied per batch (vectorised).
        seed: shuffle seed; with a seed the order is deterministic.
        cache: keep preprocessed elements in memory after the first pass.
        shuffle_buffer: examples in the shuffle buffer.
        drop_remainder: drop a last partial training batch.
        replicas: replicas the batches are split over.
        examples: examples in `dataset`, to keep every replica's share of the last batch
            non-empty (see `trainer.scaling.balanced_batch_sizes`).

    Returns:
        A batched, prefetching `tf.data.Dataset`.
    """
    prepared = prepare(dataset, preprocess, cache, scale)
    batched = _batches(prepared, global_batch, training, scale, seed, shuffle_buffer,
                       drop_remainder, replicas, examples)
    return batched.prefetch(tf.data.AUTOTUNE).with_options(_options(seed))


def build_training_epochs(dataset: tf.data.Dataset, global_batch: int, *, first_epoch: int,
                          epochs: int, skip_steps: int = 0, preprocess: Callable | None = None,
                          scale: float = 1.0, seed: int | None = None, cache: bool = True,
                          shuffle_buffer: int = 2048, drop_remainder: bool = False,
                          replicas: int = 1, examples: int | None = None) -> tf.data.Dataset:
    """The training batches of epochs `first_epoch`..`epochs - 1` as one dataset.

    Each epoch's order comes from the seed and the epoch's number alone, not from how many
    passes the process made before, so a run resumed at epoch e, step k sees exactly the
    batches the interrupted run would have seen (`skip_steps` skips the k done ones).
    Arguments as `build_pipeline`.
    """
    prepared = prepare(dataset, preprocess, cache, scale)

    def one_epoch(epoch):
        epoch_seed = None if seed is None else seed * 7919 + epoch
        return _batches(prepared, global_batch, True, scale, epoch_seed, shuffle_buffer,
                        drop_remainder, replicas, examples, reshuffle=False)

    epochs_ds = tf.data.Dataset.range(first_epoch, epochs).flat_map(one_epoch)
    return epochs_ds.skip(skip_steps).prefetch(tf.data.AUTOTUNE).with_options(_options(seed))


def prepare(dataset: tf.data.Dataset, preprocess: Callable | None, cache: bool,
            scale: float = 1.0) -> tf.data.Dataset:
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
    if dataset.element_spec[0].dtype == tf.float32 and abs(scale - 1 / 255) < 1e-12:
        dataset = dataset.map(_to_bytes, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.cache()


def _to_bytes(images, labels):
    return tf.saturate_cast(tf.round(images), tf.uint8), labels


def _batches(dataset, global_batch, training, scale, seed, shuffle_buffer, drop_remainder,
             replicas, examples, reshuffle=True) -> tf.data.Dataset:
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=reshuffle)
    drop = training and drop_remainder
    dataset = dataset.batch(global_batch, drop_remainder=drop)
    sizes = None if drop or examples is None else balanced_batch_sizes(examples, global_batch,
                                                                       replicas)
    if sizes is not None:
        dataset = dataset.rebatch(tf.constant(sizes, tf.int64))
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
