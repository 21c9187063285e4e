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
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="logical CPU replicas")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="epoch 1 (tracing) is not timed")
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--per-replica", type=int, default=64)
    parser.add_argument("--augment", default="[flip,crop]")
    parser.add_argument("--image-size", type=int, default=32)
    return parser.parse_args()


def run(args, augment: str) -> float:
    """Steady examples/s of one training run."""
    from bench_overhead import make_probe, steady_rate
    from hydra import compose, initialize_config_dir

    from trainer.config import config_dir
    from trainer.train import train

    overrides = ["model=mobilenet", "dataset=synthetic", f"dataset.train_examples={args.examples}",
                 f"dataset.image_size={args.image_size}", "accelerator=cpu",
                 f"devices={args.devices}", f"epochs={args.epochs}", "verbose=0",
                 f"batch.per_replica={args.per_replica}", "batch.drop_remainder=true",
                 "logger=[]", f"augment={augment}"]
    probe = make_probe()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        train(cfg, run_dir=run_dir, callbacks=[probe])
    return steady_rate(probe, args.per_replica * args.devices)


def main() -> None:
    args = parse_args()
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if args.devices > 1:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    from trainer.config import register_configs

    register_configs()
    print(f"MobileNetV2 devices={args.devices} batch {args.per_replica} per replica; "
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
