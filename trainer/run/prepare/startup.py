"""The start-up sequence, written once: the pre-flight, the run's owner, its record, its start.

`begin` checks a composed config (`trainer.run.prepare.preflight.preflight`, once) and hands the
checked run to `launch`, which holds its owner (the one stack of guards:
`trainer.run.prepare.owner`) around the rest: the run's config recorded (at once on another worker,
else by the run once its data is checked too: `Checked.record`), then the run started.

`start_composed` is the one way a run starts from a composed config (`python -m trainer`, a
sweep's job, `trainer.fit`, a launcher's worker): the config composed once
(`trainer.config.compose.composed`, its run directory resolved once), its place opened by
the caller (`trainer.run.prepare.place.opened`), then the pre-flight, then Hydra's own job
runner on that same composition (`trainer.internals.hydra_app.run_job`: the directory, the
log, `hydra.job.chdir`, `hydra.job.env_set`), then the run. Nothing is composed twice, so
`${now:...}` in the run directory is one folder. `train(cfg)` (`trainer.run.train`) begins
here too. `start` is what starts a checked run: `trainer.run.process.start_run` from an
entry point (TensorFlow started quietly first), `trainer.run.train.start` where TensorFlow
runs already.

A decide module: no TensorFlow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.config.compose import Composed
from trainer.config.errors import NothingToDo
from trainer.internals.hydra_app import job_config, run_job
from trainer.run.prepare.preflight import Checked, preflight
from trainer.rundir.atomic import write_text
from trainer.rundir.remote import RunPlace

# Starts a checked run with extra callbacks; returns its summary (or what a tuner found).
Start = Callable[[Checked, Sequence[Any]], Any]


@dataclass(frozen=True)
class Finished:
    """A finished run asked for nothing more (`resume=` with no epoch to add): its line was
    printed (`finished: ...`), nothing was written.

    Attributes:
        run_dir: the finished run's directory, whose summary stands.
    """

    run_dir: Path


def begin(cfg: DictConfig, logs: str | Path | None, start: Start,
          run_dir: str | Path | None = None, choices: dict[str, str] | None = None,
          record: Callable[[], None] | None = None, callbacks: Sequence[Any] = (),
          at: RunPlace | None = None) -> Any:
    """Checks a composed config and launches the run it describes.

    Args:
        cfg: the composed config (without Hydra's `hydra` node).
        logs: Hydra's run directory (`hydra.run.dir`), where `.hydra/` and the log go.
        start: what starts the checked run (see the module's doc).
        run_dir: where the run writes when it is not `logs` (`train(cfg, run_dir)`).
        choices: the config groups' choices (`{"model": "cnn"}`); None reads Hydra's job.
        record: writes the run's `.hydra/` (see `launch`); None: written already.
        callbacks: extra Keras callbacks, after the built-in and the configured ones.
        at: the run's place at a URL (`trainer.run.prepare.place`), which the run's owner
            holds; None: a local run directory.

    Returns:
        What `start` returned, or `Finished` for a finished run with nothing to add.
    """
    try:
        checked = preflight(cfg, logs, run_dir=run_dir, choices=choices, at=at)
    except NothingToDo as done:
        line = f"finished: {done}"
        print(at.shown(line) if at is not None else line, flush=True)  # named by its URL
        return Finished(Path(cfg.resume))
    return launch(checked, start, record, callbacks)


def launch(checked: Checked, start: Start, record: Callable[[], None] | None = None,
           callbacks: Sequence[Any] = ()) -> Any:
    """Runs a checked run under its owner: the one stack of guards unwinds once at its end.

    Args:
        checked: what the pre-flight returned.
        start: what starts the checked run (see the module's doc).
        record: writes the run's `.hydra/`: on the chief once the run's data is checked
            too (a refused rerun leaves the directory as it was), at once on another
            worker; None where it is written already.
        callbacks: extra Keras callbacks, after the built-in and the configured ones.

    Returns:
        What `start` returned.
    """
    with checked.owned():
        if record is not None:
            if checked.chief:
                checked = replace(checked, record=record)
            else:
                record()
        return start(checked, callbacks)


def record_config(logs: str | Path, nodes: dict[str, Any]) -> None:
    """Writes the run's `.hydra/` as Hydra's job writes it (`config.yaml`, `overrides.yaml`,
    `hydra.yaml`: each `{name: node}` as YAML), each file through the one writer."""
    folder = Path(logs) / ".hydra"
    for name, node in nodes.items():
        write_text(folder / name, OmegaConf.to_yaml(node))


def start_composed(run: Composed, start: Start, place: RunPlace | None = None,
                   callbacks: Sequence[Any] = (), console: bool = False) -> Any:
    """Starts the run a composed config describes: the one way in.

    Args:
        run: the composition (`trainer.config.compose.composed`), at its place (a URL's
            mirror in the URL's place: `trainer.run.prepare.place.opened`).
        start: what starts the checked run (see the module's doc).
        place: the run's place at a URL, held by the run's owner; None: local.
        callbacks: extra Keras callbacks, after the built-in and the configured ones.
        console: the process is the command's own, so Hydra's job logging is configured
            (the console and the log file); else (`trainer.fit` in a user's process) the
            process's logging is left as it is and the run's log file is added beside it.

    Returns:
        What `start` returned, or `Finished` for a finished run with nothing to add.
    """
    record = partial(record_config, run.logs, records(run))
    with job_config(run.job):  # `${hydra:...}` reads this composition, in the pre-flight too
        return begin(run.cfg, run.logs, partial(_in_job, run, start, console),
                     choices=run.choices, record=record, callbacks=callbacks, at=place)


def _in_job(run: Composed, start: Start, console: bool, checked: Checked,
            callbacks: Sequence[Any]) -> Any:
    """A checked run started inside Hydra's job on its one composition."""
    def task() -> Any:
        if console:
            return start(checked, callbacks)
        with file_log(log_file(run)):
            return start(checked, callbacks)

    return run_job(run.job, task, configure_logging=console)


def log_file(run: Composed) -> Path:
    """The run's log, as Hydra's job logging names it: `RUN_DIR/trainer.log`."""
    return Path(run.job.hydra.runtime.output_dir) / f"{run.job.hydra.job.name}.log"


@contextmanager
def file_log(path: Path) -> Iterator[None]:
    """The run's log file beside the logging a process has (`trainer.fit` in a user's
    script: its own handlers and levels kept), for the block: warnings and errors, and
    trainer's own INFO lines."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def records(run: Composed) -> dict[str, Any]:
    """`.hydra/`'s files as Hydra's job writes them: the config, Hydra's node, the
    overrides."""
    nodes: dict[str, Any] = {"config.yaml": run.cfg,
                             "overrides.yaml": OmegaConf.create(list(run.overrides))}
    if run.job is not None:
        hydra = OmegaConf.create({"hydra": OmegaConf.to_container(run.job.hydra)})
        hydra.hydra.output_subdir = ".hydra"
        nodes["hydra.yaml"] = hydra
    return nodes
