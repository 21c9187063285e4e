"""`python -m trainer [overrides...]`: compose the config with Hydra, check it, then train.

The pre-flight (`trainer.run.prepare.preflight`) runs before Hydra writes anything into the run
directory; the Hydra job then launches the run it checked (`trainer.run.prepare.startup`, the
start-up sequence `trainer.fit` and `train(cfg)` share). Known errors (a bad config, a missing
device) become one line on stderr and their exit code (`trainer.run.process`);
`HYDRA_FULL_ERROR=1` shows the whole traceback instead.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from trainer.config.compose import Composed, composed
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
from trainer.run.prepare.place import RunPlace, for_hydra, opened
from trainer.run.prepare.preflight import Checked, preflight
from trainer.run.prepare.startup import Finished, begin, launch, record_config

process.quiet_logs()
register_configs()
register_sweeper()

# The run the pre-flight checked before Hydra started its job (None: the job checks it: a
# sweep's job, or a config that reads the running job, `${hydra:...}`).
_checked: list[Checked] = []
# Hydra writes `.hydra/` as its job starts. A rerun in a directory that has one already asks
# it not to (this override), and the run writes it once its data is checked too
# (`Checked.record`): a refused rerun leaves the directory byte for byte as it was.
LATER = "hydra.output_subdir=null"
_later: list[bool] = []  # whether this command asked it


def _hydra_app(place: RunPlace | None) -> Any:
    """Hydra's app for one command, whose job runs with the command's place (a run
    directory at a URL: its mirror and lease; None: a local directory)."""

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def job(cfg: DictConfig) -> Any:
        return _hydra_job(cfg, place)

    return job


def _hydra_job(cfg: DictConfig, place: RunPlace | None) -> Any:
    """Hydra's job: the run the pre-flight checked, or (a sweep's job, a config that reads
    the running job) the run checked here."""
    if dispatches_jobs():
        # The job's own process validates and trains; a failure there fails this trial only.
        return run_sweep_job(cfg, process.USER_FULL_ERROR)
    # Handled here, not after Hydra returns: Hydra would add its own "Error executing job" line.
    try:
        if _checked:  # checked before Hydra started its job (`main`)
            record = partial(_record, cfg) if _later else None
            return launch(_checked[0], process.start_run, record)
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
    _checked.clear()
    _later.clear()
    argv = list(sys.argv)
    with process.signals_raise():
        try:
            _command(sys.argv[1:])
        except process.STOPS as error:
            process.exit_with(error)
        finally:
            sys.argv[:] = argv


def _command(args: list[str]) -> None:
    """`TF_CONFIG`'s evaluator task validates beside the workers; any other runs."""
    if evaluator_task(os.environ.get("TF_CONFIG")):
        raise SystemExit(_evaluate_beside(args))
    if is_sweep_job():
        _hydra_app(None)()  # a sweep's job: it checks in its own Hydra job
        return
    if args_parser().parse_args(args).multirun:
        check_sweep_direction(args)
        _hydra_app(None)()
        return
    run = composed(args)
    if run is None:  # --cfg, --help: no run
        _hydra_app(None)()
        return
    # The run's place, opened from the composed config (a URL's mirror and lease; None: a
    # local directory, opened with its lock by the pre-flight); Hydra's job runs there.
    with opened(run) as (there, place):
        sys.argv.extend(for_hydra(run, there))
        _run(there, place)


def _run(run: Composed, place: RunPlace | None) -> None:
    """Checks the run before Hydra's job, then runs the job."""
    args = sys.argv[1:]
    if _precheck(run, place) and not any(a.startswith("hydra.output_subdir=") for a in args):
        _later.append(True)
        sys.argv.append(LATER)
    # The checked run's owner is held around Hydra's job too: a start that ends before the
    # job runs its run (a signal, Hydra's own refusal) is ended here.
    with _checked[0].owned() if _checked else nullcontext():
        _hydra_app(place)()


def _precheck(run: Composed, place: RunPlace | None) -> bool:
    """Before Hydra writes `.hydra/` and its log into the run directory: checks the config
    and its run directory, holding its lock, for the job to run.

    Returns:
        Whether the run directory has a `.hydra/` already, which Hydra's job is then not to
        write (the run records it once checked: `_record`).
    """
    try:
        _checked.append(preflight(run.cfg, run.logs, choices=run.choices, at=place))
    except InterpolationResolutionError:
        return False  # it needs a running job (`${hydra:...}`): the job checks it
    return _checked[0].recorded and _checked[0].run_dir == Path(run.logs)


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


def _record(cfg: DictConfig) -> None:
    """`.hydra/` as Hydra's job writes it (`config.yaml`, `hydra.yaml`, `overrides.yaml`),
    without `LATER`, for a rerun that left it until its checks passed."""
    from hydra.core.hydra_config import HydraConfig

    # a plain copy: the job's is read-only
    hydra_cfg = OmegaConf.create(OmegaConf.to_container(HydraConfig.instance().cfg))
    hydra_cfg.hydra.output_subdir = ".hydra"
    hydra_cfg.hydra.overrides.hydra = [o for o in hydra_cfg.hydra.overrides.hydra
                                       if o != LATER]
    record_config(hydra_cfg.hydra.runtime.output_dir,
                  {"config.yaml": cfg, "hydra.yaml": hydra_cfg,
                   "overrides.yaml": hydra_cfg.hydra.overrides.task})


def cli() -> None:
    """The command (`python -m trainer`, the `trainer` script): `main` in a process of its
    own."""
    process.own_the_process()
    main()


if __name__ == "__main__":
    cli()
