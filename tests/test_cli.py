"""The command line, in subprocesses: training, sweeps over devices, and one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY, error_lines, run_cli


def test_mobilenet_on_two_replicas(tmp_path):
    out = run_cli("model=mobilenet", "accelerator=cpu", "devices=2", "epochs=1", "verbose=0",
                  f"hydra.run.dir={tmp_path}", cwd=tmp_path, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["replicas"] == 2 and summary["strategy"] == "mirrored"
    assert summary["model"] == "mobilenet"
    assert summary["batch"]["global"] == 2 * summary["batch"]["per_replica"] == 128
    lr = summary["learning_rate"]
    assert lr["rule"] == "linear"
    assert lr["scaled"] == pytest.approx(lr["base"] * 128 / lr["reference_batch"])
    assert "Summary" in out.stdout and "batch global" in out.stdout
    assert (tmp_path / ".hydra" / "config.yaml").is_file()


def test_sweep_over_devices_gives_each_job_its_devices(tmp_path):
    """Devices are fixed once per process, so each job must run in a fresh one."""
    sweep = tmp_path / "sweep"
    out = run_cli("-m", "accelerator=cpu", "devices=1,2,4", *TINY, f"hydra.sweep.dir={sweep}",
                  cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 3
    for path, replicas in zip(summaries, (1, 2, 4), strict=True):
        summary = json.loads(path.read_text())
        assert summary["replicas"] == replicas
        assert summary["devices"] == [f"/cpu:{i}" for i in range(replicas)]
        assert summary["batch"]["global"] == 64 * replicas
        assert Path(summary["run_dir"]) == path.parent
        assert (path.parent / ".hydra" / "overrides.yaml").is_file()


@pytest.mark.parametrize("args, message", [
    (["model=foo"], "error: unknown model 'foo'; available: cifar10_cnn, cnn, mobilenet"),
    (["dataset=imagenet"], "error: unknown dataset 'imagenet'; available: cats_vs_dogs, "
     "cifar10, digits, image_folder, mnist, synthetic, tfds"),
    (["epochs=x"], "Value 'x' of type 'str' could not be converted to Integer"),
    (["epochs=0"], "error: epochs must be a positive integer; received: 0"),
    (["model.widht=3"], "Key 'widht' not in 'CnnConfig'"),
    (["batch.global_size=256"], "error: set exactly one of batch.per_replica and batch.global"),
    (["accelerator=gpu", "devices=[0,3]"], "error: accelerator=gpu but TensorFlow sees no GPU"),
    (["accelerator=cpu", "devices=3", "batch.per_replica=null", "batch.global_size=100"],
     "error: batch.global_size=100 does not divide evenly over 3 replicas"),
])
def test_config_errors_are_one_line_and_exit_2(tmp_path, args, message):
    run_dir = tmp_path / "run"
    out = run_cli(*args, f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=120)
    lines = error_lines(out.stderr)
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and message in lines[0]
    assert not list(run_dir.rglob("*.keras")) and not (run_dir / "summary.json").exists()


def test_full_error_shows_the_traceback(tmp_path):
    out = run_cli("epochs=0", f"hydra.run.dir={tmp_path}", cwd=tmp_path,
                  env={"HYDRA_FULL_ERROR": "1"}, timeout=120)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_console_script_composes_the_config(tmp_path):
    script = Path(sys.executable).parent / "trainer"
    if not script.exists():
        pytest.fail(f"console script not installed next to {sys.executable}")
    import subprocess

    out = subprocess.run([str(script), "model=mobilenet", "--cfg", "job"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "_target_: trainer.models.mobilenet.build" in out.stdout


def test_unknown_experiment_is_one_line_and_trains_nothing(tmp_path):
    out = run_cli("experiment=nope", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                  timeout=60)
    assert out.returncode == 2
    assert error_lines(out.stderr) == [
        "error: unknown experiment 'nope'; available: cats_vs_dogs_mobilenet, "
        "cifar10_multi_gpu, mnist_towers"]
    assert not (tmp_path / "run").exists()
