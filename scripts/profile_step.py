"""Where trainer's steady step differs from plain Keras's: the step function alone, A/B in
one process, alternating blocks.

`bench_overhead.py` compares whole runs, each side in a fresh process: the honest number,
but its pairs spread by several percent on this machine, more than the difference sought.
This script takes the step function apart, measured side by side in one process, so the
machine's drift hits both sides alike: the same network (weights alike), the same batches
(one plain `tf.data` pipeline, distributed by the same MirroredStrategy), Keras's compiled
`train_function` of a model with Keras's own `train_step` against one with trainer's exact
step (`trainer.run.assembly.install_step`); blocks of `--steps` steps of each side in turn,
the order alternating, each block timed to its last step's result. Twice: on batches of a
known static size (`batch.drop_remainder=true`, as `bench_overhead.py` runs), and of an
unknown one (every default run's, as its last batch may be partial).

Prints each case's median ratio (trainer / plain, rates: above 1 is faster) with every
block's, and the load average before and after.

    python scripts/profile_step.py --devices 2 --blocks 12
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="logical CPU replicas")
    parser.add_argument("--per-replica", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=12, help="timed blocks of each side")
    parser.add_argument("--steps", type=int, default=8, help="steps in a block")
    parser.add_argument("--model", default="mobilenet", choices=["mobilenet", "cnn"])
    parser.add_argument("--image-size", type=int, default=32)
    return parser.parse_args()


def start(devices: int):
    """Splits the CPU into `devices` logical ones, before TensorFlow's runtime starts (where
    it started already, as in the tests' shared process, its split is taken as it is)."""
    import tensorflow as tf

    if devices > 1:
        try:
            tf.config.set_logical_device_configuration(
                tf.config.list_physical_devices("CPU")[0],
                [tf.config.LogicalDeviceConfiguration()] * devices)
        except RuntimeError:
            have = len(tf.config.list_logical_devices("CPU"))
            if have < devices:
                sys.exit(f"TensorFlow started with {have} logical CPUs, fewer than --devices "
                         f"{devices}: run this script in a process of its own")
    return tf


def alternate(sides: dict, blocks: int) -> dict[str, list[float]]:
    """Runs each side's block (a callable returning its seconds) in turn, the order
    alternating from block to block; each side's times."""
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    for block in range(blocks):
        for name in (names if block % 2 == 0 else names[::-1]):
            times[name].append(sides[name]())
    return times


def report(title: str, plain: list[float], ours: list[float]) -> float:
    """Prints per-block ratios (trainer's rate over plain's: plain's seconds over ours) and
    their median."""
    ratios = [p / o for p, o in zip(plain, ours, strict=True)]
    median = statistics.median(ratios)
    print(f"{title}: trainer / plain {median:.3f} (blocks: "
          f"{', '.join(f'{r:.3f}' for r in ratios)}); plain {statistics.median(plain):.4f} s, "
          f"trainer {statistics.median(ours):.4f} s a block", flush=True)
    return median


def step_part(args, tf, dynamic: bool) -> float:
    import keras
    import numpy as np

    from trainer.models import cnn, mobilenet
    from trainer.run.assembly.install_step import install_step

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.devices)])
    global_batch = args.per_replica * args.devices
    shape = (args.image_size, args.image_size, 3)
    rng = np.random.default_rng(0)
    x = rng.random((global_batch * 4, *shape), "float32")
    y = rng.integers(0, 10, global_batch * 4).astype("int32")
    # without drop_remainder the batches' static size is unknown (all are full here)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        global_batch, drop_remainder=not dynamic).repeat()
    build = mobilenet.build if args.model == "mobilenet" else cnn.build

    def model(exact: bool):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            made = build(shape, 10)
            made.compile(optimizer=keras.optimizers.Adam(1e-3),
                         loss=keras.losses.SparseCategoricalCrossentropy(),
                         metrics=["accuracy"])
            if exact:
                install_step(made, "fit", 1, 1)
            # the optimizer's and metrics' variables, made before the step is traced (as
            # `fit` makes them from its first batch)
            made._symbolic_build(data_batch=(tf.constant(x[:2]), tf.constant(y[:2])))
        made.make_train_function()
        iterator = iter(strategy.experimental_distribute_dataset(data))
        for _ in range(3):  # traced, and warm
            float(made.train_function(iterator)["loss"])

        def block() -> float:
            used = resource.getrusage(resource.RUSAGE_SELF)
            began = time.perf_counter()
            for _ in range(args.steps):
                logs = made.train_function(iterator)
            float(logs["loss"])
            took = time.perf_counter() - began
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu.setdefault(exact, []).append(after.ru_utime + after.ru_stime - used.ru_utime
                                             - used.ru_stime)
            return took

        return block

    cpu: dict[bool, list[float]] = {}
    sides = {"plain": model(False), "trainer": model(True)}
    alternate(sides, 2)  # not timed: the first blocks after tracing run slow on both sides
    cpu.clear()
    times = alternate(sides, args.blocks)
    kind = "unknown static batch size" if dynamic else "full batches of a known size"
    ratio = report(f"step ({kind}; {args.steps} steps a block)", times["plain"],
                   times["trainer"])
    report("  the same blocks' CPU seconds (the process's, both cores)", cpu[False], cpu[True])
    return ratio


def main() -> None:
    args = parse_args()
    tf = start(args.devices)
    print(f"model={args.model} devices={args.devices} global batch="
          f"{args.per_replica * args.devices}; load before {os.getloadavg()[0]:.2f}", flush=True)
    step_part(args, tf, dynamic=False)
    step_part(args, tf, dynamic=True)
    print(f"load after {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
