"""Everything a run builds before it trains, returned as a typed `Run`.

`assemble` turns a run's `Spec` (the config resolved once, `trainer.run.prepare.resolve`) and the
chosen devices into a strategy, the data (`trainer.data.wiring`), a compiled model with its
optimizer, the learning-rate plan and the speed options. Training (`trainer.run.train`) and
a finished run's restore (`trainer.run.assembly.restore`: evaluation, prediction) share it.

A build module: TensorFlow is imported at the top, so only what runs after the devices are
set imports it.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import keras

from trainer.config.errors import ConfigError
from trainer.config.metrics import checkpoint_monitor, default_monitor, monitor_mode
from trainer.data.wiring import (
    Batching,
    Data,
    bounded,
    build_data,
    data_notes,
    load_source,
    stop_services,
)
from trainer.distribute.cluster import Cluster, choose_communication
from trainer.distribute.runtime import (
    agree_on_data,
    apply_precision,
    build_strategy,
    compute_capability,
    nccl_available,
    synchronize_batch_norm,
)
from trainer.distribute.strategy import choose_cross_device_ops, choose_strategy, strategy_kind
from trainer.plan.scaling import BatchPlan, batch_of_data, plan_batch, steps_per_epoch
from trainer.plan.schedule import LearningRate
from trainer.plan.speed import SpeedPlan, choose_speed
from trainer.run.assembly.compiled import adapt_apart, compiled_model
from trainer.run.assembly.install_step import install_step
from trainer.run.prepare.resolve import Spec

# Keras 3.15's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585,
# tensorflow/tensorflow#72388); the custom loop does the same maths with the same callbacks.
# Held while a run is built (`assemble`): one at a time in a process.
BUILDING = threading.RLock()
MULTI_WORKER_LOOP = ("loop=custom: Keras's fit fails under MultiWorkerMirroredStrategy "
                     "(keras-team/keras#20585); the custom loop (same maths, same callbacks, "
                     "tested equal to fit) runs instead")


@dataclass(frozen=True)
class Run:
    """What `assemble` built: everything that holds variables, in the strategy's scope."""

    strategy: Any
    strategy_name: str
    cross_device_ops: str
    loop: str
    cluster: Cluster | None
    batch: BatchPlan
    steps: int
    lr: LearningRate
    model: Any
    speed: SpeedPlan
    data: Data
    loss: Any
    metric_names: tuple[str, ...]
    metric_directions: dict[str, str]
    # what Keras's fit needs beside the run's callbacks for the installed step
    fit_callbacks: tuple = ()
    # who compiled the model: `config`, or `model builder` (its loss, metrics and weights)
    compiled_by: str = "config"
    # the model's class defines its own train_step, which both loops run as written
    own_train_step: bool = False
    # why checkpoints hold the weights only (a model whose config cannot be saved), or None
    weights_only: str | None = None
    # how batch normalization runs over the replicas (trainer.distribute.runtime), or None
    batch_norm: str | None = None
    # what the summary says of the data as given (`data_notes`)
    notes: tuple[str, ...] = ()
    # the spec as the data made it (`batch_of_data`, `checkpoint_monitor`), or None
    spec: Any = None

    @property
    def workers(self) -> int:
        """Worker processes in the run (1 on one machine)."""
        return self.cluster.num_workers if self.cluster is not None else 1

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run directory."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def logged(self) -> tuple[str, ...]:
        """What is logged per epoch: the loss and the metrics, and their `val_` forms."""
        names = ("loss", *self.metric_names)
        if self.data.validation is None:  # no validation set: nothing `val_` is logged
            return names
        return (*names, *(f"val_{n}" for n in names))

    def check_evaluable(self, saving: Any) -> None:
        """Refuses, before training, what an evaluator beside the workers would refuse only
        once they trained: a dataset with no validation split, a `checkpoint.monitor` the
        run does not log (the workers keep no best checkpoint, so they never read it).

        Args:
            saving: the checkpoint node (`monitor`, `mode`).
        """
        if self.data.validation is None:
            raise ConfigError("the dataset has no validation split: there is nothing for an "
                              "evaluator to validate; give it one, or run without an "
                              "evaluator")
        self.monitor_mode(saving.monitor, saving.mode)

    def monitor_mode(self, monitor: str, mode: str = "auto", key: str = "checkpoint") -> str:
        """`min` or `max` for a logged metric, from the metric's own direction where known."""
        if monitor not in self.logged:
            raise ConfigError(f"{key}.monitor={monitor!r} is not logged by this run; valid: "
                              f"{', '.join(self.logged)}")
        return monitor_mode(monitor, mode, self.metric_directions)


def assemble(spec: Spec, plan: Any, cluster: Cluster | None = None,
             run_dir: Path | None = None) -> Run:
    """Builds strategy, data, model and optimizer: everything that holds variables in scope.

    Args:
        spec: the run's resolved config.
        plan: the devices chosen (and already configured) for this process.
        cluster: the multi-worker cluster, or None on one machine.
        run_dir: where this process writes (`dataset.cache=disk` keeps its files there);
            None: nowhere (a finished run evaluated reads its data once).

    Returns:
        A `Run`.

    One run builds at a time in a process: the seeds are process-wide (Python's `random`,
    which draws Keras's default seeds, NumPy's, TensorFlow's global seed), so two runs
    built at once in two threads drew from each other's; built one by one, each run's
    layers and datasets hold seeds of their own, and run alone or beside another, it trains
    the same (`docs/api.md`).
    """
    with BUILDING:
        return _built(spec, plan, cluster, run_dir)


def _built(spec: Spec, plan: Any, cluster: Cluster | None, run_dir: Path | None) -> Run:
    """`assemble`'s work, under its lock."""
    strategy_name, loop, strategy, cross, speed = _strategy(spec, plan, cluster)
    spec, source, batch = _source_and_batch(spec, strategy)
    speed = _speed_for_accumulation(speed, batch.accumulate)
    once = adapt_apart(spec, source, cluster)  # before the seed: a build of its own
    if spec.runtime_seed is not None:
        keras.utils.set_random_seed(spec.runtime_seed)
    with strategy.scope():
        data = build_data(source, spec.pipeline, Batching(
            batch.global_size, batch.shards, batch.per_replica * batch.replicas,
            batch.replicas, spec.batch.drop_remainder, *_place(cluster),
            spec.steps_per_epoch), seed=spec.runtime_seed, augment=spec.augment,
            class_weight=spec.class_weight, run_dir=run_dir,
            cache_from_data=spec.cache_from_data)
        agree_on_data(strategy, cluster, data.source)  # before the model's collectives
        steps = spec.steps_per_epoch or steps_per_epoch(
            data.source.train_size, batch.global_size, spec.batch.drop_remainder)
        compiled = compiled_model(spec, data, batch.global_size, steps, speed,
                                   (strategy, cluster, once))
        monitor = default_monitor(spec.checkpoint.monitor, compiled.names,
                                  data.validation is not None)
        replaced, spec = monitor != spec.checkpoint.monitor, replace(
            spec, checkpoint=replace(spec.checkpoint, monitor=monitor))
        batch_norm = synchronize_batch_norm(compiled.model, spec.sync_batchnorm,
                                            strategy.num_replicas_in_sync, batch.accumulate)
        speed = compiled.speed or speed  # a model builder's jit_compile=True kept
        fit_callbacks, own_step = install_step(compiled.model, loop, batch.accumulate,
                                      speed.steps_per_execution)
    return Run(strategy=strategy, strategy_name=strategy_name, cross_device_ops=cross,
               loop=loop, cluster=cluster, batch=batch, steps=steps, lr=compiled.lr,
               model=compiled.model, speed=speed, data=data, loss=compiled.loss,
               metric_names=compiled.names, metric_directions=compiled.ways,
               fit_callbacks=fit_callbacks, compiled_by=compiled.by,
               weights_only=compiled.weights_only,
               own_train_step=own_step, batch_norm=batch_norm,
               notes=data_notes(data.source, batch.global_size, batch.per_replica,
                                spec.checkpoint.monitor, replaced,
                                (spec.steps_per_epoch, spec.validation_steps))
               + compiled.notes, spec=spec)


def _source_and_batch(spec: Spec, strategy: Any) -> tuple[Spec, Any, BatchPlan]:
    """(the spec as the data made it, the source bounded by the run's steps, the batch
    plan): a batched dataset's batch, the replicas, `steps_per_epoch` / `validation_steps`
    (`trainer.data.wiring.bounded`), the checkpoint's monitor without validation."""
    streams = (*(("train",) if spec.steps_per_epoch else ()),
               *(("validation",) if spec.validation_steps else ()))
    with strategy.scope():
        source = load_source(spec.dataset, spec.runtime_seed, spec.dataset_defaults,
                             spec.validation_split, streams)
    if spec.batch_from_data:  # trainer.fit(data=...) with no batch set: Keras's fit batch
        batching, lr = batch_of_data(spec.batch, spec.lr, source.given_batch,
                                     strategy.num_replicas_in_sync)
        spec = replace(spec, batch=batching, lr=lr)
    batch = plan_batch(spec.batch.per_replica, spec.batch.global_size,
                       strategy.num_replicas_in_sync, spec.batch.accumulate,
                       spec.batch.max_per_replica)
    with strategy.scope():
        source = bounded(source, spec.pipeline._target_, batch.global_size,
                         batch.per_replica * batch.replicas, spec.steps_per_epoch,
                         spec.validation_steps, spec.batch.drop_remainder)
    validated = source.validation is not None and bool(source.validation_size)
    spec = replace(spec, checkpoint=replace(
        spec.checkpoint, monitor=checkpoint_monitor(spec.checkpoint.monitor, validated)))
    return spec, source, batch


def release() -> None:
    """Stops what a run's data started outside its objects, which end with the run: the
    tf.data servers of `dataset.service=local:K` (idempotent; nothing without them)."""
    stop_services()


def _place(cluster: Cluster | None) -> tuple[int, int, int]:
    """(workers, this worker's index, workers on this machine): 1, 0, 1 on one machine."""
    if cluster is None:
        return 1, 0, 1
    host = cluster.addresses[cluster.task_id].rpartition(":")[0]
    local = sum(1 for a in cluster.addresses if a.rpartition(":")[0] == host)
    return cluster.num_workers, cluster.task_id, local


def _strategy(spec: Spec, plan: Any, cluster: Cluster | None) -> tuple:
    """(strategy name, loop, strategy, cross-device ops, speed plan) for these devices."""
    replicas = len(plan.names)
    workers = cluster.num_workers if cluster is not None else 1
    strategy_name = choose_strategy(spec.strategy.name, replicas, workers, plan.kind)
    kind = strategy_kind(strategy_name)
    if kind.needs_seed and spec.seed is None:
        raise ConfigError(f"strategy={strategy_name} needs a seed: every worker shuffles the "
                          "data alike and takes its share of the same global batches; "
                          "received: seed=null (set seed=N)")
    loop = spec.loop if kind.fit_works else "custom"
    if kind.several_workers:  # created before any other TensorFlow op
        strategy, cross = _multi_worker_strategy(strategy_name, spec, plan, cluster)
    speed = choose_speed(spec.precision, spec.jit_compile, spec.steps_per_execution, plan.kind,
                         replicas * workers, loop,
                         compute_capability() if plan.kind == "gpu" else None)
    if spec.loop != loop:
        speed = replace(speed, reasons=(*speed.reasons, MULTI_WORKER_LOOP))
    apply_precision(speed.precision)
    if not kind.several_workers:
        cross = choose_cross_device_ops(spec.strategy.cross_device_ops, plan.kind, replicas,
                                        _nccl_available(plan.kind),
                                        physical_gpus=len(plan.visible))
        strategy = build_strategy(strategy_name, plan.names, cross)
    return strategy_name, loop, strategy, cross, speed


def _speed_for_accumulation(speed: SpeedPlan, accumulate: int) -> SpeedPlan:
    """XLA compiles each replica's whole step (in both loops, as Keras's `fit` does), and
    the micro-batch loop's slices have shapes it cannot fix."""
    if accumulate == 1 or speed.jit_compile is False:
        return speed
    if speed.jit_compile is True:
        raise ConfigError(f"jit_compile=true cannot be used with batch.accumulate="
                          f"{accumulate}: XLA compiles each replica's whole step, and the "
                          "micro-batch loop's slices have shapes it cannot fix; use "
                          "jit_compile=auto or batch.accumulate=1")
    return replace(speed, jit_compile=False, reasons=(*speed.reasons, ACCUMULATE_JIT))


ACCUMULATE_JIT = ("jit_compile=false: with batch.accumulate>1 the step loops over "
                  "micro-batches, which XLA cannot compile whole")


def _multi_worker_strategy(name: str, spec: Spec, plan: Any, cluster: Cluster):
    # tf.distribute's multi-worker input code reads dataset options in graph mode, which
    # warns on every run; nothing for a user to act on.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
    # MultiWorkerMirroredStrategy must exist before any other TensorFlow op runs.
    communication = choose_communication(spec.strategy.communication, plan.kind)
    cross = f"collective ({communication})"
    return build_strategy(name, plan.names, cross, cluster, communication,
                          meeting=(spec.record, spec.strategy.start_timeout_s)), cross


def _nccl_available(kind: str) -> bool:
    return kind == "gpu" and nccl_available()
