"""The model built and compiled in the strategy's scope: the builder called with what the
data says (on several workers, adapting once: `trainer.distribute.adapt`), Keras's loss,
metrics and optimizer state built from symbolic batches, the run's learning rate and what
it logs. `trainer.run.assembly.assemble` calls it.

A build module: TensorFlow (through Keras) is imported at the top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras

from trainer.config.errors import ConfigError
from trainer.data.wiring import Data, loss_for_labels, model_ready
from trainer.distribute.adapt import build_adapting, decided_apart
from trainer.distribute.cluster import Cluster
from trainer.internals.keras_compile import compile_arguments
from trainer.plan.schedule import LearningRate, learning_rate
from trainer.plan.speed import SpeedPlan, with_compiled_jit
from trainer.run.prepare.resolve import Spec
from trainer.task.build import (
    build_compiled,
    build_model,
    check_class_losses,
    check_one_batch,
    check_variables_in_scope,
    choose_task,
    default_loss,
    first_batch,
    logged_metrics,
    make_saveable,
    optimizer_for,
    output_spec,
    plan_of,
    symbolic_batch,
    takes_train,
)


@dataclass(frozen=True)
class Compiled:
    """The compiled model, its learning rate and loss, the names and directions of what it
    logs, who compiled it, why checkpoints hold weights only (or None), the summary's notes
    on adapting, and the speed plan it was compiled with (a builder's `jit_compile=True`
    kept)."""

    model: Any
    lr: LearningRate
    loss: Any
    names: tuple[str, ...]
    ways: dict[str, str]
    by: str
    weights_only: str | None
    notes: tuple[str, ...] = ()
    speed: SpeedPlan | None = None


def _builder(spec: Spec, source: Any) -> Any:
    """`build(maker)`: the model built with `maker` as its builder's `train`."""
    def build(maker: Any) -> Any:
        return build_model(spec.model, input_shape=source.input_shape,
                           num_classes=source.num_classes, num_outputs=source.num_outputs,
                           defaults=spec.model_defaults, train=maker)

    return build


def adapt_apart(spec: Spec, source: Any, cluster: Cluster | None) -> bool | None:
    """On a worker other than the chief whose builder takes `train`: whether the chief's
    adapted state can be sent to it (`trainer.distribute.adapt.decided_apart`, a build
    outside the strategy's scope on a stand-in); None anywhere else."""
    if cluster is None or cluster.num_workers < 2 or cluster.is_chief:
        return None
    if not takes_train(spec.model):
        return None
    return decided_apart(_builder(spec, source), lambda: model_ready(source))


def _built(spec: Spec, source: Any, place: tuple) -> tuple[Any, tuple[str, ...]]:
    """(the model built in the strategy's scope, the summary's notes on adapting): on
    several workers a builder taking `train` adapts once, on the chief
    (`trainer.distribute.adapt`)."""
    strategy, cluster, once = place
    build, train = _builder(spec, source), lambda: model_ready(source)
    if cluster is None or cluster.num_workers < 2 or not takes_train(spec.model):
        return build(train), ()
    model, note = build_adapting(build, train, strategy, once)
    return model, (note,) if note else ()


def compiled_model(spec: Spec, data: Data, global_batch: int, steps: int,
                    speed: SpeedPlan, place: tuple) -> Compiled:
    """The model built and compiled in the strategy's scope, with Keras's loss, metrics and
    optimizer state built from symbolic batches (as fit builds them from its first batch;
    a subclassed model's variables too), the run's learning rate and what it logs; `place`
    is (strategy, cluster, what a worker other than the chief decided about adapting)."""
    source = data.source
    model, notes = _built(spec, source, place)
    # before anything reads the model: a variable made outside the scope fails deep in
    # TensorFlow otherwise (in the loss's first call, cut mid-message)
    check_variables_in_scope(model, place[0])
    x, y, _ = keras.utils.unpack_x_y_sample_weight(symbolic_batch(data.probe.element_spec))
    try:
        # None: a model with no call(), trained by its train_step
        y_pred = output_spec(model, x)
    except ConfigError as error:  # say how an ambiguous form was read (`[a, b]` as (x, y))
        if source.read_as is None:
            raise
        raise ConfigError(f"{error} ({source.read_as})") from None
    outputs = len(keras.tree.flatten(y_pred)) if y_pred is not None else 1
    task = choose_task(model, {"loss": loss_for_labels(spec.loss, spec.augment),
                               "loss_named": spec.loss not in (None, default_loss()),
                               "metrics": spec.metrics, "loss_weights": spec.loss_weights,
                               "weighted_metrics": spec.weighted_metrics,
                               "optimizer": spec.optimizer, "targets": y is not None},
                       source.num_classes is not None, outputs)
    lr = learning_rate(plan_of(spec.lr, task), global_batch, steps, spec.epochs)
    speed = with_compiled_jit(speed, compile_arguments(model).get("jit_compile")
                              if getattr(model, "compiled", False) else None, spec.jit_compile)
    model.compile(optimizer=optimizer_for(task, spec.optimizer, lr.schedule), loss=task.loss,
                  loss_weights=task.loss_weights, metrics=task.metrics,
                  weighted_metrics=task.weighted_metrics,
                  steps_per_execution=speed.steps_per_execution,
                  jit_compile=speed.jit_compile)
    build_compiled(model, x, y)
    check_variables_in_scope(model, place[0])
    probed = first_batch(data.probe)
    check_class_losses(model, probed)
    check_one_batch(model, probed, source.num_classes, data.validation is not None)
    names, ways = logged_metrics(model)
    weights_only = make_saveable(model)
    return Compiled(model, lr, task.loss, tuple(names), ways, task.compiled_by, weights_only,
                     notes, speed)
