"""Where the time to the first step goes, on 1, 2 and 4 logical CPU replicas.

The first training step of a run is: tracing the step function in Python (one copy of the
model's forward and backward pass per replica under MirroredStrategy), then TensorFlow's
graph optimisation (Grappler) and kernel set-up on the first call, then the step itself.
This script times the three apart, for `loop=custom`'s step and Keras's own `fit` step, with
MobileNetV2 (alpha 0.35, 32x32, global batch 256) as in the issue, each replica count in its
own process; with `--grappler` it also prints Grappler's own per-optimiser times (from
TensorFlow's meta-optimizer log) for the first call.

    python scripts/profile_first_step.py --replicas 1,2,4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(args) -> None:
    import tensorflow as tf

    n = args.worker
    if n > 1:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * n)
    if args.no_grappler:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    if args.grappler_off:
        tf.config.optimizer.set_experimental_options(
            {name: False for name in args.grappler_off.split(",")})
    import keras

    sys.path.insert(0, str(HERE.parent))
    from trainer.models import cnn, mobilenet
    from trainer.run.fit.loop import CustomLoop

    devices = [f"/cpu:{i}" for i in range(n)]
    strategy = (tf.distribute.MirroredStrategy(devices) if n > 1
                else tf.distribute.OneDeviceStrategy("/cpu:0"))
    keras.utils.set_random_seed(0)
    images = tf.random.uniform((args.global_batch * 4, 32, 32, 3))
    labels = tf.random.uniform((args.global_batch * 4,), maxval=10, dtype=tf.int64)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.global_batch).repeat()
    with strategy.scope():
        model = (mobilenet.build(input_shape=(32, 32, 3), num_classes=10, alpha=0.35)
                 if args.model == "mobilenet" else cnn.build((32, 32, 3), 10))
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    result = {"replicas": n}
    if args.loop == "custom":
        loop = CustomLoop(model, strategy)
        loop._build(data)  # the metrics' and optimizer's state, before tracing (as its fit)
        iterator = iter(strategy.experimental_distribute_dataset(data))
        start = time.perf_counter()
        concrete = loop._train_chunk.get_concrete_function(iterator, None)
        result["trace_s"] = time.perf_counter() - start
        result["graph_nodes"] = len(concrete.graph.as_graph_def().node)
        step = lambda: loop._train_chunk(iterator, None)  # noqa: E731
    else:
        iterator = iter(strategy.experimental_distribute_dataset(data))
        start = time.perf_counter()
        train_function = model.make_train_function()
        concrete = model.train_function.get_concrete_function(iterator) if hasattr(
            model.train_function, "get_concrete_function") else None
        result["trace_s"] = time.perf_counter() - start
        result["graph_nodes"] = (len(concrete.graph.as_graph_def().node)
                                 if concrete is not None else None)
        step = lambda: train_function(iterator)  # noqa: E731
    start = time.perf_counter()
    out = step()
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
    result["first_call_s"] = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.steps):
        out = step()
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
    result["step_s"] = (time.perf_counter() - start) / args.steps
    print("RESULT " + json.dumps(result), flush=True)


GRAPPLER = re.compile(r"meta_optimizer\.cc:\d+\] (\w+)[^:]*: Graph size after: .*"
                      r"time = (\d+(?:\.\d+)?)ms")


def grappler_times(stderr: str) -> dict[str, float]:
    """Sums the per-optimiser times of TensorFlow's meta-optimizer log (VLOG 1)."""
    totals: dict[str, float] = defaultdict(float)
    for line in stderr.splitlines():
        found = GRAPPLER.search(line)
        if found:
            totals[found.group(1)] += float(found.group(2))
    return dict(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--loop", default="custom", choices=["custom", "fit"])
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--grappler", action="store_true",
                        help="also print Grappler's per-optimiser times")
    parser.add_argument("--no-grappler", action="store_true",
                        help="disable Grappler (to see its share of the first call)")
    parser.add_argument("--grappler-off", default="",
                        help="Grappler passes to turn off, e.g. layout_optimizer,constant_folding")
    parser.add_argument("--steps", type=int, default=10, help="steps timed after the first")
    parser.add_argument("--model", default="mobilenet", choices=["mobilenet", "cnn"],
                        help="cnn: the default network, for a quick look")
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    rows = {}
    for n in map(int, args.replicas.split(",")):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0" if args.grappler else "2"}
        if args.grappler:
            env["TF_CPP_VMODULE"] = "meta_optimizer=1"
        command = [sys.executable, __file__, "--worker", str(n), "--loop", args.loop,
                   "--global-batch", str(args.global_batch), "--steps", str(args.steps),
                   "--model", args.model]
        if args.no_grappler:
            command.append("--no-grappler")
        if args.grappler_off:
            command += ["--grappler-off", args.grappler_off]
        out = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"replicas={n} failed: {out.stderr[-3000:]}")
        rows[n] = r = json.loads(line[len("RESULT "):])
        print(f"{n} replica(s), loop={args.loop}: trace {r['trace_s']:.1f} s "
              f"({r['graph_nodes']} nodes), first call {r['first_call_s']:.1f} s, "
              f"then {r['step_s']:.2f} s/step", flush=True)
        if args.grappler:
            times = sorted(grappler_times(out.stderr).items(), key=lambda kv: -kv[1])
            print(f"   grappler {sum(v for _, v in times) / 1000:.1f} s: "
                  + ", ".join(f"{k} {v / 1000:.1f} s" for k, v in times[:8]))
    base = rows[min(rows)]
    for n, r in sorted(rows.items()):
        first = r["trace_s"] + r["first_call_s"]
        print(f"{n} vs {min(rows)}: trace {r['trace_s'] / base['trace_s']:.2f}x, first call "
              f"{r['first_call_s'] / base['first_call_s']:.2f}x, trace + first call "
              f"{first / (base['trace_s'] + base['first_call_s']):.2f}x")


if __name__ == "__main__":
    main()
