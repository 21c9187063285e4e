"""Tune before you train: `tune=lr` (a learning-rate range test) and `tune=batch` (the
per-replica batch's throughput curve, and the largest batch that fits where memory bounds
it), on the run's own model, data and devices."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.conftest import error_lines, make_config, run_main
from trainer.plan.tuning import (
    diverged,
    doubling,
    knee,
    largest_fitting,
    range_rates,
    smoothed,
    suggest_rate,
)
from trainer.run.train import train
from trainer.track.tune_plots import read_plot

DIGITS = ["verbose=0", "logger=[]"]  # the default run: cnn on 8x8 digits


def test_the_range_grows_exponentially_and_nan_is_part_of_the_curve():
    rates = range_rates(1e-4, 1.0, 5)
    assert rates == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1, 1.0])
    smooth = smoothed([2.0, 2.0, float("nan"), 1.0])
    assert smooth[:2] == pytest.approx([2.0, 2.0]) and math.isnan(smooth[2])
    assert diverged(smooth) and diverged([1.0, 0.5, 2.5]) and not diverged([1.0, 0.5, 1.5])


def test_the_suggestion_is_a_quarter_of_the_way_down_a_clear_descent():
    rates = range_rates(1e-6, 1.0, 61)
    # flat at 2.3, falls to 0.3 around 1e-3, then diverges past 0.1
    losses = [2.3 - 2.0 / (1 + math.exp(-3 * (math.log10(r) + 3))) + (0 if r < 0.1 else 50 * r)
              for r in rates]
    rate, clear = suggest_rate(rates, losses)
    assert clear and 1e-4 < rate < 1e-3
    flat = [2.3 + 0.001 * (i % 2) for i in range(61)]
    assert suggest_rate(rates, flat)[1] is False
    assert suggest_rate(rates[:4], flat[:4]) == (None, False)


def test_the_knee_is_the_smallest_batch_within_5_percent_of_the_best():
    assert doubling(8, 100) == [8, 16, 32, 64]
    assert knee([8, 16, 32, 64], [100.0, 190.0, 300.0, 310.0]) == 32
    assert knee([8, 16], [100.0, 90.0]) == 8


@pytest.mark.parametrize("cap", [8, 100, 700, 4096])
def test_the_largest_batch_that_fits_is_found_in_fewer_than_12_tries(cap):
    tried = []

    def fits(size):
        tried.append(size)
        return size <= cap

    largest, tries = largest_fitting(fits, 64, 4096) if cap >= 64 else largest_fitting(
        fits, 8, 4096)
    assert largest == cap // 8 * 8
    assert len(tries) < 12 and [s for s, _ in tries] == tried
    assert largest_fitting(lambda size: False, 64, 4096) == (None, [(64, False)])


def test_tune_lr_writes_its_curve_and_nothing_a_run_writes(tmp_path, capsys):
    run_dir = tmp_path / "tune"
    found = train(make_config(*DIGITS, "model=small", "tune=lr", "tuner.steps=30"),
                  run_dir=run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "lr_find.json",
                                                         "lr_find.png"]
    written = json.loads((run_dir / "lr_find.json").read_text())
    assert read_plot(run_dir / "lr_find.png") == written  # the picture holds its curve
    assert len(written["rates"]) == len(written["losses"]) <= 30
    assert written["suggested_lr"] == pytest.approx(found["suggested_lr"])
    assert f"suggested: optimizer.lr={found['suggested_lr']:.3g}" in capsys.readouterr().out


def test_the_suggested_rate_trains_as_well_and_replicas_agree(tmp_path):
    """On digits: the default CNN at the suggested rate reaches the default rate's validation
    accuracy within 1 point over the same epochs; 1 and 2 replicas at the same global batch
    suggest rates within a factor of 2."""
    one = train(make_config(*DIGITS, "tune=lr"), run_dir=tmp_path / "one")
    two = train(make_config(*DIGITS, "tune=lr", "accelerator=cpu", "devices=2",
                            "batch.per_replica=null", "batch.global_size=64"),
                run_dir=tmp_path / "two")
    assert one["clear"] and two["clear"]
    assert 0.5 < one["suggested_lr"] / two["suggested_lr"] < 2
    default = train(make_config(*DIGITS), run_dir=tmp_path / "default")
    tuned = train(make_config(*DIGITS, f"optimizer.lr={one['suggested_lr']}"),
                  run_dir=tmp_path / "tuned")
    assert (tuned["validation_metrics"]["accuracy"]
            >= default["validation_metrics"]["accuracy"] - 0.01)


def test_tune_batch_draws_a_throughput_curve_and_suggests_a_batch_on_it(tmp_path):
    run_dir = tmp_path / "batch"
    found = train(make_config(*DIGITS, "model=small", "tune=batch", "accelerator=cpu",
                              "devices=2", "tuner.batch_max=128"), run_dir=run_dir)
    assert found["batches"] == [8, 16, 32, 64, 128] and found["replicas"] == 2
    assert found["suggested"] in found["batches"]
    assert all(rate > 0 for rate in found["examples_per_sec"])
    assert read_plot(run_dir / "batch_find.png") == json.loads(
        (run_dir / "batch_find.json").read_text())
    assert found["line"].startswith(f"suggested: batch.per_replica={found['suggested']} "
                                    f"(global batch {2 * found['suggested']} on 2 replicas")


@pytest.mark.long
def test_the_memory_search_runs_each_try_in_a_fresh_process(tmp_path, monkeypatch):
    """An injected cap (a step above 100 examples per replica runs out of memory): from 88
    up to 104, the search finds 96 in 3 tries (88 runs, 104 does not, 96 between them does),
    each in its own process, and this process then draws the throughput curve up to it
    (still usable). The search's arithmetic over wider ranges is tested above without
    processes."""
    monkeypatch.setenv("TRAINER_TUNE_FAIL_ABOVE", "100")
    tests = os.path.dirname(__file__)  # model=small's module, for the tries' processes
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [
        tests, os.path.dirname(tests), os.environ.get("PYTHONPATH")])))
    found = train(make_config(*DIGITS, "model=small", "tune=batch", "tuner.batch_min=88",
                              "tuner.batch_max=104"), run_dir=tmp_path / "mem")
    assert found["largest_that_fits"] == 96
    assert found["memory_tries"] == [[88, True], [104, False], [96, True]]
    assert found["batches"] == [88]


@pytest.mark.parametrize("args, line", [
    (["tune=lr", "resume=/nowhere"], "error: tune=lr tunes a new run, not a finished one"),
    (["tune=lr", "strategy=multi_worker"], "error: tune=lr runs on one machine"),
    (["tune=speed"], "error: tune must be one of lr, batch; received: 'speed'"),
    (["tune=lr", "tuner.lr_min=1", "tuner.lr_max=0.1"], "error: tuner.lr_min and tuner.lr_max"),
])
def test_tuning_that_cannot_apply_is_one_line(tmp_path, args, line):
    out = run_main(*DIGITS, *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith(line), lines
    assert not (tmp_path / "run").exists()


def test_tuning_writes_nothing_into_a_runs_directory(tmp_path):
    run_dir = tmp_path / "run"
    train(make_config(*DIGITS, "model=small", "epochs=1", "checkpoint.backup_every=0"),
          run_dir=run_dir)
    (run_dir / "summary.json").unlink()  # an interrupted run: backups, no summary
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.rglob("*")
              if p.is_file()}
    out = run_main(*DIGITS, "model=small", "tune=lr", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [f"error: tune=lr writes nothing into a run's directory; "
                                       f"{run_dir} holds one: choose a new hydra.run.dir"]
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.rglob("*")
             if p.is_file()}
    assert after == before


def test_trainer_tune_in_python(tmp_path):
    import trainer

    found = trainer.tune([*DIGITS, "model=small", "tuner.steps=20"], what="lr",
                         run_dir=tmp_path / "api")
    assert (tmp_path / "api" / "lr_find.png").is_file()
    assert found["line"].startswith("suggested: optimizer.lr=") or "no suggestion" in found[
        "line"]
    assert os.path.isfile(tmp_path / "api" / ".hydra" / "config.yaml")
