"""The scaling report: its arithmetic. A real sweep's report, over 1 and 2 logical replicas,
is checked on the launcher tests' sweeps (tests/test_sweep.py: `assert_scaling_report`)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from trainer.track.report import ScalingReport, main, scaling_rows


def fake_summary(replicas, rate, accuracy=0.9):
    return {"devices": [f"/cpu:{i}" for i in range(replicas)], "replicas": replicas,
            "batch": {"global": 64 * replicas}, "learning_rate": {"scaled": 0.001 * replicas},
            "time": {"wall_s": 10.0, "first_step_s": 2.0}, "examples_per_sec": rate,
            "validation_metrics": {"accuracy": accuracy}, "run_dir": str(replicas)}


def test_speedup_and_efficiency():
    rows = scaling_rows([fake_summary(1, 100.0), fake_summary(2, 180.0), fake_summary(4, 300.0)])
    assert [r["speed-up"] for r in rows] == pytest.approx([1.0, 1.8, 3.0])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.9, 0.75])
    assert rows[2]["global batch"] == 256 and rows[2]["devices"] == "/cpu:0,/cpu:1,/cpu:2,/cpu:3"
    accumulated = fake_summary(1, 90.0)
    accumulated["batch"] = {"per_replica": 16, "accumulate": 4, "global": 64}
    row = scaling_rows([accumulated])[0]
    assert (row["micro-batch"], row["accumulate"], row["global batch"]) == (16, 4, 64)
    assert row["test accuracy"] is None  # a run without a test split
    tested = fake_summary(1, 90.0)
    tested["test_metrics"] = {"accuracy": 0.87}
    assert scaling_rows([tested])[0]["test accuracy"] == 0.87


def test_report_command_errors(tmp_path):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert main([str(tmp_path)]) == 2


def fake_sweep(root, jobs, replicas=(1, 1)):
    """A sweep directory as Hydra and the jobs leave it: each job's `.hydra/overrides.yaml`
    and `summary.json`."""
    for n, (overrides, count) in enumerate(zip(jobs, replicas, strict=True)):
        job = root / str(n)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(
            "".join(f"- {o}\n" for o in overrides))
        summary = {**fake_summary(count, 100.0 * count), "model": "cnn", "dataset": "digits"}
        (job / "summary.json").write_text(json.dumps(summary))
    return root


def _end_of(sweep):
    ScalingReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    return sorted(p.name for p in sweep.glob("scaling.*"))


def test_only_a_sweep_over_the_devices_gets_a_scaling_report(tmp_path, capsys):
    shared = ["epochs=1", "accelerator=cpu"]
    lr = fake_sweep(tmp_path / "lr", [[*shared, "optimizer.lr=0.01"],
                                      [*shared, "optimizer.lr=0.1"]])
    assert _end_of(lr) == []  # speed-up between jobs on the same devices means nothing
    assert main([str(lr)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: no scaling report for {lr}: its jobs vary optimizer.lr, not the devices "
        "(accelerator, devices, cluster, strategy, batch.max_per_replica, batch.accumulate, "
        "gpu); speed-up compares devices")
    assert _end_of(fake_sweep(tmp_path / "devices", [[*shared, "devices=1"],
                                                     [*shared, "devices=2"]], (1, 2))) == [
        "scaling.md", "scaling.png"]
    for varied in ("accelerator=gpu", "batch.max_per_replica=16", "strategy=mirrored",
                   "cluster.workers=[a:1,b:1]"):
        key = varied.split("=")[0]
        sweep = fake_sweep(tmp_path / key, [["optimizer.lr=0.1"], ["optimizer.lr=0.1", varied]])
        assert _end_of(sweep) == ["scaling.md", "scaling.png"], varied
