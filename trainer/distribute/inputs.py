"""Datasets that say how each worker reads its share of every global batch.

The input pipeline builds, for one worker of several, a dataset of that worker's share alone
(`trainer.data.shares`) and registers here how to build it from TensorFlow's
`tf.distribute.InputContext`. The multi-worker strategy (`trainer.distribute.runtime`) hands
such a dataset to `distribute_datasets_from_function`, which does not shard it again; any
other dataset it distributes as TensorFlow does (`experimental_distribute_dataset`, sharded
by element).

A build module: TensorFlow is imported at the top.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

# dataset -> (the context it was built for, how to build it for another)
_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _key(context: tf.distribute.InputContext) -> tuple[int, int, int]:
    return (context.num_input_pipelines, context.input_pipeline_id,
            context.num_replicas_in_sync)


def read_per_worker(build: DatasetFn, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """This worker's dataset, built now for `context` (its element spec is what the model is
    built from), and registered so the strategy distributes it as this worker's share.

    Args:
        build: the dataset of a worker's share, from TensorFlow's `InputContext`
            (`input_pipeline_id` of `num_input_pipelines`, `num_replicas_in_sync`).
        context: this worker's place, as TensorFlow will give it.
    """
    dataset = build(context)
    _READERS[dataset] = (_key(context), build)
    return dataset


def dataset_function(dataset: Any) -> DatasetFn | None:
    """The function `distribute_datasets_from_function` takes for a dataset registered by
    `read_per_worker` (it returns the dataset itself, built once, for its own context), or
    None for any other dataset."""
    try:
        entry = _READERS.get(dataset)
    except TypeError:  # not weakly referable: not one of ours
        return None
    if entry is None:
        return None
    key, build = entry

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # the same object for the same place: a cache built with it is kept (validation's)
        return dataset if _key(context) == key else build(context)

    return dataset_fn
