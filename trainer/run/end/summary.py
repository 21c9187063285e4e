"""The run summary: printed at the end, and written atomically to `summary.json`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from omegaconf import OmegaConf

from trainer.config.given import is_marker
from trainer.config.image_size import describe_choice
from trainer.config.schema import config_dir
from trainer.data.augment import describe
from trainer.data.fingerprint import of_source
from trainer.internals.tf_runtime import onednn_enabled
from trainer.processes import process_seconds  # noqa: F401 - the session's clock, here
from trainer.run.assembly.step import has_forward_losses
from trainer.rundir.backup import write_finished
from trainer.task.build import optimizer_settings
from trainer.task.freeze import parameter_counts


def _name(target: str) -> str:
    """`trainer.models.cnn.build` -> `cnn`; `mine.load` -> `mine`: what names the model or
    dataset where no Hydra choice does (`Spec.choices`)."""
    parts = target.split(".")
    return parts[-2] if len(parts) > 1 else parts[0]


def _parameters(model: Any) -> dict[str, int]:
    """The model's parameters at the end: trainable, and frozen (every other weight: a
    frozen backbone's, batch norm's moving statistics)."""
    counts = parameter_counts(model)
    return {"trainable": counts["trainable"], "frozen": counts["total"] - counts["trainable"]}


# What the summary says of a model compiled without a loss.
NO_LOSS = "none compiled (the model's own {how} makes it)"


def _loss_name(spec: Any) -> str:
    return spec if isinstance(spec, str) else str(spec.get("_target_"))


def _loss_label(loss: Any, spec: Any) -> str:
    """The loss trained: its name, or one per output (`cls: ..., reg: ...`)."""
    if isinstance(loss, dict):
        return ", ".join(f"{k}: {_loss_label(v, None)}" for k, v in loss.items())
    if isinstance(loss, (list, tuple)):
        return ", ".join(_loss_label(v, None) for v in loss)
    name = getattr(loss, "name", None)
    if not name and spec is not None:
        return _loss_name(spec)
    try:
        logits = (loss.get_config() or {}).get("from_logits")
    except Exception:  # noqa: BLE001 - a loss of the user's whose config cannot be read
        logits = None
    return f"{name} (from_logits=True)" if logits else str(name)


def custom_objects(model: Any) -> list[str]:
    """The registered names (`package>name`) of what a compiled model holds that is not
    Keras's own: its layers, loss, metrics, optimizer and schedule as its checkpoint saves
    them. Empty: `keras.models.load_model` loads the checkpoint in any process."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = node.get("registered_name")
            if name == "function":
                name = node.get("config")
            if isinstance(name, str) and ">" in name:
                found.add(name)
            elif _unregistered(node):  # Keras finds it in custom_objects alone
                found.add(f"{node['module']}.{node['class_name']}")
            node = list(node.values())
        if isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(keras.saving.serialize_keras_object(model))
    return sorted(found)


def _unregistered(node: dict) -> bool:
    """Whether a serialized object is a class of the user's that no registration names
    (its module is neither Keras's nor Python's)."""
    module, name = node.get("module"), node.get("class_name")
    return (isinstance(module, str) and isinstance(name, str)
            and module.split(".")[0] not in ("keras", "builtins", "tensorflow"))


def _loads_with(run: Any) -> str | None:
    """What loads the run's `.keras` checkpoints in another process: Keras alone, or
    trainer's loader (which registers trainer's objects and those the run's config names);
    None for checkpoints of weights only."""
    if run.weights_only is not None:
        return None
    names = custom_objects(run.model)
    if not names:
        return "keras.models.load_model"
    return (f"trainer.evaluate.load_checkpoint (they hold {', '.join(names)}, which plain "
            "Keras finds only registered or in custom_objects)")


def _optimizer_name(optimizer: Any) -> str:
    """The optimizer's class (the one inside a mixed-precision loss-scale wrapper)."""
    return type(getattr(optimizer, "inner_optimizer", None) or optimizer).__name__


def build_summary(spec: Any, run: Any, plan: Any, run_dir: Path, outcome: Any, callbacks: Any,
                  started: float, start: tuple[int, int],
                  changes: dict[str, list] | None = None) -> dict[str, Any]:
    """Everything a finished run reports, as a JSON-ready dict.

    Args:
        spec: the run's resolved config (`trainer.run.prepare.resolve.Spec`).
        run: the assembled `trainer.run.assembly.assemble.Run`.
        plan: the `DevicePlan`.
        run_dir: the run directory.
        outcome: what training did (`trainer.run.end.finish.Outcome`).
        callbacks: the run's `trainer.run.assembly.wiring.Callbacks`.
        started: `time.perf_counter()` at the start.
        start: (epoch, step) the run resumed from.
        changes: config keys a resume changed, `{key: [old, new]}`.
    """
    return {"run_dir": str(run_dir), **_what_ran(spec, run, plan, callbacks),
            **_how_it_ran(spec, run, outcome, callbacks, started, start, changes),
            **_results(spec, run, plan, outcome),
            "best_checkpoints": (callbacks.kept.kept.report() if callbacks.kept is not None
                                 else None),
            "averaged": outcome.averaged}


def given_name(node: dict[str, Any]) -> str | None:
    """A model or dataset given to `trainer.fit` as a Python object, as the summary calls
    it (`build, defined in __main__ (a Python object)`); None for one named in the config."""
    if not is_marker(node.get("_target_")):
        return None
    return f"{node.get('given') or 'unnamed'} (a Python object)"


def named(group: str, choice: str | None, target: str) -> str:
    """What the summary calls the model or dataset: the group's choice (`cnn`, a project's
    `mlp`), or the `_target_` where the run replaced the choice's (`model._target_=wine.build`
    on the default `cnn` trained `wine.build`, not the cnn); without a choice (`train(cfg)`
    outside a Hydra job), the target's module."""
    if not choice:
        return _name(target)
    shipped = config_dir() / group / f"{choice}.yaml"
    try:
        own = OmegaConf.load(shipped).get("_target_") if shipped.is_file() else None
    except Exception:  # noqa: BLE001 - an unreadable file names nothing
        own = None
    return target if own is not None and own != target else choice


def _image_size(spec: Any, run: Any, model: str, dataset: str) -> dict[str, Any] | None:
    """The image side and why, where the data are images of that side (a dataset that
    replaced the images' `_target_` gets their `image_size` option too, and may ignore
    it)."""
    choice = spec.image_size
    shape = tuple(run.data.source.input_shape or ())
    if choice is None or len(shape) != 3 or shape[:2] != (choice["size"], choice["size"]):
        return None
    return {**choice, "why": describe_choice(choice, model, dataset)}


def device_notes(plan: Any) -> list[str]:
    """How the devices were read on this machine (the plan's notes), and the host CPU split
    into logical devices, which share its cores (the README's promise)."""
    notes = list(plan.notes)
    if plan.kind == "cpu" and plan.logical_cpus > 1 and not notes:
        notes.append(f"the host CPU as {plan.logical_cpus} logical devices, one replica on "
                     f"each of {len(plan.names)}: they share its cores (no speed-up; for "
                     "checking a multi-device run)")
    return notes


# Keras's callbacks that set the optimizer's rate themselves.
RATE_SETTERS = (keras.callbacks.LearningRateScheduler, keras.callbacks.ReduceLROnPlateau)


def final_rate(run: Any, callbacks: Any) -> dict[str, Any]:
    """The optimizer's rate at the end where a callback set it away from the run's plan
    (`{"final": 1e-05, "set_by": ["LearningRateScheduler"]}`); empty where the plan held.
    A schedule cannot be set (Keras refuses), so only a constant rate is compared."""
    if not isinstance(run.lr.schedule, (int, float)):
        return {}
    optimizer = getattr(run.model.optimizer, "inner_optimizer", None) or run.model.optimizer
    final = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    if abs(final - float(run.lr.schedule)) <= 1e-6 * abs(float(run.lr.schedule)):
        return {}
    setters = [type(c).__name__ for c in callbacks.user if isinstance(c, RATE_SETTERS)]
    return {"final": final, "set_by": setters or ["a callback"]}


def _what_ran(spec: Any, run: Any, plan: Any, callbacks: Any) -> dict[str, Any]:
    cluster = run.cluster
    model = given_name(spec.model) or named("model", spec.choices.get("model"),
                                             spec.model["_target_"])
    dataset = given_name(spec.dataset) or named("dataset", spec.choices.get("dataset"),
                                                spec.dataset["_target_"])
    return {
        "model": model,
        "dataset": dataset,
        "image_size": _image_size(spec, run, model, dataset),
        "parameters": _parameters(run.model),
        "accelerator": plan.kind,
        "devices": list(plan.names),
        "device_notes": device_notes(plan),
        "replicas": run.strategy.num_replicas_in_sync,
        "strategy": run.strategy_name,
        "cross_device_ops": run.cross_device_ops,
        "batch": {"per_replica": run.batch.per_replica, "replicas": run.batch.replicas,
                  "accumulate": run.batch.accumulate, "global": run.batch.global_size,
                  "max_per_replica": spec.batch.max_per_replica,
                  "drop_remainder": spec.batch.drop_remainder},
        "learning_rate": {**run.lr.report(), **final_rate(run, callbacks)},
        "optimizer": _optimizer_name(run.model.optimizer),
        "optimizer_settings": optimizer_settings(run.model.optimizer),
        "compiled_by": run.compiled_by,
        "train_step": OWN_STEP if run.own_train_step else "trainer's exact step",
        "forward_losses": (FORWARD_LOSSES.format(n=run.strategy.num_replicas_in_sync)
                           if has_forward_losses(run.model)
                           and run.strategy.num_replicas_in_sync > 1 else None),
        "checkpoints_hold": ("the whole model" if run.weights_only is None
                             else f"weights only: {run.weights_only}"),
        "checkpoints_load_with": _loads_with(run),
        "loss": (_loss_label(run.loss, spec.loss) if run.loss is not None
                 else NO_LOSS.format(how="train_step" if run.own_train_step else "add_loss")),
        "metrics": list(run.metric_names),
        "callbacks": [type(c).__name__ for c in callbacks.user],
        "loop": run.loop,
        "workers": run.workers,
        "cluster": None if cluster is None else {
            "source": cluster.source, "tasks": cluster.addresses, "task_id": cluster.task_id,
            "communication": spec.strategy.communication,
            "step_timeout_s": spec.strategy.timeout_s,
            "start_timeout_s": spec.strategy.start_timeout_s},
        "steps_per_execution": run.speed.steps_per_execution,
        "precision": run.speed.precision,
        "jit_compile": run.speed.jit_compile,
        "speed_reasons": list(run.speed.reasons),
        "batch_norm": run.batch_norm,
        "deterministic": exactness(spec.deterministic, plan.kind, onednn_enabled(),
                                   random_layers(run.model), run.batch.per_replica),
        "input": run.data.reading,
        "data_notes": list(getattr(run, "notes", ())),
    }


# Keras's layers that draw random numbers in training: each replica draws its own share's.
RANDOM_LAYERS = (keras.layers.Dropout, keras.layers.GaussianDropout,
                 keras.layers.GaussianNoise, keras.layers.AlphaDropout)


def random_layers(model: Any) -> list[str]:
    """The classes of the model's layers (nested models' included) that draw random numbers
    in training (a dropout rate or noise above 0)."""
    found: list[str] = []
    for layer in getattr(model, "layers", []):
        if isinstance(layer, RANDOM_LAYERS) and (getattr(layer, "rate", 0)
                                                 or getattr(layer, "stddev", 0)):
            found.append(type(layer).__name__)
        found += random_layers(layer)
    return sorted(set(found))


def exactness(deterministic: bool, kind: str, onednn: bool, random: list[str],
              micro_batch: int) -> str | None:
    """How exactly a `deterministic=true` run repeats, and which runs on other device
    counts end with its weights; None without `deterministic`.

    Measured (the default CNN without dropout, plain SGD, one epoch at a global batch of
    64): a rerun repeats bit for bit; 1 replica with 2 micro-batches of 32 and 2 replicas
    of 32 compute the same sums (two terms add alike in either order) and end 1e-7 apart;
    runs whose sums differ in the last bit (a batch of 64 against two of 32, four
    micro-batches accumulated against a 4-replica all-reduce) end 1e-7 apart or 1e-2 apart,
    depending on whether a ReLU or max-pooling comparison falls the other way: in plain
    Keras on one device, one weight moved by one last bit ends 1.4e-2 apart after an epoch
    (scripts/ulp_probe.py).

    Args:
        deterministic: the config's `deterministic`.
        kind: the devices' kind, `cpu` or `gpu`.
        onednn: whether TensorFlow started with its oneDNN CPU kernels on.
        random: the model's layers that draw random numbers (`random_layers`).
        micro_batch: examples each device computes at once (the batch per replica).
    """
    if not deterministic:
        return None
    text = "op determinism"
    if kind == "cpu":
        text += (", oneDNN's CPU kernels on (TF_ENABLE_ONEDNN_OPTS=1, or TensorFlow started "
                 "before the run could set 0)" if onednn else
                 ", oneDNN's CPU kernels off (TF_ENABLE_ONEDNN_OPTS=0)")
    text += ": a rerun on as many devices repeats bit for bit"
    if random:
        return text + (f"; other device counts do not: its {', '.join(random)} layers draw "
                       "each replica's share of the randomness on their own")
    return text + ("; with plain SGD, a run on 2 devices or 2 workers of "
                   f"{micro_batch} examples and one on 1 device with 2 micro-batches of "
                   f"{micro_batch} (batch.accumulate=auto batch.max_per_replica={micro_batch})"
                   " compute the same sums (two partial sums added) and end within 1e-5;"
                   " other device and worker counts differ in their sums' last bits, which a"
                   " ReLU or max-pooling comparison can turn into a difference of about 1e-2"
                   " after an epoch")


FORWARD_LOSSES = ("the model adds losses in its forward pass (add_loss, an activity "
                  "regularizer): each replica's are of its share of the batch, summed over "
                  "the replicas and divided by {n}, as Keras takes them under a strategy (a "
                  "mean over the batch is exact on even shares; a sum over the batch counts "
                  "1/{n} of what it counts on one device)")
OWN_STEP = ("the model's own train_step, as written (it decides how each replica's examples "
            "weigh; super().train_step is Keras's per-replica mean, which weighs an uneven "
            "last batch's shares alike)")


def _how_it_ran(spec: Any, run: Any, outcome: Any, callbacks: Any, started: float,
                start: tuple[int, int], changes: dict | None) -> dict[str, Any]:
    throughput = callbacks.throughput
    return {
        "epochs": spec.epochs,
        "epochs_done": outcome.epochs_done,
        "stopped_early": ({"epoch": outcome.epochs_done, "of": spec.epochs}
                          if outcome.stopped_early else None),
        # a sweep job's trial its study's pruner stopped: trial, epoch, value
        "pruned": callbacks.trial.pruned if callbacks.trial is not None else None,
        "resumed_from": _resumed_from(start, spec.epochs, run.steps, changes),
        "steps_per_epoch": run.steps,
        # under `trainer.launch --max-restarts`: the restarts and the steps done twice
        "restarts": _restarts(),
        # checkpoint.recover: each loss blow-up recovered from (None: none)
        "recovered": callbacks.backup.recovery.recovered or None,
        "train_examples": run.data.source.train_size,
        "validation_examples": run.data.source.validation_size,
        "time": {"wall_s": time.perf_counter() - started,
                 "startup_s": outcome.startup_s,
                 "build_s": outcome.build_s,
                 "first_step_s": throughput.first_step_s,
                 "first_epoch_s": throughput.first_epoch_s,
                 "saving_s": sum(c.seconds for c in callbacks.checkpoints)
                 + callbacks.backup.store.seconds,
                 "final_evaluation_s": outcome.evaluation_s},
        "examples_per_sec": throughput.examples_per_sec,
        "epoch_examples_per_sec": throughput.epoch_rates,
    }


def _restarts() -> dict[str, int] | None:
    """How often `python -m trainer.launch --max-restarts` started this run's cluster again,
    the steps trained twice, and the workers it started with where it went on with fewer
    (`--min-workers`), as it tells the workers (`trainer.distribute.restarts`' RESTARTS,
    STEPS_AGAIN, WORKERS_AT_START); None for a run no such launcher started."""
    if "TRAINER_RESTARTS" not in os.environ:
        return None
    found = {"count": int(os.environ["TRAINER_RESTARTS"]),
             "steps_trained_again": int(os.environ.get("TRAINER_STEPS_AGAIN", "0"))}
    if "TRAINER_WORKERS_AT_START" in os.environ:  # `--min-workers`: it went on with fewer
        found["workers_at_start"] = int(os.environ["TRAINER_WORKERS_AT_START"])
    return found


def _results(spec: Any, run: Any, plan: Any, outcome: Any) -> dict[str, Any]:
    train_metrics = {k: float(v[-1]) for k, v in outcome.history.items()
                     if v and not k.startswith("val_") and k != "learning_rate"}
    return {
        "train_metrics": train_metrics,
        "history": {k: [float(x) for x in v] for k, v in outcome.history.items()},
        "validation_metrics": dict(outcome.validation),
        "augment": _augment(spec.augment),
        "splits": run.data.source.splits,
        "data": of_source(run.data.source) if run.is_chief else None,  # the chief's to write
        "test_examples": run.data.source.test_size,
        "test_metrics": None if outcome.test is None else dict(outcome.test),
        "test_checkpoint": outcome.test_checkpoint,
        "seed": spec.seed,
        "warnings": list(plan.warnings),
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }


def _resumed_from(start: tuple[int, int], epochs: int, steps: int,
                  changes: dict | None) -> dict[str, Any] | None:
    """Where a resumed run took over (1-based epoch, steps of it done); a run resumed after
    its last epoch (stopped in the final evaluation or export) says so, not "epoch 4 of 3"."""
    if not any(start):
        return None
    if start[0] >= epochs and not start[1]:
        return {"epoch": start[0], "step": steps, "changed": changes or {},
                "training_done": True}
    return {"epoch": start[0] + 1, "step": start[1], "changed": changes or {}}


def _augment(augment: Any) -> dict[str, Any] | None:
    return describe(augment or None)


def _time_row(times: dict[str, Any]) -> str:
    parts = [f"{name} {times[key]:.1f} s" for key, name in (
        ("startup_s", "start-up before it"), ("saving_s", "saving"),
        ("final_evaluation_s", "final evaluation")) if times.get(key) is not None]
    return f"{times['wall_s']:.1f} s" + (f" ({', '.join(parts)})" if parts else "")


def _epochs_row(summary: dict[str, Any]) -> str:
    text = f"{summary['epochs']} x {summary['steps_per_epoch']} steps"
    stopped, pruned = summary.get("stopped_early"), summary.get("pruned")
    if pruned:
        text += (f"; pruned after epoch {pruned['epoch']} of {summary['epochs']} (Optuna "
                 f"trial {pruned['trial']})")
    elif stopped:
        text += f"; stopped early after epoch {stopped['epoch']} of {stopped['of']} (callback)"
    return text


def _micro_row(batch: dict[str, Any]) -> str:
    cap = batch.get("max_per_replica")
    return f"{batch['per_replica']}" + (f" (cap {cap})" if cap else "")


def _global_row(batch: dict[str, Any]) -> str:
    accumulate = batch.get("accumulate", 1)
    if accumulate == 1:
        return str(batch["global"])
    return (f"{batch['global']} = {batch['per_replica']} x {batch['replicas']} replicas x "
            f"{accumulate} micro-batches accumulated per optimizer step")


def _input_row(reading: dict[str, Any]) -> str:
    """The cache, and what each worker reads (`trainer.data.wiring.Reading.report`)."""
    row = f"cache {reading['cache']}, {reading['reads']}"
    if reading.get("service"):
        row += f"; preprocessed on {reading['service']['says']}"
    return row + "".join(f"; {note}" for note in reading.get("notes") or [])


def _rate_row(rate: dict[str, Any]) -> str:
    auto = " (auto: one device's batch)" if rate.get("reference") == "auto" else ""
    text = ("{base:.6g} -> {scaled:.6g} ({rule}, reference batch {reference_batch}{auto}, "
            "warm-up {warmup_steps} steps, decay {decay})").format(**rate, auto=auto)
    if rate.get("final") is not None:
        text += f"; {rate['final']:.6g} at the end, set by {', '.join(rate['set_by'])}"
    return text


def _optimizer_row(summary: dict[str, Any]) -> str:
    settings = summary.get("optimizer_settings") or {}
    return summary["optimizer"] + (" (" + ", ".join(f"{k}={_fmt(v)}" for k, v in
                                                   settings.items()) + ")" if settings else "")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def format_summary(summary: dict[str, Any]) -> str:
    """Renders the summary as aligned `name: value` lines."""
    rows = [
        ("run directory", summary["run_dir"]),
        ("model / dataset", f"{summary['model']} / {summary['dataset']}"),
        *([("parameters", "{trainable:,} trainable, {frozen:,} frozen".format(
            **summary["parameters"]))] if summary.get("parameters") else []),
        *([("image size", summary["image_size"]["why"])] if summary.get("image_size")
          else []),
        ("devices", _fmt(summary["devices"]) + "".join(
            f" ({note})" for note in summary.get("device_notes") or [])),
        ("replicas", summary["replicas"] if summary.get("workers", 1) == 1 else
         f"{summary['replicas']} on {summary['workers']} workers"),
        *([("restarts", _restarts_row(summary["restarts"]))] if summary.get("restarts")
          else []),
        ("strategy", f"{summary['strategy']} (cross-device ops: {summary['cross_device_ops']})"),
        ("batch per replica", _micro_row(summary["batch"])),
        ("batch global", _global_row(summary["batch"])),
        *[("data", note) for note in summary.get("data_notes") or []],
        ("learning rate", _rate_row(summary["learning_rate"])),
        ("optimizer / loss", f"{_optimizer_row(summary)} / {summary['loss']}"),
        *([("callbacks", ", ".join(summary["callbacks"]))] if summary.get("callbacks")
          else []),
        *_model_rows(summary),
        ("epochs", _epochs_row(summary)),
        ("wall time", _time_row(summary["time"])),
        ("time to first step", "n/a (nothing left to train)"
         if summary["time"].get("first_step_s") is None
         else f"{summary['time']['first_step_s']:.1f} s"),
        ("throughput", f"{summary['examples_per_sec']:.1f} examples/s"
         if summary["examples_per_sec"] else "n/a (too few steps)"),
    ]
    rows += [(f"train {k}", v) for k, v in summary["train_metrics"].items()]
    rows += [(f"validation {k}", v) for k, v in summary["validation_metrics"].items()]
    validated = (summary.get("validated_by") or {}).get("says")  # an evaluator's
    rows += [("validated by", validated)] if validated else []
    if summary.get("test_metrics") is not None:
        rows += [(f"test {k}", v) for k, v in summary["test_metrics"].items()]
        used = (Path(summary["test_checkpoint"]).name if summary.get("test_checkpoint")
                else "the final weights")
        rows.append(("test checkpoint", f"{used} ({summary['test_examples']} examples, "
                     "evaluated once)"))
    rows += _averaged_rows(summary)
    if summary.get("augment"):
        rows.append(("augmentation", f"{', '.join(summary['augment']['applied'])} in the "
                     f"{summary['augment']['where']}"))
    rows += [(f"logged to {k}", v) for k, v in (summary.get("loggers") or {}).items()]
    for phase in summary.get("finetune") or []:
        rows.append((f"from epoch {phase['from_epoch']}", f"{phase['trains']}: "
                     f"{phase['trainable']:,} of {phase['total']:,} parameters trainable"))
    width = max(len(name) for name, _ in rows)
    lines = [f"  {name:<{width}}  {_fmt(value)}" for name, value in rows]
    return "\n".join(["Summary", *lines])


def _restarts_row(restarts: dict[str, Any]) -> str:
    text = (f"{restarts['count']} (steps trained again: "
            f"{restarts.get('steps_trained_again', 0)})")
    if restarts.get("workers_at_start"):
        text += (f"; started on {restarts['workers_at_start']} workers, went on without "
                 "the one(s) lost for good (--min-workers), at the same global batch")
    return text


def _averaged_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """The k best checkpoints kept, and the averaged model's metrics (`test (averaged)
    accuracy`) and what it averaged."""
    rows = []
    kept = summary.get("best_checkpoints")
    if kept:
        rows.append(("best checkpoints", ", ".join(Path(k["checkpoint"]).name for k in kept)))
    averaged = summary.get("averaged")
    if not averaged:
        return rows
    split = averaged["split"]
    rows += [(f"{split} (averaged) {k}", v) for k, v in averaged["metrics"].items()]
    what = (f"EMA of the weights, momentum {averaged['momentum']:g}"
            if averaged["kind"] == "ema" else
            f"mean of the {len(averaged['of'])} best checkpoints")
    rows.append((f"{split} (averaged) model", f"{Path(averaged['checkpoint']).name} ({what}, "
                 "evaluated once)"))
    return rows


def _model_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """The summary's rows that appear only where they say something: a compiled model, a
    model's own step, batch norm, exactness, how the input was read."""
    return [
        *([("compiled by", f"{summary['compiled_by']} (its loss, metrics and loss "
                           "weights train)")]
          if summary.get("compiled_by", "config") != "config" else []),
        *([("checkpoints hold", summary["checkpoints_hold"])]
          if str(summary.get("checkpoints_hold", "")).startswith("weights only") else []),
        *([("train step", summary["train_step"])]
          if summary.get("train_step") == OWN_STEP else []),
        *([("own losses", summary["forward_losses"])] if summary.get("forward_losses") else []),
        *([("checkpoints load with", summary["checkpoints_load_with"])]
          if str(summary.get("checkpoints_load_with", "")).startswith("trainer") else []),
        *([("batch norm", summary["batch_norm"])] if summary.get("batch_norm") else []),
        *([("deterministic", summary["deterministic"])] if summary.get("deterministic")
          else []),
        *([("input", _input_row(summary["input"]))] if summary.get("input") else []),
    ]


def write_summary(summary: dict[str, Any], run_dir: Path, place: Any = None) -> None:
    """Writes `summary.json` atomically, keeps the newest two backups (what `resume=DIR`
    extends the finished run from), and prints the summary; a run directory at a URL
    (`place`, its `trainer.rundir.remote.RunPlace`) is named by its URL there (its local
    mirror is removed when the command ends)."""
    summary.update(write_finished(run_dir, summary, place))
    print(format_summary(summary), flush=True)
