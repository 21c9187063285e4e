"""`loop=custom`: a `strategy.run` training loop that gets the distribution maths right.

Any Keras loss is computed per example (its reduction turned off), then the loss of each
replica is summed over its examples and divided by the examples of the
whole global batch (`tf.nn.compute_average_loss`), and regularisation losses are divided by
the replicas (`tf.nn.scale_regularization_loss`); the optimizer then sums the gradients of
all replicas, which gives exactly the gradient of the mean loss over the global batch. The
global batch is counted, not assumed, so a last partial batch, split unevenly over the
replicas, is weighted right too. Metrics live in variables summed across replicas. With
`accumulate` N > 1 each replica sums the gradients of N micro-batches (`trainer.run.accumulate`)
before the one all-reduce of the step; the loss is still divided by the whole step's count.

A model with several outputs, a loss per output or loss weights trains through its compiled
loss instead (`compiled=True`: Keras's `compute_loss`, as `fit` runs it), each example's
sample weight scaled so Keras's per-replica mean becomes the global batch's
(`trainer.run.step.exact_weights`), with the model's compiled metrics and loss trackers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.losses.loss import unscale_loss_for_distribution

from trainer.run.accumulate import accumulate
from trainer.run.step import batch_size, count_output_losses, tracked_loss
from trainer.task.build import per_example

# tf.distribute's input code reads dataset options in graph mode when a dataset is
# distributed, which warns on every run; nothing for a user to act on.
warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")


class CustomLoop:
    """Trains and evaluates a compiled model with its optimizer under a strategy.

    It drives the same Keras callbacks as `fit` (progress bar, checkpoints, backup,
    TensorBoard, history), so both loops write the same run directory.

    Args:
        model: a model compiled with its optimizer (checkpoints save it with the model).
        strategy: the `tf.distribute.Strategy` the model was built under.
        steps_per_execution: training steps per `tf.function` call.
        jit_compile: compile each replica's step with XLA.
        loss: a Keras loss (any reduction: it is computed per example here); None for
            sparse categorical cross-entropy.
        metrics: makes fresh metric objects (called inside the strategy's scope); None for
            accuracy over sparse labels.
        accumulate: micro-batches per replica whose gradients make one optimizer step.
        compiled: train and evaluate through the model's compiled loss and metrics (several
            outputs, a loss per output, loss weights); `loss` and `metrics` are then unused.
    """

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy,
                 steps_per_execution: int = 1, jit_compile: bool = False,
                 loss: keras.losses.Loss | None = None,
                 metrics: Callable[[], list] | None = None, accumulate: int = 1,
                 compiled: bool = False) -> None:
        self.model = model
        self.accumulate = accumulate
        self.strategy = strategy
        self.steps_per_execution = steps_per_execution
        self.compiled = compiled
        if compiled:  # the model's compiled loss, its metrics and trackers (fit's)
            self.output_losses = count_output_losses(model)
        else:
            self.per_example_loss = per_example(
                loss if loss is not None else keras.losses.SparseCategoricalCrossentropy())
        with strategy.scope():
            self.loss_metric = keras.metrics.Mean(name="loss")
            self.metrics = ([] if compiled else metrics() if metrics is not None
                            else [keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
            # Created here, not lazily inside the first traced step: optimizer slots born
            # inside a graph that runs several steps under MirroredStrategy fail at run time
            # ("You must feed a value for placeholder tensor").
            model.optimizer.build(model.trainable_variables)
        self._replica_gradients = (tf.function(self._gradients, jit_compile=True)
                                   if jit_compile else self._gradients)
        self._train_chunk = tf.function(self._train_steps)
        self._evaluate_all = tf.function(self._test_steps)

    def average_loss(self, per_example_loss: tf.Tensor, global_batch: tf.Tensor) -> tf.Tensor:
        """This replica's share of the mean loss over the global batch."""
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch)

    def _global_batch(self, labels: tf.Tensor) -> tf.Tensor:
        local = tf.cast(batch_size(labels), tf.float32)
        total = tf.distribute.get_replica_context().all_reduce("sum", local)
        return tf.cast(total, tf.int32)

    def _regularization(self) -> tf.Tensor:
        return tf.add_n(self.model.losses) if self.model.losses else tf.constant(0.0)

    def _gradients(self, images: Any, labels: tf.Tensor, global_batch: tf.Tensor,
                   share: tf.Tensor | float = 1.0, weights: tf.Tensor | None = None,
                   examples: tf.Tensor | None = None):
        """Forward and backward pass of one replica; no collectives, so XLA can compile it.

        `share` is the micro-batch's part of the replica's batch: the regularisation loss,
        counted once per step, is spread over the micro-batches by it. `examples` is the
        replica's batch (the micro-batch's where None).
        """
        if self.compiled:
            return self._compiled_gradients(images, labels, global_batch, share, weights,
                                            examples)
        with tf.GradientTape() as tape:
            predictions = self.model(images, training=True)
            per_example = self._per_example(labels, predictions, weights)
            regularization = self._regularization()
            loss = (self.average_loss(per_example, global_batch)
                    + tf.nn.scale_regularization_loss(regularization) * share)
            # Identity unless mixed_float16 wrapped the optimizer in a LossScaleOptimizer,
            # which unscales the gradients again in apply_gradients.
            scaled = self.model.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.model.trainable_variables)
        return gradients, predictions, per_example + regularization

    def _compiled_gradients(self, images, labels, global_batch, share, weights, examples):
        """`_gradients` through the model's compiled loss (`compute_loss`, as fit runs it):
        a loss per output, loss weights. Each example's sample weight is multiplied by
        `replica examples * replicas / global batch`, so Keras's mean over the (micro-)
        batch, divided by the replicas, times the micro-batch's `share`, sums over the
        replicas to the global batch's weighted mean (`trainer.run.step.exact_weights`)."""
        model, local = self.model, tf.cast(batch_size(labels), tf.float32)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        whole = local if examples is None else tf.cast(examples, tf.float32)
        part = whole * replicas / tf.maximum(tf.cast(global_batch, tf.float32), 1.0)
        weighted = (tf.fill(tf.reshape(batch_size(labels), [1]), part) if weights is None
                    else tf.nest.map_structure(lambda w: tf.cast(w, tf.float32) * part,
                                               weights))
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            with self.output_losses.counting(local, part):
                loss = model._compute_loss(x=images, y=labels, y_pred=predictions,
                                           sample_weight=weighted, training=True)
            model._loss_tracker.update_state(tracked_loss(model, loss, part),
                                             sample_weight=local)
            scaled = model.optimizer.scale_loss(loss * share)
        gradients = tape.gradient(scaled, model.trainable_variables)
        return gradients, predictions, None

    def _per_example(self, labels: tf.Tensor, predictions: tf.Tensor,
                     weights: tf.Tensor | None = None) -> tf.Tensor:
        """One loss value per example (a loss left per element is averaged over the rest),
        times its sample weight where the data has one."""
        values = self.per_example_loss(labels, tf.cast(predictions, tf.float32))
        if values.shape.rank is not None and values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        if weights is not None:
            values = values * tf.reshape(tf.cast(weights, values.dtype), [-1])
        return values

    def _train_step(self, images: Any, labels: tf.Tensor,
                    weights: tf.Tensor | None = None) -> None:
        global_batch = self._global_batch(labels)
        variables = self.model.trainable_variables
        if self.accumulate == 1:
            gradients, predictions, losses = self._replica_gradients(
                images, labels, global_batch, 1.0, weights)
            self._update_metrics(labels, predictions, losses, weights)
        else:
            gradients = self._accumulated_gradients(images, labels, global_batch, weights)
        self.model.optimizer.apply_gradients(zip(gradients, variables, strict=True))

    def _accumulated_gradients(self, images, labels, global_batch, weights=None) -> list:
        total = tf.cast(batch_size(labels), tf.float32)

        def gradients_of(part, count):
            x, y, w = part
            gradients, predictions, losses = self._replica_gradients(
                x, y, global_batch, tf.cast(count, tf.float32) / total, w, total)
            self._update_metrics(y, predictions, losses, w)
            return gradients

        return accumulate(self.accumulate, (images, labels, weights), gradients_of,
                          self.model.trainable_variables)

    def _update_metrics(self, labels, predictions, per_example_loss, weights=None) -> None:
        if self.compiled:  # the loss trackers were updated with the loss
            if self.model._compile_metrics is not None:
                self.model._compile_metrics.update_state(labels, predictions, weights)
            return
        self.loss_metric.update_state(per_example_loss)
        for metric in self.metrics:
            metric.update_state(labels, predictions, sample_weight=weights)

    def _train_steps(self, iterator: Any, steps: tf.Tensor | None) -> dict[str, tf.Tensor]:
        # Exactly `steps` batches, never past the end: `fit` counts the epoch's steps. One
        # step per call (steps=None) runs without a graph loop around it.
        if steps is None:
            self.strategy.run(self._train_step, args=next(iterator))
        else:
            for _ in tf.range(steps):
                self.strategy.run(self._train_step, args=next(iterator))
        # Read here, in the graph, so the Python loop never waits for a step to finish
        # (reading metrics eagerly after every call would serialise dispatch and compute).
        return self._logs()

    def _logs(self) -> dict[str, tf.Tensor]:
        if self.compiled:
            return self.model.get_metrics_result()
        return {m.name: m.result() for m in (self.loss_metric, *self.metrics)}

    def _test_step(self, images: Any, labels: tf.Tensor,
                   weights: tf.Tensor | None = None) -> None:
        if self.compiled:  # as Keras's test_step, its per-output trackers counting examples
            model, local = self.model, batch_size(labels)
            predictions = model(images, training=False)
            with self.output_losses.counting(local):
                loss = model._compute_loss(x=images, y=labels, y_pred=predictions,
                                           sample_weight=weights, training=False)
            model._loss_tracker.update_state(unscale_loss_for_distribution(loss),
                                             sample_weight=local)
            self._update_metrics(labels, predictions, None, weights)
            return
        predictions = self.model(images, training=False)
        per_example = self._per_example(labels, predictions, weights)
        self._update_metrics(labels, predictions, per_example + self._regularization(),
                             weights)

    def _test_steps(self, dataset: Any) -> None:
        for batch in dataset:
            self.strategy.run(self._test_step, args=batch)

    def _results(self) -> dict[str, float]:
        return {name: float(value) for name, value in self._logs().items()}

    @property
    def metric_variables(self) -> list:
        """The training metrics' variables (this loop's own, or, through the compiled
        loss, the compiled model's)."""
        return [v for m in self._metric_objects() for v in m.variables]

    def _metric_objects(self) -> list:
        if self.compiled:
            return list(self.model.metrics)
        return [self.loss_metric, *self.metrics]

    def _reset(self) -> None:
        for metric in self._metric_objects():
            metric.reset_state()

    def evaluate(self, dataset: tf.data.Dataset) -> dict[str, float]:
        """Loss and metrics over every example of `dataset` (batched by the global batch)."""
        self._reset()
        self._evaluate_all(self.strategy.experimental_distribute_dataset(dataset))
        return self._results()

    def fit(self, dataset: tf.data.Dataset, *, epochs: int, steps_per_epoch: int,
            initial_epoch: int = 0, validation_data: tf.data.Dataset | None = None,
            callbacks: Sequence[Any] = (), verbose: Any = "auto") -> keras.callbacks.History:
        """Trains epochs `initial_epoch`..`epochs - 1` of `steps_per_epoch` steps, like `fit`.

        `dataset` holds the batches of all those epochs in order (one iterator runs through
        them), as `fit` reads a dataset when given `steps_per_epoch`.

        Returns:
            The `History` callback, as `fit` returns it.
        """
        verbose = 1 if verbose == "auto" else verbose
        callback_list = keras.callbacks.CallbackList(
            list(callbacks), add_history=True, add_progbar=verbose != 0, verbose=verbose,
            epochs=epochs, steps=steps_per_epoch, model=self.model)
        iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
        self.model.stop_training = False
        callback_list.on_train_begin()
        logs: dict[str, float] = {}
        for epoch in range(initial_epoch, epochs):
            logs, done = self._run_epoch(epoch, iterator, steps_per_epoch, callback_list)
            if not done:  # stopped mid-epoch (a signal): no validation, no epoch end
                break
            if validation_data is not None:
                callback_list.on_test_begin()  # as fit's validation does
                val = self.evaluate(validation_data)
                callback_list.on_test_end(val)
                logs.update({f"val_{name}": value for name, value in val.items()})
            callback_list.on_epoch_end(epoch, logs)
            if self.model.stop_training:
                break
        callback_list.on_train_end(logs=logs)
        return self.model.history

    def _run_epoch(self, epoch: int, iterator: Any, steps_per_epoch: int,
                   callback_list: Any) -> tuple[dict[str, float], bool]:
        """Runs one epoch's steps; returns its logs and whether every step ran."""
        self._reset()
        callback_list.on_epoch_begin(epoch)
        step, logs = 0, {}
        while step < steps_per_epoch and not self.model.stop_training:
            chunk = min(self.steps_per_execution, steps_per_epoch - step)
            callback_list.on_train_batch_begin(step)
            logs = self._train_chunk(iterator,
                                     None if self.steps_per_execution == 1 else tf.constant(chunk))
            step += chunk
            callback_list.on_train_batch_end(step - 1, logs)
        return {name: float(value) for name, value in logs.items()}, step == steps_per_epoch
