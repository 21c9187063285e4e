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

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
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


def fit(overrides: Sequence[str] = (), config_dir: str | Path | None = None,
        run_dir: str | Path | None = None, *, model: Any = None, data: Any = None,
        callbacks: Sequence[Any] = ()) -> Result:
    """Trains as `python -m trainer OVERRIDES` would, in this process.

    Args:
        overrides: `key=value` strings, as on the command line (`["devices=2", "epochs=3"]`):
            a list, never one string.
        config_dir: a folder of the user's own config files (`--config-dir`).
        run_dir: where the run writes; the config's `hydra.run.dir` (by default
            `outputs/DATE/TIME`) when None. A URL (`s3://...`, `gs://...`) is kept in step
            with a local mirror (docs/resume.md), which the `Result` names.
        model: the model builder instead of `model._target_`: a function returning a Keras
            model (compiled or not), called inside the strategy's scope with what its
            signature names (`input_shape`, `num_classes`, `train`, ...), or its dotted name.
        data: the data instead of `dataset._target_`: a `Source`, a `tf.data.Dataset`
            (batched or not), arrays `(x, y)`, `(x, y, sample_weight)` or `x`, a dict of
            such splits (`train`, `validation`, `test`), a function returning one of
            those, or its dotted name. Unless the overrides set `batch.per_replica` or
            `batch.global_size`, the global batch is Keras's: a batched dataset's own, else 32.
        callbacks: Keras callback objects (`keras.callbacks.Callback`, a class of the
            script's own too), called as `model.fit(callbacks=...)` calls them, after
            trainer's own and the config's; the summary names them.

    Returns:
        The run's `Result`; for `resume=DIR` of a finished run with nothing more to do, the
        finished run's; on a worker of a cluster other than the chief, its own summary with
        the run directory the call named (the chief writes it).

    Raises:
        TrainerError: with the command line's one line and exit code.
    """
    process.quiet_logs()
    with one_error():
        given = as_overrides(overrides, "trainer.fit")
        extra = _callbacks(callbacks)
        _builder_not_model(model)
        run = _composed(given, config_dir, run_dir, _named(model=model, data=data))
        # TensorFlow started in this process, as this run cannot have it (trainer.child)
        fresh = child.needed(run)
        if fresh is not None:
            return child.fit_in_child(fresh, fit, dict(
                overrides=given, config_dir=config_dir, run_dir=run_dir, model=model,
                data=data, callbacks=list(extra)))
        with holding(**_objects(given, model=model, data=data)):
            return _run(run, extra)


def _builder_not_model(model: Any) -> None:
    """`model=` takes a function that returns the model: a Keras model itself (its variables
    made outside the strategy's scope) is one line saying so."""
    if isinstance(model, (str, type)) or not all(
            hasattr(model, name) for name in ("fit", "compile", "layers")):
        return
    raise ConfigError(f"model= takes a function that returns the model, not a model (a "
                      f"{type(model).__name__}): trainer calls it inside the strategy's "
                      "scope, so the variables are mirrored over the replicas; pass a "
                      "function that returns it (def build(): return model ...; model=build)")


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
        return _as_worker(run, place)
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


def _as_worker(run: Composed, place: RunPlace | None = None) -> Result:
    """A worker of a cluster other than the chief (the same script started on every
    machine): the chief writes the run directory, so this worker's own `.hydra/` and log go
    to a temporary directory, never into the chief's, and its `Result` holds its own summary
    (the run's history, as the chief's) with the run directory the call named."""
    with tempfile.TemporaryDirectory(prefix="trainer-worker-") as logs:
        found = start_composed(run.at(logs), process.start_run, place)
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
