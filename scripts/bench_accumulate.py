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
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="logical CPU replicas")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="epoch 1 (tracing) is not timed")
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--per-replica", type=int, default=64, help="the micro-batch")
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--loop", default="fit", choices=["fit", "custom"])
    parser.add_argument("--image-size", type=int, default=32)
    return parser.parse_args()


def run(args, accumulate: int) -> float:
    """Steady examples/s of one training run."""
    from bench_overhead import make_probe, steady_rate
    from hydra import compose, initialize_config_dir

    from trainer.config import config_dir
    from trainer.train import train

    overrides = ["model=mobilenet", "dataset=synthetic", f"dataset.train_examples={args.examples}",
                 f"dataset.image_size={args.image_size}", "accelerator=cpu",
                 f"devices={args.devices}", f"epochs={args.epochs}", "verbose=0",
                 f"loop={args.loop}", f"batch.per_replica={args.per_replica}",
                 f"batch.accumulate={accumulate}", "batch.drop_remainder=true",
                 "logger=[]"]
    probe = make_probe()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        train(cfg, run_dir=run_dir, callbacks=[probe])
    return steady_rate(probe, args.per_replica * args.devices * accumulate)


def main() -> None:
    args = parse_args()
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if args.devices > 1:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    from trainer.config import register_configs

    register_configs()
    n = args.accumulate
    print(f"MobileNetV2 loop={args.loop} devices={args.devices} micro-batch "
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
