"""Config schema: typed by dataclasses, checked by Hydra at compose time.

Nothing here imports TensorFlow: a bad config must fail before the runtime starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from trainer.config.image_size import register_resolver
from trainer.config.strategies import KINDS

ACCELERATORS = ("auto", "gpu", "cpu")
# The built-in kinds of strategy (`trainer.config.strategies`), and auto: one of them.
STRATEGIES = ("auto", *KINDS)
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduction_to_one_device", "collective")
LR_SCALING = ("linear", "sqrt", "none")
LOOPS = ("fit", "custom")
# What `export=[...]` may write (`true`: saved_model); see trainer.models.export.
EXPORT_FORMATS = ("saved_model", "tflite", "onnx")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
DECAYS = ("none", "cosine", "exponential")


@dataclass
class GpuConfig:
    memory_growth: Any = True  # true or false, checked as such (not 2, not 'yes')
    memory_limit_mb: int | None = None


@dataclass
class BatchConfig:
    per_replica: int | None = None
    global_size: int | None = None
    drop_remainder: Any = False  # true or false, checked as such (not 2, not 'yes')
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
    # multi_worker only: seconds a worker waits at start for the others (null: no limit)
    start_timeout_s: float | None = 300.0


@dataclass
class ClusterConfig:
    workers: list[str] = field(default_factory=list)
    task_index: int = 0
    # SLURM job steps: the tasks on a node listen on port_base, port_base + 1, ...
    port_base: int = 8888
    # host:port of an evaluator validating each checkpoint beside the workers (null: none)
    evaluator: str | None = None
    # launched by SLURM or Kubernetes: a lost peer ends every worker with 75 ("start me
    # again") instead of 4, up to this many restarts (SLURM_RESTART_COUNT counts them)
    max_restarts: int = 0
    # a Kubernetes Indexed Job's (or JobSet's) pod count, its completions: its pods form one
    # cluster (0: they do not; an Indexed Job may be an array of independent runs)
    size: int = 0


# The optimizer node is open: `_target_` names any Keras optimizer class (or the user's), its
# other keys are that class's arguments, and the fields of `LrPlan` are trainer's
# learning-rate plan, checked by `validate` and never passed to the class.
@dataclass(frozen=True)
class LrPlan:
    """The learning-rate plan as the optimizer node states it (defaults filled in)."""

    lr: float = 0.001
    # the batch `lr` was tuned at: a number (Goyal et al.'s reference batch), or `auto`, the
    # batch of one optimizer step in the user's one-device script (`reference_for`)
    reference_batch: Any = "auto"
    lr_scaling: str = "linear"
    warmup_epochs: float = 0.0
    decay: str = "none"
    decay_rate: float = 0.1
    decay_epochs: float = 1.0
    staircase: bool = True
    # set by `resolved`: whether `reference_batch` was `auto` (not a key of the node)
    reference_auto: bool = False

    def reference_for(self, per_replica: int | None, global_size: int | None) -> int:
        """`reference_batch` as a number: `auto` is the batch of one optimizer step of the same
        config on one device, `batch.per_replica` (so `lr` scales with the replicas in sync
        and the accumulated micro-batches) or a fixed `batch.global_size` (then the rate is
        the same on any device count)."""
        if self.reference_batch != "auto":
            return self.reference_batch
        return per_replica if per_replica is not None else global_size

    def resolved(self, per_replica: int | None, global_size: int | None) -> LrPlan:
        """The plan with `reference_batch` a number (`reference_for`) and `reference_auto`
        saying whether it was `auto`."""
        number = self.reference_for(per_replica, global_size)
        return replace(self, reference_batch=number,
                       reference_auto=self.reference_batch == "auto")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The optimizer node's keys that belong to the plan, not to the optimizer class."""
        return tuple(f.name for f in fields(cls) if f.name != "reference_auto")

    @classmethod
    def of(cls, opt: Any) -> LrPlan:
        """The plan of an optimizer node: its plan keys, the defaults for the others."""
        return cls(**{k: opt[k] for k in cls.keys() if k in opt})


# The optimizer node's keys of trainer's weight averaging: `ema` turns on Keras's `use_ema` at
# `ema_momentum` (passed to the class only then), so any optimizer node may carry them.
EMA_KEYS = ("ema", "ema_momentum")


@dataclass
class RecoverConfig:
    # a training loss above this (or not finite) restores the last backup (null: not finite
    # only); max_trials: how often a run recovers so (0: off, a non-finite loss stops it)
    loss_upper_bound: float | None = None
    max_trials: int = 0


@dataclass
class CheckpointConfig:
    monitor: str = "val_accuracy"
    mode: str = "auto"
    save_best: bool = True
    # the checkpoint the test split is evaluated with at the end: best | last
    test_with: str = "best"
    # the k best epochs by `monitor`, kept as files of their own (0: none)
    keep_best: int = 0
    # the mean of the `average_best` best of them, tested at the end (0: none)
    average_best: int = 0
    # the weights `export` writes: last (the final ones) | averaged (averaged.keras)
    export_with: str = "last"
    backup_every: int = 0
    nan_check_every: int = 10
    recover: RecoverConfig = field(default_factory=RecoverConfig)


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
    # the smallest image side the model takes; the built-in datasets resize up to it
    # (trainer.config.image_size)
    min_image_size: int | None = 32


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
    # the smallest image side the backbone takes, where input_size does not resize
    min_image_size: int | None = 32


@dataclass(frozen=True)
class DataService:
    """`dataset.service` read: `kind` `local` with `where` K (services started beside the
    run) or `grpc` with `where` `HOST:PORT` (a running dispatcher); `value` as written."""

    kind: str
    where: int | str
    value: str


@dataclass
class PipelineOptions:
    """The pipeline's keys every dataset node has (`keys()`): how its examples are cached,
    shuffled, shared among workers and served, never passed to the source's builder. Each
    source's schema adds its own keys after them.

    As a run's record (`Spec.pipeline`), it is what `trainer.config.validate.read_pipeline`
    read from the dataset node, once: `cache` one of `memory`, `disk`, `none`, and
    `served` the parsed `service` (not a config key: OmegaConf leaves it out).
    """

    _target_: str = MISSING
    cache: str = "memory"
    # false: the source's order every epoch (Keras's fit(shuffle=False))
    shuffle: bool = True
    shuffle_buffer: int = 2048
    memory_limit_mb: int | None = None
    lanes: int = 1
    service: str | None = None
    served: DataService | None = field(default=None, metadata={"omegaconf_ignore": True})

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The dataset node's keys that are the pipeline's (its builder never sees them)."""
        return tuple(f.name for f in fields(PipelineOptions)
                     if f.name != "_target_" and not f.metadata.get("omegaconf_ignore"))

    @property
    def buffer(self) -> int:
        """The training order's shuffle buffer: `shuffle_buffer`, 0 with `shuffle=false`
        (the source's order, every epoch, as Keras's `fit(shuffle=False)`)."""
        return self.shuffle_buffer if self.shuffle else 0


@dataclass
class DigitsConfig(PipelineOptions):
    _target_: str = "trainer.data.digits.load"
    image_size: int = 8
    validation_fraction: float = 0.1
    test_fraction: float = 0.1


@dataclass
class SyntheticConfig(PipelineOptions):
    _target_: str = "trainer.data.synthetic.load"
    train_examples: int = 2048
    validation_examples: int = 512
    image_size: int = 32
    channels: int = 3
    num_classes: int = 10


@dataclass
class TfdsConfig(PipelineOptions):
    _target_: str = "trainer.data.tfds.load"
    name: str = MISSING
    train_split: str = "train"
    validation_split: str = "auto"
    test_split: str | None = "auto"
    validation_fraction: float = 0.1
    data_dir: str | None = None
    download: bool = True
    image_size: int | None = None
    shuffle_buffer: int = 10000


@dataclass
class ImageFolderConfig(PipelineOptions):
    _target_: str = "trainer.data.image_folder.load"
    path: str = MISSING
    image_size: int = 64
    channels: int = 3
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    shuffle_buffer: int = 10000


@dataclass
class TfrecordConfig(PipelineOptions):
    _target_: str = "trainer.data.tfrecords.load"
    path: str = MISSING
    image_size: int | None = 64
    channels: int = 3
    # records other than images: {name: {dtype, shape}}, and which the model takes / predicts
    features: Any = None
    inputs: Any = None
    outputs: Any = None
    num_classes: int | None = None
    label_offset: int = 0
    shuffle_buffer: int = 10000


@dataclass
class TunerConfig:
    """`tune=lr`: `steps` steps at rates from `lr_min` to `lr_max` (exponentially, at the
    run's global batch), stopped once the smoothed loss passes `diverge_factor` times its
    best. `tune=batch`: per-replica batches doubling from `batch_min` to `batch_max`."""

    steps: int = 100
    lr_min: float = 1e-5
    lr_max: float = 1.0
    diverge_factor: float = 4.0
    batch_min: int = 8
    batch_max: int = 1024


TUNERS = ("lr", "batch")


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
    # null: [accuracy] for class targets, none otherwise (a mapping replaces null; OmegaConf
    # cannot merge a mapping over a list)
    metrics: Any = None
    # Keras's compile(weighted_metrics=...): metrics weighted by the sample (and class)
    # weights, in the same forms as `metrics`; null: none.
    weighted_metrics: Any = None
    # Multi-output models: loss and metrics may be mappings per output name, and the
    # outputs' losses are weighted by loss_weights (a mapping, as Keras's compile takes it).
    loss_weights: Any = None
    # Keras's class_weight: {class index: weight}, applied to the training examples.
    class_weight: Any = None
    callbacks: Any = field(default_factory=dict)
    seed: int | None = 42
    epochs: int = 8
    loop: str = "fit"
    steps_per_execution: Any = "auto"
    precision: str = "auto"
    jit_compile: Any = "auto"
    accelerator: str = "auto"
    devices: Any = "auto"
    soft_placement: Any = False  # true or false, checked as such (not 2, not 'yes')
    log_device_placement: Any = False  # true or false, checked as such (not 2, not 'yes')
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
    # Export formats after training: a list of EXPORT_FORMATS; true: [saved_model]; false: none.
    export: Any = False
    deterministic: Any = False  # true or false, checked as such (not 2, not 'yes')
    # Every BatchNormalization normalizes with the global batch's statistics (all replicas'),
    # as on one replica; false: each replica's own (trainer.distribute.runtime).
    sync_batchnorm: Any = False  # true or false, checked as such (not 2, not 'yes')
    # The last fraction of the training examples held out for validation, as Keras's
    # fit(validation_split=...), for a dataset without a validation split; null: none.
    validation_split: float | None = None
    # Keras's fit(steps_per_epoch=..., validation_steps=...): training steps per epoch, read
    # from one stream across epochs (needed for a dataset that repeats for ever), and the
    # validation batches read at each epoch's end; null: one pass over each split.
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    # Tune before training instead of training: lr (a learning-rate range test) or batch
    # (the per-replica batch's throughput curve and the largest that fits); null: train.
    tune: str | None = None
    tuner: TunerConfig = field(default_factory=TunerConfig)


# Schemas for the built-in group options. A YAML file extends one through its defaults list
# (`- /schema/model/cnn@_here_`), so its keys and their types are checked at compose time;
# a user's own model or dataset YAML can skip this and stays untyped.
SCHEMAS = {
    "schema/model": {"cnn": CnnConfig, "mobilenet": MobileNetConfig,
                     "cifar10_cnn": Cifar10CnnConfig, "keras_app": KerasAppConfig},
    "schema/dataset": {"digits": DigitsConfig, "synthetic": SyntheticConfig,
                       "tfds": TfdsConfig, "image_folder": ImageFolderConfig,
                       "tfrecord": TfrecordConfig},
}


def register_configs() -> None:
    """Registers the schema of the whole config and of the built-in group options, and the
    resolvers the built-in YAML files use (`${trainer.image_size:8}`)."""
    register_resolver()
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
    package = Path(__file__).resolve().parent.parent  # trainer/
    packaged = package / "conf"
    if (packaged / "config.yaml").is_file():
        return packaged
    return package.parent / "conf"
