"""Everything a run builds before it trains, returned as a typed `Run`.

`assemble` turns a run's `Spec` (the config resolved once, `trainer.run.resolve`) and the
chosen devices into a strategy, the data, a compiled model with its optimizer, the
learning-rate plan and the speed options; `build_callbacks` adds the built-in and the
user's callbacks. Training (`trainer.run.train`) and evaluation
(`trainer.evaluate`) share this wiring.

The modules that import TensorFlow (the task's builders, the data pipeline, callbacks,
trackers) are imported inside the functions that use them, each marked `# lazy`:
`trainer.evaluate` imports this module at its start, before the devices are chosen and
TensorFlow's start-up lines are quieted, and TensorFlow may start only after that.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainer.config.build import build_object
from trainer.config.errors import ConfigError
from trainer.config.metrics import monitor_mode
from trainer.config.schema import LrPlan
from trainer.data.augment import check, check_inputs, mixers
from trainer.data.augment import check as check_augment
from trainer.data.fingerprint import of_source
from trainer.distribute.cluster import Cluster, choose_communication
from trainer.distribute.devices import DevicePlan
from trainer.distribute.strategy import (
    KINDS,
    build_strategy,
    choose_cross_device_ops,
    choose_strategy,
    nccl_available,
)
from trainer.plan.scaling import BatchPlan, plan_batch, scaled_learning_rate, steps_per_epoch
from trainer.plan.scaling import warmup_steps as to_steps
from trainer.plan.speed import SpeedPlan, apply_precision, choose_speed, compute_capability
from trainer.run.resolve import Spec
from trainer.rundir.layout import RunDir

PIPELINE_KEYS = ("cache", "shuffle_buffer")

# Keras 3.15's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585,
# tensorflow/tensorflow#72388); the custom loop does the same maths with the same callbacks.
MULTI_WORKER_LOOP = ("loop=custom: Keras's fit fails under MultiWorkerMirroredStrategy "
                     "(keras-team/keras#20585); the custom loop (same maths, same callbacks, "
                     "tested equal to fit) runs instead")


@dataclass(frozen=True)
class LearningRate:
    """The learning-rate plan: `base` at `reference_batch`, `scaled` to the global batch."""

    base: float
    scaled: float
    rule: str
    reference_batch: int
    warmup_steps: int
    decay: str
    schedule: Any

    def report(self) -> dict[str, Any]:
        """The plan as the summary shows it (the schedule object left out)."""
        return {"base": self.base, "scaled": self.scaled, "rule": self.rule,
                "reference_batch": self.reference_batch, "warmup_steps": self.warmup_steps,
                "decay": self.decay}


@dataclass(frozen=True)
class Data:
    """A run's data: the source, a maker of training epochs, the validation batches, and the
    test batches (None without a test split).

    `make_train(first_epoch, end_epoch, skip_steps)` returns the training batches of those
    epochs as one dataset, skipping the steps a resumed run already did.
    """

    source: Any
    make_train: Callable[[int, int, int], Any]
    validation: Any
    test: Any = None


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
    metrics: Callable[[], list]
    metric_names: tuple[str, ...]
    metric_directions: dict[str, str]
    # what Keras's fit needs beside the run's callbacks for the installed step
    fit_callbacks: tuple = ()

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
        return (*names, *(f"val_{n}" for n in names))

    def monitor_mode(self, monitor: str, mode: str = "auto", key: str = "checkpoint") -> str:
        """`min` or `max` for a logged metric, from the metric's own direction where known."""
        if monitor not in self.logged:
            raise ConfigError(f"{key}.monitor={monitor!r} is not logged by this run; valid: "
                              f"{', '.join(self.logged)}")
        return monitor_mode(monitor, mode, self.metric_directions)


def assemble(spec: Spec, plan: DevicePlan, cluster: Cluster | None = None) -> Run:
    """Builds strategy, data, model and optimizer: everything that holds variables in scope.

    Args:
        spec: the run's resolved config.
        plan: the devices chosen (and already configured) for this process.
        cluster: the multi-worker cluster, or None on one machine.

    Returns:
        A `Run`.
    """
    import keras

    # lazy: it imports TensorFlow (see the module docstring)
    from trainer.task.build import build_losses, build_optimizer, output_metrics

    replicas = len(plan.names)
    workers = cluster.num_workers if cluster is not None else 1
    strategy_name = choose_strategy(spec.strategy.name, replicas, workers, plan.kind)
    kind = KINDS[strategy_name]
    if kind.needs_seed and spec.seed is None:
        raise ConfigError(f"strategy={strategy_name} needs a seed: every worker shuffles the "
                          "data alike and takes its share of the same global batches; "
                          "received: seed=null (set seed=N)")
    multi = kind.several_workers
    loop = spec.loop if kind.fit_works else "custom"
    if multi:
        strategy, cross = _multi_worker_strategy(spec, plan, cluster)
    speed = choose_speed(spec.precision, spec.jit_compile, spec.steps_per_execution, plan.kind,
                         replicas * workers, loop,
                         compute_capability() if plan.kind == "gpu" else None)
    if spec.loop != loop:
        speed = replace(speed, reasons=(*speed.reasons, MULTI_WORKER_LOOP))
    apply_precision(speed.precision)
    if not multi:
        cross = choose_cross_device_ops(spec.strategy.cross_device_ops, plan.kind, replicas,
                                        _nccl_available(plan.kind),
                                        physical_gpus=len(plan.visible))
        strategy = build_strategy(strategy_name, plan.names, cross)
    batch = plan_batch(spec.batch.per_replica, spec.batch.global_size,
                       strategy.num_replicas_in_sync, spec.batch.accumulate,
                       spec.batch.max_per_replica)
    if batch.accumulate > 1 and loop == "fit" and speed.jit_compile is not False:
        # XLA compiles fit's whole step, and the micro-batch loop's slices have shapes it
        # cannot fix; the custom loop compiles each micro-batch's gradients instead.
        if speed.jit_compile is True:
            raise ConfigError("jit_compile=true with batch.accumulate>1 needs loop=custom "
                              "(fit's whole step cannot be XLA-compiled around the "
                              "micro-batch loop); received: loop=fit")
        speed = replace(speed, jit_compile=False, reasons=(*speed.reasons, ACCUMULATE_JIT))
    if spec.runtime_seed is not None:
        keras.utils.set_random_seed(spec.runtime_seed)

    mixing = bool(mixers(check_augment(spec.augment)))
    # MixUp / CutMix mix labels: one-hot everywhere, and the loss that reads them
    loss = build_losses("categorical_crossentropy" if mixing
                        and spec.loss == "sparse_categorical_crossentropy" else spec.loss)
    several = isinstance(loss, dict) or isinstance(spec.metrics, dict)
    if several and loop == "custom":
        raise ConfigError("loop=custom trains a model with one output and one loss; this run "
                          "has a loss or metrics per output: use loop=fit"
                          + (f" ({MULTI_WORKER_LOOP.split(':')[1].strip()})"
                             if spec.loop != loop else ""))
    with strategy.scope():
        data = build_data(spec, batch.global_size, batch.shards,
                          batch.per_replica * batch.replicas, batch.replicas)
        source = data.source
        steps = steps_per_epoch(source.train_size, batch.global_size, spec.batch.drop_remainder)
        lr = learning_rate(spec.lr, batch.global_size, steps, spec.epochs)
        # lazy: it imports TensorFlow (see the module docstring)
        from trainer.task.build import build_model

        model = build_model(spec.model, input_shape=source.input_shape,
                            num_classes=source.num_classes, num_outputs=source.num_outputs)
        label_spec = source.train.element_spec[1]

        classes = source.num_classes is not None

        def metrics() -> Any:
            return output_metrics(spec.metrics, label_spec, model, classes)[0]

        compiled, names, ways = output_metrics(spec.metrics, label_spec, model, classes)
        model.compile(optimizer=build_optimizer(spec.optimizer, lr.schedule), loss=loss,
                      loss_weights=spec.loss_weights, metrics=compiled,
                      steps_per_execution=speed.steps_per_execution,
                      jit_compile=speed.jit_compile)
        fit_callbacks = _own_the_step(model, loop, batch.accumulate,
                                      speed.steps_per_execution)
    return Run(strategy=strategy, strategy_name=strategy_name, cross_device_ops=cross,
               loop=loop, cluster=cluster, batch=batch, steps=steps, lr=lr, model=model,
               speed=speed, data=data, loss=loss, metrics=metrics,
               metric_names=tuple(names), metric_directions=ways,
               fit_callbacks=fit_callbacks)


def _own_the_step(model: Any, loop: str, accumulate: int, steps_per_execution: int) -> tuple:
    """Installs the exact training step (`trainer.run.step`) for `fit`, or refuses a model
    whose own step the chosen loop cannot honour.

    Returns:
        Callbacks `fit` needs for the installed step (several steps per call), or ().
    """
    # lazy: they import TensorFlow (see the module docstring)
    from trainer.run.accumulate import accumulating_train_step
    from trainer.run.step import (
        build_from_one_replica,
        evaluate_one_step_per_call,
        exact_train_step,
        keeps_own_step,
        steps_in_chunks,
    )

    own = keeps_own_step(model)
    name = type(model).__name__
    if own is not None and loop == "custom":
        raise ConfigError(f"model class {name} defines its own {own}, which loop=custom "
                          "does not call (it runs trainer's step); use loop=fit")
    if own is not None and accumulate > 1:
        raise ConfigError(f"model class {name} defines its own {own}; batch.accumulate="
                          f"{accumulate} would replace it with trainer's micro-batch step; "
                          "use batch.accumulate=1")
    if loop != "fit":
        return ()
    build_from_one_replica(model)
    if own is None:
        model.train_step = (accumulating_train_step(model, accumulate) if accumulate > 1
                            else exact_train_step(model))
    if steps_per_execution == 1:
        return ()
    evaluate_one_step_per_call(model)
    return (steps_in_chunks(model, steps_per_execution),)


ACCUMULATE_JIT = ("jit_compile=false: with batch.accumulate>1 fit's step loops over "
                  "micro-batches, which XLA cannot compile whole (loop=custom compiles each "
                  "micro-batch)")


def _multi_worker_strategy(spec: Spec, plan: DevicePlan, cluster: Cluster):
    # tf.distribute's multi-worker input code reads dataset options in graph mode, which
    # warns on every run; nothing for a user to act on.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
    # MultiWorkerMirroredStrategy must exist before any other TensorFlow op runs.
    communication = choose_communication(spec.strategy.communication, plan.kind)
    cross = f"collective ({communication})"
    return build_strategy("multi_worker", plan.names, cross, cluster, communication), cross


def _nccl_available(kind: str) -> bool:
    return kind == "gpu" and nccl_available()


def build_data(spec: Spec, global_batch: int, shards: int,
               eval_batch: int | None = None, replicas: int = 1) -> Data:
    """Loads the dataset the spec names, with its training epochs and validation batches.

    `shards` (replicas x micro-batches) keeps every shard of a last partial batch non-empty;
    validation batches hold `eval_batch` examples over `replicas` (one micro-batch per
    replica: evaluation does not accumulate, and must fit the same memory), `global_batch`
    over `shards` when None.
    """
    # lazy: it imports TensorFlow (see the module docstring)
    from trainer.data.pipeline import Source, build_pipeline, build_training_epochs

    options = dict(spec.dataset)
    pipeline = {key: options.pop(key) for key in PIPELINE_KEYS if key in options}
    seed = spec.runtime_seed
    source = build_object(options, "dataset", seed=seed)
    if not isinstance(source, Source):
        raise ConfigError(f"dataset {options['_target_']} must return a trainer.data.Source "
                          f"(Source.from_arrays for arrays); received: {type(source).__name__}")
    check_inputs(spec.augment, source.input_shape, options["_target_"])
    source = _one_hot_if_mixing(spec.augment, source)
    check_class_weight(spec.class_weight, source)
    common = dict(preprocess=source.preprocess, scale=source.scale, seed=seed, **pipeline)

    def make_train(first_epoch: int, epochs: int, skip_steps: int):
        return build_training_epochs(source.train, global_batch, first_epoch=first_epoch,
                                     epochs=epochs, skip_steps=skip_steps,
                                     drop_remainder=spec.batch.drop_remainder,
                                     examples=source.train_size, replicas=shards,
                                     augment=spec.augment, class_weight=spec.class_weight,
                                     **common)

    def evaluation(dataset, examples, cache=None):
        options = common if cache is None else {**common, "cache": cache}
        return build_pipeline(dataset, eval_batch or global_batch, training=False,
                              examples=examples,
                              replicas=shards if eval_batch is None else replicas, **options)

    # The test split is read once, at the end: no cache holding it through the run.
    test = (evaluation(source.test, source.test_size, cache=False)
            if source.test is not None and source.test_size > 0 else None)
    return Data(source=source, make_train=make_train,
                validation=evaluation(source.validation, source.validation_size), test=test)


def check_class_weight(weights: dict[int, float] | None, source: Any) -> None:
    """Refuses class weights Keras would refuse or that name no class of the dataset."""
    if weights is None:
        return
    spec = source.train.element_spec
    if source.num_classes is None or isinstance(spec[1], dict):
        raise ConfigError("class_weight weighs the classes of one class target; this dataset "
                          + ("has no classes (a regression target)" if source.num_classes is None
                             else "has a target per output") + "; remove class_weight")
    if len(spec) > 2:
        raise ConfigError("class_weight and the dataset's own sample weights cannot be combined "
                          "(as in Keras's fit); remove class_weight or the sample weights")
    beyond = sorted(k for k in weights if k >= source.num_classes)
    if beyond:
        raise ConfigError(f"class_weight names class {beyond[0]}; this dataset has "
                          f"{source.num_classes} classes (0-{source.num_classes - 1})")


def _one_hot_if_mixing(augment: Any, source: Any) -> Any:
    """Every split's labels one-hot where MixUp or CutMix mixes them (the same shape for
    training and evaluation, so the loss and the metrics read both)."""
    import dataclasses

    import tensorflow as tf

    names = mixers(check(augment))
    if not names:
        return source
    if source.num_classes is None:
        raise ConfigError(f"augment {', '.join(names)} mixes class labels; this dataset's "
                          "targets are not classes")
    classes = source.num_classes

    def hot(dataset):
        if dataset is None:
            return None
        return dataset.map(lambda x, y, *rest: (x, tf.one_hot(tf.cast(y, tf.int32), classes),
                                                *rest))

    return dataclasses.replace(source, train=hot(source.train),
                               validation=hot(source.validation), test=hot(source.test))


def learning_rate(plan: LrPlan, global_batch: int, steps: int, epochs: int) -> LearningRate:
    """The scaled rate, warm-up and decay for a global batch, as one Keras schedule."""
    # lazy: it imports TensorFlow (see the module docstring)
    from trainer.plan.schedule import WarmupSchedule

    scaled = scaled_learning_rate(plan.lr, global_batch, plan.reference_batch, plan.lr_scaling)
    warm = to_steps(plan.warmup_epochs, steps)
    schedule = WarmupSchedule(plan.lr, scaled, warm, steps * epochs, plan.decay,
                              plan.decay_rate, to_steps(plan.decay_epochs, steps),
                              plan.staircase)
    return LearningRate(base=plan.lr, scaled=scaled, rule=plan.lr_scaling,
                        reference_batch=plan.reference_batch, warmup_steps=warm,
                        decay=plan.decay, schedule=schedule)


@dataclass(frozen=True)
class Callbacks:
    """A run's callbacks by role; `all` is the order Keras calls them in."""

    throughput: Any
    backup: Any
    checkpoints: tuple
    trackers: tuple
    watchdog: Any
    user: tuple
    curves: Any = None  # draws curves.png (the chief's), after the backup

    def all(self) -> list:
        """Built-in ones first (the watchdog last of them), then the user's. The backup
        follows the checkpoints: at an epoch's end it links the best one just written; the
        curves follow the backup, whose history then holds the epoch."""
        found = [self.throughput, *self.checkpoints, self.backup, self.curves,
                 *self.trackers, self.watchdog, *self.user]
        return [c for c in found if c is not None]


def build_callbacks(spec: Spec, run: Run, run_dir: Path, started: float,
                    start: tuple[int, int], request: Any, extra: tuple = (),
                    history: dict | None = None) -> Callbacks:
    """Throughput, backup, checkpoints, trackers, the watchdog, then the user's callbacks.

    Args:
        spec: the run's resolved config.
        run: what `assemble` built.
        run_dir: where the run writes.
        started: `time.perf_counter()` at the start of the run.
        start: (epoch, step) the run starts from.
        request: the stop request signals set.
        extra: callbacks passed to `train()` in code, after the configured ones.
        history: per-epoch metrics of the epochs done before `start` (from the backup).
    """
    # lazy: they import TensorFlow (see the module docstring)
    from trainer.distribute.multiworker import on_stuck, stop_agreement
    from trainer.run.callbacks import AtomicModelCheckpoint, StepWatchdog, Throughput
    from trainer.rundir.backup import Backup, BackupStore
    from trainer.task.build import build_callbacks as build_user_callbacks
    from trainer.track.curves import Curves
    from trainer.track.trackers import build_trackers

    saving = spec.checkpoint
    best_mode = (run.monitor_mode(saving.monitor, saving.mode) if saving.save_best else None)
    user = build_user_callbacks(spec.callbacks, run_dir, run.monitor_mode)
    meta = {"config": spec.record,
            "global_batch": run.batch.global_size, "replicas": run.batch.replicas,
            "accumulate": run.batch.accumulate, "data": of_source(run.data.source)}
    # Before checkpoints/ exists: a tracker that cannot start leaves a fresh run directory
    # that holds no run, which the command line then removes.
    trackers = tuple(build_trackers(spec.loggers, run_dir, meta["config"], run.is_chief,
                                    spec.profile))
    layout = RunDir(run_dir)
    layout.checkpoints.mkdir(parents=True, exist_ok=True)
    # last.keras once, at the end (the backup holds that state during the run); best.keras
    # when it improves, the epoch's backup then a link to it (trainer.rundir.backup)
    saved = [AtomicModelCheckpoint(str(layout.checkpoint("last")), at_end=True)]
    if saving.save_best:
        saved.append(AtomicModelCheckpoint(
            str(layout.checkpoint("best")), monitor=saving.monitor,
            save_best_only=True, mode=best_mode))
    if saving.save_best:
        saved[0].same_as = saved[1]  # a final epoch that was the best: last links best
    backup = Backup(BackupStore(layout.backup, meta=meta), saving.backup_every,
                    saving.nan_check_every, request, *start,
                    agree=stop_agreement(run.strategy) if run.workers > 1 else None,
                    best=saved[1] if saving.save_best else None, history=history)
    watchdog = None
    timeout = spec.strategy.timeout_s
    if run.workers > 1 and timeout is not None:
        # Last of the built-in ones, so a step's time includes Backup's stop agreement.
        watchdog = StepWatchdog(timeout, on_stuck(timeout, run.is_chief, run_dir, backup))
    return Callbacks(
        throughput=Throughput(run.data.source.train_size, run.batch.global_size, started),
        backup=backup, checkpoints=tuple(saved), trackers=trackers, watchdog=watchdog,
        user=(*user, *extra),
        curves=Curves(run_dir, lambda: backup.history, saving.monitor if saving.save_best
                      else None, best_mode) if run.is_chief else None)
