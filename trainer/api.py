"""The Python API: `trainer.fit`, `trainer.evaluate`, `trainer.predict`.

`fit(overrides)` is the command line in one call: the config is composed by Hydra's compose
API from the same schema and search path (`config_dir` in front, as `--config-dir`), the same
pre-flight checks run (the directory's lock taken first), the same start-up sequence follows
(`trainer.run.startup`: the run's owner and its guards, TensorFlow started as quietly), and
the run writes the same run directory (`.hydra/config.yaml` too, so `trainer.evaluate` and
`trainer.predict` work on it). Every failure raises `TrainerError`, whose message is the
line the command line prints after `error: `, and whose `exit_code` is the command line's.

What the API does not do: sweeps (`-m`; call `fit` in a loop, or use Hydra's command line),
and `${hydra:...}` interpolations, which need a running Hydra job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from trainer.config.compose import composed
from trainer.config.errors import ConfigError
from trainer.config.given import NODES, holding
from trainer.config.given import overrides as named_by
from trainer.config.outcome import as_overrides, one_error
from trainer.config.schema import register_configs
from trainer.run import process
from trainer.run.at_url import check_configured, checkpoints_at, is_url, run_at_url
from trainer.run.startup import Finished, begin
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
        run_dir: str | Path | None = None, *, model: Any = None, data: Any = None) -> Result:
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
            those, or its dotted name. A batched dataset's own batch is the global batch
            unless the overrides set `batch.per_replica` or `batch.global_size`.

    Returns:
        The run's `Result`; for `resume=DIR` of a finished run with nothing more to do, the
        finished run's.

    Raises:
        TrainerError: with the command line's one line and exit code.
    """
    process.quiet_logs()
    with one_error():
        given = as_overrides(overrides, "trainer.fit")
        with holding(**_objects(given, model=model, data=data)):
            return _fit(given, config_dir, run_dir, _named(model=model, data=data))


def _fit(given: list[str], config_dir: str | Path | None, run_dir: str | Path | None,
         named: list[str]) -> Result:
    """`fit` once its objects are held: `named` are the overrides that name them."""
    with one_error():
        given = [*named, *given]
        args = [*(["--config-dir", str(config_dir)] if config_dir is not None else []), *given]
        if run_dir is not None:
            args.append(f"hydra.run.dir={run_dir}")
        if any(a in ("-m", "--multirun") for a in args):
            raise ConfigError("trainer.fit runs one config; a sweep (-m) is the command "
                              "line's: call fit in a loop, or run python -m trainer -m ...")
        register_configs()
        # a run directory at a URL: the run writes its local mirror; the Result names the URL
        return run_at_url(args, lambda mirror: _at(_run(args, given), mirror))


def _at(found: Any, mirror: Any) -> Any:
    """A `Result` of a run at a URL names the URL, not its local mirror (removed)."""
    if mirror is None or not isinstance(found, Result):
        return found
    return Result(summary=found.summary, run_dir=mirror.url)


def _run(args: list[str], given: list[str]) -> Result:
    """Composes and runs `fit`'s command line (`args`)."""
    with one_error():
        run = composed(args)
        if run is None:
            raise ConfigError(f"trainer.fit trains one config; {' '.join(given)} is a command "
                              f"of the command line's: python -m trainer {' '.join(given)}")
        check_configured(run.logs)  # a config file's URL: run again with it named
        # `.hydra/` once the run's data is checked too: a refused rerun leaves it as it was
        record = partial(_save_config, Path(run.logs), run.cfg, run.overrides)
        found = begin(run.cfg, run.logs, process.start_run, choices=run.choices,
                      record=record)
        if isinstance(found, Finished):
            return _result(found.run_dir)
        if run.cfg.get("tune") is not None:
            return found  # what the tuner found (trainer.tune)
        return _result(Path(run.cfg.get("resume") or run.logs))


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
    dotted name reaches, and whether a batched dataset's own batch is the global batch (the
    overrides set no batch)."""
    held = {role: obj for role, obj in objects.items()
            if obj is not None and not isinstance(obj, str)}
    sets_batch = any(o.lstrip("+~").startswith(("batch.per_replica", "batch.global_size"))
                     for o in overrides)
    return {**held, "batch_from_data": objects.get("data") is not None and not sets_batch}


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


def _save_config(logs: Path, cfg: Any, overrides: list[str]) -> None:
    """`.hydra/config.yaml` and `overrides.yaml`, as a command-line run has them."""
    folder = logs / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), folder / "overrides.yaml")


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
