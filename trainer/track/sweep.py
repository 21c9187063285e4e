"""Sweeps: the number a job returns to Hydra's sweeper, and the table of every trial.

`optimized_metric: val_accuracy` (or any logged metric, or a numeric summary key such as
`examples_per_sec` or `time.wall_s`) makes a sweep job return that number, which is what
trainer's Optuna sweeper (and any other optimizing sweeper) maximizes or minimizes. A job that
fails (a bad sampled value, a diverged loss, a crash) raises `TrialFailed`: the sweeper marks
that trial failed and goes on, where the sweeper allows it (`max_failure_rate`). A job of
trainer's Optuna sweeper (`hydra_plugins/trainer_optuna_sweeper`) hands its process the study
(`optuna_study`), which its trial reports to per epoch (`trainer.track.pruning`); one its
pruner stopped raises `optuna.TrialPruned`, and is `pruned`, not failed.

Every job of a sweep writes `trial.json` into its own directory and rewrites `trials.md` in
the sweep directory: all trials so far, their overrides and the metric, best first. It is
rewritten after each job (under a file lock: launchers run jobs in parallel), so it is there
even when a sweep is cut short. No TensorFlow here.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from trainer.config.errors import EXIT_CONFIG, EXIT_INTERRUPTED, ConfigError
from trainer.config.metrics import sweep_mode
from trainer.config.overrides import split, value_of
from trainer.internals.hydra_app import args_parser
from trainer.processes import environment, python, spawn
from trainer.rundir.atomic import write_json, write_text
from trainer.rundir.layout import RunDir

# Numeric summary keys a sweep may optimize besides the logged metrics (dots go into nodes).
SUMMARY_KEYS = ("examples_per_sec", "time.wall_s", "time.first_step_s", "time.first_epoch_s",
                "epochs_done")


# A job of trainer's Optuna sweeper: its trial's number, which the sweeper sets in each job's
# environment (`hydra.job.env_set`), and the study (JSON of `optuna_study`), which the job
# hands its training process.
TRIAL_ENV = "TRAINER_OPTUNA_TRIAL"
STUDY_ENV = "TRAINER_OPTUNA_STUDY"


def optuna_study(sweeper: Any, sweep_dir: str | Path) -> dict[str, Any]:
    """The study of a sweep by trainer's Optuna sweeper, as the sweeper and its jobs'
    processes open it.

    Args:
        sweeper: the `hydra.sweeper` node (`storage`, `study_name`, `pruner`).
        sweep_dir: the sweep's directory.

    Returns:
        `storage`: the URL (null: `optuna.db` in the sweep directory; a relative SQLite path
        made absolute, the same from any working directory), `study_name` (null: the sweep
        directory, a study per sweep) and `pruner`: its node as a dict, or None.

    Raises:
        ConfigError: an in-memory storage, which the jobs' processes cannot reach.
    """
    from omegaconf import OmegaConf

    storage = sweeper.get("storage") or f"sqlite:///{Path(sweep_dir).resolve() / 'optuna.db'}"
    if storage in ("sqlite://", "sqlite:///:memory:"):
        raise ConfigError(f"hydra.sweeper.storage={storage} is a database in one process's "
                          "memory, but each job reports to the study from a process of its "
                          "own: name a file (sqlite:///optuna.db), or null for one in the "
                          "sweep directory")
    prefix = "sqlite:///"
    if storage.startswith(prefix) and not storage.startswith(prefix + "/"):
        storage = prefix + str(Path(storage[len(prefix):]).resolve())
    pruner = sweeper.get("pruner")
    if isinstance(pruner, DictConfig):
        pruner = OmegaConf.to_container(pruner, resolve=True)
    return {"storage": storage, "study_name": sweeper.get("study_name") or str(sweep_dir),
            "pruner": pruner}


class TrialFailed(Exception):
    """A sweep job failed; the sweeper records the trial as failed and the sweep goes on.

    Attributes:
        code: the job's exit code.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # launchers hand it between processes (joblib, submitit)
        return (TrialFailed, (str(self), self.code))


def check_metric_name(name: str | None, logged: tuple[str, ...], tested: bool = False) -> None:
    """Refuses an `optimized_metric` the run will not report, before it trains.

    Args:
        name: the config's `optimized_metric`, or None.
        logged: what the run logs per epoch (`loss`, metrics, and their `val_` forms).
        tested: whether the run has a test split (then `test_` forms are reported too).
    """
    tests = tuple(f"test_{n}" for n in logged if not n.startswith("val_")) if tested else ()
    if name is None or name in logged or name in tests or name in SUMMARY_KEYS:
        return
    raise ConfigError(f"optimized_metric={name!r} is not reported by this run; valid: "
                      f"{', '.join((*logged, *tests, *SUMMARY_KEYS))}")


def check_optuna_search(metric: str | None, sweeper: Any) -> None:
    """Refuses, before the first job, a search by trainer's Optuna sweeper with no number to
    optimize, or with a pruner over a metric no epoch logs (a summary key, a `test_` one).

    Args:
        metric: the config's `optimized_metric`, or None.
        sweeper: the `hydra.sweeper` node.
    """
    if not str(sweeper.get("_target_") or "").endswith(".TrainerOptunaSweeper"):
        return
    if not metric:
        raise ConfigError("hydra/sweeper=trainer_optuna optimizes the number each trial "
                          "returns: set optimized_metric (e.g. optimized_metric=val_accuracy)")
    if sweeper.get("pruner") and (metric in SUMMARY_KEYS or metric.startswith("test_")):
        raise ConfigError(f"hydra.sweeper.pruner prunes on a metric every epoch logs, but "
                          f"optimized_metric={metric} is known only when a trial ends; choose "
                          "a val_ or training metric, or set hydra.sweeper.pruner=null")


def metric_value(summary: dict[str, Any], name: str) -> float:
    """The number `name` stands for in a run's summary.

    `val_X` is the final validation metric X (every validation example once, after the last
    epoch), `test_X` the test metric X where the run has a test split, a bare metric name
    the last epoch's training value, and a dotted name a summary key (`time.wall_s`).

    Raises:
        ConfigError: the summary has no such number.
    """
    sections = (("val_", "validation_metrics"), ("test_", "test_metrics"))
    for prefix, section in sections:
        if name.startswith(prefix) and name[len(prefix):] in (summary.get(section) or {}):
            return float(summary[section][name[len(prefix):]])
    if name in (summary.get("train_metrics") or {}):
        return float(summary["train_metrics"][name])
    node: Any = summary
    for part in name.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node)
    valid = [*(f"val_{k}" for k in summary.get("validation_metrics") or {}),
             *(f"test_{k}" for k in summary.get("test_metrics") or {}),
             *(summary.get("train_metrics") or {}), *SUMMARY_KEYS]
    raise ConfigError(f"optimized_metric={name!r} is not in the run's summary; valid: "
                      f"{', '.join(valid)}")


def direction(metric: str, sweeper: Any = None) -> str:
    """`max` or `min` for ranking a sweep's trials by `metric` (`sweep_mode`'s rule), the
    sweeper's own `direction` checked against the metric's where it has one."""
    declared = sweeper.get("direction") if sweeper is not None else None
    declared = getattr(declared, "name", declared)  # a str or an enum
    # A multi-objective sweeper's list of directions is its own business.
    return sweep_mode(metric, declared if isinstance(declared, str) else None)


def record_trial(job_dir: Path, sweep_dir: Path, trial: dict[str, Any], mode: str) -> Path:
    """Writes a job's `trial.json` and rewrites the sweep's `trials.md`; returns the table.

    Args:
        job_dir: the job's own directory.
        sweep_dir: the sweep's directory (the jobs' parent).
        trial: `job`, `overrides`, `status` (`completed`/`pruned`/`failed`), `metric`,
            `value`, `error`; a pruned one `pruned_after_epoch`.
        mode: `max` or `min`, for the order of the table.
    """
    write_json(RunDir(job_dir).trial, trial)
    sweep_dir = Path(sweep_dir)
    with open(sweep_dir / ".trials.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        trials = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{RunDir('.').trial.name}")]
        table = sweep_dir / "trials.md"
        write_text(table, trial_table(trials, mode))
    return table


def _order(trials: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """Completed trials best first, then pruned ones (best first too), then failed ones by
    job number."""
    def key(t: dict[str, Any]) -> tuple:
        value = t.get("value")
        rank = {"completed": 0, "pruned": 1}.get(t.get("status"), 2)
        ok = rank < 2 and value is not None and math.isfinite(value)
        score = (-value if mode == "max" else value) if ok else 0.0
        return (rank if ok else 2, score, t.get("job", 0))
    return sorted(trials, key=key)


def _typed(override: str) -> tuple[str, str]:
    """An override's key as typed (`+x`) and its value ("" for `~x`), as the table shows it."""
    key, found = split(override)
    return key, found or ""


def _parameters(trials: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
    """The override keys whose values differ between trials (the searched parameters), and
    the overrides every trial shares."""
    pairs = [dict(_typed(o) for o in t.get("overrides", [])) for t in trials]
    keys: list[str] = []
    for p in pairs:
        keys += [k for k in p if k not in keys]
    varying = [k for k in keys if len({p.get(k) for p in pairs}) > 1]
    shared = {k: pairs[0][k] for k in keys if k not in varying and pairs and k in pairs[0]}
    return varying, shared


def trial_table(trials: list[dict[str, Any]], mode: str) -> str:
    """A markdown table of the trials, best first: one column per searched parameter;
    pruned trials after the completed ones, with the epoch they stopped after, and failed
    trials last, with their error."""
    ordered = _order(trials, mode)
    metric = next((t["metric"] for t in trials if t.get("metric")), "metric")
    done = [t for t in ordered if t.get("status") == "completed"]
    pruned = sum(t.get("status") == "pruned" for t in trials)
    varying, shared = _parameters(trials)
    counts = f"{len(done)} completed, " + (f"{pruned} pruned, " if pruned else "")
    lines = [f"# Trials: {len(trials)} ({counts}{len(trials) - len(done) - pruned} "
             f"failed); {metric}, {'highest' if mode == 'max' else 'lowest'} first", ""]
    if done:
        best = dict(_typed(o) for o in done[0]["overrides"] if value_of(o) is not None)
        values = " ".join(f"{k}={best[k]}" for k in varying if k in best)
        lines += [f"Best: job {done[0]['job']}, {metric} = {_number(done[0]['value'])}"
                  + (f", {values}" if values else ""), ""]
    if shared:
        lines += ["Every trial: " + " ".join(f"{k}={v}" if v else k for k, v in shared.items()),
                  ""]
    header = ["rank", "job", "status", metric, *varying, "error"]
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for rank, t in enumerate(ordered, 1):
        pairs = dict(_typed(o) for o in t.get("overrides", []) if value_of(o) is not None)
        status = str(t.get("status"))
        if status == "pruned" and t.get("pruned_after_epoch"):
            status += f" after epoch {t['pruned_after_epoch']}"
        cells = [str(rank) if t.get("status") == "completed" else "-", str(t.get("job")),
                 status, _number(t.get("value")),
                 *(pairs.get(k, "") for k in varying), t.get("error") or ""]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


# Set when a sweep job re-runs itself in a fresh process (see `run_job_in_subprocess`).
CHILD_ENV = "TRAINER_SWEEP_CHILD"


def in_sweep() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


# A job stopped by a signal (Ctrl-C, SIGTERM) stops the sweep; any other failure fails its
# trial only.
_STOPS_SWEEP = (EXIT_INTERRUPTED, 130, -2, -15)


def run_job_in_subprocess(cfg: DictConfig, full_error: bool = False,
                          cluster: Any = None) -> Any:
    """Runs one sweep job as `python -m trainer` in a fresh process.

    TensorFlow's devices can be set once per process, before its runtime starts, and Hydra's
    basic launcher runs every job of a sweep in this one process; so each job re-executes
    itself with its own overrides, writing into the job's own directory. The job's stderr is
    passed through, its last line kept as the reason of a failed trial.

    Args:
        cfg: the job's config.
        full_error: the user asked for whole tracebacks (`HYDRA_FULL_ERROR=1`).
        cluster: the job's multi-worker cluster where it has several tasks (a SLURM
            launcher's nodes x tasks: each task a worker, the chief writing the job's
            directory and reporting, the others only training); None for one.

    Returns:
        The value of `optimized_metric` where it is set (what an optimizing sweeper needs),
        else the job's summary.

    Raises:
        TrialFailed: the job failed; the trial table records it.
    """
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    command = python(*config_options(), *hc.overrides.task, "hydra.mode=RUN",
                     f"hydra.run.dir={out}", f"hydra.job.name={hc.job.name}", module="trainer")
    chief = cluster is None or cluster.is_chief
    if not chief:
        command.append("hydra.output_subdir=null")
    optimized = cfg.get("optimized_metric")
    metric = optimized or cfg.checkpoint.monitor
    try:
        mode = direction(metric, hc.sweeper if optimized else None) if chief else "max"
    except ConfigError as error:  # before the job trains: it would train for nothing
        record_trial(out, Path(hc.sweep.dir), {
            "job": hc.job.num, "overrides": list(hc.overrides.task), "metric": metric,
            "value": None, "status": "failed", "exit_code": EXIT_CONFIG,
            "error": str(error)}, "max")
        raise TrialFailed(f"sweep job {hc.job.num}: {error}", EXIT_CONFIG) from None
    study = {}
    if os.environ.get(TRIAL_ENV) is not None:  # trainer's Optuna sweeper set its trial
        study[STUDY_ENV] = json.dumps(optuna_study(hc.sweeper, hc.sweep.dir))
    code, last = _run_job(command, full_error, study)
    if not chief:
        if code:
            raise TrialFailed(f"sweep job {hc.job.num}, worker {cluster.task_id}: "
                              f"{last.removeprefix('error: ') or f'exit code {code}'}", code)
        return None
    return _report_trial(hc, out, code, last, metric, optimized, mode)


def _run_job(command: list[str], full_error: bool, extra: dict[str, str]) -> tuple[int, str]:
    """Runs the job's process (`extra` added to its environment), passing its stderr on;
    returns its exit code and the last line it wrote there."""
    # the sweep's process group: the job gets the terminal's Ctrl-C as the sweep does
    process = spawn(command, environment({CHILD_ENV: "1", **extra},
                                         drop=() if full_error else ("HYDRA_FULL_ERROR",)),
                    own_session=False, stderr=subprocess.PIPE, text=True, errors="replace")
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
    return process.wait(), last


def _report_trial(hc: Any, out: Path, code: int, last: str, metric: str,
                  optimized: str | None, mode: str) -> Any:
    """Records the chief's trial in the table; returns the job's value (or summary).

    Raises:
        TrialFailed: the job failed.
        optuna.TrialPruned: the study's pruner stopped the job's training.
    """
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
        if not RunDir(out).finished():
            trial["error"] = f"the job ended without writing {RunDir(out).summary}"
            raise TrialFailed(f"sweep job {hc.job.num}: {trial['error']}")
        summary = json.loads(RunDir(out).summary.read_text())
        try:
            trial["value"] = metric_value(summary, metric)
        except ConfigError as error:
            if optimized:
                trial["error"] = str(error)
                raise TrialFailed(f"sweep job {hc.job.num}: {error}", EXIT_CONFIG) from None
        pruned = summary.get("pruned")
        trial["status"] = "pruned" if pruned else "completed"
        if pruned:
            trial["pruned_after_epoch"] = pruned["epoch"]
    finally:
        if trial["status"] != "failed" or trial["error"]:
            table = record_trial(out, Path(hc.sweep.dir), trial, mode)
            print(f"[sweep] job {hc.job.num} {trial['status']}; all trials: {table}",
                  file=sys.stderr, flush=True)
    if trial["status"] == "pruned":
        import optuna  # the job's process reported to Optuna: it is there

        raise optuna.TrialPruned(f"sweep job {hc.job.num}: pruned after epoch "
                                 f"{trial['pruned_after_epoch']}")
    return trial["value"] if optimized else summary


def config_options() -> list[str]:
    """The sweep's own --config-name / --config-dir / --config-path, for each job."""
    parsed, _ = args_parser().parse_known_args(sys.argv[1:])
    options = []
    for flag, value in (("--config-name", parsed.config_name), ("--config-dir",
                        parsed.config_dir), ("--config-path", parsed.config_path)):
        if value is not None:
            options += [flag, os.path.abspath(value) if flag == "--config-dir" else value]
    return options
