"""The README's first command: the default run trains cnn on digits to >= 0.95 accuracy."""

from __future__ import annotations

import json
import time

from tests.conftest import run_cli


def test_default_run_reaches_95_percent(tmp_path):
    started = time.perf_counter()
    out = run_cli(f"hydra.run.dir={tmp_path}", cwd=tmp_path, timeout=600)
    elapsed = time.perf_counter() - started
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["model"] == "cnn" and summary["dataset"] == "digits"
    assert summary["validation_metrics"]["accuracy"] >= 0.95
    assert summary["validation_examples"] == 180 and summary["test_examples"] == 180
    print(f"default run: {elapsed:.1f} s, validation accuracy "
          f"{summary['validation_metrics']['accuracy']:.4f}")
