"""Throughput with training-data augmentation against without.

Both sides train MobileNetV2 (alpha 0.35) through `trainer` on the same synthetic data over
the same logical CPU replicas: one side with `augment=[]`, the other with `augment=[flip,crop]`
(each image flipped and padded-and-cropped in tf.data, after the cache, with stateless seeds).
Each side's steady rate is the median over epochs 2..E of examples per second inside the
training steps; the sides alternate (A B A B ...) in one process, because this machine's
speed drifts by tens of percent within minutes, and the result is the median of the
per-pair ratios. Target: augmented / plain >= 0.9.

    python scripts/bench_augment.py --devices 2 --pairs 3
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args() -> argparse.Namespace:
    from bench_overhead import base_parser

    parser = base_parser(__doc__.splitlines()[0], per_replica=64)
    parser.add_argument("--augment", default="[flip,crop]")
    return parser.parse_args()


def run(args, augment: str) -> float:
    """Steady examples/s of one training run."""
    from bench_overhead import trainer_rate

    return trainer_rate(args, [f"augment={augment}"], args.per_replica * args.devices)


def main() -> None:
    args = parse_args()
    from bench_overhead import start

    start(args.devices)
    print(f"model={args.model} devices={args.devices} batch {args.per_replica} per replica; "
          f"augment=[] vs augment={args.augment} (in tf.data on the CPU, after the cache); "
          f"examples={args.examples} epochs={args.epochs}")
    ratios = []
    for pair in range(args.pairs):
        plain = run(args, "[]")
        augmented = run(args, args.augment)
        ratios.append(augmented / plain)
        print(f"pair {pair + 1}: plain {plain:8.1f} ex/s  augmented {augmented:8.1f} ex/s  "
              f"(ratio {augmented / plain:.3f})", flush=True)
    print(f"median ratio augmented / plain over {args.pairs} pairs: "
          f"{statistics.median(ratios):.3f}  (each: {', '.join(f'{r:.3f}' for r in ratios)}; "
          "target >= 0.9)")


if __name__ == "__main__":
    main()
