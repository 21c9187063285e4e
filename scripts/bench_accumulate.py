"""Throughput with gradient accumulation against without, at the same micro-batch per replica.

Both sides train MobileNetV2 (alpha 0.35) through `trainer` on the same synthetic data over
the same logical CPU replicas, with `batch.per_replica` micro-batches: one side applies every
micro-batch (`batch.accumulate=1`), the other sums 4 per optimizer step
(`batch.accumulate=4`: a 4x larger global batch, a quarter of the all-reduces). Each side's
steady rate is the median over epochs 2..E of examples per second inside the training
steps; the sides alternate (A B A B ...) in one process, because this machine's speed drifts
by tens of percent within minutes, and the result is the median of the per-pair ratios.
Target: accumulate=4 / accumulate=1 >= 0.95.

    python scripts/bench_accumulate.py --devices 2 --pairs 3
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args() -> argparse.Namespace:
    from bench_overhead import base_parser

    parser = base_parser(__doc__.splitlines()[0], per_replica=64)  # --per-replica: the micro-batch
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--loop", default="fit", choices=["fit", "custom"])
    return parser.parse_args()


def run(args, accumulate: int) -> float:
    """Steady examples/s of one training run."""
    from bench_overhead import trainer_rate

    return trainer_rate(args, [f"loop={args.loop}", f"batch.accumulate={accumulate}"],
                        args.per_replica * args.devices * accumulate)


def main() -> None:
    args = parse_args()
    from bench_overhead import start

    start(args.devices)
    n = args.accumulate
    print(f"model={args.model} loop={args.loop} devices={args.devices} micro-batch "
          f"{args.per_replica} per replica; global batch {args.per_replica * args.devices} "
          f"(accumulate=1) vs {args.per_replica * args.devices * n} (accumulate={n}); "
          f"examples={args.examples} epochs={args.epochs}")
    ratios = []
    for pair in range(args.pairs):
        single = run(args, 1)
        summed = run(args, n)
        ratios.append(summed / single)
        print(f"pair {pair + 1}: accumulate=1 {single:8.1f} ex/s  accumulate={n} "
              f"{summed:8.1f} ex/s  (ratio {summed / single:.3f})", flush=True)
    print(f"median ratio accumulate={n} / accumulate=1 over {args.pairs} pairs: "
          f"{statistics.median(ratios):.3f}  (each: {', '.join(f'{r:.3f}' for r in ratios)}; "
          "target >= 0.95)")


if __name__ == "__main__":
    main()
