"""What a run trains for: its loss, metrics, optimizer and the user's callbacks, from config.

Each is a Keras name or a node whose `_target_` names what builds it: Keras's own classes,
trainer's, or the user's (importable from the working directory). Metric names resolve as
Keras's `compile` resolves them (`accuracy` follows the shapes of labels and outputs), so
both loops log the same names.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from omegaconf import DictConfig, ListConfig, OmegaConf

from trainer.config.build import build_object, describe, import_failure, load_target, taken_by
from trainer.config.errors import ConfigError
from trainer.config.given import is_marker, lookup
from trainer.config.schema import EMA_KEYS, Config, LrPlan, config_dir
from trainer.internals.keras_compile import (
    compile_arguments,
    compiled_losses,
    config_saves,
    direction,
    metric_for,
    named_metrics,
    save_weights_only,
    wrapped_loss,
)
from trainer.internals.keras_compile import output_spec as output_spec_of
from trainer.internals.keras_step import (
    build_without_call,
    defines_call,
    keeps_own_test_step,
    keeps_own_train_step,
    symbolic_build,
)

LOSS_EXAMPLES = ("sparse_categorical_crossentropy", "categorical_crossentropy",
                 "binary_crossentropy", "mean_squared_error", "mean_absolute_error", "huber")
METRIC_EXAMPLES = ("accuracy", "auc", "mae", "mse", "precision", "recall")
# Arguments of a configured callback that name a file or folder: relative ones are taken
# inside the run directory, so a callback writes where the run does.
PATH_ARGUMENTS = ("filename", "filepath", "log_dir")


def build_loss(spec: Any) -> keras.losses.Loss:
    """A Keras loss object from a name (`mean_squared_error`), a function of the user's by
    its dotted name (`my_task.my_loss`), a `_target_` node, or a loss a compiled model holds.

    Args:
        spec: the config's `loss` (or one output's).

    Returns:
        A `keras.losses.Loss` (plain functions are wrapped, keeping their name, and
        registered as Keras serializables, so checkpoints holding them load).
    """
    if isinstance(spec, keras.losses.Loss):
        return spec
    if isinstance(spec, str):
        loss, name = _named_loss(spec), spec.rsplit(".", 1)[-1]
    elif callable(spec):
        loss, name = spec, getattr(spec, "__name__", None)
    else:
        loss = build_object(spec, "loss")
        name = getattr(loss, "__name__", None) or getattr(
            getattr(loss, "func", None), "__name__", None)
    if isinstance(loss, type):
        loss = loss()
    if isinstance(loss, keras.losses.Loss):
        return loss
    if callable(loss):
        if isinstance(loss, functools.partial) and not loss.args:  # `_partial_: true`
            return wrapped_loss(serializable(loss.func), name, **loss.keywords)
        return wrapped_loss(serializable(loss), name)
    raise ConfigError(f"loss must build a Keras loss or a function; received: {loss!r}")


def _named_loss(spec: str) -> Any:
    """A Keras loss by name, or a function (or loss class) of the user's by dotted name."""
    try:
        return keras.losses.get(spec)
    except (ValueError, TypeError):
        pass
    if "." in spec:
        try:
            found = load_target(spec)
        except Exception as error:  # noqa: BLE001 - any import failure is the same bad value
            raise ConfigError(f"loss {spec!r} cannot be imported: "
                              f"{import_failure(error)}") from None
        if callable(found):
            return found
    raise ConfigError(f"unknown loss {spec!r}; valid: a Keras loss name such as "
                      f"{', '.join(LOSS_EXAMPLES)}, a function by its dotted name "
                      "(my_module.my_loss), or a node with _target_") from None


def serializable(function: Callable) -> Callable:
    """A user's loss function as Keras saves it: registered under its module
    (`my_task>my_loss`), so a checkpoint's compiled loss names it and loads wherever the
    module imports. Keras's own functions and `functools.partial`s are left as they are
    (a partial is saved by its function)."""
    import functools

    inner = function.func if isinstance(function, functools.partial) else function
    module = getattr(inner, "__module__", None) or ""
    if not inspect.isfunction(inner) or module.split(".")[0] == "keras":
        return function
    if keras.saving.get_registered_name(inner) == inner.__name__:
        keras.saving.register_keras_serializable(package=module)(inner)
    return function


def build_metrics(specs: Sequence[Any], label_shape: Sequence[int | None],
                  output_shape: Sequence[int | None]) -> list[keras.metrics.Metric]:
    """Fresh metric objects for the configured names and nodes (call inside the scope).

    Args:
        specs: the config's `metrics`.
        label_shape: shape of a batch of labels, e.g. `(None,)` for sparse class indices.
        output_shape: shape of the model's output batch, e.g. `(None, 10)`.

    Returns:
        One `keras.metrics.Metric` per spec, named as Keras's `compile` names it.
    """
    y_true = keras.KerasTensor(tuple(label_shape))
    y_pred = keras.KerasTensor(tuple(output_shape))
    metrics = []
    for spec in specs:
        if isinstance(spec, str):
            try:
                metrics.append(metric_for(spec, y_true, y_pred))
            except (ValueError, TypeError):
                raise ConfigError(f"unknown metric {spec!r}; valid: a Keras metric name such "
                                  f"as {', '.join(METRIC_EXAMPLES)}, or a node with "
                                  "_target_") from None
            continue
        metric = build_object(spec, "metrics")
        if isinstance(metric, type):
            metric = metric()
        if not isinstance(metric, keras.metrics.Metric):
            metric = keras.metrics.MeanMetricWrapper(metric, name=getattr(metric, "__name__",
                                                                          None))
        metrics.append(metric)
    names = [m.name for m in metrics]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated or "loss" in names:
        raise ConfigError(f"metrics must have distinct names other than loss; received: "
                          f"{names}")
    return metrics


def build_losses(spec: Any) -> Any:
    """`build_loss` for one loss, a list in output order, or a mapping per output name (a
    model with several outputs), as Keras's `compile` takes them; None for none (a model
    whose own `add_loss` is its loss). A tuple or named tuple stays one: Keras matches a
    loss's structure to the outputs' by type."""
    if spec is None:
        return None
    if isinstance(spec, Mapping) and "_target_" not in spec:
        if not spec:
            raise ConfigError("loss must be a Keras loss name, a _target_ node, or a mapping "
                              "per output name; received: {}")
        return {str(name): _nested_losses(value) for name, value in spec.items()}
    if isinstance(spec, (list, tuple, ListConfig)):
        if not spec:
            raise ConfigError("loss must be a Keras loss name, a _target_ node, or a list "
                              "per output; received: []")
        return _same_sequence(spec, [_nested_losses(value) for value in spec])
    return build_loss(spec)


def _same_sequence(spec: Any, items: list) -> Any:
    """`items` in the sequence type of `spec`: a list, a tuple, or the same named tuple."""
    if isinstance(spec, tuple):
        return type(spec)(*items) if hasattr(spec, "_fields") else tuple(items)
    return items


def _nested_losses(spec: Any) -> Any:
    """One output's loss: a loss, none (Keras trains that output with no loss), or a list
    of losses summed (as a compiled model may name them: `{"b": ["binary_crossentropy"]}`),
    or a nested output's structure of them."""
    if spec is None:
        return None
    if isinstance(spec, (list, tuple, ListConfig)) or (isinstance(spec, Mapping)
                                                       and "_target_" not in spec):
        return build_losses(spec)
    return build_loss(spec)


def several_losses(loss: Any) -> bool:
    """Whether `loss` is one per output (a list or a mapping) rather than one loss."""
    return isinstance(loss, (list, tuple, Mapping)) and not isinstance(loss, keras.losses.Loss)


def symbolic_batch(element_spec: Any) -> Any:
    """A batch of `keras.KerasTensor`s shaped as a batched dataset's elements (the batch axis
    unknown): what Keras's symbolic build reads instead of a real batch."""
    def symbolic(spec: Any) -> Any:
        if not hasattr(spec, "shape"):  # an optional input given as None (NoneTensorSpec)
            return None
        return keras.KerasTensor(tuple(spec.shape), keras.backend.standardize_dtype(spec.dtype))

    return tf.nest.map_structure(symbolic, element_spec)


def output_spec(model: keras.Model, x: Any) -> Any:
    """The model's outputs for symbolic inputs `x`, building its variables as Keras's fit
    does on its first batch (a subclassed model has none until then); None for a model with
    its own `train_step` and no `call` (keras.io's VAE), which nothing calls. Call inside
    the strategy's scope."""
    if not defines_call(model):
        name = type(model).__name__
        if keeps_own_train_step(model):
            return None
        raise ConfigError(f"model class {name} defines no call(), so Keras's train_step "
                          f"cannot compute its outputs: define {name}.call(inputs), or a "
                          "train_step of its own")
    try:
        return output_spec_of(model, x)
    except Exception as error:  # noqa: BLE001 - a model that cannot take the data
        raise ConfigError(f"model {type(model).__name__} cannot take this dataset's inputs "
                          f"{_structure(x)}: {describe(error)}") from None


def _structure(value: Any) -> Any:
    """Shapes (and dtypes) of a structure of tensors or specs, for a message (None where
    there is none: inputs alone have no targets)."""
    def shown(t: Any) -> str:
        if not hasattr(t, "shape"):
            return "none" if t is None else type(t).__name__
        return f"{getattr(t, 'dtype', '')}{tuple(t.shape)}"

    return "none" if value is None else tf.nest.map_structure(shown, value)


def check_variables_in_scope(model: keras.Model, strategy: tf.distribute.Strategy) -> None:
    """Every variable of the built model was created inside the strategy's scope (mirrored
    over its replicas): one made before (a layer built at a script's top level, a model
    kept from an earlier call) would fail in the first step, deep in TensorFlow."""
    for variable in model.variables:
        if not strategy.extended.variable_created_in_scope(variable.value):
            raise ConfigError(
                f"the model's variable {variable.path} was created outside the strategy's "
                "scope (a layer or model made before trainer called the builder: at a "
                "script's top level, or kept from an earlier call), so it is not mirrored "
                "over the replicas: create every layer inside the builder function, which "
                "trainer calls in the scope, or pass the model itself "
                "(trainer.fit(model, ...)), which trainer rebuilds there")


def default_metrics(specs: Any, classes: bool, outputs: int) -> Any:
    """The config's `metrics`, null resolved: accuracy for one output of classes, else none
    (Keras's `compile` applies a flat list to one output only)."""
    if specs is not None:
        return specs
    return ["accuracy"] if classes and outputs == 1 else []


def compiled_metrics(specs: Any) -> Any:
    """What `compile(metrics=...)` takes for the config's metrics: names as they are (Keras
    resolves `accuracy` from the shapes of labels and outputs), nodes built; a list, a list
    per output, or a mapping per output name."""
    if isinstance(specs, Mapping):
        return {str(name): compiled_metrics(items) for name, items in specs.items()}
    return [compiled_metrics(s) if isinstance(s, (list, tuple)) else _metric(s) for s in specs]


def _metric(spec: Any) -> Any:
    if isinstance(spec, str) and spec.lower() not in ("accuracy", "acc"):
        try:
            keras.metrics.get(spec)
        except (ValueError, TypeError):
            raise ConfigError(f"unknown metric {spec!r}; valid: a Keras metric name such "
                              f"as {', '.join(METRIC_EXAMPLES)}, or a node with "
                              "_target_") from None
    if isinstance(spec, (str, keras.metrics.Metric)):
        return spec
    metric = build_object(spec, "metrics")
    if isinstance(metric, type):
        metric = metric()
    if not isinstance(metric, keras.metrics.Metric):
        metric = keras.metrics.MeanMetricWrapper(metric, name=getattr(metric, "__name__", None))
    return metric


def logged_metrics(model: keras.Model) -> tuple[list[str], dict[str, str]]:
    """The metrics a built, compiled model logs besides `loss`, named as Keras's `fit` names
    them (`cls_accuracy`, `reg_loss`, ...), and which way each improves where it says.

    Keras's logs are a mapping: two losses on one output (`{"b": ["mse", "bce"]}`) log one
    `b_loss`, the last one's, and so does this list."""
    names, ways = [], {}
    for metric in model.metrics:
        for name, item in named_metrics(metric):
            if name != "loss" and name not in names:
                names.append(name)
            if direction(item):
                ways[name] = direction(item)
    return names, ways


@dataclass(frozen=True)
class Task:
    """What a run compiles its model with: the config's loss, metrics and optimizer, or
    those of a model the builder compiled (`compiled_by`).

    Attributes:
        loss: what `compile(loss=...)` takes (built loss objects).
        loss_weights: a number, a list in output order, a mapping per output, or None.
        metrics: what `compile(metrics=...)` takes (names or metric objects).
        weighted_metrics: the same for `weighted_metrics` (a compiled model's), or None.
        optimizer: the model's own optimizer to keep, with its settings (its rate becomes
            the plan's `lr`); None: the config's optimizer.
        compiled_by: `config` or `model builder`.
    """

    loss: Any
    loss_weights: Any
    metrics: Any
    weighted_metrics: Any = None
    optimizer: Any = None
    compiled_by: str = "config"


# What `Task.compiled_by` says of a model the builder compiled.
BY_BUILDER = "model builder"


def choose_task(model: keras.Model, config: Mapping[str, Any], classes: bool,
                outputs: int) -> Task:
    """The config's task, or the one a model the builder compiled holds.

    A compiled model's loss, metrics and loss weights train; its optimizer too unless the
    config names one (a `_target_` or class argument other than the default group's). A
    config that also names a loss, metrics or loss weights is refused (one line naming
    both), as is `optimizer.lr` changed for a kept optimizer (its own rate is the `lr`).

    Args:
        model: what the model builder returned.
        config: the config's `loss`, `metrics`, `loss_weights`, `weighted_metrics` and
            `optimizer`; `targets` False where the dataset gives inputs alone (no loss then,
            but the model's own).
        classes: whether the dataset's targets are classes.
        outputs: the model's outputs.
    """
    named_loss = config.get("loss_named", config["loss"] != default_loss())
    if not config.get("targets", True) and named_loss:
        raise ConfigError(f"loss={_named(config['loss'])} needs targets; the dataset gives "
                          "inputs alone (x, no y): remove loss (a model that trains on x "
                          "makes its own loss: its train_step, or add_loss), or give (x, y)")
    weighted = config.get("weighted_metrics")
    weighted = None if weighted is None else compiled_metrics(weighted)
    if not getattr(model, "compiled", False):
        if not config.get("targets", True):  # x alone: the model's add_loss trains
            metrics = None if config["metrics"] is None else compiled_metrics(config["metrics"])
            return Task(None, None, metrics, weighted)
        named = default_metrics(config["metrics"], classes, outputs)
        return Task(build_losses(config["loss"]), config["loss_weights"],
                    compiled_metrics(named), weighted)
    own = compile_arguments(model)
    loss = own.get("loss")
    if loss is not None and not config.get("targets", True):
        raise ConfigError(f"the model builder compiled the model with loss {_named(loss)}, "
                          "which needs targets; the dataset gives inputs alone (x, no y): "
                          "give (x, y), or compile without a loss (a model that trains on x "
                          "makes its own: its train_step, or add_loss)")
    _conflict("loss", loss, config["loss"], config.get("loss_named",
                                                   config["loss"] != default_loss()))
    _conflict("metrics", own.get("metrics") or own.get("weighted_metrics"),
              config["metrics"], config["metrics"] is not None)
    _conflict("loss_weights", own.get("loss_weights"), config["loss_weights"],
              config["loss_weights"] is not None)
    _conflict("weighted_metrics", own.get("weighted_metrics"), weighted, weighted is not None)
    weighted = own.get("weighted_metrics") or weighted
    if own.get("metrics") or own.get("weighted_metrics"):
        metrics = own.get("metrics")
    elif config["metrics"] is not None:
        metrics = compiled_metrics(config["metrics"])
    else:  # compiled without metrics: its loss alone is logged, as Keras's fit logs it
        metrics = None
    optimizer = None if optimizer_named(config["optimizer"]) else _own_optimizer(
        own.get("optimizer"), config["optimizer"])
    if loss is None and not named_loss:
        # compiled with no loss: its own `add_loss` is what trains, as in Keras's fit
        return Task(None, None, metrics, weighted, optimizer, BY_BUILDER)
    return Task(build_losses(loss if loss is not None else config["loss"]),
                own.get("loss_weights") if loss is not None else config["loss_weights"],
                metrics, weighted, optimizer, BY_BUILDER)


def _conflict(key: str, theirs: Any, ours: Any, named: bool) -> None:
    if theirs is not None and named and theirs != ours:
        raise ConfigError(f"the model builder compiled the model with {key} {_named(theirs)};"
                          f" the config also names {key}={_named(ours)}: keep one (remove "
                          f"{key} from the config, or compile the model without it)")


def _named(value: Any) -> str:
    """A loss, metric or optimizer (or a structure of them) by name, for a message."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_named(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_named(v) for v in value) + "]"
    if isinstance(value, (str, int, float)) or value is None:
        return str(value)
    return (getattr(value, "name", None) or getattr(value, "__name__", None)
            or type(value).__name__)


def default_loss() -> str:
    """The loss a config has when it names none (`conf/config.yaml`'s, the schema's)."""
    return Config.__dataclass_fields__["loss"].default


def default_optimizer() -> dict[str, Any]:
    """The optimizer node of the default `optimizer` group option (`conf/config.yaml`'s
    defaults list: `adam`), a fresh copy each call."""
    return copy.deepcopy(_default_optimizer())


@functools.cache  # the package's own files: read once per process, not twice per run
def _default_optimizer() -> dict[str, Any]:
    root = config_dir()
    defaults = OmegaConf.to_container(OmegaConf.load(root / "config.yaml")).get("defaults", [])
    chosen = next((d["optimizer"] for d in defaults
                   if isinstance(d, dict) and "optimizer" in d), "adam")
    return OmegaConf.to_container(OmegaConf.load(root / "optimizer" / f"{chosen}.yaml"))


def optimizer_named(node: Mapping[str, Any]) -> bool:
    """Whether the config names an optimizer: its `_target_` or a class argument differs
    from the default group option's (the learning-rate plan's keys do not count)."""
    def arguments(options: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in options.items() if k not in (*LrPlan.keys(), *EMA_KEYS)}

    return arguments(node) != arguments(default_optimizer())


def _own_optimizer(optimizer: Any, node: Mapping[str, Any]) -> keras.optimizers.Optimizer:
    """A compiled model's optimizer (by name or object), to be rebuilt at the plan's rate;
    one whose rate cannot be scaled, or a changed `optimizer.lr`, is one line."""
    found = keras.optimizers.get(optimizer)
    rate = found.get_config().get("learning_rate")
    name = type(found).__name__
    if not isinstance(rate, (int, float)):
        raise ConfigError(f"the model builder compiled the model with {name} on a learning-"
                          "rate schedule; trainer scales the rate to the global batch and "
                          "warms it up: compile with a number as learning_rate, or name "
                          "the optimizer in the config (optimizer=...)")
    default = default_optimizer().get("lr")
    if node.get("lr") != default:
        raise ConfigError(f"the model builder compiled the model with {name} at learning "
                          f"rate {rate:g}; the config also names optimizer.lr={node.get('lr')}"
                          ": keep one (remove optimizer.lr, or name the optimizer in the "
                          "config)")
    return found


def plan_of(plan: LrPlan, task: Task) -> LrPlan:
    """The learning-rate plan the run uses: the config's, with a kept optimizer's own rate
    as its `lr` (the rate at `reference_batch`)."""
    if task.optimizer is None:
        return plan
    return replace(plan, lr=float(task.optimizer.get_config()["learning_rate"]))


def optimizer_for(task: Task, node: Mapping, learning_rate: Any) -> keras.optimizers.Optimizer:
    """The run's optimizer: the config's (`build_optimizer`), or the compiled model's class
    and settings at trainer's rate (call inside the strategy's scope)."""
    if task.optimizer is None:
        return build_optimizer(node, learning_rate)
    kept = task.optimizer
    return type(kept).from_config({**kept.get_config(), "learning_rate": learning_rate,
                                   **ema_arguments(node)})


def ema_arguments(node: Mapping) -> dict[str, Any]:
    """Keras's arguments for `optimizer.ema=true` (`use_ema` at `ema_momentum`); none where
    it is off, so an optimizer class without them still builds."""
    if not node.get("ema", False):
        return {}
    return {"use_ema": True, "ema_momentum": float(node.get("ema_momentum", 0.99))}


def optimizer_settings(optimizer: keras.optimizers.Optimizer) -> dict[str, Any]:
    """An optimizer's settings that differ from its class's defaults (the learning rate,
    reported apart, and its name left out): what the summary shows beside the class."""
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer
    try:
        defaults = {k: p.default for k, p in inspect.signature(type(inner)).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):
        defaults = {}
    return {k: v for k, v in inner.get_config().items()
            if k in defaults and k not in ("learning_rate", "name") and v != defaults[k]
            and isinstance(v, (int, float, str, bool, type(None)))}


def build_compiled(model: keras.Model, x: Any, y: Any) -> None:
    """Builds a compiled model's loss, metrics and optimizer from symbolic batches, as
    Keras's fit does from its first batch (call inside the strategy's scope); a loss or
    metrics that do not fit the outputs and targets is one line. A model with no `call`
    (its `train_step` calls its parts) is built from its parts."""
    if not defines_call(model):
        build_without_call(model)
        return
    try:
        symbolic_build(model, (x, y))
    except (ValueError, TypeError, KeyError) as error:
        raise ConfigError(f"the loss and metrics do not fit the model's outputs "
                          f"{_structure(output_spec(model, x))} and the targets "
                          f"{_structure(y)}: {describe(error)}") from None


def make_saveable(model: keras.Model) -> str | None:
    """Checkpoints of a model whose config cannot be saved hold its weights only
    (`save_weights_in_keras_files`); returns why, or None for a model saved whole."""
    reason = weights_only_reason(model)
    if reason is not None:
        save_weights_in_keras_files(model, reason)
    return reason


def weights_only_reason(model: keras.Model) -> str | None:
    """Why a `.keras` file cannot hold this model's config (a subclassed model without
    `get_config`, an argument Keras cannot serialize), or None where it can."""
    try:
        config_saves(model)
    except NotImplementedError:
        return (f"{type(model).__name__} does not implement get_config (load it with "
                "trainer.evaluate / trainer.predict, which rebuild it)")
    except (TypeError, ValueError) as error:
        return f"{type(model).__name__}'s config cannot be saved ({describe(error)})"
    return None


def save_weights_in_keras_files(model: keras.Model, reason: str) -> None:
    """Makes `model.save(PATH.keras)` (what checkpoints call) write a `.keras` archive of the
    weights (and optimizer state) with a stand-in config naming the class and `reason`:
    `model.load_weights` reads it, so a run resumes, evaluates and predicts through its
    model builder; `keras.models.load_model` cannot rebuild such a model from the file."""
    import datetime
    import json
    import tempfile
    import zipfile

    def save(filepath, overwrite=True, **_):
        del overwrite  # checkpoints write to a fresh temporary name
        with tempfile.TemporaryDirectory(dir=Path(filepath).parent) as tmp:
            weights = Path(tmp) / "model.weights.h5"
            save_weights_only(model, str(weights))
            cls = type(model)
            with zipfile.ZipFile(filepath, "w") as archive:
                archive.writestr("metadata.json", json.dumps({
                    "keras_version": keras.__version__, "weights_only": reason,
                    "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")}))
                archive.writestr("config.json", json.dumps({
                    "module": cls.__module__, "class_name": cls.__name__, "config": None,
                    "registered_name": None, "weights_only": reason}))
                archive.write(weights, "model.weights.h5")

    model.save = save


def first_batch(batches: tf.data.Dataset) -> Any:
    """The first batch the checks before training probe, read once (an uncached source's
    files are read once more for it, not once per check); None when there is none or it
    does not read: bad data (a NaN, an image that does not decode) is named by the run's
    data checks, with the source's words, as it trains."""
    try:
        return next(iter(batches.take(1)), None)
    except tf.errors.OpError:
        return None


def check_class_losses(model: keras.Model, batch: Any) -> None:
    """Refuses a loss over class indices (sparse categorical cross-entropy) on float targets
    that are not whole numbers (a regression target, read as classes, would train without
    an error); float class indices (`1.0`) are taken, as Keras takes them.

    Args:
        model: the compiled model.
        batch: the probed batch (`first_batch`), or None.
    """
    entries = compiled_losses(model)
    if entries is None:
        return
    y_true = None if batch is None else keras.utils.unpack_x_y_sample_weight(batch)[1]
    for index, entry in enumerate(entries):
        if getattr(entry.loss, "fn", None) is not keras.losses.sparse_categorical_crossentropy:
            continue
        target = _output_part(y_true, entry, index)
        if target is not None and target.dtype.is_floating and not bool(
                tf.reduce_all(tf.equal(target, tf.round(target)))):
            raise ConfigError(
                f"loss {entry.loss.name} takes class indices, but output {entry.name!r}'s "
                f"target is {target.dtype.name} of shape {_batch_shape(target)} (a regression "
                "target?), not whole numbers: use a regression loss such as "
                "mean_squared_error, or class indices")


# One batch through the model and its loss before training. The symbolic build checks
# structures and ranks, not sizes: a builder's model compiled with `mse` over 3 softmax
# outputs and class indices as targets passed it and failed in the first step, in a 91-line
# traceback (`Incompatible shapes: [64] vs. [64,3]`); 2 output units for classes 0..2 failed
# once a batch held a 2 (93 lines); a model with its own `train_step` but no `test_step` and
# no loss trained a whole epoch before validation found nothing to compute. Examples of the
# batch probed (sizes are what is checked, not values):
PROBED = 8


def check_one_batch(model: keras.Model, batch: Any,
                    num_classes: int | None, validated: bool = True) -> None:
    """Checks, before training, that the model's compiled losses take its outputs and the
    dataset's targets, that a class loss has a unit per class, and that a model with its
    own `train_step` can be validated.

    Args:
        model: the compiled, built model.
        batch: the first validation batch, as training's validation reads it
            (`first_batch`), or None.
        num_classes: the dataset's classes (None: not a class target).
        validated: whether the run has a validation split (`batches` are then its own).

    Raises:
        ConfigError: one line naming the loss, the output and the target's shape.
    """
    entries = compiled_losses(model) or []
    if batch is None:
        return
    if keeps_own_train_step(model):
        if validated:
            _check_validation(model, entries)
        return
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    x, y = (None if part is None else keras.tree.map_structure(
        lambda t: None if t is None else t[:PROBED], part) for part in (x, y))  # an optional input
    y_pred = model(x, training=False)
    if type(model).compute_loss is not keras.Model.compute_loss:
        return  # its own compute_loss decides which loss takes which output
    for index, entry in enumerate(entries):
        target, output = _output_part(y, entry, index), _output_part(y_pred, entry, index)
        if not (hasattr(target, "shape") and hasattr(output, "shape")):
            continue  # none, or a loss of a whole structure of outputs (Keras takes one)
        what = "the model's output" if len(entries) == 1 else f"output {entry.name!r}"
        _check_units(entry, what, output, num_classes if len(entries) == 1 else None)
        if target.dtype == tf.string:
            raise ConfigError(
                f"the targets of {what} are strings ({_strings_of(target)}), and loss "
                f"{entry.loss.name} takes numbers: map the labels to class indices 0..N-1 "
                "(np.unique(y, return_inverse=True), or a keras.layers.StringLookup in the "
                "data)")
        try:
            entry.loss(target, output)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, ValueError,
                TypeError) as error:
            raise ConfigError(
                f"loss {entry.loss.name} cannot take {what} of shape {_batch_shape(output)} "
                f"and its targets of shape {_batch_shape(target)} {target.dtype.name}: "
                f"{_op_reason(error)}; use a loss for these targets "
                "(sparse_categorical_crossentropy for class indices), or give the model "
                "outputs of their shape") from None


def _strings_of(target: Any) -> str:
    """A few of a string target's values, for the message."""
    values = sorted({v.decode(errors="replace") for v in target.numpy().reshape(-1)[:50]})
    return ", ".join(repr(v) for v in values[:3]) + (", ..." if len(values) > 3 else "")


def _check_units(entry: Any, what: str, output: Any, num_classes: int | None) -> None:
    """A loss over class indices needs one output unit per class of the dataset."""
    if num_classes is None or getattr(entry.loss, "fn", None) is not (
            keras.losses.sparse_categorical_crossentropy):
        return
    units = int(output.shape[-1]) if len(output.shape) > 1 else 1
    if units < num_classes:
        raise ConfigError(
            f"{what} has {units} units, but the dataset has {num_classes} "
            f"classes (labels 0..{num_classes - 1}): {entry.loss.name} needs one unit per "
            "class; build the last layer with num_classes units (the builder's num_classes "
            "argument)")


def _check_validation(model: keras.Model, entries: list) -> None:
    """A model with its own `train_step` is validated by trainer's test step (Keras's, with
    exact weights), which needs a loss: compiled, or added in the forward pass."""
    if keeps_own_test_step(model) or (defines_call(model) and (entries or model.losses)):
        return
    name = type(model).__name__
    what, loss = ("no call() to validate with", "") if not defines_call(model) else (
        "no loss to validate with (compiled without one, and none added in its forward "
        "pass)", ", give a loss (loss=... in the config)")
    raise ConfigError(
        f"model class {name} trains with its own train_step, but has no test_step and "
        f"{what}, and the run has a validation split: define {name}.test_step (returning "
        f"its logs, as train_step does){loss}, or give no validation data")


def _output_part(structure: Any, entry: Any, index: int) -> Any:
    """An output's part of targets or predictions: by the loss entry's path; else, in a
    dict, by the output's name (as Keras's compiled loss matches dict targets to a list of
    outputs); else by its position among the flattened parts."""
    try:
        return functools.reduce(lambda node, key: node[key], entry.path or (), structure)
    except (KeyError, IndexError, TypeError):
        if isinstance(structure, dict) and entry.name in structure:
            return structure[entry.name]
        flat = keras.tree.flatten(structure)
        return flat[index] if index < len(flat) else None


def _batch_shape(tensor: Any) -> tuple:
    return (None, *tuple(tensor.shape)[1:])


def _op_reason(error: BaseException) -> str:
    """TensorFlow's sentence, without its `{{function_node ...}}` head and `[Op:Sub] name:`
    tail."""
    return re.sub(r"\s*\[Op:.*$|\{\{function_node [^}]*\}\}\s*", "", describe(error))


def directions(metrics: Sequence[keras.metrics.Metric]) -> dict[str, str]:
    """Which way each metric improves (`up`/`down`), where the metric says it."""
    return {m.name: direction(m) for m in metrics if direction(m)}


def build_optimizer(node: Mapping, learning_rate: Any) -> keras.optimizers.Optimizer:
    """The optimizer `node._target_` names, with its arguments and trainer's learning rate.

    Args:
        node: the config's `optimizer`: `_target_`, trainer's learning-rate plan keys
            (`lr`, `reference_batch`, ...: not passed on), and the class's own arguments
            (`weight_decay`, `global_clipnorm`, `momentum`, ...).
        learning_rate: the scaled rate or schedule.

    Returns:
        A Keras optimizer.
    """
    options = (OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig)
               else dict(node))
    arguments = {k: v for k, v in options.items()
                 if k not in (*LrPlan.keys(), *EMA_KEYS, "_target_")}
    arguments.update(ema_arguments(options))
    target = options["_target_"]
    try:
        cls = load_target(target)
    except Exception as error:  # noqa: BLE001 - any import failure is the same bad value
        raise ConfigError(f"optimizer._target_={target!r} cannot be imported: "
                          f"{import_failure(error)}; use a Keras optimizer class such as "
                          "keras.optimizers.AdamW, or your own") from None
    try:
        optimizer = cls(learning_rate=learning_rate, **arguments)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"optimizer {target} does not take {sorted(arguments)}: "
                          f"{str(error).splitlines()[0]}") from None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(f"optimizer._target_={target!r} is not a Keras optimizer; received: "
                          f"{type(optimizer).__name__}")
    return optimizer


def build_callbacks(nodes: Mapping, run_dir: Path,
                    mode_of: Callable[..., str]) -> list[keras.callbacks.Callback]:
    """The user's callbacks in config order; null entries are left out.

    A callback's `monitor` must be a metric the run logs; with no explicit `mode` it gets
    the mode trainer infers (`mode_of(monitor, mode, key)`, see `Run.monitor_mode`): Keras
    infers it from compiled metrics, which the custom loop never builds. Relative
    `filename`, `filepath` and `log_dir` are taken inside the run directory.
    """
    built = []
    for name, node in nodes.items():
        if node is None:
            continue
        target = _callback_class(name, node["_target_"])
        extra = _paths_in_run_dir(node, run_dir)
        if "monitor" in node:
            mode = mode_of(node["monitor"], node.get("mode", "auto"), f"callbacks.{name}")
            if node.get("mode", "auto") == "auto" and _takes(target, "mode"):
                extra["mode"] = mode
        callback = build_object(node, f"callbacks.{name}", **extra)
        if not isinstance(callback, keras.callbacks.Callback):
            raise ConfigError(f"callbacks.{name} must build a keras.callbacks.Callback; "
                              f"received: {type(callback).__name__}")
        built.append(callback)
    return built


def check_given_callbacks(callbacks: Sequence[Any], recovering: bool = False
                          ) -> Sequence[Any]:
    """Callbacks given as objects (`trainer.fit(callbacks=[...])`), returned where all are
    Keras's; one line naming the first that is not, or a `TerminateOnNaN` beside recovery
    (`recovering`), which would end the run at the first blow-up it is to recover from."""
    for index, callback in enumerate(callbacks):
        if not isinstance(callback, keras.callbacks.Callback):
            raise ConfigError(f"callbacks[{index}] must be a keras.callbacks.Callback object, "
                              f"as model.fit takes them; received: {callback!r}")
        if recovering and isinstance(callback, keras.callbacks.TerminateOnNaN):
            raise ConfigError(f"callbacks[{index}] (TerminateOnNaN) stops training at the "
                              "first non-finite loss, before checkpoint.recover can restore a "
                              "backup: remove one of them (recovery stops the run itself once "
                              "its trials are used)")
    return callbacks


def _callback_class(name: str, target: Any) -> Callable | None:
    """What a callback's `_target_` names; one that cannot be imported is one line.

    The pre-flight finds only the top-level package (looking deeper would import it, and
    with it TensorFlow): `keras.callbacks.EarlyStoping` or a module missing from the user's
    package is first seen here.
    """
    if not isinstance(target, str):
        return None
    try:
        return load_target(target)
    except Exception as error:  # noqa: BLE001 - any import failure is the same bad value
        raise ConfigError(f"callbacks.{name}._target_={target!r} cannot be imported: "
                          f"{import_failure(error)}") from None


def _paths_in_run_dir(node: Mapping, run_dir: Path) -> dict[str, str]:
    return {key: str(run_dir / node[key]) for key in PATH_ARGUMENTS
            if isinstance(node.get(key), str) and not Path(node[key]).is_absolute()}


def _takes(target: Callable | None, argument: str) -> bool:
    if target is None:
        return False
    try:
        return argument in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def _model_target(node: Mapping) -> Any:
    """The model builder a `model` node names: a given object, or what `_target_` imports."""
    try:
        return (lookup("model", node.get("given")) if is_marker(node["_target_"])
                else load_target(node["_target_"]))
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - any import failure is the same bad value
        raise ConfigError(f"model._target_={node['_target_']!r} cannot be imported: "
                          f"{import_failure(error)}") from None


def takes_train(node: Mapping) -> bool:
    """Whether the model builder names `train` (it adapts on the training split), as
    `build_model` reads its signature; False where the signature cannot be read."""
    return "train" not in node and _takes(_model_target(node), "train")


def build_model(node: Mapping, input_shape: tuple[int, ...], num_classes: int | None,
                num_outputs: int, defaults: tuple[str, ...] = (),
                train: Callable[[], Any] | None = None) -> keras.Model:
    """Calls the model builder with what the data says, as far as its signature asks.

    The builder receives `input_shape` and `num_classes` or `num_outputs` (whichever it
    names; a regression task has no classes), `train` where it names it (the training split,
    unbatched, as the model takes it: to `adapt` preprocessing layers), plus its own config
    keys; `defaults`, the default group's keys a replaced `_target_` left
    (`group_defaults`), only where it takes them.

    Args:
        train: makes the training split, called only for a builder that names `train`.
    """
    given = is_marker(node["_target_"])
    target = _model_target(node)
    if given:  # an object takes what it names: the group's keys are no options of its own
        node = {k: v for k, v in node.items() if k != "given"}
        defaults = tuple(k for k in node if k != "_target_")
    node = taken_by(target, dict(node), defaults)
    offered = {"input_shape": input_shape, "num_classes": num_classes,
               "num_outputs": num_outputs, "train": train}
    try:
        wanted = inspect.signature(target).parameters
    except (TypeError, ValueError):
        wanted = offered
    kwargs = {k: v for k, v in offered.items() if k in wanted and k not in node}
    if "train" in kwargs:
        kwargs["train"] = train() if train is not None else None
    if "num_classes" in kwargs and num_classes is None:
        raise ConfigError(f"model {node['_target_']} asks for num_classes, but the dataset has "
                          "no classes (a regression target); give the builder num_outputs")
    model = (_called(target, node, kwargs) if given
             else build_object(node, "model", **kwargs))
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model {node['_target_']} must return a keras.Model; received: "
                          f"{type(model).__name__}")
    return model


def _called(target: Callable, node: Mapping, kwargs: dict[str, Any]) -> Any:
    """A model builder given as an object, called with its options and `kwargs`; what it
    raises is one line naming it (as `build_object` names a dotted one)."""
    options = {k: v for k, v in node.items() if k != "_target_"}
    name = getattr(target, "__qualname__", type(target).__name__)
    try:
        return target(**options, **kwargs)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's builder failed: one line
        raise ConfigError(f"model: cannot build {name}: {describe(error)}") from None
