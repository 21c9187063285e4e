"""trainer's Optuna sweeper (hydra_plugins/trainer_optuna_sweeper, on Optuna 4 and later):
Hydra's sweep syntax as Optuna's distributions, the study every job opens, a trial reporting
per epoch and pruned, and two sweeps sharing one SQLite study."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import optuna
import pytest
import yaml
from conftest import REPO, TINY, error_lines, run_main
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.trainer_optuna_sweeper._impl import grid, search_space
from trainer.config.compose import compose_from_args
from trainer.config.errors import ConfigError
from trainer.track.pruning import optuna_trial
from trainer.track.sweep import STUDY_ENV, TRIAL_ENV, optuna_study, trial_table

QUICK = [*TINY, "hparams_search=digits_optuna"]
THRESHOLD = "hydra.sweeper.pruner={_target_: optuna.pruners.ThresholdPruner, lower: %s}"


def test_hydras_sweep_syntax_becomes_optuna_distributions():
    space, fixed = search_space([
        "optimizer.lr=tag(log, interval(0.0001, 0.03))", "batch.per_replica=choice(16, 32)",
        "model.dropout=interval(0.0, 0.5)", "units=int(interval(8, 64))",
        "width=interval(8, 64)", "layers=range(1, 4)", "scale=range(0.5, 2.0, step=0.5)",
        "epochs=3", "model.dropout=0.1"])
    assert space == {"optimizer.lr": FloatDistribution(0.0001, 0.03, log=True),
                     "batch.per_replica": CategoricalDistribution([16, 32]),
                     "units": IntDistribution(8, 64), "width": FloatDistribution(8, 64),
                     "layers": IntDistribution(1, 4),
                     "scale": FloatDistribution(0.5, 2.0, step=0.5)}
    assert fixed == {"epochs": "3", "model.dropout": "0.1"}  # the later value wins
    assert grid({k: space[k] for k in ("batch.per_replica", "layers", "scale")}) == {
        "batch.per_replica": [16, 32], "layers": [1, 2, 3, 4], "scale": [0.5, 1.0, 1.5, 2.0]}
    with pytest.raises(ConfigError, match=r"width: the grid sampler needs choice\(...\) or "
                                          r"range\(...\), not an interval"):
        grid({"width": space["width"]})


def test_the_study_is_in_the_sweep_directory_unless_the_sweeper_names_one(tmp_path,
                                                                          monkeypatch):
    sweep = tmp_path / "multirun" / "12-00-00"
    none = OmegaConf.create({"storage": None, "study_name": None, "pruner": None})
    assert optuna_study(none, sweep) == {"storage": f"sqlite:///{sweep / 'optuna.db'}",
                                         "study_name": str(sweep), "pruner": None}
    monkeypatch.chdir(tmp_path)  # a relative SQLite path: the same file from any process
    named = OmegaConf.create({"storage": "sqlite:///studies/s.db", "study_name": "s",
                              "pruner": {"_target_": "optuna.pruners.MedianPruner"}})
    assert optuna_study(named, sweep) == {
        "storage": f"sqlite:///{tmp_path / 'studies' / 's.db'}", "study_name": "s",
        "pruner": {"_target_": "optuna.pruners.MedianPruner"}}


def _study_env(tmp_path, pruner):
    """A study with one asked trial in an SQLite file, and a job's environment naming it."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    study.ask()
    return study, {TRIAL_ENV: "0", STUDY_ENV: json.dumps(
        {"storage": storage, "study_name": "s", "pruner": pruner})}


def test_a_trial_reports_each_epoch_and_stops_training_where_its_pruner_prunes(tmp_path):
    threshold = {"_target_": "optuna.pruners.ThresholdPruner", "lower": 0.6}
    study, environ = _study_env(tmp_path, threshold)
    logged = ("loss", "val_loss", "val_accuracy")
    callback = optuna_trial("val_accuracy", logged, 1, environ)
    model = SimpleNamespace(stop_training=False)
    callback.set_model(model)
    callback.on_epoch_end(0, {"val_accuracy": 0.7})
    assert not model.stop_training and callback.pruned is None
    callback.on_epoch_end(1, {"val_accuracy": 0.5, "loss": 1.0})
    assert model.stop_training
    assert callback.pruned == {"trial": 0, "epoch": 2, "value": 0.5}
    (trial,) = study.get_trials()
    assert trial.intermediate_values == {1: 0.7, 2: 0.5}  # steps: epochs done
    assert trial.state == TrialState.RUNNING  # the sweeper tells how it ended
    # No such trial where the job is no Optuna trial's, the metric is no epoch's, or
    # several workers would have to agree on a stop.
    assert optuna_trial("val_accuracy", logged, 1, {}) is None
    assert optuna_trial("time.wall_s", logged, 1, environ) is None
    assert optuna_trial("val_accuracy", logged, 2, environ) is None


def test_without_a_pruner_a_trial_reports_and_is_never_pruned(tmp_path):
    study, environ = _study_env(tmp_path, None)  # not Optuna's default, the median pruner
    callback = optuna_trial("val_loss", ("val_loss",), 1, environ)
    callback.set_model(SimpleNamespace(stop_training=False))
    for epoch, value in enumerate([1.0, 9.0, 99.0]):
        callback.on_epoch_end(epoch, {"val_loss": value})
    assert callback.pruned is None and not callback.model.stop_training
    assert study.get_trials()[0].intermediate_values == {1: 1.0, 2: 9.0, 3: 99.0}


def test_the_trial_table_puts_pruned_trials_after_the_completed_ones():
    def trial(job, value, status, **extra):
        return {"job": job, "overrides": [f"optimizer.lr={job / 10}"], "metric": "val_accuracy",
                "value": value, "status": status, "error": None, **extra}

    table = trial_table([trial(0, 0.5, "pruned", pruned_after_epoch=1), trial(1, 0.7, "completed"),
                         trial(2, None, "failed"), trial(3, 0.6, "pruned", pruned_after_epoch=2),
                         trial(4, 0.8, "completed")], "max")
    lines = table.splitlines()
    assert lines[0] == ("# Trials: 5 (2 completed, 2 pruned, 1 failed); val_accuracy, highest "
                        "first")
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and "rank" not in line]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("| 1", "4", "completed"), ("| 2", "1", "completed"), ("| -", "3", "pruned after epoch 2"),
        ("| -", "0", "pruned after epoch 1"), ("| -", "2", "failed")]
    assert "Best: job 4, val_accuracy = 0.8, optimizer.lr=0.4" in lines


def test_a_search_that_cannot_work_is_one_line_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    cases = {
        ("optimized_metric=time.wall_s", "hydra.sweeper.direction=minimize"):
            "error: hydra.sweeper.pruner prunes on a metric every epoch logs, but "
            "optimized_metric=time.wall_s is known only when a trial ends; choose a val_ or "
            "training metric, or set hydra.sweeper.pruner=null",
        ("optimized_metric=null",):
            "error: hydra/sweeper=trainer_optuna optimizes the number each trial returns: set "
            "optimized_metric (e.g. optimized_metric=val_accuracy)",
        ("hydra.sweeper.sampler._target_=optuna.samplers.NoSuchSampler",):
            "error: hydra.sweeper.sampler._target_='optuna.samplers.NoSuchSampler' cannot be "
            "imported: ModuleNotFoundError: ",
        ("hydra.sweeper.max_failure_rate=1.5",):
            "error: hydra.sweeper.max_failure_rate=1.5: must be between 0.0 and 1.0",
        ("hydra.sweeper.storage=sqlite:///:memory:",):
            "error: hydra.sweeper.storage=sqlite:///:memory: is a database in one process's "
            "memory, but each job reports to the study from a process of its own",
    }
    for overrides, line in cases.items():
        out = run_main("-m", *QUICK, *overrides, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        (found,) = error_lines(out.stderr)
        assert found.startswith(line), found
        assert not list(sweep.glob("*/"))  # no job ran


def test_a_search_whose_every_trial_failed_ends_with_the_first_failure(tmp_path):
    sweep = tmp_path / "sweep"
    # each job refuses its learning rate before TensorFlow starts: a failed trial, quickly
    out = run_main("-m", *QUICK, "optimizer.lr=choice(-1.0, -2.0)", "hydra.sweeper.n_trials=2",
                   f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]  # the failed job's own exit code
    assert re.fullmatch(r"error: sweep job 0 \(.*optimizer\.lr=(-[\d.]+) .*\) failed: "
                        r"optimizer\.lr must be positive; received: \1; every job's outcome "
                        r"is in trials\.md in the sweep directory",
                        error_lines(out.stderr)[-1]), error_lines(out.stderr)[-1]
    assert "# Trials: 2 (0 completed, 2 failed)" in (sweep / "trials.md").read_text()
    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}")
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL] * 2


def test_a_pruned_trial_stops_training_exits_cleanly_and_ends_pruned(tmp_path):
    sweep = tmp_path / "sweep"
    # accuracy never reaches 1.1: the pruner prunes the trial at its first report
    out = run_main("-m", *QUICK, "epochs=3", "hydra.sweeper.n_trials=1",
                   "hydra.sweeper.pruner=null", THRESHOLD % 1.1, f"hydra.sweep.dir={sweep}",
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Error executing job" not in out.stderr  # a pruned trial is no failed job
    record = json.loads((sweep / "0" / "trial.json").read_text())
    assert (record["status"], record["pruned_after_epoch"], record["exit_code"]) == (
        "pruned", 1, 0)
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["epochs_done"] == 1 and summary["pruned"]["epoch"] == 1
    table = (sweep / "trials.md").read_text()
    assert table.startswith("# Trials: 1 (0 completed, 1 pruned, 0 failed)")
    assert "| - | 0 | pruned after epoch 1 |" in table
    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{sweep / 'optuna.db'}")
    (trial,) = study.get_trials()
    assert trial.state == TrialState.PRUNED
    assert trial.intermediate_values == {1: summary["pruned"]["value"]}
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["trials"] == {"complete": 0, "pruned": 1, "failed": 0}
    assert results["best_value"] is None


@pytest.mark.multiworker  # two sweeps and their jobs' processes at once: ~20 s on 2 cores
def test_two_sweeps_at_once_share_one_sqlite_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    shared = (*QUICK, f"hydra.sweeper.storage={storage}", "hydra.sweeper.study_name=shared",
              "hydra.sweeper.n_trials=1", "hydra.sweeper.pruner=null")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    # One sweep in a process of its own, the other in this one (its jobs' processes start
    # alike), at the same time: both open the new file, one creating its tables.
    other = subprocess.Popen([sys.executable, "-m", "trainer", "-m", *shared,
                              f"hydra.sweep.dir={tmp_path / 'a'}"], cwd=tmp_path,
                             env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        out = run_main("-m", *shared, f"hydra.sweep.dir={tmp_path / 'b'}", cwd=tmp_path)
        errors = other.communicate(timeout=600)[1]
    finally:
        other.kill()
        other.wait()
    assert (other.returncode, out.returncode) == (0, 0), (errors[-3000:], out.stderr[-3000:])
    study = optuna.load_study(study_name="shared", storage=storage)
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == [0, 1]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    values, results = [], []
    for name in ("a", "b"):  # each sweep ran, and tabled, its own trial
        values.append(json.loads((tmp_path / name / "0" / "trial.json").read_text())["value"])
        assert (tmp_path / name / "trials.md").read_text().startswith("# Trials: 1 (1 completed")
        found = tmp_path / name / "optimization_results.yaml"
        results.append((found.stat().st_mtime_ns, yaml.safe_load(found.read_text())))
    assert sorted(t.value for t in trials) == sorted(values)
    assert all(r["study_name"] == "shared" and r["trials"]["complete"] == 1 for _, r in results)
    # the sweep that ended last saw both trials: its best is the study's
    assert max(results, key=lambda r: r[0])[1]["best_value"] == pytest.approx(max(values))


def test_a_new_sqlite_study_opens_under_a_lock_beside_its_file(tmp_path):
    """Two sweeps starting at once on a new SQLite file would both create its tables (one
    then fails, 'table ... already exists'): the sweeper opens the study holding a lock."""
    import fcntl

    from hydra_plugins.trainer_optuna_sweeper._impl import _opening

    with _opening(f"sqlite:///{tmp_path / 'study.db'}"):
        with open(tmp_path / ".study.db.lock") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(tmp_path / ".study.db.lock") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_samplers_and_pruners_are_chosen_by_name_and_take_their_arguments():
    from hydra_plugins.trainer_optuna_sweeper._impl import OptunaSearch

    def built(*overrides):
        sweeper = compose_from_args(["-m", "hparams_search=digits_optuna", *overrides]
                                    ).hydra.sweeper
        search = OptunaSearch(**{k: v for k, v in sweeper.items() if not k.startswith("_")})
        search.build()
        return search.sampler, search.pruner

    sampler, pruner = built()  # the search's own: TPE, seeded, and the median pruner
    assert type(sampler) is optuna.samplers.TPESampler
    assert type(pruner) is optuna.pruners.MedianPruner
    sampler, pruner = built("hydra/sweeper/pruner=hyperband", "hydra/sweeper/sampler=random")
    assert type(sampler) is optuna.samplers.RandomSampler
    assert type(pruner) is optuna.pruners.HyperbandPruner
    _, pruner = built("hydra/sweeper/pruner=threshold", "+hydra.sweeper.pruner.lower=0.5")
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for value, pruned in ((0.4, True), (0.6, False)):
        trial = study.ask()
        trial.report(value, 1)
        assert trial.should_prune() is pruned
    _, pruner = built("hydra.sweeper.pruner=null")  # none, not Optuna's default median
    assert type(pruner) is optuna.pruners.NopPruner


APP = '''
import hydra
import optuna


@hydra.main(config_path=".", config_name="app", version_base="1.3")
def main(cfg):
    if cfg.x > 3.5:
        raise optuna.TrialPruned("past 3.5")  # Optuna's way to say a trial is pruned
    return (cfg.x - 2) ** 2 + cfg.y


main()
'''
APP_CONFIG = '''
x: 0
y: 0
defaults:
  - override hydra/sweeper: trainer_optuna
  - override hydra/sweeper/sampler: grid
  - _self_
hydra:
  sweeper:
    n_trials: 100
    params:
      x: range(0, 4)
      y: choice(0, 1)
'''


def test_a_grid_search_of_any_hydra_app_runs_each_point_once(tmp_path):
    """The sweeper is Hydra's, for any app (here one without TensorFlow): a grid of
    every choice and range value, n_trials cut to its size, the sweep ending cleanly where
    the grid's last point makes Optuna's grid sampler stop the study; a job raising
    `optuna.TrialPruned` is a pruned trial."""
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "app.yaml").write_text(APP_CONFIG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("HYDRA_FULL_ERROR", None)
    out = subprocess.run([sys.executable, "app.py", "-m", "hydra.sweep.dir=sweep"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    study = optuna.load_study(study_name="sweep",
                              storage=f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}")
    points = sorted((t.params["x"], t.params["y"], t.state.name) for t in study.get_trials())
    assert points == [(x, y, "PRUNED" if x == 4 else "COMPLETE") for x in range(5)
                      for y in (0, 1)]
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert results["best_params"] == {"x": 2, "y": 0} and results["best_value"] == 0
    assert results["trials"] == {"complete": 8, "pruned": 2, "failed": 0}


def test_the_command_line_registers_the_sweeper_where_hydras_scan_misses_it(monkeypatch):
    """An editable install (`pip install -e`) maps `hydra_plugins.trainer_optuna_sweeper`
    through an import hook, which Hydra's scan of the namespace does not walk: the command
    line registers the sweeper with Hydra itself (a wheel's install is scanned, see
    tests/test_task.py)."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.trainer_optuna_sweeper.sweeper import TrainerOptunaSweeper
    from trainer.run.prepare.jobs import register_sweeper

    registered = []
    monkeypatch.setattr(Plugins, "instance",
                        staticmethod(lambda: SimpleNamespace(register=registered.append)))
    register_sweeper()
    assert registered == [TrainerOptunaSweeper]
