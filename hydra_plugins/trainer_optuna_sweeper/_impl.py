"""The Optuna search behind `TrainerOptunaSweeper`, on Optuna 4's ask-and-tell API.

Each launch asks the study for `n_jobs` trials, runs them as Hydra jobs with the sampled values
as overrides, and tells the study how each ended: its number (COMPLETE), pruned (the job
raised `optuna.TrialPruned`), or failed. The study lives in a storage every process opens (an
SQLite file in the sweep directory unless `storage` names one), so a job's own process reports
its metric per epoch to its trial and asks the pruner (`trainer.track.pruning`): each job's
environment names its trial (`TRAINER_OPTUNA_TRIAL`, through `hydra.job.env_set`). Two sweeps
naming one storage and study share the study, Optuna's own way to search from several
machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)
from hydra.core.plugins import Plugins
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from trainer.config.build import build_object, describe
from trainer.config.errors import ConfigError
from trainer.track.sweep import TRIAL_ENV, optuna_study

log = logging.getLogger(__name__)


def distribution(override: Override) -> BaseDistribution | None:
    """The Optuna distribution of a sweep override (None for a plain value).

    `choice(a, b)` and a shuffled range are categorical; `range(a, b, step)` steps from `a`
    to `b` included, as Optuna's `step` does (and Hydra's Optuna sweeper did);
    `interval(a, b)` is uniform over floats (Hydra's interval is of floats), `int(interval(a,
    b))` over integers, and `tag(log, interval(a, b))` log-uniform.
    """
    if not override.is_sweep_override():
        return None
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(
            transformer=Transformer.encode)))
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        if any(isinstance(x, float) for x in (value.start, value.stop, value.step)):
            return FloatDistribution(value.start, value.stop, step=value.step)
        return IntDistribution(int(value.start), int(value.stop), step=int(value.step))
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(value.start, value.end, log=log_scale)
    raise ConfigError(f"{override.input_line}: the Optuna sweeper takes choice(...), "
                      "range(...), interval(...) and tag(log, interval(...))")


def search_space(overrides: Sequence[str]) -> tuple[dict[str, BaseDistribution],
                                                     dict[str, str]]:
    """The distributions to sample and the fixed values every trial gets, from `params` and
    the command line's overrides (a later one of the same key wins)."""
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        found = distribution(override)
        if found is None:
            fixed[key] = override.get_value_element_as_str()
        else:
            space[key] = found
    return space, fixed


def grid(space: dict[str, BaseDistribution]) -> dict[str, list]:
    """The search space as GridSampler's lists of values: choices, and the steps of a
    range; a continuous interval has no grid."""
    values = {}
    for key, found in space.items():
        if isinstance(found, CategoricalDistribution):
            values[key] = list(found.choices)
        elif found.step is not None and not found.log:
            count = int(round((found.high - found.low) / found.step)) + 1
            values[key] = [found.low + i * found.step for i in range(count)]
        else:
            raise ConfigError(f"{key}: the grid sampler needs choice(...) or range(...), not "
                              "an interval")
    return values


class Pruned:
    """What a job that raised `optuna.TrialPruned` returns to the sweeper."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _CatchPruned:
    """The task function, its `optuna.TrialPruned` turned into a `Pruned` return: a pruned
    trial is no failed job (Hydra would report it as one)."""

    def __init__(self, task_function: TaskFunction) -> None:
        self.task_function = task_function

    def __call__(self, cfg: DictConfig) -> Any:
        try:
            return self.task_function(cfg)
        except optuna.TrialPruned as pruned:
            return Pruned(str(pruned))


class OptunaSearch:
    """A sweep's study: its trials asked, launched and told, its best written out."""

    def __init__(self, sampler: Any, pruner: Any, direction: Any, storage: str | None,
                 study_name: str | None, n_trials: int, n_jobs: int,
                 max_failure_rate: float, params: DictConfig | None) -> None:
        self.options = OmegaConf.create({"sampler": sampler, "storage": storage,
                                         "study_name": study_name, "pruner": pruner})
        self.direction = getattr(direction, "name", direction)
        self.n_trials, self.n_jobs = n_trials, n_jobs
        self.max_failure_rate = max_failure_rate
        self.params = [f"{k}={v}" for k, v in (params or {}).items()]
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        """Builds the search (`build`), and the launcher of its jobs."""
        self.build()
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context,
            task_function=_CatchPruned(task_function))

    def build(self) -> None:
        """Checks the options and builds the sampler and the pruner (in `setup`, not in
        `__init__`, which Hydra's `instantiate` calls: an error raised here is the user's
        one line, not Hydra's wrapping of it)."""
        for name, value in (("n_trials", self.n_trials), ("n_jobs", self.n_jobs)):
            if value < 1:
                raise ConfigError(f"hydra.sweeper.{name}={value}: must be at least 1")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ConfigError(f"hydra.sweeper.max_failure_rate={self.max_failure_rate}: must "
                              "be between 0.0 and 1.0")
        sampler, pruner = self.options.sampler, self.options.pruner
        self.sampler = build_object(sampler, "hydra.sweeper.sampler") if sampler else None
        # None would be Optuna's default, the median pruner: none is none
        self.pruner = (build_object(pruner, "hydra.sweeper.pruner") if pruner
                       else optuna.pruners.NopPruner())

    def sweep(self, arguments: list[str]) -> None:
        """Runs `n_trials` trials, `n_jobs` at a time, then writes
        `optimization_results.yaml`; raises the first failure past `max_failure_rate`, or
        when every trial of the sweep failed."""
        space, fixed = search_space([*self.params, *arguments])
        study = self._open(space)
        outcomes: list[Any] = []  # this sweep's: a trial's state, or the error it failed with
        while len(outcomes) < self.n_trials:
            trials = [study.ask(space) for _ in range(min(self.n_jobs,
                                                          self.n_trials - len(outcomes)))]
            overrides = [self._overrides(trial, fixed) for trial in trials]
            returns = self.launcher.launch(overrides, initial_job_idx=self.job_idx)
            self.job_idx += len(returns)
            batch = [_tell(study, trial, ret) for trial, ret in zip(trials, returns, strict=True)]
            outcomes += batch
            failures = [o for o in batch if isinstance(o, BaseException)]
            if failures and len(failures) / len(batch) > self.max_failure_rate:
                log.error(f"{len(failures)} of {len(batch)} trials failed, more than "
                          f"max_failure_rate={self.max_failure_rate}")
                raise failures[0]
            if _exhausted(self.sampler, study):
                break
        if all(isinstance(o, BaseException) for o in outcomes):
            raise outcomes[0]  # every trial failed
        self._write_results(study, outcomes)

    def _open(self, space: dict[str, BaseDistribution]) -> optuna.study.Study:
        """Creates the study, or loads it where the storage has one of that name."""
        if isinstance(self.sampler, functools.partial):  # the grid: made of the space
            values = grid(space)
            self.sampler = self.sampler(values)
            size = 1
            for choices in values.values():
                size *= len(choices)
            self.n_trials = min(self.n_trials, size)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        where = optuna_study(self.options, sweep_dir)
        try:
            with _opening(where["storage"]):
                study = optuna.create_study(
                    storage=where["storage"], study_name=where["study_name"],
                    sampler=self.sampler, pruner=self.pruner, direction=self.direction,
                    load_if_exists=True)
        except Exception as error:  # a URL SQLAlchemy cannot parse, a database not there
            raise ConfigError(f"hydra.sweeper.storage={where['storage']}: cannot open the "
                              f"study {where['study_name']!r}: {describe(error)}") from None
        log.info(f"Study {study.study_name!r} in {where['storage']} ({self.direction}; "
                 f"sampler {type(study.sampler).__name__}, pruner "
                 f"{type(study.pruner).__name__}); {len(study.trials)} trials before this "
                 "sweep")
        return study

    @staticmethod
    def _overrides(trial: optuna.trial.Trial, fixed: dict[str, str]) -> tuple[str, ...]:
        """The job's overrides: the trial's values, the fixed ones, and its trial's number
        in its environment (for the job's process to report to)."""
        for key, value in fixed.items():
            trial.set_user_attr(key, value)
        values = {**trial.params, **fixed}
        return (*(f"{k}={v}" for k, v in values.items()),
                f"++hydra.job.env_set.{TRIAL_ENV}={trial.number}")

    def _write_results(self, study: optuna.study.Study, outcomes: list[Any]) -> None:
        """`optimization_results.yaml`: the study's best trial (over every sweep sharing the
        study), and how this sweep's trials ended."""
        states = [o.name for o in outcomes if isinstance(o, TrialState)]
        ended = {"complete": states.count("COMPLETE"), "pruned": states.count("PRUNED"),
                 "failed": len(outcomes) - len(states) + states.count("FAIL")}
        results: dict[str, Any] = {"name": "optuna", "study_name": study.study_name,
                                   "trials": ended, "best_params": None, "best_value": None}
        if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            best = study.best_trial
            results.update(best_params=best.params, best_value=best.value,
                           best_trial=best.number)
            log.info(f"Best trial {best.number}: value {best.value}, {best.params}")
        else:
            log.warning(f"No trial of study {study.study_name!r} completed: {ended}")
        OmegaConf.save(OmegaConf.create(results),
                       Path(self.config.hydra.sweep.dir) / "optimization_results.yaml")


@contextlib.contextmanager
def _opening(storage: str) -> Iterator[None]:
    """Holds a lock beside an SQLite file while the study opens: two sweeps starting at once
    on a new file would both create its tables, and one of them fail."""
    prefix = "sqlite:///"
    if not storage.startswith(prefix):
        yield
        return
    database = Path(storage[len(prefix):])
    with open(database.with_name(f".{database.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _tell(study: optuna.study.Study, trial: optuna.trial.Trial, ret: Any) -> Any:
    """Tells the study how a job ended; returns the trial's state, or the job's error."""
    try:
        value = ret.return_value  # the job's failure is raised here (Hydra names the job)
    except Exception as error:
        _told(study, trial, state=TrialState.FAIL)
        log.warning(f"Trial {trial.number} failed: {error}")
        return error
    if isinstance(value, Pruned):
        return _told(study, trial, state=TrialState.PRUNED)
    try:
        number = float(value)
    except (TypeError, ValueError):
        _told(study, trial, state=TrialState.FAIL)
        return ConfigError(f"trial {trial.number} returned {type(value).__name__}, not a "
                           "number: set optimized_metric (the number each trial returns)")
    if _told(study, trial, number) == TrialState.FAIL:  # Optuna's answer to a NaN
        return ValueError(f"trial {trial.number} returned {number}")
    return TrialState.COMPLETE


def _told(study: optuna.study.Study, trial: optuna.trial.Trial, value: float | None = None,
          state: TrialState | None = None) -> TrialState:
    """`study.tell`; returns the state stored. The grid sampler's last point calls
    `Study.stop`, which Optuna allows only inside `optimize` (the trial is stored first)."""
    try:
        return study.tell(trial, value, state=state).state
    except RuntimeError as error:
        if "Study.stop" not in str(error):
            raise
    return next(t.state for t in study.get_trials(deepcopy=False) if t.number == trial.number)


def _exhausted(sampler: Any, study: optuna.study.Study) -> bool:
    """Whether a grid sampler has run every point of its grid."""
    if not isinstance(sampler, optuna.samplers.GridSampler):
        return False
    return sampler.is_exhausted(study)
