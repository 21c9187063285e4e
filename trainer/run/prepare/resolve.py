"""The config resolved once: the composed `DictConfig` becomes one frozen, typed `Spec`.

`resolve` is the only reader of the composed config in a run: it runs after the pre-flight
(`check_config`), and everything after it (assembling, the loops, callbacks, the summary,
evaluation) reads the `Spec`. Its sections are the schema's own dataclasses (Hydra's
`OmegaConf.to_object`), plus what is derived from them once: `devices` and `export` as the
config's check parsed them (`trainer.config.validate.Parsed`), the runtime seed and the
learning-rate plan, the dataset's pipeline options (`pipeline`, read once by the check) and
what a `trainer.fit` call said of the data it was given. The open nodes (`model`,
`dataset`, `optimizer`, `callbacks`, `logger`), whose keys are their builders' arguments,
are plain dicts. A worker with an evaluator beside it (`with_evaluator`) is refused what
needs validation while it trains, and leaves `best.keras` to the evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.config.build import group_defaults
from trainer.config.errors import ConfigError
from trainer.config.given import flag as given_flag
from trainer.config.image_size import image_size_choice
from trainer.config.schema import (
    BatchConfig,
    CheckpointConfig,
    ClusterConfig,
    FinetuneConfig,
    LrPlan,
    PipelineOptions,
    RecoverConfig,
    StrategyConfig,
    TunerConfig,
)
from trainer.config.validate import Parsed, runtime_seed, validate
from trainer.data.augment import listed


@dataclass(frozen=True)
class DeviceRequest:
    """What the config asks of the devices; `DevicePlan` is what this machine gives."""

    accelerator: str
    devices: str | int | tuple[int, ...]
    soft_placement: bool
    log_placement: bool
    memory_growth: bool
    memory_limit_mb: int | None


@dataclass(frozen=True)
class Spec:
    """A run's config, resolved once.

    Attributes:
        record: the whole config, interpolations resolved, as plain data: what backups,
            trackers and resume checks record and compare.
        seed: the config's `seed` as written (reported); `runtime_seed` is what is used.
        choices: the config files the `model` and `dataset` groups chose (`wine_mlp`,
            `wine`), read from Hydra in a Hydra job (before TensorFlow starts); empty
            outside one (`train(cfg, run_dir)` in code), where the summary names the
            `_target_`'s module instead.
        image_size: the dataset's image side, its own and the model's minimum
            (`trainer.config.image_size.image_size_choice`), for the summary; None: none.
        pipeline: the dataset node's pipeline options, read once
            (`trainer.config.validate.read_pipeline`); `dataset` keeps the whole node for
            the source's builder, which never sees them.
        batch_from_data: the global batch is the given data's own (`trainer.fit(data=...)`
            with no batch set; `trainer.plan.scaling.batch_of_data`).
        cache_from_data: a given dataset is read anew every epoch, uncached
            (`trainer.fit(data=...)` with no `dataset.cache` set).
    """

    record: dict[str, Any]
    devices: DeviceRequest
    strategy: StrategyConfig
    cluster: ClusterConfig
    batch: BatchConfig
    checkpoint: CheckpointConfig
    finetune: FinetuneConfig
    lr: LrPlan
    optimizer: dict[str, Any]
    model: dict[str, Any]
    dataset: dict[str, Any]
    # the default group's own keys, passed only to a builder that takes them (`group_defaults`)
    model_defaults: tuple[str, ...]
    dataset_defaults: tuple[str, ...]
    loss: Any
    metrics: list[Any] | dict[str, list[Any]] | None
    weighted_metrics: list[Any] | dict[str, list[Any]] | None
    loss_weights: dict[str, float] | list[float] | None
    class_weight: dict[int, float] | None
    callbacks: dict[str, Any]
    loggers: dict[str, Any]
    augment: list[Any]
    loop: str
    precision: str
    jit_compile: bool | str
    steps_per_execution: int | str
    epochs: int
    seed: int | None
    runtime_seed: int | None
    deterministic: bool
    verbose: int | str
    export: tuple[str, ...]  # formats, in order (trainer.models.export)
    resume: str | None
    profile: tuple[int, int] | None
    optimized_metric: str | None
    choices: dict[str, str] = field(default_factory=dict)
    tune: str | None = None  # lr | batch: tune instead of training
    tuner: TunerConfig = field(default_factory=TunerConfig)
    image_size: dict[str, Any] | None = None
    sync_batchnorm: bool = False
    validation_split: float | None = None
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    batch_from_data: bool = False
    cache_from_data: bool = False


# The config groups whose choice names the run in its summary.
NAMED_GROUPS = ("model", "dataset")


def hydra_choices() -> dict[str, str]:
    """The `model` and `dataset` choices of the Hydra job this process runs; empty outside
    one."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    chosen = HydraConfig.get().runtime.choices
    return {g: str(chosen[g]) for g in NAMED_GROUPS if chosen.get(g) is not None}


def _lr_plan(record: dict[str, Any]) -> LrPlan:
    """The optimizer node's learning-rate plan, `reference_batch: auto` made a number."""
    batch = record["batch"]
    return LrPlan.of(record["optimizer"]).resolved(batch["per_replica"], batch["global_size"])


def _metrics(metrics: Any) -> list[Any] | dict[str, list[Any]] | None:
    return (dict(metrics) if isinstance(metrics, dict)
            else None if metrics is None else list(metrics))


def _defaults(node: DictConfig) -> tuple[str, ...]:
    return group_defaults(OmegaConf.get_type(node), OmegaConf.to_container(node, resolve=False))


def resolve(cfg: DictConfig, choices: dict[str, str] | None = None,
            parsed: Parsed | None = None) -> Spec:
    """Turns a composed, checked config into a `Spec`.

    Args:
        cfg: the composed config, already through `trainer.run.prepare.preflight.check_config`.
        choices: the config groups' choices where no Hydra job runs (`trainer.fit`
            composes without one); None reads the running job's.
        parsed: what the config's check parsed (`devices`, `export`, the pipeline's
            options): each value is parsed once, there; None checks the config here (a
            config no check has seen).

    Returns:
        The run's `Spec`.
    """
    parsed = validate(cfg) if parsed is None else parsed
    record = OmegaConf.to_container(cfg, resolve=True)
    node = record.get
    return Spec(
        record=record,
        devices=DeviceRequest(cfg.accelerator, parsed.devices, cfg.soft_placement,
                              cfg.log_device_placement, cfg.gpu.memory_growth,
                              cfg.gpu.memory_limit_mb),
        strategy=StrategyConfig(**record["strategy"]),
        cluster=ClusterConfig(**record["cluster"]),
        batch=BatchConfig(**record["batch"]),
        checkpoint=_checkpoint(record["checkpoint"]),
        finetune=FinetuneConfig(**record["finetune"]),
        lr=_lr_plan(record),
        optimizer=dict(record["optimizer"]),
        model=dict(record["model"]),
        dataset=dict(record["dataset"]),
        model_defaults=_defaults(cfg.model), dataset_defaults=_defaults(cfg.dataset),
        loss=node("loss"),
        metrics=_metrics(record["metrics"]), weighted_metrics=_metrics(node("weighted_metrics")),
        loss_weights=node("loss_weights"),
        class_weight=({int(k): float(v) for k, v in node("class_weight").items()}
                      if node("class_weight") is not None else None),
        callbacks=dict(record["callbacks"] or {}),
        loggers=dict(node("logger") or {}),
        augment=listed(node("augment")),
        loop=cfg.loop, precision=cfg.precision,
        jit_compile=cfg.jit_compile, steps_per_execution=cfg.steps_per_execution,
        epochs=cfg.epochs, seed=cfg.seed, runtime_seed=runtime_seed(cfg.seed),
        deterministic=cfg.deterministic, verbose=cfg.verbose,
        export=parsed.export,
        resume=cfg.get("resume"),
        profile=tuple(record["profile"]) if node("profile") is not None else None,
        optimized_metric=node("optimized_metric"),
        tune=node("tune"), tuner=TunerConfig(**(node("tuner") or {})),
        choices=hydra_choices() if choices is None else {
            g: str(choices[g]) for g in NAMED_GROUPS if choices.get(g) is not None},
        image_size=image_size_choice(cfg),
        sync_batchnorm=bool(node("sync_batchnorm")), validation_split=node("validation_split"),
        steps_per_epoch=node("steps_per_epoch"), validation_steps=node("validation_steps"),
        pipeline=parsed.pipeline,  # and what the API's call holds (`trainer.config.given`):
        batch_from_data=given_flag("batch_from_data"),
        cache_from_data=given_flag("cache_from_data"),
    )


def _checkpoint(node: dict) -> CheckpointConfig:
    """The `checkpoint` node as its record, `recover` (`checkpoint.recover`) included."""
    return CheckpointConfig(**{**node, "recover": RecoverConfig(**node.get("recover", {}))})


def check_with_evaluator(spec: Any) -> None:
    """Refuses what needs validation on the workers while they train: they do not wait for
    the evaluator, so a callback that reads a validation metric (early stopping, a plateau)
    would read nothing; so would the k best checkpoints and their average.

    Raises:
        ConfigError: naming the key.
    """
    for name, node in (spec.callbacks or {}).items():
        monitor = str((node or {}).get("monitor", ""))
        if monitor.startswith("val_"):
            raise ConfigError(f"callbacks.{name} monitors {monitor}, which the evaluator "
                              "computes after the workers have moved on; with an evaluator, "
                              f"monitor a training metric or remove it; received: {monitor}")
    saving = spec.checkpoint
    for key, value in (("keep_best", saving.keep_best), ("average_best", saving.average_best)):
        if value:
            raise ConfigError(f"checkpoint.{key} is not kept with an evaluator (it keeps "
                              f"best.keras alone); set checkpoint.{key}=0; received: {value}")
    for key in ("ema", "use_ema"):  # trainer's key, and Keras's own argument passed on
        if spec.optimizer.get(key):
            raise ConfigError(f"optimizer.{key}=true is not kept with an evaluator: it "
                              "validates the backups' raw weights and keeps best.keras alone, "
                              f"with no averaged model to test; set optimizer.{key}=false, or "
                              "run without an evaluator; received: true")


def with_evaluator(spec: Any, cluster: Any) -> Any:
    """The spec of a worker of `cluster`: as it is without an evaluator; with one, checked
    (`check_with_evaluator`) and `without_validation`."""
    if cluster is None or cluster.evaluator is None:
        return spec
    check_with_evaluator(spec)
    return without_validation(spec)


def without_validation(spec: Spec) -> Spec:
    """The workers' spec with an evaluator: `best.keras` is the evaluator's to write."""
    return replace(spec, checkpoint=replace(spec.checkpoint, save_best=False))
