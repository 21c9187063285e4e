"""Sweeps: the number a job returns to an optimizing sweeper, the trial table, failed
trials, and Hydra's Optuna sweeper and joblib / submitit_local launchers end to end (their
sweeps over 1 and 2 logical replicas also end with a real scaling report)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import TINY, error_lines, run_main

from trainer.config.errors import EXIT_DIVERGED, ConfigError
from trainer.run.train import train
from trainer.track.sweep import (
    check_metric_name,
    direction,
    metric_value,
    record_trial,
    trial_table,
)

SUMMARY = {"validation_metrics": {"accuracy": 0.9, "loss": 0.3},
           "train_metrics": {"accuracy": 0.95, "loss": 0.2},
           "test_metrics": {"accuracy": 0.88},
           "examples_per_sec": 1234.0, "time": {"wall_s": 12.5}, "epochs_done": 3}


def test_a_metric_name_reads_the_summary():
    assert metric_value(SUMMARY, "val_accuracy") == 0.9
    assert metric_value(SUMMARY, "val_loss") == 0.3
    assert metric_value(SUMMARY, "accuracy") == 0.95  # the last epoch's training value
    assert metric_value(SUMMARY, "test_accuracy") == 0.88
    assert metric_value(SUMMARY, "examples_per_sec") == 1234.0
    assert metric_value(SUMMARY, "time.wall_s") == 12.5
    with pytest.raises(ConfigError, match=r"optimized_metric='val_auc' is not in the run's "
                                          r"summary; valid: val_accuracy, val_loss, test_acc"):
        metric_value(SUMMARY, "val_auc")


def test_an_unreported_metric_is_refused_before_training(tiny_config, tmp_path):
    check_metric_name("val_accuracy", ("loss", "accuracy", "val_loss", "val_accuracy"))
    check_metric_name("time.wall_s", ("loss",))
    check_metric_name("test_accuracy", ("accuracy", "val_accuracy"), tested=True)
    with pytest.raises(ConfigError, match="valid: accuracy, val_accuracy, examples_per_sec"):
        check_metric_name("test_accuracy", ("accuracy", "val_accuracy"), tested=False)
    with pytest.raises(ConfigError, match="optimized_metric='val_acc' is not reported by this "
                                          "run; valid: loss, accuracy, val_loss, val_accuracy"):
        train(tiny_config("optimized_metric=val_acc"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_failed_trial_keeps_its_exit_code_across_processes():
    import pickle

    from trainer.track.sweep import TrialFailed

    again = pickle.loads(pickle.dumps(TrialFailed("sweep job 3 failed: loss became nan", 3)))
    assert (str(again), again.code) == ("sweep job 3 failed: loss became nan", 3)


def test_direction_is_the_metrics_own_and_a_contradicting_sweeper_is_refused():
    assert direction("val_loss", {"direction": "minimize"}) == "min"
    assert direction("val_loss") == "min" and direction("time.wall_s") == "min"
    assert direction("val_accuracy") == "max" and direction("val_auc", None) == "max"
    assert direction("val_mae") == "min" and direction("examples_per_sec") == "max"
    assert direction("my_score", {"direction": "minimize"}) == "min"  # the name says nothing
    with pytest.raises(ConfigError, match="optimized_metric=val_loss falls as it improves, "
                       "but the sweeper's direction is maximize; set "
                       "hydra.sweeper.direction=minimize"):
        direction("val_loss", {"direction": "maximize"})
    with pytest.raises(ConfigError, match="hydra.sweeper.direction=maximize"):
        direction("val_accuracy", {"direction": "minimize"})


def test_checkpoints_and_sweeps_agree_on_every_direction():
    from trainer.config.metrics import monitor_mode

    for name in ("val_mae", "val_loss", "val_accuracy", "val_auc", "val_mse", "val_recall"):
        assert direction(name) == monitor_mode(name), name


def test_the_trial_table_ranks_val_mae_ascending():
    trials = [{"job": j, "overrides": [f"optimizer.lr={lr}"], "metric": "val_mae", "value": v,
               "status": "completed", "error": None}
              for j, lr, v in ((0, 0.1, 0.5), (1, 0.01, 0.2), (2, 0.001, 0.9))]
    rows = [r for r in trial_table(trials, direction("val_mae")).splitlines()
            if r.startswith("| ") and not r.startswith("| rank")]
    assert [r.split(" | ")[1] for r in rows] == ["1", "0", "2"]


def trial(job, value, lr, status="completed", error=None):
    return {"job": job, "overrides": [f"optimizer.lr={lr}", "epochs=1"], "metric": "val_loss",
            "value": value, "status": status, "error": error}


def test_the_trial_table_is_best_first_with_failures_last(tmp_path):
    trials = [trial(0, 0.5, 0.1), trial(1, None, "1e+30", "failed", "loss became nan"),
              trial(2, 0.2, 0.01), trial(3, 0.9, 0.001)]
    for t in trials:
        (tmp_path / str(t["job"])).mkdir()
        table = record_trial(tmp_path / str(t["job"]), tmp_path, t, "min")
    text = table.read_text()
    assert text == trial_table(trials, "min")
    lines = text.splitlines()
    assert lines[0] == "# Trials: 4 (3 completed, 1 failed); val_loss, lowest first"
    assert "Best: job 2, val_loss = 0.2, optimizer.lr=0.01" in lines
    assert "Every trial: epochs=1" in lines
    rows = [line for line in lines if line.startswith("| ") and "rank" not in line]
    assert [r.split(" | ")[1] for r in rows] == ["2", "0", "3", "1"]
    assert rows[-1] == "| - | 1 | failed | n/a | 1e+30 | loss became nan |"
    assert json.loads((tmp_path / "1" / "trial.json").read_text())["status"] == "failed"
    # highest first for a metric that grows
    assert [r.split(" | ")[1] for r in trial_table(trials, "max").splitlines()
            if r.startswith("| ") and "rank" not in r] == ["3", "0", "2", "1"]


QUICK = [*TINY, "dataset.image_size=8"]


@pytest.mark.long
def test_optuna_search_goes_on_past_a_failed_trial_and_tables_every_trial(tmp_path):
    sweep = tmp_path / "sweep"
    # lr from {0.001, 1e30}: the sampler's seed (1234) picks 1e30 for the first 2 of the 3
    # trials, 0.001 for the third
    out = run_main("-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=3", *QUICK,
                  "optimizer.lr=choice(0.001,1e30)", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
                  timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    trials = [json.loads((sweep / str(i) / "trial.json").read_text()) for i in range(3)]
    failed = [t for t in trials if t["status"] == "failed"]
    done = [t for t in trials if t["status"] == "completed"]
    assert failed and done, trials
    assert all("optimizer.lr=1e+30" in t["overrides"] for t in failed)
    assert all(t["error"].startswith("loss became nan") for t in failed)
    assert all(t["metric"] == "val_accuracy" and 0 <= t["value"] <= 1 for t in done)
    # The value each trial returned is its summary's final validation accuracy.
    for t in done:
        summary = json.loads((sweep / str(t["job"]) / "summary.json").read_text())
        assert t["value"] == summary["validation_metrics"]["accuracy"]
    table = (sweep / "trials.md").read_text()
    assert table.startswith(f"# Trials: 3 ({len(done)} completed, {len(failed)} failed); "
                            "val_accuracy, highest first")
    best = max(done, key=lambda t: t["value"])
    assert f"Best: job {best['job']}, val_accuracy = {best['value']:.6g}" in table
    header = next(line for line in table.splitlines() if line.startswith("| rank"))
    assert all(p in header for p in ("optimizer.lr", "batch.per_replica", "model.dropout"))
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(best["value"])
    assert not list(sweep.glob("scaling.*"))  # the jobs share their devices: no speed-up


@pytest.mark.long
def test_a_grid_sweep_runs_every_job_and_names_the_failed_one(tmp_path):
    sweep = tmp_path / "sweep"
    out = run_main("-m", *QUICK, "optimizer.lr=0.001,1e30", f"hydra.sweep.dir={sweep}",
                  cwd=tmp_path, timeout=300)
    assert out.returncode == EXIT_DIVERGED  # the failed job's own exit code
    assert (sweep / "0" / "summary.json").is_file()  # the good job ran and finished
    last = error_lines(out.stderr)[-1]
    assert last.startswith("error: sweep job 1 (") and "failed: loss became nan" in last
    assert last.endswith("every job's outcome is in trials.md in the sweep directory")
    assert "Traceback" not in out.stderr
    assert "# Trials: 2 (1 completed, 1 failed)" in (sweep / "trials.md").read_text()


@pytest.mark.long
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_launcher_plugins_give_each_job_its_own_devices(tmp_path, launcher):
    sweep = tmp_path / "sweep"
    out = run_main("-m", f"hydra/launcher={launcher}", "accelerator=cpu", "devices=1,2",
                  *QUICK, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads((sweep / str(i) / "summary.json").read_text()) for i in (0, 1)]
    assert [s["replicas"] for s in summaries] == [1, 2]
    assert [len(s["devices"]) for s in summaries] == [1, 2]
    assert "# Trials: 2 (2 completed, 0 failed)" in (sweep / "trials.md").read_text()
    assert_scaling_report(sweep)


def assert_scaling_report(sweep) -> None:
    """A sweep over devices=1,2 ends with its scaling report: a row per job, each cell its
    job's summary's, the picture, and `python -m trainer.track.report` writes it again."""
    from PIL import Image

    from trainer.track.report import COLUMNS, main

    table = (sweep / "scaling.md").read_text().splitlines()
    header = next(line for line in table if line.startswith("| devices"))
    assert header == "| " + " | ".join(COLUMNS) + " |"
    rows = [line.split(" | ") for line in table if line.startswith("| /cpu")]
    assert len(rows) == 2
    for row, job in zip(rows, ("0", "1"), strict=True):
        summary = json.loads((sweep / job / "summary.json").read_text())
        cells = dict(zip(COLUMNS, [c.strip("| ") for c in row], strict=True))
        assert int(cells["replicas"]) == summary["replicas"]
        assert int(cells["global batch"]) == summary["batch"]["global"]
        assert int(cells["micro-batch"]) == summary["batch"]["per_replica"] == 64
        assert int(cells["accumulate"]) == summary["batch"]["accumulate"] == 1
        assert float(cells["examples/s"]) == pytest.approx(summary["examples_per_sec"], rel=1e-2)
        assert float(cells["val accuracy"]) == pytest.approx(
            summary["validation_metrics"]["accuracy"], rel=1e-3)
        assert float(cells["test accuracy"]) == pytest.approx(
            summary["test_metrics"]["accuracy"], rel=1e-3)
    assert float(dict(zip(COLUMNS, rows[0], strict=True))["speed-up"].strip()) == 1.0
    with Image.open(sweep / "scaling.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 100
    (sweep / "scaling.md").unlink()
    assert main([str(sweep)]) == 0 and (sweep / "scaling.md").is_file()


def test_a_sweeper_direction_against_the_metric_is_one_line_before_any_job(tmp_path):
    out = run_main("-m", "hparams_search=digits_optuna", "optimized_metric=val_loss",
                  f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert error_lines(out.stderr) == [
        "error: optimized_metric=val_loss falls as it improves, but the sweeper's direction "
        "is maximize; set hydra.sweeper.direction=minimize"]
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_whose_shared_overrides_do_not_compose_alone_is_left_to_its_jobs():
    from trainer.run.prepare.jobs import check_sweep_direction as _check_sweep_direction

    # optimizer.momentum exists only in the swept optimizers: each job composes it.
    _check_sweep_direction(["-m", "optimizer=sgd,rmsprop", "optimizer.momentum=0.9",
                            "optimized_metric=val_loss", "hparams_search=digits_optuna"])
    with pytest.raises(ConfigError, match="hydra.sweeper.direction=minimize"):
        _check_sweep_direction(["-m", "epochs=1,2", "optimized_metric=val_loss",
                                "hparams_search=digits_optuna"])
