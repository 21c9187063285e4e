"""The training and test step's contacts with Keras 3.15's TensorFlow trainer.

trainer's exact step (`trainer.run.assembly.step`) is Keras's `train_step` with other sample
weights; it calls the same private pieces Keras's own step calls (`_compute_loss`, the loss
tracker, `_call_has_training_arg`), and replaces a few of Keras's methods where they fail
under a strategy (`_maybe_symbolic_build`, `make_train_function`, `evaluate`) or weigh
differently from one device (the per-output loss trackers' `update_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer, reduce_per_replica
from keras.src.losses import loss as loss_module
from keras.src.trainers.data_adapters import data_adapter_utils

from trainer.internals import check_version

check_version("keras", keras.__version__)


def unpack(data: Any) -> tuple[Any, Any, Any]:
    """`(x, y, sample_weight)` of a batch, as Keras's step unpacks it."""
    return data_adapter_utils.unpack_x_y_sample_weight(data)


def keeps_own_train_step(model: keras.Model) -> bool:
    """Whether the model's class defines its own `train_step`."""
    return type(model).train_step is not TensorFlowTrainer.train_step


def keeps_own_test_step(model: keras.Model) -> bool:
    """Whether the model's class defines its own `test_step`."""
    return type(model).test_step is not TensorFlowTrainer.test_step


def defines_call(model: keras.Model) -> bool:
    """Whether the model computes outputs: a functional or Sequential model, or a subclass
    with its own `call` (keras.io's VAE has none: its `train_step` calls its parts)."""
    return type(model).call is not keras.Model.call


def build_without_call(model: keras.Model) -> None:
    """Marks a model with no `call` built once its parts are (Keras's symbolic build would
    call it), and builds its optimizer's state for its variables, as Keras's first step
    would, here inside the strategy's scope."""
    model.built = True
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def forward(model: keras.Model, x: Any, training: bool) -> Any:
    """The model's outputs, with `training` where its `call` takes it (as Keras's step)."""
    return model(x, training=training) if model._call_has_training_arg else model(x)


def compute_loss(model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any,
                 training: bool) -> tf.Tensor:
    """The model's `compute_loss` as Keras's step calls it (its own override included)."""
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=training)


def track_loss(model: keras.Model, value: tf.Tensor, sample_weight: Any) -> None:
    """Records a step's loss in the model's `loss` tracker, as Keras's step does."""
    model._loss_tracker.update_state(value, sample_weight=sample_weight)


def adds_forward_losses(model: keras.Model) -> bool:
    """Whether the model's losses include some added in its forward pass (`add_loss`, an
    activity regulariser), not only weight regularisers (read at trace time)."""
    return len(model.losses) > len(model._get_regularization_losses())


@contextmanager
def unscaled_losses() -> Iterator[None]:
    """Keras's losses as on one device while the code inside is traced.

    Under a strategy Keras 3.15 divides every loss by the replicas where it is computed
    (`scale_loss_for_distribution`, in `Loss.__call__` and for `add_loss`) and multiplies
    the per-output values back for their trackers; here both are the identity."""
    saved = loss_module.scale_loss_for_distribution, loss_module.unscale_loss_for_distribution
    loss_module.scale_loss_for_distribution = loss_module.unscale_loss_for_distribution = (
        lambda value: value)
    try:
        yield
    finally:
        loss_module.scale_loss_for_distribution, loss_module.unscale_loss_for_distribution = saved


def wrap_output_loss_trackers(model: keras.Model,
                              wrap: Callable[[Callable], Callable]) -> None:
    """Replaces each per-output loss tracker's `update_state` (`cls_loss`, `reg_loss`; Keras's
    `CompileLoss` keeps them) by `wrap(original)`."""
    compiled = getattr(model, "_compile_loss", None)
    for tracker in (compiled.metrics if compiled is not None else []):
        tracker.update_state = wrap(tracker.update_state)


def built(model: keras.Model) -> bool:
    """Whether the model's layers, compiled loss and compiled metrics all hold their state
    (what Keras's symbolic build would otherwise create)."""
    pieces = [*model._flatten_layers(), model._compile_loss, model._compile_metrics]
    return all(piece is None or piece.built for piece in pieces)


def layers_within(model: keras.Model) -> list:
    """Every layer of `model`, itself, nested models and a layer's sublayers included
    (Keras's own walk over tracked layers)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def symbolic_build(model: keras.Model, data_batch: Any) -> None:
    """Creates the model's layers, compiled loss and metrics from a batch's shapes, as
    Keras's `fit` does before its first step (`data_batch` may hold specs)."""
    model._symbolic_build(data_batch=data_batch)


def build_from_one_replica(model: keras.Model) -> None:
    """Makes Keras's symbolic build (`_maybe_symbolic_build`, run by `fit` and `evaluate`
    on their first batch) read one replica's share of that batch instead of reducing it
    over the replicas with MEAN (which fails on uneven shares and on strings); a built model
    reads no batch (Keras would read one, then reset the iterator)."""
    original = model._maybe_symbolic_build

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if built(model):
            return
        if iterator is not None and data_batch is None:
            strategy = model.distribute_strategy

            def first_replica(value):
                if isinstance(value, tf.distribute.DistributedValues):
                    return strategy.experimental_local_results(value)[0]
                return value

            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(first_replica, next(it))
                break
            iterator = None
        return original(iterator=iterator, data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build


def replace_train_function(model: keras.Model, train_function: Callable) -> None:
    """Makes `fit` run `train_function(iterator)` for each of its graph calls (Keras builds
    its own in `make_train_function`, which this replaces)."""

    def make_train_function(force=False):
        model.train_function = train_function
        return train_function

    model.make_train_function = make_train_function


def forget_train_function(model: keras.Model) -> None:
    """Drops the traced train function, so that `fit` traces it anew (the trainable
    variables changed)."""
    model.train_function = None


def evaluate_one_step_per_call(model: keras.Model) -> None:
    """Keras's `evaluate` (and `fit`'s validation) with one step per graph call, whatever
    the model's `steps_per_execution`: Keras's multi-step test function fails under
    MirroredStrategy, and evaluation's length is the data's."""
    original = model.evaluate

    def evaluate(*args, _use_cached_eval_dataset=False, **kwargs):
        saved = model.steps_per_execution
        model.steps_per_execution = 1  # what the test function and its iterator are built for
        try:
            return original(*args, **kwargs)
        finally:
            model.steps_per_execution = saved

    model.evaluate = evaluate


def reduce_logs(outputs: Any, strategy: tf.distribute.Strategy, reduction: str = "auto") -> Any:
    """A step's per-replica outputs reduced as Keras's `fit` reduces them on one machine
    (`auto`: the mean of the replicas' values; `first`: the first replica's).

    Under MultiWorkerMirroredStrategy `auto` is the mean over every replica of every worker
    (one all-reduce per floating-point value, which every worker runs at the same place):
    Keras 3.15 asks that mean along an axis 0 a scalar lacks, and its `first` would be each
    worker's own value. Other values (integers, strings) are the first local replica's.
    """
    if reduction != "auto" or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return reduce_per_replica(outputs, strategy, reduction=reduction)

    def cluster_mean(value: Any) -> Any:
        local = strategy.experimental_local_results(value)[0]
        if not tf.is_tensor(local) or not local.dtype.is_floating:
            return local
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)

    return keras.tree.map_structure(cluster_mean, outputs)


def metrics_result_or_logs(model: keras.Model, logs: Any) -> dict[str, Any]:
    """The metrics' results, or the last step's own logs where the model's step logs other
    names (Keras's choice at the end of an epoch)."""
    return model._get_metrics_result_or_logs(logs)
