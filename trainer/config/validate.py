"""Checks of the values the schema cannot express (ranges, one-of choices, combinations).

The checks that belong to one part of a run (a tracker's package, an augmentation preset,
fine-tuning options) live with that part and are run beside these by the pre-flight
(`trainer.run.prepare.preflight`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from trainer.config.errors import ConfigError
from trainer.config.image_size import check_image_size
from trainer.config.schema import (
    ACCELERATORS,
    CROSS_DEVICE_OPS,
    DECAYS,
    EXPORT_FORMATS,
    LOOPS,
    LR_SCALING,
    PRECISIONS,
    STRATEGIES,
    TUNERS,
    Config,
    DataService,
    LrPlan,
    PipelineOptions,
)
from trainer.config.strategies import is_own


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


def export_formats(value: Any) -> tuple[str, ...]:
    """Normalises the `export` option.

    Args:
        value: `true` (a SavedModel, as before export formats), `false`, `null` or `[]`
            (nothing), one format name, or a list of them (`EXPORT_FORMATS`).

    Returns:
        The formats to write, each once, in the order given.
    """
    valid = f"valid: true, false or a list of {', '.join(EXPORT_FORMATS)}"
    if value is None or value is False:
        return ()
    if value is True:
        return ("saved_model",)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple, ListConfig)):
        raise ConfigError(f"export must be true, false or a list of formats; {valid}; "
                          f"received: {value!r}")
    names = list(names)
    for name in names:
        _require(isinstance(name, str) and name in EXPORT_FORMATS,
                 f"export: unknown format {name!r}; {valid}")
    return tuple(dict.fromkeys(names))


def _validate_profile(profile: Any) -> None:
    if profile is None:
        return
    steps = list(profile) if isinstance(profile, (list, tuple, ListConfig)) else None
    ok = (steps is not None and len(steps) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in steps)
          and steps[0] <= steps[1])
    _require(ok, "profile must be [first_step, last_step] with 1 <= first <= last, e.g. "
             f"profile=[5,8], or null; received: {profile!r}")


# Nodes whose keys are their builders' arguments (checked by the builder), not the schema's.
OPEN_NODES = ("model", "dataset", "optimizer", "callbacks", "logger", "hydra", "loss",
              "metrics", "weighted_metrics", "loss_weights", "class_weight", "augment",
              "profile", "devices",
              "steps_per_execution", "jit_compile", "verbose", "hparams_search", "experiment")


def unknown_keys(cfg: DictConfig) -> None:
    """Refuses a key no part of a run reads (`+epoch=1`, a typo in an experiment file).

    Hydra's `+key=value` adds a key even where the schema has none; the schema's typed
    sections (`batch`, `checkpoint`, ...) and the top level are checked here, the open
    nodes by the builders their keys are passed to.
    """
    def check(node: Any, schema: type, prefix: str) -> None:
        known = {f.name: f for f in fields(schema)}
        for key in node:
            name = f"{prefix}{key}"
            if key not in known:
                close = sorted(k for k in known if k[:3] == str(key)[:3])
                hint = f" (did you mean {close[0]}?)" if close else ""
                _require(False, f"unknown key {name}{hint}: no part of a run reads it; "
                         "remove it, or see conf/config.yaml for the keys there are")
            default = known[key].default_factory() if callable(
                known[key].default_factory) else None
            if is_dataclass(default) and key not in OPEN_NODES and isinstance(node[key],
                                                                              DictConfig):
                check(node[key], type(default), f"{name}.")

    check({k: cfg[k] for k in cfg if k not in ("hydra",)}, Config, "")


def _plain(value: Any) -> Any:
    """A config value as plain data, for a message."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value)
    return value


def _validate_weights(cfg: DictConfig) -> None:
    weights = cfg.get("class_weight")
    if weights is not None:
        ok = isinstance(weights, DictConfig) and len(weights) > 0
        for key, value in (weights.items() if ok else []):
            ok = ok and str(key).isdigit() and isinstance(value, (int, float)) \
                and not isinstance(value, bool) and value >= 0
        _require(ok, "class_weight must map class indices to non-negative weights, e.g. "
                 "class_weight='{0: 1.0, 1: 5.0}'; received: "
                 f"{_plain(weights)!r}")
    loss_weights = cfg.get("loss_weights")
    _require(loss_weights is None or _numbers(loss_weights),
             "loss_weights must be a number, or map output names to numbers (or list them "
             f"in output order, nested as the outputs are); received: {_plain(loss_weights)!r}")
    # As a negative class weight is refused: a negative loss weight trains by maximizing
    # that output's loss, silently.
    _require(loss_weights is None or _non_negative(loss_weights),
             "loss_weights must be non-negative (a negative weight trains by maximizing its "
             f"output's loss; 0 leaves an output untrained); received: "
             f"{_plain(loss_weights)!r}")


def _numbers(value: Any) -> bool:
    """A number, or a non-empty list or mapping of numbers (nested as a model's outputs)."""
    if isinstance(value, (DictConfig, ListConfig)):
        items = list(value.values()) if isinstance(value, DictConfig) else list(value)
        return len(items) > 0 and all(_numbers(v) for v in items)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _non_negative(value: Any) -> bool:
    """Every number of a (nested) list or mapping of numbers is >= 0."""
    if isinstance(value, (DictConfig, ListConfig)):
        items = list(value.values()) if isinstance(value, DictConfig) else list(value)
        return all(_non_negative(v) for v in items)
    return value >= 0


def finite_numbers(cfg: DictConfig) -> None:
    """Refuses NaN and infinity anywhere in the config (Hydra's own node aside).

    No rate, count, fraction or weight of a run is infinite: `optimizer.lr=inf` trained to
    a NaN validation loss with exit 0. YAML reads `inf`, `.nan` and any literal past the
    float range (`1e400`) as such a value, so the message says so.
    """
    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                walk(value, f"{key}.{name}" if key else str(name))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{key}[{i}]")
        elif isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{key} must be a finite number; received: {node} (YAML reads "
                              "inf, nan and any number past 1.8e308, such as 1e400, as such)")

    plain = OmegaConf.create({k: cfg[k] for k in cfg if k != "hydra"})
    try:
        values = OmegaConf.to_container(plain, resolve=True, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an interpolation that fails is reported where read
        values = OmegaConf.to_container(plain, resolve=False, throw_on_missing=False)
    walk(values, "")


def _validate_tune(cfg: DictConfig) -> None:
    """`tune=lr|batch` tunes a new run on one machine, with a range that makes sense."""
    tune, tuner = cfg.get("tune"), cfg.tuner
    if tune is None:
        return
    _one_of("tune", tune, TUNERS)
    _require(not cfg.get("resume"), f"tune={tune} tunes a new run, not a finished one; "
             f"received: resume={cfg.get('resume')} (drop resume, or tune)")
    _require(cfg.strategy.name != "multi_worker" and not list(cfg.cluster.workers),
             f"tune={tune} runs on one machine; received a multi-worker run (drop "
             "strategy=multi_worker and cluster.workers to tune, then train on the cluster)")
    _positive_int("tuner.steps", tuner.steps)
    _require(tuner.steps >= 5, f"tuner.steps must be at least 5; received: {tuner.steps}")
    _require(0 < tuner.lr_min < tuner.lr_max, "tuner.lr_min and tuner.lr_max must satisfy "
             f"0 < lr_min < lr_max; received: {tuner.lr_min}, {tuner.lr_max}")
    _require(math.isfinite(tuner.lr_max / tuner.lr_min), "tuner.lr_max / tuner.lr_min must be "
             f"a finite ratio (the rates grow by it); received: {tuner.lr_max} / "
             f"{tuner.lr_min}, which overflows: raise tuner.lr_min")
    _require(tuner.diverge_factor > 1, "tuner.diverge_factor must be above 1; received: "
             f"{tuner.diverge_factor}")
    _positive_int("tuner.batch_min", tuner.batch_min)
    _require(tuner.batch_max >= tuner.batch_min, "tuner.batch_max must be at least "
             f"tuner.batch_min; received: {tuner.batch_max} < {tuner.batch_min}")


@dataclass(frozen=True)
class Parsed:
    """The values `validate` parses on its way, each once: the run's `Spec`
    (`trainer.run.prepare.resolve`) takes them from here, and later code reads the `Spec`.

    Attributes:
        devices: `devices` as `parse_devices` returns it.
        export: `export` as `export_formats` returns it.
        pipeline: the dataset node's pipeline options as `read_pipeline` returns them.
    """

    devices: str | int | tuple[int, ...]
    export: tuple[str, ...]
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)


def _validate_batch(batch: Any) -> None:
    """Exactly one of the per-replica and global batch, each a positive integer; the
    accumulation and the cap."""
    per_replica, global_size = batch.per_replica, batch.global_size
    alone = (f" (the global batch alone: batch.per_replica=null batch.global_size="
             f"{global_size}; trainer.fit drops the default per_replica itself)"
             if per_replica is not None and global_size is not None else "")
    _require((per_replica is None) != (global_size is None),
             "set exactly one of batch.per_replica and batch.global_size; received: "
             f"per_replica={per_replica}, global_size={global_size}{alone}")
    name = "batch.per_replica" if per_replica is not None else "batch.global_size"
    _positive_int(name, per_replica if per_replica is not None else global_size)
    accumulate, cap = batch.accumulate, batch.max_per_replica
    if accumulate != "auto":
        _require(isinstance(accumulate, int) and not isinstance(accumulate, bool)
                 and accumulate > 0, "batch.accumulate must be a positive integer or auto; "
                 f"received: {accumulate!r}")
    if cap is not None:
        _positive_int("batch.max_per_replica", cap)


def validate(cfg: DictConfig) -> Parsed:
    """Checks the values the schema cannot express, before TensorFlow is imported.

    Args:
        cfg: the composed config.

    Returns:
        The values parsed on the way (`devices`, `export`, the pipeline's options), for
        the run's `Spec`.

    Raises:
        ConfigError: naming the bad value and what would be valid.
    """
    missing = sorted(OmegaConf.missing_keys(cfg))
    _require(not missing, f"{', '.join(missing)} must be set (no default); e.g. "
             f"{missing[0] if missing else ''}=VALUE on the command line")
    unknown_keys(cfg)
    finite_numbers(cfg)
    _positive_int("epochs", cfg.epochs)
    _validate_profile(cfg.profile)
    export = export_formats(cfg.export)
    _validate_weights(cfg)
    _one_of("checkpoint.test_with", cfg.checkpoint.test_with, ("best", "last"))
    validate_averaging(cfg.checkpoint, cfg.optimizer)
    metric = cfg.optimized_metric
    _require(metric is None or (isinstance(metric, str) and metric), "optimized_metric must be "
             f"a metric name such as val_accuracy, or null; received: {metric!r}")
    _one_of("loop", cfg.loop, LOOPS)
    _validate_tune(cfg)
    _validate_speed(cfg, export)
    _validate_verbose(cfg.verbose)
    _one_of("accelerator", cfg.accelerator, ACCELERATORS)
    devices = parse_devices(cfg.devices)
    _validate_strategy(cfg.strategy)
    _validate_flags(cfg)
    _validate_ports(cfg.cluster)
    _validate_batch(cfg.batch)
    _validate_optimizer(cfg.optimizer)
    _validate_task(cfg)
    _one_of("checkpoint.mode", cfg.checkpoint.mode, ("auto", "min", "max"))
    _require(cfg.checkpoint.backup_every >= 0, "checkpoint.backup_every must be >= 0 (0: each "
             f"epoch end only); received: {cfg.checkpoint.backup_every}")
    _positive_int("checkpoint.nan_check_every", cfg.checkpoint.nan_check_every)
    _validate_healing(cfg)
    for group in ("model", "dataset"):
        node = cfg.get(group)
        _require(isinstance(node, DictConfig) and "_target_" in node,
                 f"{group} must name a builder with _target_; received: {node!r}")
    pipeline = _validate_builders(cfg.model, cfg.dataset)
    check_image_size(cfg)
    return Parsed(devices, export, pipeline)


# Switches that are true or false: never 2, 'yes' or 1, which a bool field of the schema
# would coerce to true without a word.
FLAGS = ("gpu.memory_growth", "batch.drop_remainder", "soft_placement",
         "log_device_placement", "deterministic", "sync_batchnorm")
# The ports a process may listen on.
PORTS = (1, 65535)


def _validate_flags(cfg: DictConfig) -> None:
    for key in FLAGS:
        value = OmegaConf.select(cfg, key)
        _require(isinstance(value, bool), f"{key} must be true or false; received: {value!r}")


def _validate_ports(cluster: DictConfig) -> None:
    """`cluster.port_base`: the first of the ports a node's tasks listen on, one each."""
    base = cluster.port_base
    _require(isinstance(base, int) and not isinstance(base, bool)
             and PORTS[0] <= base <= PORTS[1], f"cluster.port_base must be a port number, "
             f"{PORTS[0]} to {PORTS[1]}; received: {base!r}")


def _validate_strategy(strategy: DictConfig) -> None:
    if is_own(strategy.name):  # a StrategyKind of the user's, imported once TensorFlow runs
        _importable("strategy.name", strategy.name)
    else:
        _one_of("strategy.name", strategy.name, STRATEGIES)
    _one_of("strategy.cross_device_ops", strategy.cross_device_ops, CROSS_DEVICE_OPS)
    # checked here, not only once a multi-worker strategy is built: a typo is one line now
    _one_of("strategy.communication", strategy.communication, ("auto", "ring", "nccl"))
    for key in ("timeout_s", "start_timeout_s"):
        timeout = strategy.get(key)
        _require(timeout is None or 0 < timeout < float("inf"), f"strategy.{key} must be a "
                 f"positive number of seconds, or null for no timeout; received: {timeout!r}")


def _validate_speed(cfg: DictConfig, export: tuple[str, ...]) -> None:
    _one_of("precision", cfg.precision, PRECISIONS)
    if cfg.precision.startswith("mixed_") and "tflite" in export:
        # Measured: the converted file holds Flex ops (FlexConv2D) that TFLite's interpreter
        # cannot run, so the export's check failed after the whole training.
        rest = ",".join(f for f in export if f != "tflite")
        raise ConfigError(f"export=[tflite] cannot hold a precision={cfg.precision} model: "
                          f"TFLite has no {cfg.precision[6:]} kernels for its layers (the file "
                          "would need TensorFlow's Flex ops, which TFLite's interpreter does "
                          "not run); use precision=float32, or leave tflite out: "
                          f"export=[{rest}]")
    jit = cfg.jit_compile
    _require(jit == "auto" or isinstance(jit, bool),
             f"jit_compile must be auto, true or false; received: {jit!r}")
    steps = cfg.steps_per_execution
    if steps != "auto":
        _require(isinstance(steps, int) and not isinstance(steps, bool) and steps > 0,
                 f"steps_per_execution must be auto or a positive integer; received: {steps!r}")


# What Keras's fit takes as `verbose` (the custom loop reads it the same way); a bool is
# refused, not read as 0 or 1.
VERBOSE = (0, 1, 2, "auto")


def _validate_verbose(verbose: Any) -> None:
    ok = not isinstance(verbose, bool) and verbose in VERBOSE
    _require(ok, "verbose must be 0 (silent), 1 (progress bar), 2 (a line per epoch) or auto; "
             f"received: {_plain(verbose)!r}")


# Where the input pipeline keeps preprocessed (decoded) elements between epochs: in memory,
# in files under the run directory, or nowhere (every epoch reads and decodes again).
CACHE_MODES = ("memory", "disk", "none")
# `dataset.cache` was a bool before it had modes: true kept the elements in memory.
CACHE_BOOLS = {"true": "memory", "false": "none"}


def cache_mode(value: Any) -> str:
    """`dataset.cache` as `memory`, `disk` or `none`; `true` and `false` (the older
    spelling, still in configs and in the backups of older runs) as `memory` and `none`.

    Raises:
        ConfigError: any other value, named with the valid ones.
    """
    if isinstance(value, bool):
        return "memory" if value else "none"
    text = str(value).strip().lower()
    text = CACHE_BOOLS.get(text, text)
    _require(text in CACHE_MODES, "dataset.cache must be memory, disk or none (true and false "
             f"mean memory and none); received: {value!r}")
    return text


# `dataset.service`: where the training split's preprocessing runs (TensorFlow's tf.data
# service): K one-worker services started in this process, or a running dispatcher.
SERVICE_LOCAL = re.compile(r"local:(\d+)")
SERVICE_GRPC = re.compile(r"grpc://([^\s:/]+|\[[0-9a-fA-F:]+\]):(\d+)")
SERVICE_MAX_LOCAL = 64


def service_of(value: Any) -> tuple[str, Any] | None:
    """`dataset.service` parsed: `("local", K)`, `("grpc", "HOST:PORT")` or None (off).

    Raises:
        ConfigError: any other value, named with the valid forms.
    """
    if value is None or str(value).strip().lower() in ("", "none", "null", "off"):
        return None
    text = str(value).strip()
    local, grpc = SERVICE_LOCAL.fullmatch(text), SERVICE_GRPC.fullmatch(text)
    if local and 1 <= int(local[1]) <= SERVICE_MAX_LOCAL:
        return "local", int(local[1])
    if grpc and 1 <= int(grpc[2]) <= 65535:
        return "grpc", f"{grpc[1]}:{grpc[2]}"
    raise ConfigError(f"dataset.service must be local:K (K tf.data service workers started "
                      f"beside the run, 1 <= K <= {SERVICE_MAX_LOCAL}), grpc://HOST:PORT (a "
                      f"running tf.data dispatcher) or null (no service); received: {value!r}")


def read_pipeline(dataset: Any) -> PipelineOptions:
    """The dataset node's pipeline options (`PipelineOptions.keys()`), read once for the
    run: `cache` as its mode (`cache_mode`), `service` parsed (`served`), the defaults
    where a node (a user's own, with no schema) leaves a key out.

    Args:
        dataset: the dataset node (a `DictConfig` or a mapping), its ranges checked.

    Raises:
        ConfigError: a bad `cache` or `service`, or `dataset.cache=disk` beside a
            dispatcher's service (the files would go to another machine's workers).
    """
    served = service_of(dataset.get("service"))
    options = PipelineOptions(
        _target_=str(dataset.get("_target_")), cache=cache_mode(dataset.get("cache", True)),
        shuffle=dataset.get("shuffle") is not False,
        shuffle_buffer=int(dataset.get("shuffle_buffer") or 2048),
        memory_limit_mb=dataset.get("memory_limit_mb"), lanes=int(dataset.get("lanes") or 1),
        service=None if served is None else str(dataset.get("service")),
        served=None if served is None else DataService(*served, str(dataset.get("service"))))
    _require(served is None or served[0] != "grpc" or options.cache != "disk",
             "dataset.cache=disk writes its files where the preprocessing runs, which with "
             f"dataset.service={options.service} is another machine's tf.data workers; use "
             "dataset.cache=memory (kept by those workers) or none")
    return options


def _validate_builders(model: DictConfig, dataset: DictConfig) -> PipelineOptions:
    """Ranges of the arguments the built-in models and datasets share, by name; returns
    the pipeline's options, read (`read_pipeline`)."""
    for key in ("image_size", "channels", "train_examples", "validation_examples",
                "shuffle_buffer", "memory_limit_mb", "lanes"):
        if dataset.get(key) is not None:
            _positive_int(f"dataset.{key}", dataset[key])
    pipeline = read_pipeline(dataset)
    for key in ("input_size", "min_image_size"):
        if model.get(key) is not None:
            _positive_int(f"model.{key}", model[key])
    if dataset.get("channels") is not None and ("image" in str(dataset._target_)
                                                or "tfrecords" in str(dataset._target_)):
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
    return pipeline


def _validate_optimizer(opt: Any) -> None:
    _require(isinstance(opt, DictConfig) and isinstance(opt.get("_target_"), str),
             f"optimizer must name a Keras optimizer class with _target_; received: {opt!r}")
    _require("learning_rate" not in opt, "optimizer.learning_rate is set by trainer from "
             "optimizer.lr, scaled to the global batch; set optimizer.lr instead")
    plan = {k: opt[k] for k in LrPlan.keys() if k in opt}
    for key in ("lr", "warmup_epochs", "decay_rate", "decay_epochs"):
        value = plan.get(key, 1)
        _require(isinstance(value, (int, float)) and not isinstance(value, bool),
                 f"optimizer.{key} must be a number; received: {value!r}")
    plan = LrPlan.of(opt)
    _require(plan.lr > 0, f"optimizer.lr must be positive; received: {plan.lr!r}")
    if plan.reference_batch != "auto":
        _require(isinstance(plan.reference_batch, int) and not isinstance(
            plan.reference_batch, bool) and plan.reference_batch > 0,
                 "optimizer.reference_batch must be auto (the per-replica batch, or a fixed "
                 "batch.global_size) or a positive whole number; received: "
                 f"{plan.reference_batch!r}")
    _one_of("optimizer.lr_scaling", plan.lr_scaling, LR_SCALING)
    _require(plan.warmup_epochs >= 0,
             f"optimizer.warmup_epochs must be >= 0; received: {plan.warmup_epochs!r}")
    _one_of("optimizer.decay", plan.decay, DECAYS)
    _require(0 < plan.decay_rate <= 1,
             f"optimizer.decay_rate must be in (0, 1]; received: {plan.decay_rate!r}")
    _require(plan.decay_epochs > 0,
             f"optimizer.decay_epochs must be positive; received: {plan.decay_epochs!r}")


def _validate_healing(cfg: DictConfig) -> None:
    """`cluster.max_restarts` and `checkpoint.recover.max_trials`: whole numbers (the schema
    and the finite-number check above take care of `checkpoint.recover.loss_upper_bound`)."""
    _whole("cluster.max_restarts", cfg.cluster.get("max_restarts", 0))
    _whole("cluster.size", cfg.cluster.get("size", 0))
    recover = cfg.checkpoint.recover
    trials = _whole("checkpoint.recover.max_trials", recover.max_trials)
    bound = recover.loss_upper_bound
    _require(bound is None or bound > 0, "checkpoint.recover.loss_upper_bound must be a "
             "positive loss (a step's loss above it is a blow-up), or null for non-finite "
             f"losses only; received: {bound!r}")
    _require(bound is None or trials > 0, f"checkpoint.recover.loss_upper_bound={bound} is a "
             "bound for recovery, which checkpoint.recover.max_trials=0 turns off: set "
             "max_trials (e.g. 2), or remove the bound")
    stops = [name for name, node in (cfg.get("callbacks") or {}).items()
             if isinstance(node, DictConfig)
             and str(node.get("_target_", "")).endswith("TerminateOnNaN")]
    _require(not (stops and trials), f"callbacks {stops[0] if stops else ''} stops training "
             "at the first non-finite loss, before checkpoint.recover can restore a backup: "
             "remove one of them (recovery stops the run itself once its trials are used)")


def _whole(name: str, value: Any) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
             f"{name} must be a whole number >= 0 (0: off); received: {value!r}")
    return value


def validate_averaging(checkpoint: Any, opt: Any) -> None:
    """The k best checkpoints and the averaged model: `checkpoint.keep_best` and
    `average_best` whole numbers, the average taken over kept checkpoints only, and one
    averaged model a run (the best checkpoints' mean, or the optimizer's EMA)."""
    keep = _whole("checkpoint.keep_best", checkpoint.keep_best)
    average = _whole("checkpoint.average_best", checkpoint.average_best)
    _require(average <= keep, f"checkpoint.average_best={average} averages the best "
             f"checkpoints kept, and checkpoint.keep_best={keep} keeps fewer; pass "
             f"checkpoint.keep_best={average} (or more), or checkpoint.average_best<={keep}")
    if not isinstance(opt, DictConfig):
        opt = DictConfig({})
    ema, momentum = opt.get("ema", False), opt.get("ema_momentum", 0.99)
    _require(isinstance(ema, bool), f"optimizer.ema must be true or false; received: {ema!r}")
    ema = ema or opt.get("use_ema") is True  # Keras's own argument, passed on as it is
    _require(isinstance(momentum, (int, float)) and not isinstance(momentum, bool)
             and 0 <= momentum < 1, "optimizer.ema_momentum must be a number in [0, 1) "
             f"(Keras's default: 0.99); received: {momentum!r}")
    _require(not (ema and average), f"optimizer.ema=true and checkpoint.average_best="
             f"{average} would make two averaged models; a run keeps one: drop "
             "optimizer.ema, or pass checkpoint.average_best=0")
    _one_of("checkpoint.export_with", checkpoint.export_with, ("last", "averaged"))
    _require(checkpoint.export_with != "averaged" or ema or average, "checkpoint.export_with="
             "averaged exports the averaged model, and this run keeps none; pass "
             "optimizer.ema=true or checkpoint.average_best=k (with keep_best>=k), or "
             "checkpoint.export_with=last")


def _is_loss(loss: Any) -> bool:
    return isinstance(loss, str) or (isinstance(loss, DictConfig) and "_target_" in loss)


def _is_losses(loss: Any) -> bool:
    """One output's loss as Keras's `compile` takes it: a loss, null (that output trains
    with no loss), or a list or mapping of them (losses summed, or a nested output's)."""
    if loss is None or _is_loss(loss):
        return True
    items = (list(loss.values()) if isinstance(loss, DictConfig)
             else list(loss) if isinstance(loss, ListConfig) else None)
    return bool(items) and all(_is_losses(v) for v in items)


def _is_metric(metric: Any) -> bool:
    return isinstance(metric, str) or (isinstance(metric, DictConfig) and "_target_" in metric)


def _is_metric_list(metrics: Any) -> bool:
    return isinstance(metrics, ListConfig) and all(_is_metric(m) for m in metrics)


def _is_metrics(metrics: Any) -> bool:
    """`metrics` as Keras's `compile` takes them: a list of metrics (one output), a list of
    such lists in output order (null for none), or a mapping per output name of a metric
    or a list of them."""
    if metrics is None or _is_metric_list(metrics):
        return True
    if isinstance(metrics, ListConfig):
        return all(m is None or _is_metric(m) or _is_metric_list(m) for m in metrics)
    return isinstance(metrics, DictConfig) and "_target_" not in metrics and all(
        _is_metric(m) or _is_metric_list(m) for m in metrics.values())


def _importable(key: str, target: Any) -> None:
    """A dotted name (a `_target_`) whose top-level package is nowhere is refused before
    anything starts (found without importing it: importing could start TensorFlow)."""
    import importlib.util

    top = str(target).split(".")[0]
    try:
        found = bool(top) and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    _require(found, f"{key}={target!r}: no module named {top!r} (is it installed, "
             "or in the working directory?)")


def _validate_task(cfg: DictConfig) -> None:
    split = cfg.get("validation_split")
    _require(split is None or (isinstance(split, float) and 0 < split < 1),
             f"validation_split must be a fraction between 0 and 1 (0.2: the last 20% of the "
             f"training examples), or null; received: {split!r}")
    for key in ("steps_per_epoch", "validation_steps"):
        steps = cfg.get(key)
        _require(steps is None or (isinstance(steps, int) and not isinstance(steps, bool)
                                   and steps >= 1),
                 f"{key} must be a positive number of steps, or null (one pass over the "
                 f"data); received: {steps!r}")
    loss = cfg.loss
    _require(_is_losses(loss), "loss must be a Keras loss name, a node with _target_, null "
             "(the model's own add_loss alone), or a mapping per output name or a list in "
             "output order of those (a list per output sums its losses); received: "
             f"{_plain(loss)!r}")
    _require(_is_metrics(cfg.metrics), "metrics must be a list of metric names or nodes "
             "with _target_ (e.g. [accuracy]), a list of such lists in output order, a "
             f"mapping per output name of such lists, or null; received: "
             f"{_plain(cfg.metrics)!r}")
    _require(_is_metrics(cfg.weighted_metrics), "weighted_metrics must be as metrics are (a "
             "list of metric names or nodes with _target_, a list of such lists in output "
             f"order, a mapping per output name of such lists), or null; received: "
             f"{_plain(cfg.weighted_metrics)!r}")
    callbacks = cfg.callbacks
    _require(isinstance(callbacks, DictConfig), "callbacks must be a mapping of names to nodes "
             f"with _target_, e.g. callbacks=[early_stopping]; received: {callbacks!r}")
    for name, node in callbacks.items():
        _require(node is None or (isinstance(node, DictConfig) and "_target_" in node),
                 f"callbacks.{name} must be a node with _target_ (or null to disable it); "
                 f"received: {node!r}")
        if node is not None:
            _importable(f"callbacks.{name}._target_", node._target_)
    for key in ("model", "dataset", "optimizer"):
        node = cfg.get(key)
        if isinstance(node, DictConfig) and isinstance(node.get("_target_"), str):
            _importable(f"{key}._target_", node._target_)
    loggers = cfg.logger or {}
    if "csv" in loggers:
        file = (loggers.get("csv") or {}).get("filename", "metrics.csv")
        for name, node in callbacks.items():
            _require(node is None or not str(node._target_).endswith("CSVLogger")
                     or node.get("filename") != file,
                     f"logger=[csv] and callbacks.{name} would both append to {file}; keep "
                     f"one of them (e.g. drop {name} from callbacks)")
