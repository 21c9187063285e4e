"""The run summary: printed at the end, and written atomically to `summary.json`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes JSON to a temporary name and renames it, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def refuse_finished_run(run_dir: Path, resume: bool) -> None:
    """Refuses to start a new run over a finished one (its summary.json would be lost)."""
    from trainer.config import ConfigError

    if not resume and (Path(run_dir) / "summary.json").exists():
        raise ConfigError(f"run directory {run_dir} holds a finished run (summary.json); "
                          f"choose a new hydra.run.dir, or pass resume={run_dir} to continue it")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def format_summary(summary: dict[str, Any]) -> str:
    """Renders the summary as aligned `name: value` lines."""
    rows = [
        ("run directory", summary["run_dir"]),
        ("model / dataset", f"{summary['model']} / {summary['dataset']}"),
        ("devices", summary["devices"]),
        ("replicas", summary["replicas"] if summary.get("workers", 1) == 1 else
         f"{summary['replicas']} on {summary['workers']} workers"),
        ("strategy", f"{summary['strategy']} (cross-device ops: {summary['cross_device_ops']})"),
        ("batch per replica", summary["batch"]["per_replica"]),
        ("batch global", summary["batch"]["global"]),
        ("learning rate", "{base:.6g} -> {scaled:.6g} ({rule}, reference batch "
                          "{reference_batch}, warm-up {warmup_steps} steps, decay {decay})"
         .format(**summary["learning_rate"])),
        ("epochs", f"{summary['epochs']} x {summary['steps_per_epoch']} steps"),
        ("wall time", f"{summary['time']['wall_s']:.1f} s"),
        ("time to first step", f"{summary['time']['first_step_s']:.1f} s"),
        ("throughput", f"{summary['examples_per_sec']:.1f} examples/s"
         if summary["examples_per_sec"] else "n/a (too few steps)"),
    ]
    rows += [(f"train {k}", v) for k, v in summary["train_metrics"].items()]
    rows += [(f"validation {k}", v) for k, v in summary["validation_metrics"].items()]
    width = max(len(name) for name, _ in rows)
    lines = [f"  {name:<{width}}  {_fmt(value)}" for name, value in rows]
    return "\n".join(["Summary", *lines])
