"""`loop=custom`: trainer's own epoch loop around the same step `fit` runs.

Each replica runs the model's `train_step` inside `strategy.run`: the exact step
`trainer.run.assembly.install_step` installs for both loops (every example weighs `1 / N` of its
global step, an uneven last batch included; gradient accumulation; a loss per output, loss
weights, per-output sample weights, metrics and their trackers, as Keras's `fit` computes
them), or the model's own `train_step` / `compute_loss` where its class defines one. The two
loops differ only in who drives the epochs: Keras's `fit`, or this loop, which is what runs
under MultiWorkerMirroredStrategy (where Keras's `fit` does not). Evaluation runs the model's
`test_step` the same way. With `jit_compile` each replica's step is compiled by XLA, as
Keras compiles it under `fit`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from trainer.internals.keras_step import (
    built,
    metrics_result_or_logs,
    reduce_logs,
    symbolic_build,
)

# tf.distribute's input code reads dataset options in graph mode when a dataset is
# distributed, which warns on every run; nothing for a user to act on.
warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")


class CustomLoop:
    """Trains and evaluates a compiled model with its optimizer under a strategy.

    It drives the same Keras callbacks as `fit` (progress bar, checkpoints, backup,
    TensorBoard, history), so both loops write the same run directory, with the same logs.

    Args:
        model: a model compiled with its optimizer (checkpoints save it with the model);
            its `train_step` and `test_step` are the steps each replica runs.
        strategy: the `tf.distribute.Strategy` the model was built under.
        steps_per_execution: training steps per `tf.function` call.
        jit_compile: compile each replica's step with XLA.
    """

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy,
                 steps_per_execution: int = 1, jit_compile: bool = False) -> None:
        self.model = model
        self.strategy = strategy
        self.steps_per_execution = steps_per_execution
        with strategy.scope():
            # Created here, not lazily inside the first traced step: optimizer slots born
            # inside a graph that runs several steps under MirroredStrategy fail at run time
            # ("You must feed a value for placeholder tensor").
            model.optimizer.build(model.trainable_variables)

        def replica_step(data):  # the model's step as it is when traced
            return model.train_step(data)

        self._replica_step = (tf.function(replica_step, jit_compile=True) if jit_compile
                              else replica_step)
        self._train_chunk = tf.function(self._train_steps)
        self._test_one = tf.function(self._test_step)

    def _train_steps(self, iterator: Any, steps: tf.Tensor | None) -> dict[str, Any]:
        # Exactly `steps` batches, never past the end: `fit` counts the epoch's steps. One
        # step per call (steps=None) runs without a graph loop around it and returns the
        # step's own logs, as Keras's train function does (a model's own train_step may log
        # more than its metrics); a chunk returns the metrics, read in the graph so the
        # Python loop never waits for a step to finish.
        if steps is None:
            outputs = self.strategy.run(self._replica_step, args=(next(iterator),))
            return self._reduced(outputs)
        for _ in tf.range(steps):
            self.strategy.run(self._replica_step, args=(next(iterator),))
        return self.model.get_metrics_result()

    def _test_step(self, batch: Any) -> dict[str, Any]:
        outputs = self.strategy.run(self.model.test_step, args=(batch,))
        return self._reduced(outputs)

    def _reduced(self, outputs: Any) -> Any:
        """A step's logs as one value each: the metrics' results over every replica, and
        any other value the model's step logs as Keras's `fit` reduces it on one machine:
        the mean over the replicas, of every worker under MultiWorkerMirroredStrategy (so
        each worker logs the cluster's value, not its own)."""
        if not isinstance(outputs, dict):
            return reduce_logs(outputs, self.strategy)
        metrics = self.model.get_metrics_result()
        own = reduce_logs({k: v for k, v in outputs.items() if k not in metrics},
                          self.strategy)
        return {k: metrics[k] if k in metrics else own[k] for k in outputs}

    def _build(self, dataset: tf.data.Dataset) -> None:
        """Creates the model's layers, compiled loss and metrics from the batches' shapes
        before the first traced step, as `fit` does (Keras's symbolic build): state
        born inside a graph that runs several steps under a strategy fails at run time."""
        if not built(self.model):
            with self.strategy.scope():
                symbolic_build(self.model, dataset.element_spec)

    def evaluate(self, dataset: tf.data.Dataset, callbacks: Any = None) -> dict[str, float]:
        """Loss and metrics over every example of `dataset` (batched by the global batch),
        one step per call as Keras's `evaluate`, with its test-batch callbacks."""
        self._build(dataset)
        self.model.reset_metrics()
        logs: Any = {}
        for step, batch in enumerate(self.strategy.experimental_distribute_dataset(dataset)):
            if callbacks is not None:
                callbacks.on_test_batch_begin(step)
            logs = self._test_one(batch)
            if callbacks is not None:
                callbacks.on_test_batch_end(step, logs)
        return self._epoch_logs(logs)

    def _epoch_logs(self, logs: Any) -> dict[str, float]:
        """The metrics' results, or the last step's own logs where the model's step logs
        other names (Keras's own choice)."""
        found = metrics_result_or_logs(self.model, logs)
        return {name: float(value) for name, value in found.items()}

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
        self._build(dataset)
        callback_list = keras.callbacks.CallbackList(
            list(callbacks), add_history=True, add_progbar=verbose != 0, verbose=verbose,
            epochs=epochs, steps=steps_per_epoch, model=self.model)
        iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
        self.model.stop_training = False
        callback_list.on_train_begin()
        logs: dict[str, float] = {}
        for epoch in range(initial_epoch, epochs):
            # A callback's `stop_training` ends the epoch's steps; its validation and end
            # still run, as in `fit` (a signal raises out of the loop instead).
            logs = self._run_epoch(epoch, iterator, steps_per_epoch, callback_list)
            if validation_data is not None:
                callback_list.on_test_begin()  # as fit's validation does
                val = self.evaluate(validation_data, callback_list)
                callback_list.on_test_end(val)
                logs.update({f"val_{name}": value for name, value in val.items()})
            callback_list.on_epoch_end(epoch, logs)
            if self.model.stop_training:
                break
        callback_list.on_train_end(logs=logs)
        return self.model.history

    def _run_epoch(self, epoch: int, iterator: Any, steps_per_epoch: int,
                   callback_list: Any) -> dict[str, float]:
        """Runs one epoch's steps (fewer where a callback stops training); its logs."""
        self.model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        step, logs = 0, {}
        while step < steps_per_epoch and not self.model.stop_training:
            chunk = min(self.steps_per_execution, steps_per_epoch - step)
            callback_list.on_train_batch_begin(step)
            logs = self._train_chunk(iterator,
                                     None if self.steps_per_execution == 1 else tf.constant(chunk))
            step += chunk
            callback_list.on_train_batch_end(step - 1, logs)
        return self._epoch_logs(logs)
