"""Gradient accumulation: one optimizer step from several micro-batches, one all-reduce.

Each replica cuts its batch into `n` micro-batches, runs forward and backward on one at a
time (so only a micro-batch's activations are alive), sums the gradients in a graph loop,
and the optimizer then all-reduces the sums once and applies them. Keras's own optimizer
option `gradient_accumulation_steps` fails under `tf.distribute` strategies
(keras-team/keras#20582); this does the same inside the train step, for `fit` (through the
model's `train_step`) and for the custom loop.

Every micro-batch's loss is weighted by its share of the step's examples, so the summed
gradient is exactly the gradient of the step's mean loss, also for an uneven last batch;
batch-norm statistics are per micro-batch, as they are per replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from trainer.internals.keras_step import (
    compute_loss,
    forward,
    track_loss,
    unpack,
    unscaled_losses,
)
from trainer.run.assembly.step import (
    batch_size,
    count_output_losses,
    exact_weights,
    replicas_in_sync,
    tracked_loss,
)


def accumulate(n: int, data: Any, gradients_of: Callable[[Any, tf.Tensor], list],
               variables: list) -> list:
    """Sums `gradients_of` over `n` micro-batches of this replica's batch.

    Micro-batch `i` holds examples `[i * size // n, (i + 1) * size // n)`: sizes differ by
    at most one, and an empty one (a last batch smaller than `n`) is skipped, so no layer
    ever sees an empty batch.

    Args:
        n: micro-batches per step.
        data: this replica's batch, a nested structure of tensors (None entries allowed).
        gradients_of: `(micro_batch, examples)` -> one gradient (or None) per variable; it
            may update metrics and layer state.
        variables: the trainable variables.

    Returns:
        The summed gradients, None where no micro-batch had one.
    """
    size = batch_size(data)
    unconnected: set[int] = set()

    def micro(i):
        start, end = i * size // n, (i + 1) * size // n
        part = tf.nest.map_structure(lambda t: None if t is None else t[start:end], data)
        return part, end - start

    def dense(gradients):
        out = []
        for index, (g, v) in enumerate(zip(gradients, variables, strict=True)):
            if g is None:
                unconnected.add(index)
                g = tf.zeros_like(v)
            out.append(tf.cast(tf.convert_to_tensor(g), v.dtype))
        return out

    def body(i, sums):
        part, count = micro(i)
        gradients = tf.cond(count > 0, lambda: dense(gradients_of(part, count)),
                            lambda: [tf.zeros_like(v) for v in variables])
        return i + 1, [s + g for s, g in zip(sums, gradients, strict=True)]

    zeros = [tf.zeros_like(v) for v in variables]
    _, sums = tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), zeros),
                            parallel_iterations=1)
    return [None if i in unconnected else s for i, s in enumerate(sums)]


def accumulating_train_step(model: Any, n: int) -> Callable[[Any], dict]:
    """A `train_step` for `fit` that accumulates `n` micro-batches per optimizer step.

    It is the exact step of `trainer.run.assembly.step` with the forward and backward pass in the
    loop of `accumulate`: Keras's loss (mean over the micro-batch, divided by the replicas)
    on the exact sample weights, weighted by the micro-batch's share of the replica's batch,
    sums to the loss of the whole global step, each example weighing `1 / N`; the loss
    tracker and the compiled metrics see every micro-batch; the optimizer applies (and
    all-reduces) once.
    """
    count = count_output_losses(model)

    def train_step(data):
        x, y, sample_weight = unpack(data)
        variables = model.trainable_weights
        local = batch_size(x)
        total = tf.cast(local, tf.float32)
        weighted, share = exact_weights(sample_weight, local)
        replicas = replicas_in_sync()

        def gradients_of(part, count_of):
            mx, my, mw, ow = part
            part_share = tf.cast(count_of, tf.float32) / total
            with tf.GradientTape() as tape:
                y_pred = forward(model, mx, training=True)
                with count.counting(share, share / replicas * part_share), unscaled_losses():
                    loss = compute_loss(model, mx, my, y_pred, mw, training=True)
                track_loss(model, tracked_loss(model, loss, share), count_of)
                scaled = model.optimizer.scale_loss(loss * part_share / replicas)
            gradients = tape.gradient(scaled, variables)
            model.compute_metrics(mx, my, y_pred, sample_weight=ow)
            return gradients

        if not variables:  # nothing to train (all frozen), as Keras's own step
            gradients_of((x, y, weighted, sample_weight), local)
            return model.get_metrics_result()
        gradients = accumulate(n, (x, y, weighted, sample_weight), gradients_of, variables)
        model.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return model.get_metrics_result()

    return train_step
