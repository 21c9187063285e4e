"""`python -m trainer [overrides...]`: compose the config with Hydra once, check it, then train.

A single run (a sweep's job too) starts the one way `trainer.fit` does
(`trainer.run.prepare.startup.start_composed`): composed once, its place opened, the
pre-flight before anything is written, then Hydra's own job runner on that composition.
Hydra's app keeps what only it does: sweeps (`-m`) and their jobs' dispatch, `--cfg`,
`--help`, `--info`. Known errors (a bad config, a missing device) become one line on stderr
and their exit code (`trainer.run.process`); `HYDRA_FULL_ERROR=1` shows the whole traceback
instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from trainer.config.compose import composed
from trainer.config.schema import config_dir, register_configs
from trainer.distribute.cluster import evaluator_task
from trainer.internals.hydra_app import args_parser
from trainer.run import process
from trainer.run.prepare.jobs import (
    check_sweep_direction,
    dispatches_jobs,
    is_sweep_job,
    register_sweeper,
    run_sweep_job,
)
from trainer.run.prepare.place import RunPlace, opened
from trainer.run.prepare.startup import Finished, begin, start_composed

process.quiet_logs()
register_configs()
register_sweeper()

def _hydra_app(place: RunPlace | None) -> Any:
    """Hydra's app for one command, whose job runs with the command's place (a run
    directory at a URL: its mirror and lease; None: a local directory)."""

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def job(cfg: DictConfig) -> Any:
        return _hydra_job(cfg, place)

    return job


def _hydra_job(cfg: DictConfig, place: RunPlace | None) -> Any:
    """Hydra's job, for what only Hydra's app runs: a sweep's job, dispatched to a process
    of its own (where it starts the one way, `_command`), or `--experimental-rerun`."""
    if dispatches_jobs():
        # The job's own process validates and trains; a failure there fails this trial only.
        return run_sweep_job(cfg, process.USER_FULL_ERROR)
    # Handled here, not after Hydra returns: Hydra would add its own "Error executing job" line.
    try:
        from hydra.core.hydra_config import HydraConfig

        found = begin(cfg, HydraConfig.get().runtime.output_dir, process.start_run, at=place)
        return None if isinstance(found, Finished) else found
    except process.FAILURES as error:
        process.exit_with(error, place)


def main() -> None:
    """Console entry point (`trainer` and `python -m trainer`)."""
    # Let Hydra raise instead of printing its own multi-line report, so we can print one line.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # `_target_` finds the user's own modules in the working directory, as `python -m` does
    # (the `trainer` console script would not look there).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    argv = list(sys.argv)
    with process.signals_raise():
        try:
            _command(sys.argv[1:])
        except process.STOPS as error:
            process.exit_with(error)
        finally:
            sys.argv[:] = argv


def _command(args: list[str]) -> None:
    """`TF_CONFIG`'s evaluator task validates beside the workers; a sweep, `--cfg` and
    `--help` are Hydra's app's; a single run (a sweep's job too) starts the one way."""
    if evaluator_task(os.environ.get("TF_CONFIG")):
        raise SystemExit(_evaluate_beside(args))
    if args_parser().parse_args(args).multirun and not is_sweep_job():
        check_sweep_direction(args)
        _hydra_app(None)()
        return
    run = composed(args)
    if run is None:  # --cfg, --help: no run
        _hydra_app(None)()
        return
    # The run's place, opened from the composed config (a URL's mirror and lease; None: a
    # local directory, opened with its lock by the pre-flight).
    with opened(run) as (there, place):
        try:
            start_composed(there, process.start_run, place, console=True)
        except process.FAILURES as error:
            process.exit_with(error, place)


def _evaluate_beside(args: list[str]) -> int:
    """`TF_CONFIG`'s `evaluator` task: validates the chief's run (its `hydra.run.dir`) beside
    the workers (`trainer.run.end.evaluator`); Hydra's job never starts, so it writes nothing
    of its own there. Returns the exit code."""
    run = composed(args)
    if run is None or not run.logs:
        print("error: the evaluator validates one run: give it the chief's hydra.run.dir; "
              f"received: {' '.join(args)}", file=sys.stderr, flush=True)
        return 2
    with opened(run):  # a run directory at a URL: refused beside the workers, in one line
        pass
    os.environ.pop("TF_CONFIG", None)  # it is no member of the workers' cluster
    timeout = run.cfg.strategy.start_timeout_s

    def work() -> int:
        # an entry point: the evaluator's build module imports TensorFlow, started by now
        from trainer.run.end.evaluator import run_evaluator

        return run_evaluator(run.logs, timeout)

    return process.guarded(work)


def cli() -> None:
    """The command (`python -m trainer`, the `trainer` script): `main` in a process of its
    own."""
    process.own_the_process()
    try:
        main()
    finally:
        process.settled(ending=True)  # the exit's collections skip the run's objects too


if __name__ == "__main__":
    cli()
