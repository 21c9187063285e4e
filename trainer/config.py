"""Config schema (typed by dataclasses, checked by Hydra at compose time) and validation.

Nothing here imports TensorFlow: a bad config must fail before the runtime starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from trainer.errors import ConfigError

__all__ = ["ConfigError", "Config", "register_configs", "validate", "config_dir"]

ACCELERATORS = ("auto", "gpu", "cpu")
STRATEGIES = ("auto", "mirrored", "one_device", "multi_worker", "default")
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduction_to_one_device", "collective")
LR_SCALING = ("linear", "sqrt", "none")
LOOPS = ("fit", "custom")
DECAYS = ("none", "cosine", "exponential")


@dataclass
class GpuConfig:
    memory_growth: bool = True
    memory_limit_mb: int | None = None


@dataclass
class BatchConfig:
    per_replica: int | None = None
    global_size: int | None = None
    drop_remainder: bool = False
    # micro-batches whose gradients are summed into one optimizer step (auto: from
    # max_per_replica), and the most examples one replica may take at once
    accumulate: Any = 1
    max_per_replica: int | None = None


@dataclass
class StrategyConfig:
    name: str = "auto"
    cross_device_ops: str = "auto"
    # multi_worker only: collective implementation, and seconds a training step may take
    # before the run fails as stuck (null: no limit; a crashed peer is caught by heartbeats)
    communication: str = "auto"
    timeout_s: float | None = 600.0


@dataclass
class ClusterConfig:
    workers: list[str] = field(default_factory=list)
    task_index: int = 0
    # SLURM job steps: the tasks on a node listen on port_base, port_base + 1, ...
    port_base: int = 8888


# The optimizer node is open: `_target_` names any Keras optimizer class (or the user's), its
# other keys are that class's arguments, and these keys are trainer's learning-rate plan,
# checked by `validate` and never passed to the class.
LR_PLAN = {"lr": 0.001, "reference_batch": 256, "lr_scaling": "linear", "warmup_epochs": 0.0,
           "decay": "none", "decay_rate": 0.1, "decay_epochs": 1.0, "staircase": True}


@dataclass
class CheckpointConfig:
    monitor: str = "val_accuracy"
    mode: str = "auto"
    save_best: bool = True
    # the checkpoint the test split is evaluated with at the end: best | last
    test_with: str = "best"
    backup_every: int = 0
    nan_check_every: int = 10


@dataclass
class FinetuneConfig:
    freeze_backbone: bool = False
    unfreeze_at_epoch: int | None = None
    unfreeze_layers: int | None = None
    backbone_lr_scale: float = 1.0


@dataclass
class CnnConfig:
    _target_: str = "trainer.models.cnn.build"
    dropout: float = 0.25


@dataclass
class MobileNetConfig:
    _target_: str = "trainer.models.mobilenet.build"
    alpha: float = 0.35


@dataclass
class Cifar10CnnConfig:
    _target_: str = "trainer.models.cifar10_cnn.build"
    weight_decay: float = 0.004


@dataclass
class KerasAppConfig:
    _target_: str = "trainer.models.keras_app.build"
    name: str = "MobileNetV2"
    weights: str | None = None
    input_size: int | None = None
    pooling: str = "avg"
    dropout: float = 0.2


@dataclass
class DigitsConfig:
    _target_: str = "trainer.data.digits.load"
    image_size: int = 32
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    cache: bool = True
    shuffle_buffer: int = 2048


@dataclass
class SyntheticConfig:
    _target_: str = "trainer.data.synthetic.load"
    train_examples: int = 2048
    validation_examples: int = 512
    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    cache: bool = True
    shuffle_buffer: int = 2048


@dataclass
class TfdsConfig:
    _target_: str = "trainer.data.tfds.load"
    name: str = MISSING
    train_split: str = "train"
    validation_split: str = "auto"
    test_split: str | None = "auto"
    validation_fraction: float = 0.1
    data_dir: str | None = None
    download: bool = True
    image_size: int | None = None
    cache: bool = True
    shuffle_buffer: int = 10000


@dataclass
class ImageFolderConfig:
    _target_: str = "trainer.data.image_folder.load"
    path: str = MISSING
    image_size: int = 64
    channels: int = 3
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    cache: bool = True
    shuffle_buffer: int = 10000


@dataclass
class Config:
    model: Any = MISSING
    dataset: Any = MISSING
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    optimizer: Any = MISSING
    # What is trained for: a Keras loss name or a `_target_` node; metric names or nodes;
    # callbacks by name, each a `_target_` node (null disables one).
    loss: Any = "sparse_categorical_crossentropy"
    metrics: Any = field(default_factory=lambda: ["accuracy"])
    callbacks: Any = field(default_factory=dict)
    seed: int | None = 42
    epochs: int = 8
    loop: str = "fit"
    steps_per_execution: Any = "auto"
    precision: str = "auto"
    jit_compile: Any = "auto"
    accelerator: str = "auto"
    devices: Any = "auto"
    soft_placement: bool = False
    log_device_placement: bool = False
    gpu: GpuConfig = field(default_factory=GpuConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    augment: Any = field(default_factory=list)
    # Trackers by name (`conf/logger/`), several at once.
    logger: Any = field(default_factory=dict)
    optimized_metric: str | None = None
    profile: Any = None
    verbose: Any = "auto"
    resume: str | None = None
    export: bool = False
    deterministic: bool = False


# Schemas for the built-in group options. A YAML file extends one through its defaults list
# (`- /schema/model/cnn@_here_`), so its keys and their types are checked at compose time;
# a user's own model or dataset YAML can skip this and stays untyped.
SCHEMAS = {
    "schema/model": {"cnn": CnnConfig, "mobilenet": MobileNetConfig,
                     "cifar10_cnn": Cifar10CnnConfig, "keras_app": KerasAppConfig},
    "schema/dataset": {"digits": DigitsConfig, "synthetic": SyntheticConfig,
                       "tfds": TfdsConfig, "image_folder": ImageFolderConfig},
}


def register_configs() -> None:
    """Registers the schema of the whole config and of the built-in group options."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            cs.store(group=group, name=name, node=node)


def config_dir() -> Path:
    """Returns the directory holding `config.yaml`, for a source checkout or an install.

    Returns:
        `trainer/conf` inside an installed wheel, else the repository's top-level `conf/`.
    """
    packaged = Path(__file__).resolve().parent / "conf"
    if (packaged / "config.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "conf"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _one_of(name: str, value: Any, options: tuple[str, ...]) -> None:
    _require(value in options,
             f"{name} must be one of {', '.join(map(str, options))}; received: {value!r}")


# Counts past this overflow TensorFlow's int32 shapes and indices.
INT_LIMIT = 2**31 - 1


def _positive_int(name: str, value: Any) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    _require(ok, f"{name} must be a positive integer; received: {value!r}")
    _require(value <= INT_LIMIT, f"{name} must be at most {INT_LIMIT}; received: {value!r}")


# Seeds every library takes as they are: TensorFlow treats a global seed of 0 specially (a
# per-epoch shuffle seed then fails in graph mode: OperatorNotAllowedInGraphError), NumPy
# refuses negative seeds and everything refuses seeds past 64 bits.
SEED_LIMIT = 2**31 - 1


def runtime_seed(seed: int | None) -> int | None:
    """The seed handed to Keras, TensorFlow, NumPy and the data order, for any integer.

    Seeds from 1 to 2**31 - 2 are used as they are; any other integer (0, negative, huge)
    maps to one in that range by a fixed hash, so every seed trains and is reproducible.

    Args:
        seed: the config's `seed`; None for no seeding.

    Returns:
        An int in [1, 2**31 - 2], or None.
    """
    if seed is None:
        return None
    if 0 < seed < SEED_LIMIT:
        return seed
    import hashlib

    digest = hashlib.sha256(str(int(seed)).encode()).hexdigest()
    return int(digest, 16) % (SEED_LIMIT - 1) + 1


def parse_devices(value: Any) -> str | int | tuple[int, ...]:
    """Normalises the `devices` option.

    Args:
        value: `"auto"`, a positive integer N (the first N devices), or a list of distinct
            non-negative device indices.

    Returns:
        `"auto"`, an int, or a tuple of ints.
    """
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool):
        _require(value > 0, f"devices must be auto, a positive count or a list of indices; "
                            f"received: {value!r}")
        return value
    if isinstance(value, (list, tuple, ListConfig)):
        indices = tuple(value)
        ok = bool(indices) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                   for i in indices) and len(set(indices)) == len(indices)
        _require(ok, f"devices must be a non-empty list of distinct non-negative indices; "
                     f"received: {list(indices)!r}")
        return indices
    raise ConfigError("devices must be auto, a positive count or a list of indices like [0,1]; "
                      f"received: {value!r}")


def _validate_profile(profile: Any) -> None:
    if profile is None:
        return
    steps = list(profile) if isinstance(profile, (list, tuple, ListConfig)) else None
    ok = (steps is not None and len(steps) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in steps)
          and steps[0] <= steps[1])
    _require(ok, "profile must be [first_step, last_step] with 1 <= first <= last, e.g. "
             f"profile=[5,8], or null; received: {profile!r}")


def validate(cfg: DictConfig) -> None:
    """Checks the values the schema cannot express, before TensorFlow is imported.

    Args:
        cfg: the composed config.

    Raises:
        ConfigError: naming the bad value and what would be valid.
    """
    missing = sorted(OmegaConf.missing_keys(cfg))
    _require(not missing, f"{', '.join(missing)} must be set (no default); e.g. "
             f"{missing[0] if missing else ''}=VALUE on the command line")
    _positive_int("epochs", cfg.epochs)
    from trainer.loggers import check_loggers

    check_loggers(cfg.logger)
    _validate_profile(cfg.profile)
    _one_of("checkpoint.test_with", cfg.checkpoint.test_with, ("best", "last"))
    from trainer.augment import check as check_augment
    from trainer.finetune import check as check_finetune

    check_augment(cfg.augment)

    check_finetune(cfg.finetune, str(cfg.optimizer.get("_target_", "")))
    metric = cfg.optimized_metric
    _require(metric is None or (isinstance(metric, str) and metric), "optimized_metric must be "
             f"a metric name such as val_accuracy, or null; received: {metric!r}")
    _one_of("loop", cfg.loop, LOOPS)
    _validate_speed(cfg)
    _one_of("accelerator", cfg.accelerator, ACCELERATORS)
    parse_devices(cfg.devices)
    _one_of("strategy.name", cfg.strategy.name, STRATEGIES)
    _one_of("strategy.cross_device_ops", cfg.strategy.cross_device_ops, CROSS_DEVICE_OPS)
    timeout = cfg.strategy.timeout_s
    _require(timeout is None or timeout > 0, "strategy.timeout_s must be a positive number of "
             f"seconds, or null for no timeout; received: {timeout!r}")
    per_replica, global_size = cfg.batch.per_replica, cfg.batch.global_size
    _require((per_replica is None) != (global_size is None),
             "set exactly one of batch.per_replica and batch.global_size; received: "
             f"per_replica={per_replica}, global_size={global_size}")
    name = "batch.per_replica" if per_replica is not None else "batch.global_size"
    _positive_int(name, per_replica if per_replica is not None else global_size)
    accumulate, cap = cfg.batch.accumulate, cfg.batch.max_per_replica
    if accumulate != "auto":
        _require(isinstance(accumulate, int) and not isinstance(accumulate, bool)
                 and accumulate > 0, "batch.accumulate must be a positive integer or auto; "
                 f"received: {accumulate!r}")
    if cap is not None:
        _positive_int("batch.max_per_replica", cap)
    _validate_optimizer(cfg.optimizer)
    _validate_task(cfg)
    _one_of("checkpoint.mode", cfg.checkpoint.mode, ("auto", "min", "max"))
    _require(cfg.checkpoint.backup_every >= 0, "checkpoint.backup_every must be >= 0 (0: each "
             f"epoch end only); received: {cfg.checkpoint.backup_every}")
    _positive_int("checkpoint.nan_check_every", cfg.checkpoint.nan_check_every)
    for group in ("model", "dataset"):
        node = cfg.get(group)
        _require(isinstance(node, DictConfig) and "_target_" in node,
                 f"{group} must name a builder with _target_; received: {node!r}")
    _validate_builders(cfg.model, cfg.dataset)


def _validate_speed(cfg: DictConfig) -> None:
    from trainer.speed import PRECISIONS

    _one_of("precision", cfg.precision, PRECISIONS)
    jit = cfg.jit_compile
    _require(jit == "auto" or isinstance(jit, bool),
             f"jit_compile must be auto, true or false; received: {jit!r}")
    steps = cfg.steps_per_execution
    if steps != "auto":
        _require(isinstance(steps, int) and not isinstance(steps, bool) and steps > 0,
                 f"steps_per_execution must be auto or a positive integer; received: {steps!r}")


def _validate_builders(model: DictConfig, dataset: DictConfig) -> None:
    """Ranges of the arguments the built-in models and datasets share, by name."""
    for key in ("image_size", "channels", "train_examples", "validation_examples",
                "shuffle_buffer"):
        if dataset.get(key) is not None:
            _positive_int(f"dataset.{key}", dataset[key])
    if model.get("input_size") is not None:
        _positive_int("model.input_size", model.input_size)
    if dataset.get("channels") is not None and "image" in str(dataset._target_):
        _one_of("dataset.channels", dataset.channels, (1, 3, 4))
    if dataset.get("num_classes") is not None:
        _positive_int("dataset.num_classes", dataset.num_classes)
        _require(dataset.num_classes >= 2, "dataset.num_classes must be at least 2 for a "
                 f"classifier; received: {dataset.num_classes!r}")
    fraction = dataset.get("validation_fraction")
    if fraction is not None:
        _require(isinstance(fraction, (int, float)) and 0 < fraction < 1,
                 "dataset.validation_fraction must be between 0 and 1 (exclusive); received: "
                 f"{fraction!r}")
    test = dataset.get("test_fraction")
    if test is not None:
        _require(isinstance(test, (int, float)) and 0 <= test < 1,
                 f"dataset.test_fraction must be in [0, 1); received: {test!r}")
        _require(test + (fraction or 0) < 1, "dataset.validation_fraction + "
                 f"dataset.test_fraction must leave examples to train on; received: "
                 f"{fraction!r} + {test!r}")
    dropout = model.get("dropout")
    if dropout is not None:
        _require(isinstance(dropout, (int, float)) and 0 <= dropout < 1,
                 f"model.dropout must be in [0, 1); received: {dropout!r}")


def _validate_optimizer(opt: Any) -> None:
    _require(isinstance(opt, DictConfig) and isinstance(opt.get("_target_"), str),
             f"optimizer must name a Keras optimizer class with _target_; received: {opt!r}")
    _require("learning_rate" not in opt, "optimizer.learning_rate is set by trainer from "
             "optimizer.lr, scaled to the global batch; set optimizer.lr instead")
    plan = {**LR_PLAN, **{k: opt[k] for k in LR_PLAN if k in opt}}
    for key in ("lr", "warmup_epochs", "decay_rate", "decay_epochs"):
        value = plan[key]
        _require(isinstance(value, (int, float)) and not isinstance(value, bool),
                 f"optimizer.{key} must be a number; received: {value!r}")
    _require(plan["lr"] > 0, f"optimizer.lr must be positive; received: {plan['lr']!r}")
    _positive_int("optimizer.reference_batch", plan["reference_batch"])
    _one_of("optimizer.lr_scaling", plan["lr_scaling"], LR_SCALING)
    _require(plan["warmup_epochs"] >= 0,
             f"optimizer.warmup_epochs must be >= 0; received: {plan['warmup_epochs']!r}")
    _one_of("optimizer.decay", plan["decay"], DECAYS)
    _require(0 < plan["decay_rate"] <= 1,
             f"optimizer.decay_rate must be in (0, 1]; received: {plan['decay_rate']!r}")
    _require(plan["decay_epochs"] > 0,
             f"optimizer.decay_epochs must be positive; received: {plan['decay_epochs']!r}")


def lr_plan(opt: DictConfig) -> dict[str, Any]:
    """The learning-rate plan keys of the optimizer node, with their defaults filled in."""
    return {**LR_PLAN, **{k: opt[k] for k in LR_PLAN if k in opt}}


def _validate_task(cfg: DictConfig) -> None:
    loss = cfg.loss
    _require(isinstance(loss, str) or (isinstance(loss, DictConfig) and "_target_" in loss),
             f"loss must be a Keras loss name or a node with _target_; received: {loss!r}")
    metrics = cfg.metrics
    _require(isinstance(metrics, ListConfig), "metrics must be a list of metric names or "
             f"nodes with _target_, e.g. [accuracy]; received: {metrics!r}")
    for metric in metrics:
        _require(isinstance(metric, str) or (isinstance(metric, DictConfig)
                                             and "_target_" in metric),
                 f"each of metrics must be a name or a node with _target_; received: {metric!r}")
    callbacks = cfg.callbacks
    _require(isinstance(callbacks, DictConfig), "callbacks must be a mapping of names to nodes "
             f"with _target_, e.g. callbacks=[early_stopping]; received: {callbacks!r}")
    for name, node in callbacks.items():
        _require(node is None or (isinstance(node, DictConfig) and "_target_" in node),
                 f"callbacks.{name} must be a node with _target_ (or null to disable it); "
                 f"received: {node!r}")
    loggers = cfg.logger or {}
    if "csv" in loggers:
        file = (loggers.get("csv") or {}).get("filename", "metrics.csv")
        for name, node in callbacks.items():
            _require(node is None or not str(node._target_).endswith("CSVLogger")
                     or node.get("filename") != file,
                     f"logger=[csv] and callbacks.{name} would both append to {file}; keep "
                     f"one of them (e.g. drop {name} from callbacks)")


# Words in metric names that say which way is better, for metrics that do not say it
# themselves (a Keras metric's `_direction`).
RISING = ("acc", "auc", "precision", "recall", "f1", "iou", "r2")
FALLING = ("loss", "error", "mae", "mse", "mape", "msle", "crossentropy", "hinge",
           "divergence", "poisson", "cosh")


def monitor_mode(monitor: str, mode: str = "auto",
                 directions: dict[str, str] | None = None) -> str:
    """Resolves whether the best checkpoint has the highest or the lowest `monitor`.

    Keras infers this from compiled metrics, which a custom loop never builds, so it is
    decided here: from the metric's own direction where known (`directions`, name to
    `up`/`down`), else from its name: accuracies and AUCs up, losses and errors down.

    Args:
        monitor: a logged metric name, e.g. `val_accuracy`.
        mode: `auto`, `min` or `max`.
        directions: the run's metrics' directions by name, where they declare one.

    Returns:
        `min` or `max`.
    """
    if mode != "auto":
        return mode
    name = monitor.removeprefix("val_")
    direction = (directions or {}).get(name)
    if direction in ("up", "down"):
        return "max" if direction == "up" else "min"
    if any(word in name for word in FALLING):
        return "min"
    if any(word in name for word in RISING):
        return "max"
    raise ConfigError(f"cannot tell whether checkpoint.monitor={monitor!r} should rise or fall; "
                      "set checkpoint.mode=max or checkpoint.mode=min")
