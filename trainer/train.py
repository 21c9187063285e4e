"""train(cfg): the one place that wires devices, strategy, scaling, data, model and fit."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from trainer.config import ConfigError, monitor_mode, validate
from trainer.devices import configure_devices, memory_option, plan_devices
from trainer.scaling import plan_batch, scaled_learning_rate, steps_per_epoch, warmup_steps
from trainer.strategy import (
    build_strategy,
    check_steps_per_execution,
    choose_cross_device_ops,
    choose_strategy,
)

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
    run_dir = Path(run_dir) if run_dir is not None else _hydra_run_dir()
    plan = plan_devices(cfg.accelerator, cfg.devices, _num_gpus(), cfg.soft_placement)
    configure_devices(plan, memory_option(cfg.gpu.memory_growth, cfg.gpu.memory_limit_mb),
                      cfg.soft_placement, cfg.log_device_placement)
    run = _prepare(cfg, plan)
    builtin = _callbacks(cfg, run, run_dir, started)
    history, final = _fit(cfg, run, [*builtin, *callbacks])
    summary = _summary(cfg, run, plan, run_dir, history, final, builtin[0], started)
    _finish(summary, run_dir)
    return summary


def _fit(cfg: DictConfig, run: dict[str, Any], callbacks: list) -> tuple[Any, dict[str, float]]:
    """Trains with the chosen loop, then evaluates every validation example once."""
    model = run["model"]
    if cfg.loop == "custom":
        from trainer.loop import CustomLoop

        loop = CustomLoop(model, run["strategy"], cfg.steps_per_execution)
        history = loop.fit(run["train"], epochs=cfg.epochs, steps_per_epoch=run["steps"],
                           validation_data=run["validation"], callbacks=callbacks,
                           verbose=cfg.verbose)
        return history, loop.evaluate(run["validation"])
    history = model.fit(run["train"], validation_data=run["validation"], epochs=cfg.epochs,
                        callbacks=callbacks, verbose=cfg.verbose, shuffle=False)  # shuffled
    return history, model.evaluate(run["validation"], return_dict=True, verbose=0)


def _num_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _hydra_run_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise ConfigError("train() outside a Hydra run needs run_dir; received: None")
    return Path(HydraConfig.get().runtime.output_dir)


def _prepare(cfg: DictConfig, plan) -> dict[str, Any]:
    """Builds strategy, data, model and optimizer: everything that holds variables in scope."""
    import keras

    replicas = len(plan.names)
    strategy_name = choose_strategy(cfg.strategy.name, replicas)
    check_steps_per_execution(cfg.loop, cfg.steps_per_execution, replicas)
    cross = choose_cross_device_ops(cfg.strategy.cross_device_ops, plan.kind, replicas,
                                    _nccl_available(plan.kind))
    strategy = build_strategy(strategy_name, plan.names, cross)
    batch = plan_batch(cfg.batch.per_replica, cfg.batch.global_size,
                       strategy.num_replicas_in_sync)
    if cfg.seed is not None:
        keras.utils.set_random_seed(cfg.seed)
    with strategy.scope():
        data = _data(cfg, batch.global_size, strategy.num_replicas_in_sync)
        steps = steps_per_epoch(data["source"].train_size, batch.global_size,
                                cfg.batch.drop_remainder)
        lr = _learning_rate(cfg.optimizer, batch.global_size, steps, cfg.epochs)
        model = build(cfg.model, input_shape=data["source"].input_shape,
                      num_classes=data["source"].num_classes)
        model.compile(optimizer=build_optimizer(cfg.optimizer, lr["schedule"]),
                      loss=keras.losses.SparseCategoricalCrossentropy(),
                      metrics=["accuracy"], steps_per_execution=cfg.steps_per_execution)
    return {"strategy": strategy, "strategy_name": strategy_name, "cross": cross,
            "batch": batch, "steps": steps, "lr": lr, "model": model, **data}


def _nccl_available(kind: str) -> bool:
    from trainer.strategy import nccl_available

    return kind == "gpu" and nccl_available()


def _data(cfg: DictConfig, global_batch: int, replicas: int) -> dict[str, Any]:
    from trainer.data.pipeline import build_pipeline

    options = OmegaConf.to_container(cfg.dataset, resolve=True)
    pipeline = {key: options.pop(key) for key in PIPELINE_KEYS if key in options}
    source = build(options, seed=cfg.seed)
    common = dict(preprocess=source.preprocess, scale=source.scale, seed=cfg.seed,
                  replicas=replicas, **pipeline)
    return {
        "source": source,
        "train": build_pipeline(source.train, global_batch, training=True,
                                drop_remainder=cfg.batch.drop_remainder,
                                examples=source.train_size, **common),
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


def _callbacks(cfg: DictConfig, run: dict[str, Any], run_dir: Path, started: float) -> list:
    import keras

    from trainer.callbacks import Throughput

    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    found = [Throughput(run["source"].train_size, run["batch"].global_size, started),
             keras.callbacks.BackupAndRestore(str(run_dir / "backup")),
             keras.callbacks.ModelCheckpoint(str(checkpoints / "last.keras"))]
    if cfg.checkpoint.save_best:
        found.append(keras.callbacks.ModelCheckpoint(
            str(checkpoints / "best.keras"), monitor=cfg.checkpoint.monitor, save_best_only=True,
            mode=monitor_mode(cfg.checkpoint.monitor, cfg.checkpoint.mode)))
    if cfg.tensorboard:
        found.append(keras.callbacks.TensorBoard(str(run_dir / "tensorboard")))
    return found


def _name(node: DictConfig) -> str:
    """`trainer.models.cnn.build` -> `cnn`."""
    parts = node._target_.split(".")
    return parts[-2] if len(parts) > 1 else parts[0]


def _summary(cfg, run, plan, run_dir, history, final, throughput, started) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    train_metrics = {k: float(v[-1]) for k, v in history.history.items()
                     if not k.startswith("val_") and k != "learning_rate"}
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
        "loop": cfg.loop,
        "steps_per_execution": cfg.steps_per_execution,
        "epochs": cfg.epochs,
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
