"""What a run trains for: its loss, metrics, optimizer and the user's callbacks, from config.

Each is a Keras name or a node whose `_target_` names what builds it: Keras's own classes,
trainer's, or the user's (importable from the working directory). Metric names resolve as
Keras's `compile` resolves them (`accuracy` follows the shapes of labels and outputs), so
both loops log the same names.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from trainer.config.build import build_object, describe
from trainer.config.errors import ConfigError
from trainer.config.schema import LrPlan

LOSS_EXAMPLES = ("sparse_categorical_crossentropy", "categorical_crossentropy",
                 "binary_crossentropy", "mean_squared_error", "mean_absolute_error", "huber")
METRIC_EXAMPLES = ("accuracy", "auc", "mae", "mse", "precision", "recall")
# Arguments of a configured callback that name a file or folder: relative ones are taken
# inside the run directory, so a callback writes where the run does.
PATH_ARGUMENTS = ("filename", "filepath", "log_dir")


def build_loss(spec: Any) -> keras.losses.Loss:
    """A Keras loss object from a name (`mean_squared_error`) or a `_target_` node.

    Args:
        spec: the config's `loss`.

    Returns:
        A `keras.losses.Loss` (plain functions are wrapped, keeping their name).
    """
    if isinstance(spec, str):
        try:
            loss = keras.losses.get(spec)
        except (ValueError, TypeError):
            raise ConfigError(f"unknown loss {spec!r}; valid: a Keras loss name such as "
                              f"{', '.join(LOSS_EXAMPLES)}, or a node with _target_") from None
        name = spec
    else:
        loss = build_object(spec, "loss")
        name = getattr(loss, "__name__", None)
    if isinstance(loss, type):
        loss = loss()
    if isinstance(loss, keras.losses.Loss):
        return loss
    if callable(loss):
        # What Keras's compile wraps a loss function in (not exported under keras.losses).
        from keras.src.losses import LossFunctionWrapper

        return LossFunctionWrapper(loss, name=name)
    raise ConfigError(f"loss must build a Keras loss or a function; received: {loss!r}")


def per_example(loss: keras.losses.Loss) -> keras.losses.Loss:
    """The same loss, unreduced: one value per example, for averaging over the global batch."""
    unreduced = copy.copy(loss)
    unreduced.reduction = None
    return unreduced


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
    from keras.src.trainers.compile_utils import get_metric

    y_true = keras.KerasTensor(tuple(label_shape))
    y_pred = keras.KerasTensor(tuple(output_shape))
    metrics = []
    for spec in specs:
        if isinstance(spec, str):
            try:
                metrics.append(get_metric(spec, y_true, y_pred))
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


def build_losses(spec: Any) -> keras.losses.Loss | dict[str, keras.losses.Loss]:
    """`build_loss` for one loss, or a mapping per output name (a multi-output model)."""
    if isinstance(spec, Mapping) and "_target_" not in spec:
        if not spec:
            raise ConfigError("loss must be a Keras loss name, a _target_ node, or a mapping "
                              "per output name; received: {}")
        return {str(name): build_loss(value) for name, value in spec.items()}
    return build_loss(spec)


def output_metrics(specs: Any, label_spec: Any, model: keras.Model,
                   classes: bool = True) -> tuple[Any, list[str], dict[str, str]]:
    """The compiled metrics of a model with one output (a list) or several (a mapping per
    output name, as Keras's `compile` takes them).

    Args:
        specs: the config's `metrics`: a list, a mapping of output name to a list, or None
            (accuracy where `classes`, else none).
        label_spec: the dataset's target spec (a `tf.TensorSpec`, or a dict of them).
        model: the built model.
        classes: whether the dataset's targets are classes.

    Returns:
        (what `compile` takes, the names Keras logs, which way each improves).
    """
    if specs is None:  # accuracy where the dataset has classes
        specs = ["accuracy"] if classes else []
    if not isinstance(specs, Mapping):
        if isinstance(label_spec, Mapping) and specs:
            raise ConfigError("this dataset's targets are a mapping per output ("
                              f"{', '.join(label_spec)}): metrics must be one too, e.g. "
                              f"metrics='{{{next(iter(label_spec))}: [accuracy]}}'")
        compiled = build_metrics(specs, (None, *label_spec.shape), model.output_shape)
        return compiled, [m.name for m in compiled], directions(compiled)
    outputs = {name: tuple(t.shape) for name, t in zip(model.output_names, model.outputs,
                                                       strict=True)}
    labels = label_spec if isinstance(label_spec, Mapping) else {}
    unknown = sorted(set(map(str, specs)) - set(outputs))
    if unknown:
        raise ConfigError(f"metrics name outputs the model does not have: {', '.join(unknown)};"
                          f" its outputs: {', '.join(outputs)}")
    compiled, names, ways = {}, [f"{name}_loss" for name in outputs] if len(outputs) > 1 \
        else [], {}
    for name, items in specs.items():
        label = labels.get(name)
        shape = (None, *label.shape) if label is not None else outputs[name]
        built = build_metrics(list(items), shape, outputs[name])
        compiled[str(name)] = built
        names += [f"{name}_{m.name}" for m in built]
        ways.update({f"{name}_{k}": v for k, v in directions(built).items()})
    return compiled, names, ways


def directions(metrics: Sequence[keras.metrics.Metric]) -> dict[str, str]:
    """Which way each metric improves (`up`/`down`), where the metric says it."""
    return {m.name: m._direction for m in metrics if getattr(m, "_direction", None)}


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
    arguments = {k: v for k, v in options.items() if k not in LrPlan.keys() and k != "_target_"}
    target = options["_target_"]
    try:
        cls = get_object(target)
    except Exception:  # noqa: BLE001 - any import failure is the same bad value
        raise ConfigError(f"optimizer._target_={target!r} cannot be imported; use a Keras "
                          "optimizer class such as keras.optimizers.AdamW") from None
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


def _callback_class(name: str, target: Any) -> Callable | None:
    """What a callback's `_target_` names; one that cannot be imported is one line.

    The pre-flight finds only the top-level package (looking deeper would import it, and
    with it TensorFlow): `keras.callbacks.EarlyStoping` or a module missing from the user's
    package is first seen here.
    """
    if not isinstance(target, str):
        return None
    try:
        return get_object(target)
    except Exception as error:  # noqa: BLE001 - any import failure is the same bad value
        raise ConfigError(f"callbacks.{name}._target_={target!r} cannot be imported: "
                          f"{describe(error)} (is its module installed, or in the working "
                          "directory?)") from None


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


def build_model(node: Mapping, input_shape: tuple[int, ...], num_classes: int | None,
                num_outputs: int) -> keras.Model:
    """Calls the model builder with what the data says, as far as its signature asks.

    The builder receives `input_shape` and `num_classes` or `num_outputs` (whichever it
    names; a regression task has no classes), plus its own config keys.
    """
    try:
        target = get_object(node["_target_"])
    except Exception:  # noqa: BLE001 - any import failure is the same bad value
        raise ConfigError(f"model._target_={node['_target_']!r} cannot be imported; is its module "
                          "in the working directory or installed?") from None
    offered = {"input_shape": input_shape, "num_classes": num_classes,
               "num_outputs": num_outputs}
    try:
        wanted = inspect.signature(target).parameters
    except (TypeError, ValueError):
        wanted = offered
    kwargs = {k: v for k, v in offered.items() if k in wanted and k not in node}
    if "num_classes" in kwargs and num_classes is None:
        raise ConfigError(f"model {node['_target_']} asks for num_classes, but the dataset has "
                          "no classes (a regression target); give the builder num_outputs")
    model = build_object(node, "model", **kwargs)
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model {node['_target_']} must return a keras.Model; received: "
                          f"{type(model).__name__}")
    return model
