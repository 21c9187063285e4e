"""Throughput and time to first step on 1, 2 and 4 logical CPU replicas, trainer vs plain.

The global batch is the same for every replica count (strong scaling). Logical devices are
fixed once per process, so each replica count runs in its own process; inside it, plain
Keras (MirroredStrategy + fit, as the tutorial writes it) and `trainer` alternate for
`--pairs` pairs. Printed: per replica count the medians, trainer / plain ratios, and each
count against one replica (throughput ratio, first-step ratio), the numbers issue targets
are stated in (2 replicas >= 0.9 of one; first step with 4 <= 1.5x that with 1).

    python scripts/bench_replicas.py --pairs 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent


def worker(args) -> None:
    """One replica count: alternate plain and trainer, print medians as JSON."""
    import tensorflow as tf

    sys.path.insert(0, str(HERE))
    import bench_overhead as bench

    if args.worker > 1:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0],
            [tf.config.LogicalDeviceConfiguration()] * args.worker)
    from trainer.config.schema import register_configs

    register_configs()
    run_args = argparse.Namespace(
        devices=args.worker, per_replica=args.global_batch // args.worker,
        examples=args.examples, epochs=args.epochs, model=args.model,
        image_size=args.image_size)
    plain, ours = [], []
    for _ in range(args.pairs):
        plain.append(bench.run_plain_timed(run_args))
        ours.append(bench.run_trainer_timed(run_args, "fit"))
    median = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    print("RESULT " + json.dumps({
        "replicas": args.worker, "plain_rate": median(plain, 0), "plain_first": median(plain, 1),
        "trainer_rate": median(ours, 0), "trainer_first": median(ours, 1),
        "ratio_rate": statistics.median(o[0] / p[0] for o, p in zip(ours, plain, strict=True)),
    }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--model", default="mobilenet")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    results = {}
    for n in map(int, args.replicas.split(",")):
        command = [sys.executable, __file__, "--worker", str(n), "--pairs", str(args.pairs),
                   "--global-batch", str(args.global_batch), "--examples", str(args.examples),
                   "--epochs", str(args.epochs), "--model", args.model,
                   "--image-size", str(args.image_size)]
        out = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"replicas={n} failed: {out.stderr[-2000:]}")
        results[n] = json.loads(line[len("RESULT "):])
        r = results[n]
        print(f"{n} replica(s): plain {r['plain_rate']:7.1f} ex/s, first step "
              f"{r['plain_first']:5.1f} s | trainer {r['trainer_rate']:7.1f} ex/s, first step "
              f"{r['trainer_first']:5.1f} s | trainer/plain {r['ratio_rate']:.3f}", flush=True)
    base = results[min(results)]
    for n, r in sorted(results.items()):
        print(f"{n} vs {min(results)} replica(s): throughput plain "
              f"{r['plain_rate'] / base['plain_rate']:.2f}"
              f" trainer {r['trainer_rate'] / base['trainer_rate']:.2f}; first step plain "
              f"{r['plain_first'] / base['plain_first']:.2f} trainer "
              f"{r['trainer_first'] / base['trainer_first']:.2f}")


if __name__ == "__main__":
    main()
