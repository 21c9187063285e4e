"""Whole-process cost of a run: `python -m trainer` against the plain Keras script a user
would write for the same model, data, batch and optimizer (`plain_keras_digits.py`).

Both run as fresh processes, alternating (which one goes first alternates too, since this
machine's speed drifts within minutes); the result is the median of the per-pair ratios of
wall time and of CPU time (user + system, from the children's rusage). Trainer's own run is
broken down by phase from its `summary.json` (`time`): start-up before `train()` (interpreter,
imports, config, pre-flight, TensorFlow's import), building (devices, data, model), first step,
the training after it, saving (checkpoints and backups), the final evaluation, and the end of
the process. Trainer's start-up is printed beside the plain script's own (its interpreter and
`import keras, tensorflow`, from its `startup.json`), pair by pair. Time from process start
to the first training step is measured on 1 and 4 logical replicas as well. Targets (issue 24):
CPU <= 1.15x, wall <= 1.25x.

    python scripts/bench_run.py --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(command: list[str], cwd: Path) -> tuple[float, float]:
    """Runs a command to its end; (wall seconds, CPU seconds of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def trainer_command(run_dir: Path, args, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trainer", f"epochs={args.epochs}",
            f"dataset.image_size={args.image_size}", "logger=[]", "verbose=0",
            f"hydra.run.dir={run_dir}", *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=8)
    parser.add_argument("--no-startup", action="store_true",
                        help="skip the 1- and 4-replica start-up runs")
    args = parser.parse_args()
    load = os.getloadavg()
    rows, phases, firsts, imports = [], [], {1: [], 4: []}, []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for pair in range(args.pairs):
            run_dir = work / f"trainer-{pair}"
            sides = {
                "trainer": trainer_command(run_dir, args),
                "plain": [sys.executable, str(REPO / "scripts" / "plain_keras_digits.py"),
                          "--epochs", str(args.epochs), "--image-size", str(args.image_size),
                          "--out", str(work / f"plain-{pair}")],
            }
            order = ["trainer", "plain"] if pair % 2 == 0 else ["plain", "trainer"]
            measured = {side: run(sides[side], REPO) for side in order}
            (tw, tc), (pw, pc) = measured["trainer"], measured["plain"]
            rows.append((tw / pw, tc / pc))
            summary = json.loads((run_dir / "summary.json").read_text())
            t = summary["time"]
            plain_imports = json.loads((work / f"plain-{pair}" / "startup.json").read_text())
            imports.append((t["startup_s"], plain_imports["imported_s"]))
            phases.append({
                "start-up (to train())": t["startup_s"],
                "build (devices, data, model)": t["build_s"],
                "first step": t["first_step_s"] - t["build_s"],
                "training after it (incl. saving)": t["wall_s"] - t["first_step_s"]
                - t["final_evaluation_s"],
                "  of which saving": t["saving_s"],
                "final evaluation": t["final_evaluation_s"],
                "end of process": tw - t["startup_s"] - t["wall_s"],
            })
            print(f"pair {pair + 1}: trainer {tw:5.1f} s wall {tc:5.1f} s CPU | plain {pw:5.1f} s "
                  f"wall {pc:5.1f} s CPU | ratios wall {tw / pw:.2f} CPU {tc / pc:.2f} | "
                  f"test accuracy {summary['test_metrics']['accuracy']:.3f}", flush=True)
            if not args.no_startup:
                for replicas in (1, 4):
                    first = work / f"first-{replicas}-{pair}"
                    run(trainer_command(first, args, "epochs=1", "accelerator=cpu",
                                        f"devices={replicas}"), REPO)
                    t = json.loads((first / "summary.json").read_text())["time"]
                    firsts[replicas].append(t["startup_s"] + t["first_step_s"])
    wall = statistics.median(r[0] for r in rows)
    cpu = statistics.median(r[1] for r in rows)
    print(f"\nmedian trainer / plain over {args.pairs} pairs: wall {wall:.2f}, CPU {cpu:.2f} "
          f"(targets: wall <= 1.25, CPU <= 1.15); load average before {load[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f}")
    print(f"\nstart-up, median seconds: trainer's to train() (interpreter, imports, one "
          f"composition, pre-flight, TensorFlow's import) "
          f"{statistics.median(a for a, _ in imports):.2f}; the plain script's interpreter "
          f"and `import keras, tensorflow` {statistics.median(b for _, b in imports):.2f}; "
          f"per pair: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in imports))
    print("\ntrainer's run by phase (median seconds):")
    for name in phases[0]:
        print(f"  {name:<34} {statistics.median(p[name] for p in phases):6.2f}")
    if not args.no_startup:
        for replicas, values in firsts.items():
            print(f"process start to first training step, {replicas} logical replica(s): "
                  f"{statistics.median(values):.2f} s")


if __name__ == "__main__":
    main()
