"""What the replicas hand each other outside a training step (`trainer.distribute.multiworker`):
the first replica's weights held by every replica before an evaluation, and the packed,
traced-once sum over replicas, on this process's logical CPU devices."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from trainer.distribute.multiworker import hold_first_replicas_weights, replica_sum
from trainer.distribute.runtime import build_mirrored


def _two_replicas() -> tf.distribute.MirroredStrategy:
    """trainer's MirroredStrategy, with collective keys of its own: a plain one here would
    share key 100 with every other plain one in the test process, and a float64 sum under
    it aborted the collectives of the next test's float32 step (tests/test_strategy.py)."""
    return build_mirrored(("/cpu:0", "/cpu:1"), "collective")


def test_every_replica_holds_the_first_replicas_batch_norm_statistics():
    """Unsynchronized batch norm leaves each replica its own moving statistics: after the
    hold, the second replica's copy of every weight equals the first's (what a checkpoint
    saves), and the first is unchanged."""
    strategy = _two_replicas()
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                  keras.layers.BatchNormalization()])
    mean = model.layers[1].moving_mean
    first, second = mean.value.values
    second.assign(first + 3.0)
    before = first.numpy().copy()
    hold_first_replicas_weights(strategy, model)
    for weight in model.weights:
        copies = [c.numpy() for c in weight.value.values]
        np.testing.assert_array_equal(copies[1], copies[0])
    np.testing.assert_array_equal(first.numpy(), before)


def test_a_replica_sum_adds_every_replicas_tensors_packed_and_is_traced_once():
    strategy = _two_replicas()
    total = replica_sum(strategy)
    assert replica_sum(strategy) is total  # kept per strategy: the end's calls trace once
    sums = total([tf.constant([1.0, 2.5]), tf.constant([[3]], tf.int32)])
    assert [s.dtype for s in sums] == [tf.float64, tf.float64]
    np.testing.assert_array_equal(sums[0].numpy(), [2.0, 5.0])
    np.testing.assert_array_equal(sums[1].numpy(), [[6.0]])
    chief = replica_sum(strategy, replica_zero_only=True)
    np.testing.assert_array_equal(chief([tf.constant([1.0, 2.5])])[0].numpy(), [1.0, 2.5])
    assert total([]) == []
