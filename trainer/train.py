"""train(cfg): the one place that wires devices, strategy, scaling, data, model and fit."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from trainer.backup import (
    Backup,
    BackupStore,
    StopRequest,
    replica_sum,
    share_from_chief,
    stop_on_signals,
)
from trainer.callbacks import StepWatchdog
from trainer.cluster import Cluster, choose_communication, lost_tasks, resolve_cluster
from trainer.config import ConfigError, monitor_mode, validate
from trainer.devices import configure_devices, memory_option, plan_devices
from trainer.errors import EXIT_WORKER_LOST, Interrupted, WorkerLost
from trainer.scaling import plan_batch, scaled_learning_rate, steps_per_epoch, warmup_steps
from trainer.speed import apply_precision, choose_speed, compute_capability
from trainer.strategy import (
    build_strategy,
    check_steps_per_execution,
    choose_cross_device_ops,
    choose_strategy,
)
from trainer.summary import refuse_finished_run

log = logging.getLogger(__name__)

PIPELINE_KEYS = ("cache", "shuffle_buffer")


def train(cfg: DictConfig, run_dir: str | Path | None = None,
          callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Trains and evaluates as the config says; writes everything into the run directory.

    Args:
        cfg: a composed config (see `conf/config.yaml`).
        run_dir: where checkpoints, logs and `summary.json` go; Hydra's output directory
            when None.
        callbacks: extra Keras callbacks, after the built-in ones.

    Returns:
        The summary dict, also written to `run_dir/summary.json`.
    """
    started = time.perf_counter()
    validate(cfg)
    cluster = resolve_cluster(list(cfg.cluster.workers), cfg.cluster.task_index,
                              os.environ.get("TF_CONFIG"))
    if cluster is None or cluster.is_chief:
        return _train(cfg, _run_dir(cfg, run_dir), callbacks, started, cluster)
    # Another worker: it saves what the chief saves (some reads of distributed variables are
    # collectives every worker must join) but into a temporary place, removed at the end.
    scratch = Path(tempfile.mkdtemp(prefix=f"trainer-worker{cluster.task_id}-"))
    try:
        return _train(cfg, scratch, callbacks, started, cluster)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _train(cfg: DictConfig, run_dir: Path, callbacks: Sequence[Any], started: float,
           cluster: Cluster | None) -> dict[str, Any]:
    chief = cluster is None or cluster.is_chief
    if chief:
        refuse_finished_run(run_dir, resume=cfg.resume is not None)
    plan = plan_devices(cfg.accelerator, cfg.devices, visible_gpu_count(),
                        cfg.soft_placement)
    configure_devices(plan, memory_option(cfg.gpu.memory_growth, cfg.gpu.memory_limit_mb),
                      cfg.soft_placement, cfg.log_device_placement)
    if cfg.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    builtin: list = []
    try:
        return _run(cfg, plan, run_dir, callbacks, started, cluster, builtin)
    except Exception as error:
        if cluster is not None and cluster.num_workers > 1 and _peer_failure(error):
            epoch = builtin[1].epoch if builtin else None
            raise WorkerLost(_lost_message(error, cluster, epoch,
                                           _backup_place(run_dir, chief))) from error
        raise
    finally:
        for callback in builtin:  # a failed fit never reaches on_train_end
            if isinstance(callback, StepWatchdog):
                callback.stop()


def _run(cfg: DictConfig, plan, run_dir: Path, callbacks: Sequence[Any], started: float,
         cluster: Cluster | None, builtin: list) -> dict[str, Any]:
    """Builds, trains, evaluates and reports; `builtin` receives the built-in callbacks."""
    chief = cluster is None or cluster.is_chief
    run = _prepare(cfg, plan, cluster)
    start = _resume_point(run, run_dir)
    request = StopRequest()
    builtin.extend(_callbacks(cfg, run, run_dir, started, start, request))
    with stop_on_signals(request):
        history, final = _fit(cfg, run, [*builtin, *callbacks], start)
    if builtin[1].interrupted:
        where = _backup_place(run_dir, chief)
        why = ("another worker was asked to stop" if builtin[1].stopped_by_peer
               else f"stopped by signal {request.signal}")
        who = "; every worker stopped" if _workers(run) > 1 else ""
        raise Interrupted(f"{why}{who} at epoch {builtin[1].epoch + 1}; backup in {where}; "
                          "rerun the same command to resume")
    summary = _summary(cfg, run, plan, run_dir, history, final, builtin[0], started, start)
    if cfg.export:
        run["model"].export(str(run_dir / "saved_model"), verbose=False)
        summary["saved_model"] = str(run_dir / "saved_model")
    if chief:
        _finish(summary, run_dir)
    else:
        print(f"worker {cluster.task_id} of {cluster.num_workers} finished; the chief "
              f"({cluster.addresses[0]}) wrote the checkpoints and summary", flush=True)
    return summary


def _peer_failure(error: BaseException) -> bool:
    """Whether a collective failed because a peer crashed, vanished or timed out."""
    import tensorflow as tf

    return isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                              tf.errors.AbortedError, tf.errors.CancelledError))


def _backup_place(run_dir: Path, chief: bool) -> str:
    """Where the backup to resume from is, as this worker can say it."""
    return str(run_dir / "backup") if chief else "the chief's run directory"


def _lost_message(error: BaseException, cluster: Cluster, epoch: int | None,
                  backup: str) -> str:
    lost = lost_tasks(str(error), cluster)
    who = " and ".join(lost) if lost else "a peer worker"
    what = f"lost {who}: it stopped responding (crashed, killed or unreachable)"
    when = f"during epoch {epoch + 1}" if epoch is not None else "before training"
    return (f"{what} {when}; this worker stopped. The last backup is in "
            f"{backup}; start every worker again with the same command to resume")


def _run_dir(cfg: DictConfig, run_dir: str | Path | None) -> Path:
    if cfg.resume is not None:
        if not Path(cfg.resume).is_dir():
            raise ConfigError(f"resume={cfg.resume} is not a run directory")
        return Path(cfg.resume)
    return Path(run_dir) if run_dir is not None else _hydra_run_dir()


def _resume_point(run: dict[str, Any], run_dir: Path) -> tuple[int, int]:
    """Restores the newest good backup; returns (epoch, step in epoch) to start from."""
    model = run["model"]
    with run["strategy"].scope():  # the optimizer's slots are distributed variables
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    # Loaded outside the scope: Keras's loader creates throwaway variables, which under
    # MultiWorkerMirroredStrategy's scope would start collectives on the chief alone.
    point = BackupStore(run_dir / "backup").restore(model)
    if run["strategy_name"] == "multi_worker":
        # Only the chief keeps backups: every worker continues from the chief's.
        point = share_from_chief(run["strategy"], run["model"], point)
    if point is None:
        return 0, 0
    log.warning("resuming from %s: epoch %d, step %d", point.path, point.epoch + 1, point.step)
    if point.step >= run["steps"]:
        return point.epoch + 1, 0
    return point.epoch, point.step


def _segments(cfg: DictConfig, run: dict[str, Any], start: tuple[int, int]) -> list:
    """(first epoch, end epoch, steps per epoch, dataset) to train, in order.

    A run resumed mid-epoch first finishes that epoch's remaining steps, then trains whole
    epochs; each dataset starts exactly where the interrupted run would have been.
    """
    epoch, step = start
    make = run["make_train"]
    segments = []
    if step:
        segments.append((epoch, epoch + 1, run["steps"] - step, make(epoch, epoch + 1, step)))
        epoch += 1
    if epoch < cfg.epochs:
        segments.append((epoch, cfg.epochs, run["steps"], make(epoch, cfg.epochs, 0)))
    return segments


def _fit(cfg: DictConfig, run: dict[str, Any], callbacks: list,
         start: tuple[int, int]) -> tuple[dict[str, list], dict[str, float]]:
    """Trains with the chosen loop, then evaluates every validation example once."""
    model, history = run["model"], {}
    loop = None
    if run["loop"] == "custom":
        from trainer.loop import CustomLoop

        speed = run["speed"]
        loop = CustomLoop(model, run["strategy"], speed.steps_per_execution,
                          jit_compile=speed.jit_compile is True)
    for first, end, steps, dataset in _segments(cfg, run, start):
        kwargs = dict(initial_epoch=first, epochs=end, steps_per_epoch=steps,
                      validation_data=run["validation"], callbacks=callbacks,
                      verbose=cfg.verbose)
        if loop is not None:
            part = loop.fit(dataset, **kwargs)
        else:
            part = model.fit(dataset, shuffle=False, **kwargs)  # already shuffled
        for key, values in part.history.items():
            history.setdefault(key, []).extend(values)
        if callbacks[1].interrupted:
            break
    if callbacks[1].interrupted:
        return history, {}  # a stopped run is not evaluated (other workers may be gone)
    if loop is not None:
        return history, loop.evaluate(run["validation"])
    return history, model.evaluate(run["validation"], return_dict=True, verbose=0)


def visible_gpu_count() -> int:
    """Physical GPUs TensorFlow sees (after CUDA_VISIBLE_DEVICES)."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _hydra_run_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise ConfigError("train() outside a Hydra run needs run_dir; received: None")
    return Path(HydraConfig.get().runtime.output_dir)


# Keras 3.15's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585,
# tensorflow/tensorflow#72388); the custom loop does the same maths with the same callbacks.
MULTI_WORKER_LOOP = ("loop=custom: Keras's fit fails under MultiWorkerMirroredStrategy "
                     "(keras-team/keras#20585); the custom loop (same maths, same callbacks, "
                     "tested equal to fit) runs instead")


def _prepare(cfg: DictConfig, plan, cluster: Cluster | None = None) -> dict[str, Any]:
    """Builds strategy, data, model and optimizer: everything that holds variables in scope."""
    import keras

    replicas = len(plan.names)
    workers = cluster.num_workers if cluster is not None else 1
    strategy_name = choose_strategy(cfg.strategy.name, replicas, workers, plan.kind)
    multi = strategy_name == "multi_worker"
    loop = "custom" if multi else cfg.loop
    if multi:
        if cfg.seed is None:
            raise ConfigError("strategy=multi_worker needs a seed: every worker shuffles the "
                              "data alike and takes its share of the same global batches; "
                              "received: seed=null (set seed=N)")
        # tf.distribute's multi-worker input code reads dataset options in graph mode, which
        # warns on every run; nothing for a user to act on.
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
        # MultiWorkerMirroredStrategy must exist before any other TensorFlow op runs.
        communication = choose_communication(cfg.strategy.communication, plan.kind)
        cross = f"collective ({communication})"
        strategy = build_strategy(strategy_name, plan.names, cross, cluster, communication)
    speed = choose_speed(cfg.precision, cfg.jit_compile, cfg.steps_per_execution, plan.kind,
                         replicas * workers, loop,
                         compute_capability() if plan.kind == "gpu" else None)
    if multi and cfg.loop != loop:
        speed = replace(speed, reasons=(*speed.reasons, MULTI_WORKER_LOOP))
    check_steps_per_execution(loop, speed.steps_per_execution, replicas)
    apply_precision(speed.precision)
    if not multi:
        cross = choose_cross_device_ops(cfg.strategy.cross_device_ops, plan.kind, replicas,
                                        _nccl_available(plan.kind))
        strategy = build_strategy(strategy_name, plan.names, cross)
    batch = plan_batch(cfg.batch.per_replica, cfg.batch.global_size,
                       strategy.num_replicas_in_sync)
    if cfg.seed is not None:
        keras.utils.set_random_seed(cfg.seed)
    with strategy.scope():
        data = build_data(cfg, batch.global_size, strategy.num_replicas_in_sync)
        steps = steps_per_epoch(data["source"].train_size, batch.global_size,
                                cfg.batch.drop_remainder)
        lr = _learning_rate(cfg.optimizer, batch.global_size, steps, cfg.epochs)
        model = build(cfg.model, input_shape=data["source"].input_shape,
                      num_classes=data["source"].num_classes)
        model.compile(optimizer=build_optimizer(cfg.optimizer, lr["schedule"]),
                      loss=keras.losses.SparseCategoricalCrossentropy(),
                      metrics=["accuracy"], steps_per_execution=speed.steps_per_execution,
                      jit_compile=speed.jit_compile)
    return {"strategy": strategy, "strategy_name": strategy_name, "cross": cross, "loop": loop,
            "cluster": cluster,
            "batch": batch, "steps": steps, "lr": lr, "model": model, "speed": speed, **data}


def _nccl_available(kind: str) -> bool:
    from trainer.strategy import nccl_available

    return kind == "gpu" and nccl_available()


def build_data(cfg: DictConfig, global_batch: int, replicas: int) -> dict[str, Any]:
    """Loads the dataset the config names; returns its source, a maker of training epochs
    (`make_train(first_epoch, epochs, skip_steps)`) and the validation batches."""
    from trainer.data.pipeline import build_pipeline, build_training_epochs

    options = OmegaConf.to_container(cfg.dataset, resolve=True)
    pipeline = {key: options.pop(key) for key in PIPELINE_KEYS if key in options}
    source = build(options, seed=cfg.seed)
    common = dict(preprocess=source.preprocess, scale=source.scale, seed=cfg.seed,
                  replicas=replicas, **pipeline)

    def make_train(first_epoch: int, epochs: int, skip_steps: int):
        return build_training_epochs(source.train, global_batch, first_epoch=first_epoch,
                                     epochs=epochs, skip_steps=skip_steps,
                                     drop_remainder=cfg.batch.drop_remainder,
                                     examples=source.train_size, **common)

    return {
        "source": source,
        "make_train": make_train,
        "validation": build_pipeline(source.validation, global_batch, training=False,
                                     examples=source.validation_size, **common),
    }


def build(node: Any, **kwargs: Any) -> Any:
    """Calls the builder a config node names by `_target_`, keeping our config errors intact."""
    from hydra.errors import InstantiationException

    try:
        return instantiate(node, **kwargs, _convert_="all")
    except InstantiationException as error:
        if isinstance(error.__cause__, ConfigError):
            raise error.__cause__ from None
        raise


def _learning_rate(opt: DictConfig, global_batch: int, steps: int, epochs: int) -> dict[str, Any]:
    from trainer.schedule import WarmupSchedule

    scaled = scaled_learning_rate(opt.lr, global_batch, opt.reference_batch, opt.lr_scaling)
    warm = warmup_steps(opt.warmup_epochs, steps)
    decay_steps = warmup_steps(opt.decay_epochs, steps)
    schedule = WarmupSchedule(opt.lr, scaled, warm, steps * epochs, opt.decay,
                              opt.decay_rate, decay_steps, opt.staircase)
    return {"base": opt.lr, "scaled": scaled, "rule": opt.lr_scaling,
            "reference_batch": opt.reference_batch, "warmup_steps": warm, "decay": opt.decay,
            "schedule": schedule}


def build_optimizer(opt: DictConfig, learning_rate: Any) -> Any:
    """Creates the Keras optimizer named by `optimizer.name` with the given rate or schedule."""
    import keras

    if opt.name == "sgd":
        return keras.optimizers.SGD(learning_rate, momentum=opt.momentum, nesterov=opt.nesterov,
                                    weight_decay=opt.weight_decay)
    return keras.optimizers.Adam(learning_rate, weight_decay=opt.weight_decay)


def _callbacks(cfg: DictConfig, run: dict[str, Any], run_dir: Path, started: float,
               start: tuple[int, int], request: StopRequest) -> list:
    """Throughput first and Backup second (train() reads both), then checkpoints, TensorBoard."""
    import keras

    from trainer.callbacks import AtomicModelCheckpoint, Throughput

    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    found = [Throughput(run["source"].train_size, run["batch"].global_size, started),
             Backup(BackupStore(run_dir / "backup"), cfg.checkpoint.backup_every,
                    cfg.checkpoint.nan_check_every, request, *start,
                    agree=_stop_agreement(run["strategy"]) if _workers(run) > 1 else None),
             AtomicModelCheckpoint(str(checkpoints / "last.keras"))]
    if cfg.checkpoint.save_best:
        found.append(AtomicModelCheckpoint(
            str(checkpoints / "best.keras"), monitor=cfg.checkpoint.monitor, save_best_only=True,
            mode=monitor_mode(cfg.checkpoint.monitor, cfg.checkpoint.mode)))
    if cfg.tensorboard:
        found.append(keras.callbacks.TensorBoard(str(run_dir / "tensorboard")))
    if _workers(run) > 1 and cfg.strategy.timeout_s is not None:
        # Last, so a step's time includes the stop agreement Backup runs after it.
        found.append(StepWatchdog(cfg.strategy.timeout_s,
                                  _on_stuck(cfg, run, run_dir, found[1])))
    return found


def _on_stuck(cfg: DictConfig, run: dict[str, Any], run_dir: Path, backup: Backup):
    """What the step watchdog does: one line, the scratch directory removed, exit code 4."""

    def on_timeout(waited: float) -> None:
        chief = run["cluster"].is_chief
        where = _backup_place(run_dir, chief)
        print(f"error: a training step has not finished after {waited:.0f} s "
              f"(strategy.timeout_s={cfg.strategy.timeout_s:g}) during epoch "
              f"{backup.epoch + 1}: a peer worker is stuck, or the network between the workers "
              f"is; this worker stopped. The last backup is in {where}; start every worker "
              "again with the same command to resume", file=sys.stderr, flush=True)
        if not chief:
            shutil.rmtree(run_dir, ignore_errors=True)
        os._exit(EXIT_WORKER_LOST)  # the main thread is blocked in the stuck collective

    return on_timeout


def _workers(run: dict[str, Any]) -> int:
    return run["cluster"].num_workers if run["cluster"] is not None else 1


def _stop_agreement(strategy: Any):
    """`agree(asked) -> bool`: whether any worker was asked to stop (one small all-reduce)."""
    import tensorflow as tf

    votes = replica_sum(strategy)

    def agree(asked: bool) -> bool:
        return float(votes([tf.constant(1.0 if asked else 0.0)])[0]) > 0

    return agree


def _name(node: DictConfig) -> str:
    """`trainer.models.cnn.build` -> `cnn`."""
    parts = node._target_.split(".")
    return parts[-2] if len(parts) > 1 else parts[0]


def _summary(cfg, run, plan, run_dir, history, final, throughput, started,
             start) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    train_metrics = {k: float(v[-1]) for k, v in history.items()
                     if v and not k.startswith("val_") and k != "learning_rate"}
    return {
        "run_dir": str(run_dir),
        "model": _name(cfg.model),
        "dataset": _name(cfg.dataset),
        "accelerator": plan.kind,
        "devices": list(plan.names),
        "replicas": run["strategy"].num_replicas_in_sync,
        "strategy": run["strategy_name"],
        "cross_device_ops": run["cross"],
        "batch": {"per_replica": run["batch"].per_replica, "global": run["batch"].global_size,
                  "drop_remainder": cfg.batch.drop_remainder},
        "learning_rate": {k: v for k, v in run["lr"].items() if k != "schedule"},
        "optimizer": cfg.optimizer.name,
        "loop": run["loop"],
        "workers": _workers(run),
        "cluster": None if (cluster := run["cluster"]) is None else {
            "source": cluster.source, "tasks": cluster.addresses, "task_id": cluster.task_id,
            "communication": cfg.strategy.communication,
            "step_timeout_s": cfg.strategy.timeout_s},
        "steps_per_execution": run["speed"].steps_per_execution,
        "precision": run["speed"].precision,
        "jit_compile": run["speed"].jit_compile,
        "speed_reasons": list(run["speed"].reasons),
        "epochs": cfg.epochs,
        "resumed_from": {"epoch": start[0] + 1, "step": start[1]} if any(start) else None,
        "steps_per_epoch": run["steps"],
        "train_examples": run["source"].train_size,
        "validation_examples": run["source"].validation_size,
        "time": {"wall_s": time.perf_counter() - started,
                 "first_step_s": throughput.first_step_s,
                 "first_epoch_s": throughput.first_epoch_s},
        "examples_per_sec": throughput.examples_per_sec,
        "epoch_examples_per_sec": throughput.epoch_rates,
        "train_metrics": train_metrics,
        "validation_metrics": {k: float(v) for k, v in final.items()},
        "seed": cfg.seed,
        "warnings": list(plan.warnings),
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }


def _finish(summary: dict[str, Any], run_dir: Path) -> None:
    from trainer.summary import format_summary, write_json

    write_json(run_dir / "summary.json", summary)
    print(format_summary(summary), flush=True)
