"""Steady training throughput of `trainer` vs. a plain hand-written Keras script.

Both sides train the same model on the same synthetic data with MirroredStrategy over the
same logical CPU devices. Each side runs in a fresh process of its own (a TensorFlow runtime
keeps the graphs, functions and memory of every run before: in one process a later side
would pay for the earlier ones), and the order alternates from pair to pair (plain first,
then trainer first: this machine's speed drifts by tens of percent within minutes). Each
side's steady rate is the median over epochs 2..E of examples per second inside `fit`'s
training steps; the result is the median of the per-pair ratios trainer / plain, printed
with every pair's ratio, each run's spread (its epochs' slowest and fastest rate against
its median) and the load average before and after. Target: trainer[fit] and
trainer[custom] >= 0.99 of plain.

    python scripts/bench_overhead.py --devices 2 --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], per_replica=128)
    parser.add_argument("--loops", default="fit,custom",
                        help="trainer loops to compare with plain Keras, comma-separated")
    # one side, in this process (the parent starts a process per side and run)
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def base_parser(description: str, per_replica: int) -> argparse.ArgumentParser:
    """The arguments every trainer-vs-trainer benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--devices", type=int, default=2, help="logical CPU replicas")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epoch 1 (tracing) is not timed")
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--per-replica", type=int, default=per_replica)
    parser.add_argument("--image-size", type=int, default=32)
    # cnn: the default network, for a quick look (and CI's smoke run of every script)
    parser.add_argument("--model", default="mobilenet", choices=["mobilenet", "cnn"])
    return parser


def start(devices: int) -> None:
    """Splits the CPU into `devices` logical ones (before TensorFlow's runtime starts) and
    registers trainer's config schema."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if devices > 1:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
    from trainer.config.schema import register_configs

    register_configs()


def trainer_rate(args, overrides: list[str], global_batch: int) -> float:
    """Steady examples/s of one `trainer` run of `--model` on synthetic data."""
    from hydra import compose, initialize_config_dir

    from trainer.config.schema import config_dir
    from trainer.run.train import train

    common = [f"model={args.model}", "dataset=synthetic", f"dataset.train_examples={args.examples}",
              f"dataset.image_size={args.image_size}", "accelerator=cpu",
              f"devices={args.devices}", f"epochs={args.epochs}", "verbose=0",
              f"batch.per_replica={args.per_replica}", "batch.drop_remainder=true",
              "logger=[]"]
    probe = make_probe()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[*common, *overrides])
    with tempfile.TemporaryDirectory() as run_dir:
        train(cfg, run_dir=run_dir, callbacks=[probe])
    return steady_rate(probe, global_batch)


def make_probe():
    import keras

    class Probe(keras.callbacks.Callback):
        """Examples per second inside each epoch's training steps."""

        def __init__(self):
            super().__init__()
            self.rates, self.batch = [], 0
            self.created, self.first_step = time.perf_counter(), None

        def on_epoch_begin(self, epoch, logs=None):
            self.start = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.start is None:
                self.start, self.first = time.perf_counter(), batch

        def on_train_batch_end(self, batch, logs=None):
            self.end, self.last = time.perf_counter(), batch
            if self.first_step is None:
                self.first_step = self.end - self.created  # build + trace + first step

        def on_epoch_end(self, epoch, logs=None):
            self.rates.append((self.last - self.first + 1) / (self.end - self.start))

    return Probe()


def steady_rate(probe, global_batch: int) -> float:
    """Median steps/s over epochs 2..E, in examples/s (every timed step is a full batch)."""
    return statistics.median(probe.rates[1:]) * global_batch


def run_trainer(args, loop: str) -> float:
    return run_trainer_timed(args, loop)[0]


def run_trainer_timed(args, loop: str, probe=None) -> tuple[float, float]:
    """Steady examples/s and seconds from start to the end of the first step (`probe`: the
    callback timing it, which keeps each epoch's rate)."""
    from hydra import compose, initialize_config_dir

    from trainer.config.schema import config_dir
    from trainer.run.train import train

    overrides = [f"model={args.model}", "dataset=synthetic",
                 f"dataset.train_examples={args.examples}",
                 f"dataset.image_size={args.image_size}", "accelerator=cpu",
                 f"devices={args.devices}", f"epochs={args.epochs}", "verbose=0",
                 f"batch.per_replica={args.per_replica}", "batch.drop_remainder=true"]
    if loop != "fit":
        overrides.append(f"loop={loop}")
    probe = probe or make_probe()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        train(cfg, run_dir=run_dir, callbacks=[probe])
    return steady_rate(probe, args.per_replica * args.devices), probe.first_step


def run_plain(args) -> float:
    return run_plain_timed(args)[0]


def run_plain_timed(args, probe=None) -> tuple[float, float]:
    """What a user writes from the MirroredStrategy tutorial, with the same model and data
    (`probe` as `run_trainer_timed`'s)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer.models import cnn, mobilenet

    probe = probe or make_probe()
    global_batch = args.per_replica * args.devices
    rng = np.random.default_rng(42)
    shape = (args.image_size, args.image_size, 3)
    x = rng.integers(0, 256, size=(args.examples, *shape), dtype=np.uint8)
    y = rng.integers(0, 10, size=args.examples, dtype=np.int32)
    xv = rng.integers(0, 256, size=(512, *shape), dtype=np.uint8)
    yv = rng.integers(0, 10, size=512, dtype=np.int32)

    def scale(image, label):
        return tf.cast(image, tf.float32) / 255.0, label

    train_ds = (tf.data.Dataset.from_tensor_slices((x, y)).map(scale).cache()
                .shuffle(2048).batch(global_batch, drop_remainder=True))
    val_ds = tf.data.Dataset.from_tensor_slices((xv, yv)).map(scale).batch(global_batch)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.devices)])
    with strategy.scope():
        build = mobilenet.build if args.model == "mobilenet" else cnn.build
        model = build(shape, 10)
        model.compile(optimizer=keras.optimizers.Adam(0.001),
                      loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    model.fit(train_ds, validation_data=val_ds, epochs=args.epochs, callbacks=[probe], verbose=0)
    return steady_rate(probe, global_batch), probe.first_step


def one_side(args) -> None:
    """This process's side (`--side`): its steady rate and each epoch's, as a JSON line."""
    start(args.devices)
    probe = make_probe()
    if args.side == "plain":
        rate, _ = run_plain_timed(args, probe)
    else:
        rate, _ = run_trainer_timed(args, args.side, probe)
    global_batch = args.per_replica * args.devices
    print("RESULT " + json.dumps({"rate": rate,
                                  "epochs": [r * global_batch for r in probe.rates[1:]]}),
          flush=True)


def in_fresh_process(side: str) -> dict:
    """Runs one side in a process of its own; its result line."""
    command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--side", side]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        sys.exit(f"side {side} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(found[-1][len("RESULT "):])


def spread(epochs: list[float]) -> str:
    """A run's epochs' slowest and fastest rate against its median."""
    middle = statistics.median(epochs)
    return f"{min(epochs) / middle:.2f}-{max(epochs) / middle:.2f}"


def main() -> None:
    args = parse_args()
    if args.side is not None:
        one_side(args)
        return
    loops = args.loops.split(",")
    print(f"model={args.model} devices={args.devices} global batch="
          f"{args.per_replica * args.devices} examples={args.examples} epochs={args.epochs}; "
          "each side in a fresh process, the order alternating")
    load_before = os.getloadavg()
    ratios: dict[str, list[float]] = {loop: [] for loop in loops}
    for pair in range(args.pairs):
        order = ["plain", *loops] if pair % 2 == 0 else [*loops, "plain"]
        results = {side: in_fresh_process(side) for side in order}
        plain = results["plain"]["rate"]
        line = [f"pair {pair + 1} ({' then '.join(order)}): plain {plain:8.1f} ex/s "
                f"(epochs {spread(results['plain']['epochs'])})"]
        for loop in loops:
            ours = results[loop]["rate"]
            ratios[loop].append(ours / plain)
            line.append(f"trainer[{loop}] {ours:8.1f} ex/s (epochs "
                        f"{spread(results[loop]['epochs'])}, ratio {ours / plain:.3f})")
        print("  ".join(line), flush=True)
    for loop, values in ratios.items():
        print(f"median ratio trainer[{loop}] / plain over {args.pairs} pairs: "
              f"{statistics.median(values):.3f}  (each: {', '.join(f'{r:.3f}' for r in values)})")
    if "fit" in ratios and "custom" in ratios:  # the two drivers of one step, side by side
        versus = [c / f for c, f in zip(ratios["custom"], ratios["fit"], strict=True)]
        print(f"median ratio trainer[custom] / trainer[fit]: {statistics.median(versus):.3f}  "
              f"(each: {', '.join(f'{r:.3f}' for r in versus)})")
    after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; "
          f"after: {', '.join(f'{v:.2f}' for v in after)}")


if __name__ == "__main__":
    main()
