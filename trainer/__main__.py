"""`python -m trainer [overrides...]`: compose the config with Hydra, then train.

Known errors (a bad config, a missing device) become one line on stderr and exit code 2;
`HYDRA_FULL_ERROR=1` shows the whole traceback instead.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import hydra
from omegaconf import DictConfig, open_dict

from trainer.config.compose import KNOWN_ERRORS, compose_from_args
from trainer.config.errors import (
    EXIT_INTERRUPTED,
    ConfigError,
    Diverged,
    Interrupted,
    NothingToDo,
    WorkerLost,
)
from trainer.config.messages import one_line
from trainer.config.schema import config_dir, register_configs
from trainer.run.preflight import check_config, check_run_dir
from trainer.run.quiet import tensorflow_started
from trainer.rundir.layout import LOCK, RunDir
from trainer.rundir.lock import check_writable, release_held, remove_created
from trainer.rundir.names import check_name
from trainer.rundir.resume import (
    refuse_finished_run,
)
from trainer.track.sweep import CHILD_ENV, TrialFailed, direction, in_sweep, run_job_in_subprocess

# TensorFlow's C++ INFO and WARNING lines (tf.distribute's notes on its own datasets, an
# abandoned prefetch) drown the progress and ask nothing of the user; errors still show, and
# TRAINER_TF_LOGS=1 shows everything (see trainer/quiet.py).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if os.environ.get("TRAINER_TF_LOGS") == "1"
                      else "2")

register_configs()


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def _hydra_main(cfg: DictConfig) -> Any:
    if in_sweep() and not os.environ.get(CHILD_ENV):
        # The job's own process validates and trains; a failure there fails this trial only.
        return run_job_in_subprocess(cfg, _USER_FULL_ERROR)
    # Handled here, not after Hydra returns: Hydra would add its own "Error executing job" line.
    try:
        check_config(cfg)

        tensorflow_started()
        _raise_if_signalled()
        # lazy: it imports TensorFlow, which starts after the pre-flight
        from trainer.run.train import train

        return train(cfg)
    except ConfigError as error:
        _exit_config_error(error)
    except (Interrupted, Diverged, WorkerLost) as error:
        _exit_run_error(error)


def _exit_run_error(error: Interrupted | Diverged | WorkerLost) -> None:
    """One line and the error's own exit code for a run that started and then stopped."""
    if _USER_FULL_ERROR and not isinstance(error, Interrupted):
        raise error
    word = "interrupted" if isinstance(error, Interrupted) else "error"
    print(f"{word}: {error}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if isinstance(error, WorkerLost):
        # Not sys.exit: TensorFlow's shutdown would wait for the lost peer at its exit barrier.
        os._exit(error.exit_code)
    sys.exit(error.exit_code)


_USER_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
# The shell's convention for a process ended by Ctrl-C.
EXIT_CTRL_C = 130


class _Terminated(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt
    """SIGTERM outside the training steps (start-up, the summary), raised by `_on_sigterm`."""


# Signals received outside the training steps. A library may catch what a signal raises (an
# import that tries alternatives under `except BaseException`), so they are also checked
# again once TensorFlow has started: a Ctrl-C at start-up is never silently lost.
_signalled: list[int] = []


def _on_sigterm(signum: int, frame: Any) -> None:
    _signalled.append(signum)
    raise _Terminated(signum)


def _on_sigint(signum: int, frame: Any) -> None:
    _signalled.append(signum)
    raise KeyboardInterrupt


def _raise_if_signalled() -> None:
    """Raises again a start-up signal whose exception something swallowed."""
    if signal.SIGTERM in _signalled:
        raise _Terminated(signal.SIGTERM)
    if signal.SIGINT in _signalled:
        raise KeyboardInterrupt


def main() -> None:
    """Console entry point (`trainer` and `python -m trainer`)."""
    # Let Hydra raise instead of printing its own multi-line report, so we can print one line.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # `_target_` finds the user's own modules in the working directory, as `python -m` does
    # (the `trainer` console script would not look there).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # SIGTERM before or after the training steps (which route it to a clean stop of their
    # own): one line and a tidy run directory, not a silent death.
    _signalled.clear()
    try:
        previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _on_sigterm)}
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread
        previous = {}
    try:
        _main()
    finally:
        release_held()
        for number, handler in previous.items():
            signal.signal(number, handler)


def _main() -> None:
    try:
        _refuse_finished_run_dir(sys.argv[1:])
        _precheck(sys.argv[1:])
        _hydra_main()
    except KNOWN_ERRORS as error:
        _exit_config_error(error)
    except TrialFailed as error:
        # A sweeper that stops at a failed job (Hydra's grid sweeper, after its batch; Optuna's
        # past max_failure_rate): the first failure, and where every job's outcome is.
        if _USER_FULL_ERROR:
            raise
        print(f"error: {error}; every job's outcome is in trials.md in the sweep directory",
              file=sys.stderr, flush=True)
        sys.exit(error.code)
    except ValueError as error:
        if _USER_FULL_ERROR:
            raise
        if "No trials are completed yet" in str(error):  # Optuna's, when every trial failed
            print("error: every trial of the sweep failed; trials.md in the sweep directory "
                  "lists each one's error", file=sys.stderr, flush=True)
            sys.exit(1)
        if not _raised_by_hydra(error):
            raise
        _exit_config_error(error)  # e.g. "Only one of --run, --multirun, --cfg ..."
    except NothingToDo as done:
        print(f"finished: {done}", flush=True)
        sys.exit(done.exit_code)
    except (KeyboardInterrupt, _Terminated) as stop:
        # Ctrl-C or SIGTERM outside the training steps (start-up, the summary), where no
        # stop request is listened for.
        if _USER_FULL_ERROR:
            raise
        what = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "SIGTERM"
        print(f"interrupted: {what} outside the training steps; rerun the same command to "
              "start again, or to finish from the last backup", file=sys.stderr, flush=True)
        _remove_fresh_run_dir()
        sys.exit(EXIT_CTRL_C if isinstance(stop, KeyboardInterrupt) else EXIT_INTERRUPTED)


def _raised_by_hydra(error: BaseException) -> bool:
    """Whether Hydra's own code raised it (its command-line checks), not the training."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}hydra{os.sep}" in frames[-1].filename


def _refuse_finished_run_dir(args: list[str]) -> None:
    """Checks `hydra.run.dir=` before Hydra writes its .hydra/ files into a finished run."""
    from pathlib import Path

    run_dirs = [a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")]
    resume = any(a.startswith("resume=") and a != "resume=null" for a in args)
    if run_dirs and os.environ.get(CHILD_ENV) is None:
        check_name(run_dirs[-1])  # the raw value: an empty one is '.' once a Path
        refuse_finished_run(Path(run_dirs[-1]), resume)


# (directory, topmost directory this process created for it): a run that fails on its
# configuration removes what it created, so a config error leaves nothing behind. A directory
# another process created (two starts at once) is never listed.
_fresh_run_dir: list = []


def _precheck(args: list[str]) -> None:
    """Before Hydra writes `.hydra/` and its log into the run directory: validates the
    config, and refuses a directory another run holds, a `resume=` that is not a run, and a
    resume with a changed config."""
    from pathlib import Path

    from omegaconf import OmegaConf

    if os.environ.get(CHILD_ENV) is not None:
        return
    from hydra._internal.utils import get_args_parser

    if get_args_parser().parse_args(args).multirun:
        _check_sweep_direction(args)
        return
    cfg = compose_from_args(args)
    if cfg is None:
        return
    logs = OmegaConf.select(cfg, "hydra.run.dir")
    if logs is not None:
        check_name(logs)  # the string: an empty one would be '.' as a Path
        check_writable(Path(logs))
    with open_dict(cfg):
        del cfg["hydra"]
    check_run_dir(cfg, logs, _fresh_run_dir)


def _check_sweep_direction(args: list[str]) -> None:
    """Refuses a sweeper direction against the optimized metric before the first job.

    Composed from the overrides every job shares (the swept ones left out): where those
    alone do not compose or resolve (`optimizer=sgd,rmsprop optimizer.momentum=0.9`), each
    job composes and checks its own config instead.
    """
    try:
        cfg = compose_from_args(args)
        metric = cfg.get("optimized_metric") if cfg is not None else None
    except (*KNOWN_ERRORS, ValueError):
        return
    if metric:
        direction(metric, cfg.hydra.sweeper)


def _close_logs_in(path: Any) -> None:
    """Closes the logging handlers writing into `path` (Hydra's job log), and only those."""
    import logging

    root = os.path.realpath(path)
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in list(getattr(logger, "handlers", [])):
            name = getattr(handler, "baseFilename", None)
            if name and os.path.realpath(name).startswith(root + os.sep):
                handler.close()
                logger.removeHandler(handler)


def _remove_fresh_run_dir() -> None:
    """Removes the run directory this run created (Hydra's `.hydra/` and log only)."""
    import shutil

    for path, top in _fresh_run_dir:
        if path.is_dir() and not RunDir(path).holds_run():
            _close_logs_in(path)
            for inside in path.iterdir():  # .hydra/ and the log; the lock file last
                if inside.is_dir():
                    shutil.rmtree(inside, ignore_errors=True)
                elif inside.name != LOCK:
                    inside.unlink(missing_ok=True)
            if top is None:
                shutil.rmtree(path, ignore_errors=True)
            else:
                remove_created(path, top)
    _fresh_run_dir.clear()


def _exit_config_error(error: BaseException) -> None:
    if _USER_FULL_ERROR:
        raise error
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    _remove_fresh_run_dir()
    sys.exit(ConfigError.exit_code)


if __name__ == "__main__":
    main()
