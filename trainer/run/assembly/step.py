"""The step `fit` runs: Keras's own, with every example weighted by the global step's count.

Keras's `train_step` averages the loss over each replica's own examples and then over the
replicas. On full batches that is the mean over the global batch; on a last batch split
unevenly (15 and 14 examples), the examples of the smaller share weigh more, and the
weights after an epoch depend on the number of replicas. Here each replica's sample weights
are multiplied by `examples on this replica * replicas / examples in the global step` (one
scalar all-reduce per step counts them), which turns Keras's per-replica mean (divided by
the replicas) into `sum of weighted losses / examples in the global step`: each example
weighs `1 / N` on any number of replicas. Regularisation losses are untouched (counted once
per step, as Keras counts them), metrics see the sample weights the data gave.

This holds for Keras's default loss reduction (`sum_over_batch_size`), which divides by
the examples of the batch. A model whose class overrides `compute_loss` gets it called by
this step with the exact sample weights (exact where it passes them on, as a call to
`super().compute_loss` does). A model whose class overrides `train_step` keeps its own step
in both loops: its author decided what a step is, and how a replica's examples weigh (a
call to `super().train_step` is Keras's per-replica mean).

Keras's symbolic build (Keras 3.15) reduces the first batch of a `fit` or `evaluate` over
the replicas with MEAN to learn the input shapes, which fails on a batch split unevenly and
on strings; `build_from_one_replica` gives it one replica's share instead (only shapes and
dtypes are read). Every private piece of Keras this step touches is in
`trainer.internals.keras_step`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import keras
import tensorflow as tf

from trainer.internals.keras_step import (
    adds_forward_losses,
    compute_loss,
    forward,
    keeps_own_test_step,
    keeps_own_train_step,
    replace_train_function,
    track_loss,
    unpack,
    unscaled_losses,
    wrap_output_loss_trackers,
)


def batch_size(data: Any) -> tf.Tensor:
    """Examples in a nested batch (the first axis of its first tensor), as int32."""
    first = next(t for t in tf.nest.flatten(data) if t is not None)
    return tf.shape(first)[0]


def keeps_own_step(model: keras.Model) -> bool:
    """Whether the model's class defines its own `train_step` (which trainer then runs)."""
    return keeps_own_train_step(model)


def as_keras_passes(step: Any) -> Any:
    """A model's own `train_step` or `test_step` called with a batch as Keras's `fit` passes
    it: inputs alone (`fit(x)`, a dataset of `x`) as the inputs themselves, not the `(x,)`
    trainer's pipeline holds (keras.io's VAE encodes `data` as it comes). Keras passes `(x,)`
    where `x` is itself a tuple or list of inputs, and so does this."""
    def passed(data):
        if isinstance(data, tuple) and len(data) == 1 and not isinstance(data[0], (tuple, list)):
            data = data[0]
        return step(data)

    return passed


def global_count(local: tf.Tensor) -> tf.Tensor:
    """Examples in the global step (float32): this replica's, summed over the replicas."""
    local = tf.cast(local, tf.float32)
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return local
    return context.all_reduce(tf.distribute.ReduceOp.SUM, local)


def exact_weights(sample_weight: Any, local: tf.Tensor) -> tuple[Any, tf.Tensor]:
    """Sample weights that make Keras's per-replica mean the global step's mean.

    Args:
        sample_weight: the batch's sample weights (a tensor, a structure per output) or None.
        local: examples in this replica's batch.

    Returns:
        (`sample_weight` (ones where None) times `share`, `share`), where `share` is
        `local * replicas / examples in the global step` (1 on even shares).
    """
    replicas = replicas_in_sync()
    share = tf.cast(local, tf.float32) * replicas / tf.maximum(global_count(local), 1.0)
    if sample_weight is None:
        return tf.fill(tf.reshape(local, [1]), share), share
    return tf.nest.map_structure(lambda w: tf.cast(w, tf.float32) * share, sample_weight), share


def regularization(model: keras.Model) -> tf.Tensor:
    """The model's own losses (regularisers, `add_loss`), summed, unscaled."""
    if not model.losses:
        return tf.constant(0.0)
    return tf.add_n([tf.cast(tf.reduce_sum(v), tf.float32) for v in model.losses])


def tracked_loss(model: keras.Model, loss: tf.Tensor, share: tf.Tensor) -> tf.Tensor:
    """The loss Keras's tracker records for this replica (its examples' weighted mean plus
    the model's own losses), from the step's unscaled loss (`unscaled_losses`) with `share`
    taken out of the examples' part."""
    loss = tf.cast(loss, tf.float32)
    reg = regularization(model)
    return tf.math.divide_no_nan(loss - reg, share) + reg


def replicas_in_sync() -> int:
    """Replicas of the step being traced (1 outside a strategy)."""
    context = tf.distribute.get_replica_context()
    return 1 if context is None else context.num_replicas_in_sync


class StepCount:
    """What the per-output loss trackers (`count_output_losses`) read while a step's loss
    is computed: `divisor`, the factor the loss values carry (the step's `share`, see
    `exact_weights`), and `weight`, this replica's part of the global step (its examples
    over the step's: the parts of a step sum to 1)."""

    def __init__(self) -> None:
        self.divisor: tf.Tensor | float | None = None
        self.weight: tf.Tensor | float = 1.0

    @contextmanager
    def counting(self, divisor: tf.Tensor | float, weight: tf.Tensor | float) -> Iterator[None]:
        """The trackers read `divisor` and `weight` while the loss is computed inside."""
        self.divisor, self.weight = divisor, weight
        try:
            yield
        finally:
            self.divisor, self.weight = None, 1.0


def count_output_losses(model: keras.Model) -> StepCount:
    """Makes the per-output loss trackers of a model with several outputs (`cls_loss`,
    `reg_loss`) count each global step once, with the step's mean, on any number of
    replicas: what Keras's `fit` logs on one device.

    Keras 3.15 weighs them by the batch's static size (`CompileLoss.call`), unknown for
    batches from a dataset: on one device each batch counts once, whatever its size. Under
    a strategy each replica's share would count once: the logged values would change with
    the number of replicas. Here each replica records its examples' mean (the value
    without the step's `share`) weighted by its part of the global step.
    """
    count = _step_counts.get(model)
    if count is not None:
        return count
    count = _step_counts[model] = StepCount()

    def wrap(original):
        def update_state(values, sample_weight=None):
            if count.divisor is None:
                return original(values, sample_weight=sample_weight)
            values = tf.math.divide_no_nan(tf.cast(values, tf.float32),
                                           tf.cast(count.divisor, tf.float32))
            return original(values, sample_weight=tf.cast(count.weight, tf.float32))

        return update_state

    wrap_output_loss_trackers(model, wrap)
    return count


# Each model's `StepCount` (its trackers are wrapped once), and the models whose step met
# losses added in the forward pass (`note_forward_losses`): trainer's own state, kept off
# Keras's objects.
_step_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_forward_losses: weakref.WeakSet = weakref.WeakSet()


def exact_test_step(model: keras.Model) -> Any:
    """Keras's `test_step` with trainer's exact weighting: the loss through the model's
    `compute_loss` on the exact sample weights, unscaled (`unscaled_losses`), its trackers
    counting as on one device; a model's own `test_step` is kept, its trackers counting."""
    count = count_output_losses(model)
    if keeps_own_test_step(model):
        original = as_keras_passes(model.test_step)

        def own_test_step(data):
            x, _, _ = unpack(data)
            local = batch_size(x)
            with count.counting(1.0, tf.cast(local, tf.float32) / global_count(local)):
                return original(data)

        return own_test_step

    def test_step(data):
        x, y, sample_weight = unpack(data)
        local = batch_size(x)
        weighted, share = exact_weights(sample_weight, local)
        y_pred = forward(model, x, training=False)
        with count.counting(share, share / replicas_in_sync()), unscaled_losses():
            loss = compute_loss(model, x, y, y_pred, weighted, training=False)
        track_loss(model, tracked_loss(model, loss, share), local)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return test_step


def exact_train_step(model: keras.Model) -> Any:
    """Keras's TensorFlow `train_step`, with `exact_weights` on the loss (computed unscaled,
    then divided by the replicas: `unscaled_losses`)."""
    count = count_output_losses(model)

    def train_step(data):
        x, y, sample_weight = unpack(data)
        local = batch_size(x)
        weighted, share = exact_weights(sample_weight, local)
        replicas = replicas_in_sync()
        with tf.GradientTape() as tape:
            y_pred = forward(model, x, training=True)
            with count.counting(share, share / replicas), unscaled_losses():
                loss = compute_loss(model, x, y, y_pred, weighted, training=True)
            track_loss(model, tracked_loss(model, loss, share), local)
            scaled = model.optimizer.scale_loss(loss / replicas)
        note_forward_losses(model)
        apply(model, tape, scaled)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step


def note_forward_losses(model: keras.Model) -> None:
    """Marks (at trace time) a model that adds losses in its forward pass (`add_loss`, an
    activity regulariser), for the summary: each replica's are of its own share of the
    batch, taken as Keras takes them under a strategy (summed over the replicas, divided by
    their number): a batch's mean is exact on even shares, a batch's sum counts 1/N."""
    if adds_forward_losses(model):
        _forward_losses.add(model)


def has_forward_losses(model: keras.Model) -> bool:
    """Whether a traced step of the model met losses added in its forward pass."""
    return model in _forward_losses


def apply(model: keras.Model, tape: tf.GradientTape, loss: tf.Tensor) -> None:
    """The optimizer's step on the loss's gradients; none for a model with nothing to train
    (all frozen), as Keras's own step."""
    variables = model.trainable_weights
    if not variables:
        return
    gradients = tape.gradient(loss, variables)
    model.optimizer.apply_gradients(zip(gradients, variables, strict=True))


class ChunkStart(keras.callbacks.Callback):
    """Remembers the step a `fit` chunk begins at (Keras calls `on_train_batch_begin` with
    it just before the train function), for `steps_in_chunks`."""

    def __init__(self) -> None:
        super().__init__()
        self.begin = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.begin = batch


def steps_in_chunks(model: keras.Model, steps_per_execution: int) -> ChunkStart:
    """Makes `fit` run `steps_per_execution` steps per graph call on any number of replicas.

    Keras 3.15's own multi-step function reads the distributed iterator with
    `get_next_as_optional` inside a `tf.cond`, which fails under MirroredStrategy ("You
    must feed a value for placeholder tensor"), and runs a whole chunk past the end of an
    epoch whose steps are not a multiple of the chunk (reading the next epoch's batches).
    This one runs the chunk's steps in a graph loop of `strategy.run` (as `loop=custom`
    does) and stops at the epoch's last step. The returned callback must be among `fit`'s.
    """
    strategy = model.distribute_strategy
    start = ChunkStart()

    def one_step(data):
        strategy.run(model.train_step, args=(data,))

    # as Keras compiles it: each step (with its all-reduce) by XLA when the model asks
    one_step = tf.function(one_step, jit_compile=model.jit_compile is True)

    @tf.function
    def run_steps(iterator, steps):
        for _ in tf.range(steps):
            one_step(next(iterator))
        return model.get_metrics_result()

    def train_function(iterator):
        total = (start.params or {}).get("steps") or steps_per_execution
        steps = max(1, min(steps_per_execution, total - start.begin))
        return run_steps(iterator, tf.constant(steps))

    replace_train_function(model, train_function)
    return start
