"""Scaling report of a sweep: a markdown table and a speed-up plot from the jobs' summaries.

    python -m trainer -m accelerator=cpu devices=1,2,4   # writes the report at the end
    python -m trainer.track.report multirun/2026-11-21/10-00-00  # or again, by hand

Only a sweep whose jobs differ in their devices (`devices`, `accelerator`, the cluster, the
strategy, how the batch is split) gets one: speed-up over the fewest replicas means nothing
between jobs on the same devices (a sweep over `optimizer.lr`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from trainer.config.overrides import pairs
from trainer.rundir.atomic import write_text, written

COLUMNS = ("devices", "replicas", "micro-batch", "accumulate", "global batch", "scaled lr",
           "time (s)", "first step (s)", "examples/s", "speed-up", "efficiency", "val accuracy",
           "test accuracy")


# Override keys (and the nodes under them) that change the devices a job trains on.
DEVICE_KEYS = ("accelerator", "devices", "cluster", "strategy", "batch.max_per_replica",
               "batch.accumulate", "gpu")


def job_overrides(sweep_dir: Path) -> list[dict[str, str]]:
    """Each job's overrides (`key: value`), from the `.hydra/overrides.yaml` Hydra writes
    into its directory, else its `trial.json`; failed jobs included."""
    sweep_dir = Path(sweep_dir)
    found = []
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir()) if sweep_dir.is_dir() else []:
        saved, trial = job / ".hydra" / "overrides.yaml", job / "trial.json"
        try:
            if saved.is_file():
                items = yaml.safe_load(saved.read_text()) or []
            elif trial.is_file():
                items = json.loads(trial.read_text()).get("overrides", [])
            else:
                continue
        except (OSError, ValueError, yaml.YAMLError):
            continue
        found.append(pairs(items))
    return found


def _varying(jobs: list[dict[str, str]]) -> list[str]:
    keys = sorted({k for job in jobs for k in job})
    return [k for k in keys if len({job.get(k) for job in jobs}) > 1]


def _is_device_key(key: str) -> bool:
    return any(key == d or key.startswith((f"{d}.", f"{d}/")) for d in DEVICE_KEYS)


def not_a_scaling_sweep(sweep_dir: Path) -> str | None:
    """Why the sweep gets no scaling report (one line): none of the keys its jobs vary
    changes the devices. None where one does."""
    varying = _varying(job_overrides(sweep_dir))
    if any(_is_device_key(k) for k in varying):
        return None
    return (f"its jobs vary {', '.join(varying) or 'nothing'}, not the devices "
            f"({', '.join(DEVICE_KEYS)}); speed-up compares devices")


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """Reads every job's `summary.json` under a sweep directory, fewest replicas first."""
    summaries = [json.loads(p.read_text()) for p in sorted(Path(sweep_dir).glob("*/summary.json"))]
    return sorted(summaries, key=lambda s: (s["replicas"], s["run_dir"]))


def scaling_rows(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per job; speed-up and efficiency relative to the job with the fewest replicas.

    Speed-up is the ratio of steady training throughputs; efficiency is speed-up divided by
    the ratio of replica counts (1.0 is perfect scaling).
    """
    base = summaries[0]
    rows = []
    for s in summaries:
        rate, base_rate = s["examples_per_sec"], base["examples_per_sec"]
        speedup = rate / base_rate if rate and base_rate else None
        rows.append({
            "devices": ",".join(s["devices"]), "replicas": s["replicas"],
            "micro-batch": s["batch"].get("per_replica"),
            "accumulate": s["batch"].get("accumulate", 1),
            "global batch": s["batch"]["global"], "scaled lr": s["learning_rate"]["scaled"],
            "time (s)": s["time"]["wall_s"], "first step (s)": s["time"]["first_step_s"],
            "examples/s": rate, "speed-up": speedup,
            "efficiency": speedup / (s["replicas"] / base["replicas"]) if speedup else None,
            "val accuracy": s["validation_metrics"].get("accuracy"),
            "test accuracy": (s.get("test_metrics") or {}).get("accuracy"),
        })
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Renders the rows as a GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Plots speed-up against replicas, with the ideal (linear) line, to a PNG file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    replicas = [r["replicas"] for r in rows]
    base = replicas[0]
    fig, ax = plt.subplots(figsize=(5, 4), dpi=100)
    ax.plot(replicas, [n / base for n in replicas], "--", color="grey", label="ideal")
    ax.plot(replicas, [r["speed-up"] or 0.0 for r in rows], "o-", label="measured")
    ax.set_xlabel("replicas")
    ax.set_ylabel(f"speed-up over {base} replica(s)")
    ax.set_xticks(replicas)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with written(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_report(sweep_dir: str | Path) -> tuple[Path, Path] | None:
    """Writes `scaling.md` and `scaling.png` into the sweep directory.

    Returns:
        The two paths, or None when no job wrote a summary or the jobs do not differ in
        their devices (`not_a_scaling_sweep`).
    """
    sweep_dir = Path(sweep_dir)
    summaries = collect(sweep_dir)
    if not summaries or not_a_scaling_sweep(sweep_dir) is not None:
        return None
    rows = scaling_rows(summaries)
    first = summaries[0]
    title = f"# Scaling: {first['model']} on {first['dataset']}\n\n"
    table_path, plot_path = sweep_dir / "scaling.md", sweep_dir / "scaling.png"
    write_text(table_path, title + markdown_table(rows) + "\n\n![speed-up](scaling.png)\n")
    plot(rows, plot_path)
    return table_path, plot_path


class ScalingReport(Callback):
    """Hydra callback: writes the scaling report when a sweep ends."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        # Only where the jobs differ in their devices; any sweep's report is trials.md.
        written = write_report(config.hydra.sweep.dir)
        if written:
            print(f"scaling report: {written[0]}\n{written[0].read_text()}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.track.report SWEEP_DIR`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("error: usage: python -m trainer.track.report SWEEP_DIR (a multirun directory); "
              f"received: {' '.join(args) or 'nothing'}", file=sys.stderr)
        return 2
    if not collect(Path(args[0])):
        print(f"error: no */summary.json under {args[0]}; run a sweep first", file=sys.stderr)
        return 2
    why = not_a_scaling_sweep(Path(args[0]))
    if why is not None:
        print(f"error: no scaling report for {args[0]}: {why}", file=sys.stderr)
        return 2
    written = write_report(args[0])
    print(written[0].read_text())
    print(f"wrote {written[0]} and {written[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
