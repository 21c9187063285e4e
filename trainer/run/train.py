"""A run in the order it happens: `run(checked)` is the recipe, `train(cfg)` checks a config
and runs it (`trainer.run.prepare.startup`, the start-up sequence of every entry point). Each
phase's owner is a method of `trainer.run.session.Session`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from trainer.run.prepare.preflight import Checked
from trainer.run.prepare.startup import Finished, begin
from trainer.run.session import Session
from trainer.run.tune import tune
from trainer.rundir.layout import RunDir


def run(checked: Checked, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Trains, evaluates and reports a checked run; writes everything into its directory.

    Args:
        checked: what the pre-flight returned (`trainer.run.prepare.preflight.preflight`), its
            owner held (`trainer.run.prepare.startup.launch`), which unwinds the session's guards.
        callbacks: extra Keras callbacks, after the built-in and the configured ones.

    Returns:
        The summary dict, also written to `run_dir/summary.json` (by the chief).
    """
    session = Session(checked, callbacks)
    session.open_devices()
    run = session.assemble()
    start = session.restore(run)
    # The end of a run listens for signals too: a stop there ends with the final
    # epoch's backup, from which a rerun finishes just that.
    with session.listening():
        trained = session.fit(run, start)
        outcome = session.evaluate(run, trained)
        report = session.report(run, outcome)
        session.export(run, report)
    return session.finish(run, report)


def start(checked: Checked, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """A checked run trained (`run`), or tuned where it says `tune=lr|batch`
    (`trainer.run.tune`: nothing trained is kept)."""
    if checked.spec.tune is not None:
        return tune(checked)
    return run(checked, callbacks)


def train(cfg: DictConfig, run_dir: str | Path | None = None,
          callbacks: Sequence[Any] = (), choices: dict[str, str] | None = None
          ) -> dict[str, Any]:
    """Checks a composed config (`trainer.run.prepare.preflight`), then runs it under its owner
    (`trainer.run.prepare.startup.begin`).

    Args:
        cfg: a composed config (see `conf/config.yaml`).
        run_dir: where checkpoints, logs and `summary.json` go; Hydra's output directory
            when None.
        callbacks: extra Keras callbacks, after the built-in and the configured ones.
        choices: the config groups' choices (`{"model": "cnn", ...}`) where no Hydra job
            runs; the summary names the model and dataset by them.

    Returns:
        The summary dict; for a resume with nothing to add, the finished run's.
    """
    found = begin(cfg, None if run_dir is not None else hydra_run_dir(), start,
                  run_dir=run_dir, choices=choices, callbacks=callbacks)
    if isinstance(found, Finished):
        return json.loads(RunDir(found.run_dir).summary.read_text())
    return found


def hydra_run_dir() -> str | None:
    """The running Hydra job's output directory; None outside a job."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None
