"""`python -m trainer [overrides...]`: compose the config with Hydra, then train.

Known errors (a bad config, a missing device) become one line on stderr and exit code 2;
`HYDRA_FULL_ERROR=1` shows the whole traceback instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import hydra
from hydra.errors import (
    ConfigCompositionException,
    OverrideParseException,
    SearchPathException,
)
from omegaconf import DictConfig, open_dict
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from trainer.config.errors import (
    EXIT_CONFIG,
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_WORKER_LOST,
    ConfigError,
    Diverged,
    Interrupted,
    WorkerLost,
)
from trainer.config.messages import one_line
from trainer.config.schema import config_dir, register_configs
from trainer.run.preflight import check_config
from trainer.track.sweep import TrialFailed

# Set when a sweep job re-runs itself in a fresh process (see `_run_job_in_subprocess`).
CHILD_ENV = "TRAINER_SWEEP_CHILD"
# TensorFlow's C++ INFO and WARNING lines (tf.distribute's notes on its own datasets, an
# abandoned prefetch) drown the progress and ask nothing of the user; errors still show, and
# TRAINER_TF_LOGS=1 shows everything (see trainer/quiet.py).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if os.environ.get("TRAINER_TF_LOGS") == "1"
                      else "2")

register_configs()


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def _hydra_main(cfg: DictConfig) -> Any:
    if _in_sweep() and not os.environ.get(CHILD_ENV):
        # The job's own process validates and trains; a failure there fails this trial only.
        return _run_job_in_subprocess(cfg)
    # Handled here, not after Hydra returns: Hydra would add its own "Error executing job" line.
    try:
        check_config(cfg)
        from trainer.run.quiet import tensorflow_started

        tensorflow_started()
        from trainer.run.train import train

        return train(cfg)
    except ConfigError as error:
        _exit_config_error(error)
    except Interrupted as error:
        print(f"interrupted: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    except Diverged as error:
        if _USER_FULL_ERROR:
            raise
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_DIVERGED)
    except WorkerLost as error:
        if _USER_FULL_ERROR:
            raise
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Not sys.exit: TensorFlow's shutdown would wait for the lost peer at its exit barrier.
        os._exit(EXIT_WORKER_LOST)


def _in_sweep() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


# A job stopped by a signal (Ctrl-C, SIGTERM) stops the sweep; any other failure fails its
# trial only.
_STOPS_SWEEP = (EXIT_INTERRUPTED, 130, -2, -15)


def _run_job_in_subprocess(cfg: DictConfig) -> Any:
    """Runs one sweep job as `python -m trainer` in a fresh process.

    TensorFlow's devices can be set once per process, before its runtime starts, and Hydra's
    basic launcher runs every job of a sweep in this one process; so each job re-executes
    itself with its own overrides, writing into the job's own directory. The job's stderr is
    passed through, its last line kept as the reason of a failed trial.

    Returns:
        The value of `optimized_metric` where it is set (what an optimizing sweeper needs),
        else the job's summary.

    Raises:
        TrialFailed: the job failed; the trial table records it.
    """
    import json
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from trainer.distribute.cluster import resolve_cluster
    from trainer.track.sweep import direction, metric_value, record_trial

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    command = [sys.executable, "-m", "trainer", *_config_options(), *hc.overrides.task,
               "hydra.mode=RUN", f"hydra.run.dir={out}", f"hydra.job.name={hc.job.name}"]
    # A job of several tasks (a SLURM launcher's nodes x tasks): each task is a worker;
    # the chief writes the job's directory and reports, the others only train.
    try:
        cluster = resolve_cluster(list(cfg.cluster.workers), cfg.cluster.task_index,
                                  os.environ.get("TF_CONFIG"), os.environ,
                                  cfg.cluster.port_base)
    except ConfigError:
        cluster = None  # the job itself says what is wrong, and fails this trial only
    chief = cluster is None or cluster.is_chief
    if not chief:
        command.append("hydra.output_subdir=null")
    env = {**os.environ, CHILD_ENV: "1"}
    if not _USER_FULL_ERROR:
        env.pop("HYDRA_FULL_ERROR", None)
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True,
                               errors="replace")
    last = ""

    def relay() -> None:
        nonlocal last
        for line in process.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            last = line.strip() or last

    try:
        relay()
    except KeyboardInterrupt:
        # The job got the same Ctrl-C: it writes its backup and stops; pass its lines on
        # until it has, then stop the sweep with its exit code.
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        relay()
        sys.exit(process.wait() or EXIT_INTERRUPTED)
    code = process.wait()
    if not chief:
        if code:
            raise TrialFailed(f"sweep job {hc.job.num}, worker {cluster.task_id}: "
                              f"{last.removeprefix('error: ') or f'exit code {code}'}", code)
        return None
    optimized = cfg.get("optimized_metric")
    metric = optimized or cfg.checkpoint.monitor
    mode = direction(metric, hc.sweeper if optimized else None)
    trial = {"job": hc.job.num, "overrides": list(hc.overrides.task), "metric": metric,
             "value": None, "status": "failed", "exit_code": code, "error": None}
    summary = None
    try:
        if code in _STOPS_SWEEP:
            sys.exit(EXIT_INTERRUPTED if code < 0 else code)  # the job said why
        if code:
            trial["error"] = last.removeprefix("error: ") or f"exit code {code}"
            raise TrialFailed(f"sweep job {hc.job.num} ({' '.join(hc.overrides.task)}) "
                              f"failed: {trial['error']}", code)
        if not (out / "summary.json").is_file():
            trial["error"] = f"the job ended without writing {out / 'summary.json'}"
            raise TrialFailed(f"sweep job {hc.job.num}: {trial['error']}")
        summary = json.loads((out / "summary.json").read_text())
        try:
            trial["value"] = metric_value(summary, metric)
        except ConfigError as error:
            if optimized:
                trial["error"] = str(error)
                raise TrialFailed(f"sweep job {hc.job.num}: {error}", EXIT_CONFIG) from None
        trial["status"] = "completed"
    finally:
        if trial["status"] == "completed" or trial["error"]:
            table = record_trial(out, Path(hc.sweep.dir), trial, mode)
            print(f"[sweep] job {hc.job.num} {trial['status']}; all trials: {table}",
                  file=sys.stderr, flush=True)
    return trial["value"] if optimized else summary


def _config_options() -> list[str]:
    """The sweep's own --config-name / --config-dir / --config-path, for each job."""
    from hydra._internal.utils import get_args_parser

    parsed, _ = get_args_parser().parse_known_args(sys.argv[1:])
    options = []
    for flag, value in (("--config-name", parsed.config_name), ("--config-dir",
                        parsed.config_dir), ("--config-path", parsed.config_path)):
        if value is not None:
            options += [flag, os.path.abspath(value) if flag == "--config-dir" else value]
    return options



_USER_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
KNOWN_ERRORS = (ConfigError, ConfigCompositionException, OverrideParseException,
                SearchPathException, OmegaConfBaseException)
# The shell's convention for a process ended by Ctrl-C.
EXIT_CTRL_C = 130


def main() -> None:
    """Console entry point (`trainer` and `python -m trainer`)."""
    # Let Hydra raise instead of printing its own multi-line report, so we can print one line.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # `_target_` finds the user's own modules in the working directory, as `python -m` does
    # (the `trainer` console script would not look there).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
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
    except KeyboardInterrupt:
        # Ctrl-C outside the training steps (start-up, the final evaluation), where no
        # stop request is listened for.
        if _USER_FULL_ERROR:
            raise
        print("interrupted: Ctrl-C outside the training steps; rerun the same command to "
              "start again, or to finish from the last backup", file=sys.stderr, flush=True)
        _remove_fresh_run_dir()
        sys.exit(EXIT_CTRL_C)


def _raised_by_hydra(error: BaseException) -> bool:
    """Whether Hydra's own code raised it (its command-line checks), not the training."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}hydra{os.sep}" in frames[-1].filename


def _refuse_finished_run_dir(args: list[str]) -> None:
    """Checks `hydra.run.dir=` before Hydra writes its .hydra/ files into a finished run."""
    from pathlib import Path

    from trainer.run.summary import refuse_finished_run

    run_dirs = [a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")]
    resume = any(a.startswith("resume=") and a != "resume=null" for a in args)
    if run_dirs and os.environ.get(CHILD_ENV) is None:
        refuse_finished_run(Path(run_dirs[-1]), resume)


def compose_from_args(args: list[str]) -> DictConfig | None:
    """The config (with its `hydra` node) these arguments would run, composed as Hydra
    composes it but without running anything or writing anything; None for commands that
    run no single job (`-m`, `--cfg`, `--help`, ...)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path, get_args_parser
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    parsed = get_args_parser().parse_args(args)
    if (parsed.multirun or parsed.cfg or parsed.help or parsed.hydra_help or parsed.info
            or parsed.shell_completion or parsed.experimental_rerun):
        return None
    search = create_config_search_path(f"file://{config_dir()}")
    if parsed.config_dir is not None:
        search.prepend(provider="command-line",
                       path=f"file://{os.path.abspath(parsed.config_dir)}",
                       anchor=SearchPathQuery(provider="schema"))
    try:
        hydra_app = Hydra.create_main_hydra2(task_name="trainer", config_search_path=search)
        return hydra_app.compose_config(parsed.config_name or "config", parsed.overrides,
                                        run_mode=RunMode.RUN)
    except ValueError as error:  # Hydra's own for some malformed overrides, e.g. `=5`
        if isinstance(error, KNOWN_ERRORS):
            raise
        raise ConfigError(f"cannot use the overrides {' '.join(parsed.overrides)}: "
                          f"{str(error).strip().splitlines()[0]} (overrides are key=value, "
                          "e.g. epochs=3)") from None
    finally:
        GlobalHydra.instance().clear()


# The run directory this process's Hydra run will create, when it does not exist yet: a run
# that fails on its configuration removes it again, so a config error leaves nothing behind.
_fresh_run_dir: list = []


def _precheck(args: list[str]) -> None:
    """Before Hydra writes `.hydra/` and its log into the run directory: validates the
    config, and refuses a directory another run holds, a `resume=` that is not a run, and a
    resume with a changed config."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from trainer.distribute.cluster import resolve_cluster
    from trainer.rundir.lock import check_unlocked, check_writable
    from trainer.rundir.resume import check_resume, check_resume_target, latest_state

    if os.environ.get(CHILD_ENV) is not None:
        return
    cfg = compose_from_args(args)
    if cfg is None:
        return
    logs = OmegaConf.select(cfg, "hydra.run.dir")
    if logs is not None:
        check_writable(Path(logs))
        if not Path(logs).exists():
            _fresh_run_dir.append(Path(logs))
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        check_config(cfg)
    except InterpolationResolutionError:
        return  # it needs a running job (`${hydra:...}`): the job validates it
    cluster = resolve_cluster(list(cfg.cluster.workers), cfg.cluster.task_index,
                              os.environ.get("TF_CONFIG"), os.environ,
                              cfg.cluster.port_base)
    if cluster is not None and not cluster.is_chief:
        return  # the chief checks and writes the run directory
    from trainer.track.loggers import check_loggers

    check_loggers(cfg.logger, reach=True)
    check_resume_target(cfg.get("resume"), logs)
    run_dir = Path(cfg.resume if cfg.get("resume") else logs)
    check_unlocked(run_dir)
    state = latest_state(run_dir)
    if state is None:
        return
    try:
        new = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:  # an interpolation only a running job resolves
        new = OmegaConf.to_container(cfg, resolve=False)
    check_resume(run_dir, state, new)


def _remove_fresh_run_dir() -> None:
    """Removes the run directory this run created (Hydra's `.hydra/` and log only)."""
    import logging
    import shutil

    for path in _fresh_run_dir:
        if path.is_dir() and not any((path / name).exists()
                                     for name in ("backup", "checkpoints", "summary.json")):
            logging.shutdown()
            shutil.rmtree(path, ignore_errors=True)


def _exit_config_error(error: BaseException) -> None:
    if _USER_FULL_ERROR:
        raise error
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    _remove_fresh_run_dir()
    sys.exit(EXIT_CONFIG)


if __name__ == "__main__":
    main()
