"""The start-up sequence, written once: the pre-flight, the run's owner, its record, its start.

`begin` checks a composed config (`trainer.run.prepare.preflight.preflight`, once) and hands the
checked run to `launch`, which holds its owner (the one stack of guards:
`trainer.run.prepare.owner`) around the rest: the run's config recorded (at once on another worker,
else by the run once its data is checked too: `Checked.record`), then the run started.

`trainer.fit` (`trainer.api`) and `train(cfg)` (`trainer.run.train`) begin here; the command
line checks before Hydra's job starts (so a refused start writes nothing) and launches
inside it. `start` is what starts a checked run: `trainer.run.process.start_run` from an
entry point (TensorFlow started quietly first), `trainer.run.train.start` where TensorFlow
runs already.

A decide module: no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.config.errors import NothingToDo
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
