"""The input pipeline all sources share: parallel preprocess, cache, shuffle, batch, prefetch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf


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
        preprocess: per-element function applied in parallel before caching, or None.
    """

    train: tf.data.Dataset
    validation: tf.data.Dataset
    train_size: int
    validation_size: int
    input_shape: tuple[int, ...]
    num_classes: int
    preprocess: Callable[[Any, Any], tuple[Any, Any]] | None = None


def build_pipeline(dataset: tf.data.Dataset, global_batch: int, *, training: bool,
                   preprocess: Callable | None = None, seed: int | None = None,
                   cache: bool = True, shuffle_buffer: int = 2048,
                   drop_remainder: bool = False) -> tf.data.Dataset:
    """Turns unbatched examples into batches of the global batch size, ready for a strategy.

    Args:
        dataset: unbatched `(image, label)` elements.
        global_batch: examples per step over all replicas; the strategy splits each batch.
        training: shuffle (and maybe drop a last partial batch); evaluation never drops one.
        preprocess: per-element function, mapped in parallel.
        seed: shuffle seed; with a seed the order is deterministic.
        cache: keep preprocessed elements in memory after the first pass.
        shuffle_buffer: examples in the shuffle buffer.
        drop_remainder: drop a last partial training batch.

    Returns:
        A batched, prefetching `tf.data.Dataset`.
    """
    autotune = tf.data.AUTOTUNE
    if preprocess is not None:
        dataset = dataset.map(preprocess, num_parallel_calls=autotune)
    if cache:
        dataset = dataset.cache()
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(global_batch, drop_remainder=training and drop_remainder)
    return dataset.prefetch(autotune).with_options(_options(seed))


def _options(seed: int | None) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = seed is not None
    # In-memory data cannot be sharded by file; DATA sharding is what AUTO falls back to,
    # set explicitly so no worker logs the fallback warning.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return options
