"""The Python API: `trainer.fit`, `trainer.evaluate`, `trainer.predict`.

`fit(overrides)` is the command line in one call: the config is composed by Hydra's compose
API from the same schema and search path (`config_dir` in front, as `--config-dir`), the same
pre-flight checks run (the directory's lock taken first), the same start-up sequence follows
(`trainer.run.prepare.startup`: the run's owner and its guards, TensorFlow started as quietly), and
the run writes the same run directory (`.hydra/config.yaml` too, so `trainer.evaluate` and
`trainer.predict` work on it). Every failure raises `TrainerError`, whose message is the
line the command line prints after `error: `, and whose `exit_code` is the command line's.

Where TensorFlow already started in this process (a layer, a dataset made first; any
notebook) as the run cannot have it (more devices, oneDNN's kernels off for
`deterministic=true`, a cluster's worker), `fit` runs the same call in a fresh child process
(`trainer.child`) and returns its `Result`.

What the API does not do: sweeps (`-m`; call `fit` in a loop, or use Hydra's command line).
A run starts the one way the command line starts it (`start_composed`): `${hydra:...}`
reads the run's own composition, and the run keeps its log (`trainer.log`) beside the
process's own logging.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from trainer import child
from trainer.config.compose import Composed, composed
from trainer.config.errors import ConfigError
from trainer.config.given import NODES, holding
from trainer.config.given import overrides as named_by
from trainer.config.outcome import as_overrides, one_error
from trainer.config.overrides import is_multirun, sets, value
from trainer.config.schema import register_configs
from trainer.distribute.cluster import cluster_of_config
from trainer.internals.tf_start import cpp_notices_dropped
from trainer.run import process
from trainer.run.prepare.place import RunPlace, checkpoints_at, is_url, opened
from trainer.run.prepare.startup import Finished, start_composed
from trainer.rundir.layout import RunDir


@dataclass(frozen=True)
class Result:
    """What a run left: its summary (`summary.json`, as written), the per-epoch history,
    the run directory and its checkpoints."""

    summary: dict[str, Any]
    run_dir: Path | str  # a run directory at a URL: the URL

    @property
    def history(self) -> dict[str, list[float]]:
        """Loss and each metric per epoch, train and validation (`val_` prefix)."""
        return self.summary.get("history") or {}

    @property
    def checkpoints(self) -> dict[str, Path | str]:
        """`best`, `last` and `averaged` checkpoints that exist, by name (their URLs, for a
        run directory at a URL)."""
        if is_url(self.run_dir):
            return checkpoints_at(str(self.run_dir), ("best", "last", "averaged"))
        layout = RunDir(self.run_dir)
        return {name: layout.checkpoint(name) for name in ("best", "last", "averaged")
                if layout.checkpoint(name).is_file()}

    @property
    def metrics(self) -> dict[str, float]:
        """The final validation metrics, the test metrics with a `test_` prefix, and the
        averaged model's where the run kept one (`test_averaged_accuracy`)."""
        found = {f"val_{k}": v for k, v in self.summary.get("validation_metrics", {}).items()}
        found.update({f"test_{k}": v
                      for k, v in (self.summary.get("test_metrics") or {}).items()})
        averaged = self.summary.get("averaged") or {}
        found.update({f"{averaged['split']}_averaged_{k}": v
                      for k, v in averaged.get("metrics", {}).items()})
        return found


@dataclass(frozen=True)
class FitCall:
    """One `trainer.fit` call's arguments: `model.fit`'s (Keras 3's, in its order, with
    Keras's meaning on one device), then trainer's own (keyword only). See `fit`."""

    model: Any = None
    x: Any = None
    y: Any = None
    batch_size: int | None = None
    epochs: int | None = None
    verbose: Any = None
    callbacks: Any = None
    validation_split: float | None = None
    validation_data: Any = None
    shuffle: Any = None
    class_weight: Any = None
    sample_weight: Any = None
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    validation_freq: int = 1
    _: KW_ONLY
    devices: Any = None
    accelerator: str | None = None
    strategy: str | None = None
    overrides: Sequence[str] = ()
    config_dir: str | Path | None = None
    run_dir: str | Path | None = None
    data: Any = None

    @property
    def keras_form(self) -> bool:
        """Whether the data comes through Keras's arguments (`x`): Keras's defaults too."""
        return self.x is not None or self.validation_data is not None


def fit(*args: Any, **kwargs: Any) -> Result:
    """Trains a model as Keras's `model.fit` would, on the devices asked for.

    Keras's form, `trainer.fit(model, x, y, batch_size=None, epochs=1, ..., devices=None,
    accelerator=None, strategy=None, overrides=(), config_dir=None, run_dir=None)` (the
    fields of `FitCall`): porting a script is changing `model.fit(` to `trainer.fit(model, `
    and adding the device choice. The command line's form, `trainer.fit(overrides,
    config_dir=None, run_dir=None, *, model=None, data=None, callbacks=())`, is
    `python -m trainer OVERRIDES` in one call.

    Args:
        model: a Keras model (compiled or not: rebuilt inside the strategy's scope with its
            weights and compile arguments, its trained weights written back into it as
            `model.fit` leaves them), a function returning one (called inside the scope
            with what its signature names: `input_shape`, `num_classes`, `train`, ...), or
            its dotted name.
        x, y, sample_weight, validation_data, epochs, verbose, validation_split, shuffle,
            class_weight, steps_per_epoch, validation_steps: as `model.fit` takes them;
            where the data comes as `x`, Keras's defaults too (one epoch).
        batch_size: Keras's batch on one device: trainer's global batch
            (`batch.global_size`), split over the replicas (16 on each of 2 for 32), the
            learning rate the one set for it. None: a batched dataset's own, else 32.
        callbacks: Keras callbacks, called as `model.fit` calls them, after trainer's own;
            their state after training is what they reached, in a fresh process too.
        initial_epoch, validation_freq: Keras's defaults only (0, 1); else one line (a run
            resumes from its own backups: the same `run_dir`, or `resume=`).
        devices, accelerator, strategy: the devices (`devices=2`, `devices=[0, 1]`,
            `accelerator="cpu"`); None: the config's (every GPU, or the CPU as one).
        overrides: `key=value` strings, as on the command line (a list, never one string).
        config_dir: a folder of the user's own config files (`--config-dir`).
        run_dir: where the run writes; `hydra.run.dir` (`outputs/DATE/TIME`) when None. A
            URL (`s3://...`, `gs://...`) is kept in step with a local mirror.
        data: the command line's form's data instead of `dataset._target_`: a dataset,
            arrays `(x, y)`, `(x, y, sample_weight)` or `x`, a dict of splits (`train`,
            `validation`, `test`), a function returning one, or its dotted name.

    Returns:
        The run's `Result` (a finished run's, for `resume=DIR` with nothing to add; on a
        worker other than the chief, its own summary with the run directory named).

    Raises:
        TrainerError: with the command line's one line and exit code.
    """
    if args and (args[0] is None or isinstance(args[0], (list, tuple, str))):  # the CLI's
        if len(args) > 3:
            raise TypeError(f"trainer.fit(overrides, config_dir, run_dir) takes at most 3 "
                            f"positional arguments; received {len(args)}")
        given = dict(zip(("overrides", "config_dir", "run_dir"), args, strict=False))
        twice = sorted(set(given) & set(kwargs))
        if twice:
            raise TypeError(f"trainer.fit got {', '.join(twice)} twice")
        return _fit(_call(**given, **kwargs))
    return _fit(_call(*args, **kwargs))


def _call(*args: Any, **kwargs: Any) -> FitCall:
    """The call's arguments; a wrong one is Python's own error, naming `trainer.fit`."""
    try:
        return FitCall(*args, **kwargs)
    except TypeError as error:
        raise TypeError(str(error).replace("FitCall.__init__()", "trainer.fit()")) from None


fit.__signature__ = inspect.signature(FitCall).replace(return_annotation=Result)


def _fit(call: FitCall) -> Result:
    """`fit` for its arguments."""
    process.quiet_logs()
    instance = call.model if _is_keras_model(call.model) else None
    model, data = call.model, call.data
    with one_error():
        given = as_overrides(call.overrides, "trainer.fit")
        if call.keras_form and data is not None:
            raise ConfigError("trainer.fit takes the data once: x=, y=, validation_data= as "
                              "model.fit takes them, or data= (the command-line form)")
        given = [*keras_overrides(call), *given]
        if call.keras_form:
            data = keras_data(call.x, call.y, call.sample_weight, call.validation_data)
        if instance is not None:
            from trainer.models.instance import builder_of

            model = builder_of(instance)
        extra = _callbacks(call.callbacks if call.callbacks is not None else ())
        with cpp_notices_dropped():  # TensorFlow imported first: its C++ notices are on
            found = _fit_overrides(given, call.config_dir, call.run_dir, model, data, extra)
    if instance is not None and isinstance(found, Result):
        _write_back(instance, found)
    return found


def keras_overrides(call: FitCall) -> list[str]:
    """The overrides that give `model.fit`'s arguments their Keras meaning; where the data
    comes through Keras's arguments (`FitCall.keras_form`), Keras's defaults too (one
    epoch).

    Raises:
        ConfigError: an argument trainer cannot honour (one line naming it).
    """
    if call.initial_epoch not in (0, None):
        raise ConfigError(f"trainer.fit does not take initial_epoch={call.initial_epoch}: "
                          "a run resumes from its own backups (run it again with the same "
                          "run_dir, or overrides=['resume=DIR']); leave initial_epoch out")
    if call.validation_freq not in (1, None):
        raise ConfigError(f"trainer.fit validates every epoch (the best checkpoint and early "
                          f"stopping read it); validation_freq={call.validation_freq!r} "
                          "cannot be honoured: leave it out")
    if call.shuffle not in (None, True, False):
        raise ConfigError(f"trainer.fit takes shuffle=True or False; received: "
                          f"{call.shuffle!r} (trainer shuffles examples, not whole batches)")
    epochs = call.epochs if call.epochs is not None else (1 if call.keras_form else None)
    found = {"devices": _devices_text(call.devices), "accelerator": call.accelerator,
             "strategy": call.strategy, "epochs": epochs,
             "batch.global_size": call.batch_size, "verbose": call.verbose,
             "validation_split": call.validation_split or None,
             "dataset.shuffle": None if call.shuffle is None else str(call.shuffle).lower(),
             "class_weight": _dict_text(call.class_weight),
             "steps_per_epoch": call.steps_per_epoch,
             "validation_steps": call.validation_steps}
    return [f"{key}={value}" for key, value in found.items() if value is not None]


def keras_data(x: Any, y: Any, sample_weight: Any, validation_data: Any) -> dict[str, Any]:
    """`model.fit`'s data as trainer's splits: `{"train": ..., "validation": ...}`."""
    if x is None:
        raise ConfigError("trainer.fit has validation_data but no x: give the training data "
                          "as model.fit takes it (x, y)")
    train = x if y is None and sample_weight is None else (
        (x, y) if sample_weight is None else (x, y, sample_weight))
    return {"train": train, **({} if validation_data is None
                               else {"validation": validation_data})}


def _devices_text(devices: Any) -> str | None:
    if devices is None or isinstance(devices, str):
        return devices
    if isinstance(devices, (list, tuple)):
        return "[" + ",".join(str(d) for d in devices) + "]"
    return str(devices)


def _dict_text(weights: Any) -> str | None:
    if weights is None:
        return None
    if not isinstance(weights, dict):
        raise ConfigError(f"class_weight is a dict of class index to weight, as model.fit "
                          f"takes it; received: {type(weights).__name__}")
    return "{" + ", ".join(f"{int(k)}: {float(v)!r}" for k, v in weights.items()) + "}"


def _is_keras_model(obj: Any) -> bool:
    """Whether `obj` is a Keras model instance (Keras imported by whoever made it)."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(obj, keras.Model)


def _write_back(instance: Any, found: Result) -> None:
    """The trained weights into the caller's model instance, as `model.fit` leaves them
    (the last epoch's: `checkpoints/last.keras`), where this process wrote the run; a run
    at a URL keeps them there, and so does the chief of a cluster."""
    cluster = found.summary.get("cluster") or {}
    if cluster.get("task_id", 0) != 0:
        return  # another worker's: the chief wrote the run (and keeps its weights)
    last = found.checkpoints.get("last")
    if last is None or is_url(last) or not Path(last).is_file():
        return
    from trainer.models.instance import write_back

    with one_error():
        write_back(instance, last)


def _fit_overrides(given: list[str], config_dir: str | Path | None,
                   run_dir: str | Path | None, model: Any, data: Any,
                   extra: tuple) -> Result:
    """The command line's form: the overrides, the objects standing in for `_target_`s, the
    callbacks; run here, or in a fresh process where this one's TensorFlow cannot have it."""
    run = _composed(given, config_dir, run_dir, _named(model=model, data=data))
    # TensorFlow started in this process, as this run cannot have it (trainer.child)
    fresh = child.needed(run)
    if fresh is not None:
        return child.fit_in_child(fresh, _fit_overrides, dict(
            given=given, config_dir=config_dir, run_dir=run_dir, model=model, data=data,
            extra=extra), callbacks=extra)
    with holding(**_objects(given, model=model, data=data)):
        return _run(run, extra)


def _callbacks(callbacks: Any) -> tuple:
    """`fit`'s `callbacks` as a tuple; anything but a list or tuple of them is one line
    (each is checked to be a Keras callback once Keras is imported:
    `trainer.run.assembly.wiring`)."""
    if isinstance(callbacks, (list, tuple)):
        return tuple(callbacks)
    raise ConfigError("trainer.fit takes callbacks as a list of Keras callbacks, as "
                      f"model.fit does (callbacks=[...]); received: {type(callbacks).__name__}")


def _args(given: list[str], config_dir: str | Path | None,
          run_dir: str | Path | None) -> list[str]:
    """`fit`'s command line: `--config-dir`, the overrides, `hydra.run.dir`."""
    args = [*(["--config-dir", str(config_dir)] if config_dir is not None else []), *given]
    return [*args, f"hydra.run.dir={run_dir}"] if run_dir is not None else args


def _composed(given: list[str], config_dir: str | Path | None, run_dir: str | Path | None,
              named: list[str]) -> Composed:
    """`fit`'s one composition: its command line (`named` are the overrides that name the
    objects it was given) composed as `python -m trainer` composes it."""
    given = [*named, *_global_size_alone(given)]
    args = _args(given, config_dir, run_dir)
    if is_multirun(args):
        raise ConfigError("trainer.fit runs one config; a sweep (-m) is the command "
                          "line's: call fit in a loop, or run python -m trainer -m ...")
    register_configs()
    run = composed(args)
    if run is None:
        raise ConfigError(f"trainer.fit trains one config; {' '.join(given)} is a command "
                          f"of the command line's: python -m trainer {' '.join(given)}")
    return run


def _at(found: Any, place: RunPlace | None) -> Any:
    """A `Result` of a run at a URL names the URL, not its local mirror (removed)."""
    if place is None or not isinstance(found, Result):
        return found
    return Result(summary=found.summary, run_dir=place.url)


def _run(run: Composed, callbacks: tuple = ()) -> Result:
    """Runs `fit`'s composition with the given Keras callbacks, at the run's place
    (`trainer.run.prepare.place.opened`: a run directory at a URL runs in its local mirror,
    and the Result names the URL)."""
    with one_error(), opened(run) as (there, place):
        return _at(_run_at(there, callbacks, place), place)


def _run_at(run: Composed, callbacks: tuple, place: RunPlace | None) -> Result:
    """`_run` for the run as it runs at its place (`place`: a URL's; None: local), started
    the one way the command line starts it (`start_composed`)."""
    cluster = cluster_of_config(run.cfg.cluster, os.environ)
    if cluster is not None and not cluster.is_chief:
        return _as_worker(run, place, callbacks)
    found = start_composed(run, process.start_run, place, callbacks)
    if isinstance(found, Finished):
        return _result(found.run_dir)
    if run.cfg.get("tune") is not None:
        return found  # what the tuner found (trainer.tune)
    return _result(Path(run.cfg.get("resume") or run.logs))


def _global_size_alone(overrides: list[str]) -> list[str]:
    """The overrides, with `batch.per_replica=null` added where they set
    `batch.global_size` and not `batch.per_replica`: the global batch alone sets the batch,
    as `fit(batch_size=N)` does, instead of being refused beside the default per-replica
    batch."""
    if value(overrides, "batch.global_size") in (None, "null") or sets(
            overrides, "batch.per_replica"):
        return overrides
    return [*overrides, "batch.per_replica=null"]


def _as_worker(run: Composed, place: RunPlace | None = None, callbacks: tuple = ()) -> Result:
    """A worker of a cluster other than the chief (the same script started on every
    machine): the chief writes the run directory, so this worker's own `.hydra/` and log go
    to a temporary directory, never into the chief's, and its `Result` holds its own summary
    (the run's history, as the chief's) with the run directory the call named. The user's
    callbacks run here too, as Keras's `fit` runs them on every worker."""
    with tempfile.TemporaryDirectory(prefix="trainer-worker-") as logs:
        found = start_composed(run.at(logs), process.start_run, place, callbacks)
    if isinstance(found, Finished):
        return _result(found.run_dir)
    return Result(summary=found, run_dir=Path(run.cfg.get("resume") or run.logs))


def _named(**objects: Any) -> list[str]:
    """The overrides naming the given objects (`trainer.config.given.overrides`); a string
    is a dotted name, as `model._target_=` takes it."""
    found = []
    for role, obj in objects.items():
        if isinstance(obj, str):
            found.append(f"{NODES[role]}._target_={obj}")
        else:
            found += named_by(role, obj)
    return found


def _objects(overrides: list[str], **objects: Any) -> dict[str, Any]:
    """What the call holds for the run (`trainer.config.given.holding`): the objects no
    dotted name reaches, whether a batched dataset's own batch is the global batch (the
    overrides set no batch), and whether a given dataset is left uncached (the overrides
    set no `dataset.cache`)."""
    held = {role: obj for role, obj in objects.items()
            if obj is not None and not isinstance(obj, str)}
    sets_batch = sets(overrides, "batch.per_replica", "batch.global_size")
    sets_cache = sets(overrides, "dataset.cache")
    given = objects.get("data") is not None
    return {**held, "batch_from_data": given and not sets_batch,
            "cache_from_data": given and not sets_cache}


def tune(overrides: Sequence[str] = (), what: str = "lr",
         config_dir: str | Path | None = None, run_dir: str | Path | None = None, *,
         model: Any = None, data: Any = None) -> dict[str, Any]:
    """`python -m trainer tune=WHAT OVERRIDES` in this process: a learning-rate range test
    (`what="lr"`) or the per-replica batch's throughput curve (`"batch"`) for the run the
    overrides describe, written into a new run directory (`lr_find.png`, `lr_find.json`).

    Returns:
        What the tuner found: the curve, the suggestion, and `line`, the override to paste.

    Raises:
        TrainerError: with the command line's one line and exit code.
    """
    with one_error():  # as fit checks them: one string would be read character by character
        given = as_overrides(overrides, "trainer.tune")
    return fit([*given, f"tune={what}"], config_dir, run_dir, model=model, data=data)


def _result(run_dir: Path) -> Result:
    summary = json.loads(RunDir(run_dir).summary.read_text())
    return Result(summary=summary, run_dir=Path(run_dir))


def evaluate(run_dir: str | Path, overrides: Sequence[str] = (), *, model: Any = None,
             data: Any = None) -> dict[str, Any]:
    """`python -m trainer.evaluate RUN_DIR OVERRIDES` in this process: a finished run's
    checkpoint on its validation (or `split=test`) examples, each once. A run trained on
    Python objects (`fit(model=..., data=...)`) takes the same objects again.

    Raises:
        TrainerError: with the command line's one line.
    """
    # lazy: it imports the run's assembly, which imports TensorFlow
    import trainer.evaluate

    return trainer.evaluate(run_dir, overrides, model=model, data=data)


def predict(run_dir: str | Path, input: Any, output: str | Path | None = None,
            overrides: Sequence[str] = (), overwrite: bool = False, *, model: Any = None,
            data: Any = None) -> dict[str, Any]:
    """`python -m trainer.predict RUN_DIR input=INPUT output=OUTPUT` in this process; `input`
    may also be a list of image paths, a NumPy array or a dict of arrays. A run trained on
    Python objects takes the same objects again (`model=`, `data=`).

    Raises:
        TrainerError: with the command line's one line.
    """
    # lazy: it imports the run's assembly, which imports TensorFlow
    import trainer.predict

    return trainer.predict(run_dir, input, output, overrides, overwrite, model=model,
                           data=data)
