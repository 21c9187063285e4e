"""An input-bound job on 1 and 2 local workers, and on a tf.data service: what sharding saves.

The data: an image folder of PNGs (smooth random images, 768x768 by default) and its
TFRecord twin (`python -m trainer.data.tfrecords`), decoded, resized to 32x32 and augmented
(flip, crop) every epoch (`dataset.cache=none`), training the default network at a fixed
global batch of 64; and a control: the same steps on in-memory images that cost nothing to
read. Each run is `python -m trainer.launch --workers N`, 1 and 2 workers alternating; the
medians over the repeats are printed:

- the training examples each worker decoded per epoch (the PNG files it read; for TFRecord,
  every worker reads every record's bytes and decodes these), counted by a wrapper of the
  source's decoder (a Python call per example, on both sides);
- the cluster's CPU seconds per epoch: every worker's process CPU time from the end of its
  first epoch to the end of its last (a callback of the bench's own), summed, per epoch; its
  ratio 2 workers / 1 worker (target <= 1.15; before sharding each worker decoded
  everything, about 1.6-2). The control's ratio is what a second worker costs by itself
  (its own step loop, the gradients' all-reduce over gRPC): the ceiling of a job whose
  input is cheap. At 384x384 the job is not input-bound on 2 cores (measured: 1 worker
  spends as much CPU per epoch as on the control), so its ratio is the control's, not the
  target's;
- the epoch time of one worker with `dataset.service=local:1` against without (alternating,
  no counting wrapper: a Python call cannot run on the service): what handing the
  preprocessing to TensorFlow's tf.data service costs on one machine.

    python scripts/bench_workers.py                 # a run per side: 8 runs, 8-12 min on 2 cores
    python scripts/bench_workers.py --repeats 3     # medians of 3 (a release note's numbers)
    python scripts/bench_workers.py --only control  # one source, no service comparison
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The bench's own module: a dataset wrapper counting the training examples decoded (the
# decoder is the source's own `preprocess`), and a callback writing, at every epoch end, the
# process's CPU time, wall clock and that count, one line per epoch in a file per process.
BENCH_MODULE = '''
import dataclasses
import json
import os
import time

import keras
import tensorflow as tf

from trainer.data import image_folder, tfrecords

DECODED = [0]


def _counted(source):
    decode = source.preprocess

    def count(label):
        DECODED[0] += 1
        return label

    def counted(item, label):
        label = tf.py_function(count, [label], label.dtype)
        label.set_shape([])
        return decode(item, label)

    return dataclasses.replace(source, preprocess=counted)


def folder(**options):
    return _counted(image_folder.load(**options))


def records(**options):
    return _counted(tfrecords.load(**options))


class EpochClock(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        with open(f"{os.environ['BENCH_CLOCK']}.{os.getpid()}", "a") as out:
            out.write(json.dumps([epoch, time.process_time(), time.perf_counter(),
                                  DECODED[0]]) + "\\n")
'''


def make_folder(root: Path, count: int, side: int = 384) -> Path:
    """`count` smooth random PNGs in two class folders."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for i in range(count):
        small = rng.integers(0, 256, (side // 16, side // 16, 3)).astype(np.float32)
        image = tf.image.resize(small, (side, side)).numpy().clip(0, 255).astype(np.uint8)
        folder = root / ("b" if i % 2 else "a")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.png").write_bytes(tf.io.encode_png(image).numpy())
    return root


def launch(workers: int, data: list[str], work: Path, name: str, epochs: int,
           extra: tuple[str, ...] = ()) -> dict[str, list]:
    """One run; returns each worker's epoch clocks `{pid: [[epoch, cpu, wall, decoded]]}`."""
    run_dir, clock = work / name, work / f"{name}.clock"
    env = {**os.environ, "BENCH_CLOCK": str(clock), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([str(work), str(REPO),
                                          os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "trainer.launch", "--workers", str(workers),
               *data, "model=cnn", f"epochs={epochs}", "batch.per_replica=null",
               "batch.global_size=64", "augment=[flip,crop]", "dataset.cache=none",
               "verbose=0", "logger=[]", "+callbacks.clock._target_=bench_module.EpochClock",
               f"hydra.run.dir={run_dir}", *extra]
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        sys.exit(f"the run failed ({' '.join(command[2:])}):\n{done.stdout[-3000:]}"
                 f"{done.stderr[-3000:]}")
    return _clocks(clock)


def _clocks(clock: Path) -> dict[str, list]:
    return {p.suffix[1:]: [json.loads(line) for line in p.read_text().split("\n") if line]
            for p in clock.parent.glob(clock.name + ".*")}


def per_epoch(clocks: dict[str, list], epochs: int) -> dict:
    """Examples decoded per worker per epoch (training and validation), and the cluster's CPU
    seconds and the wall seconds per epoch after the first."""
    cpu = sum(c[-1][1] - c[0][1] for c in clocks.values()) / (epochs - 1)
    wall = max(c[-1][2] - c[0][2] for c in clocks.values()) / (epochs - 1)
    # all of the run's decodes (prefetching reads the next epoch before an epoch ends)
    decoded = sorted((c[-1][3] / epochs for c in clocks.values()), reverse=True)
    return {"cpu_s": cpu, "wall_s": wall, "decoded": decoded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--side", type=int, default=768,
                        help="the PNGs' side in pixels: the larger, the more input-bound")
    parser.add_argument("--only", choices=["image_folder", "tfrecord", "control"],
                        default=None,
                        help="one source, and no service comparison")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per side, alternating (3 for a release note's medians)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        work = Path(tmp)
        (work / "bench_module.py").write_text(BENCH_MODULE)
        folder = make_folder(work / "images", args.images, args.side)
        subprocess.run([sys.executable, "-m", "trainer.data.tfrecords", str(folder),
                        str(work / "records"), "--shards", "8"], check=True,
                       capture_output=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        counted = {"image_folder": ["dataset=image_folder", f"dataset.path={folder}",
                                    "dataset.image_size=32",
                                    "dataset._target_=bench_module.folder"],
                   "tfrecord": ["dataset=tfrecord", f"dataset.path={work / 'records'}",
                                "dataset.image_size=32",
                                "dataset._target_=bench_module.records"],
                   # the same steps on in-memory images that cost nothing to read: what a
                   # second worker costs by itself (its step loop, the gradients' all-reduce)
                   "control": ["dataset=synthetic", "dataset.image_size=32",
                               f"dataset.train_examples={args.images * 8 // 10}",
                               f"dataset.validation_examples={args.images // 10}",
                               "dataset.num_classes=2"]}
        started = time.perf_counter()
        rows = {}
        for name, data in counted.items():
            if args.only not in (None, name):
                continue
            runs = {1: [], 2: []}
            for repeat in range(args.repeats):
                for workers in (1, 2) if repeat % 2 == 0 else (2, 1):
                    result = launch(workers, data, work, f"{name}-{workers}-{repeat}",
                                    args.epochs)
                    runs[workers].append(per_epoch(result, args.epochs))
            rows[name] = runs
        service = {"none": [], "local:1": []}
        for repeat in range(args.repeats if args.only is None else 0):
            for value in ("none", "local:1") if repeat % 2 == 0 else ("local:1", "none"):
                extra = () if value == "none" else (f"dataset.service={value}",)
                plain = counted["image_folder"][:-1]  # the folder's own loader
                result = launch(1, plain, work, f"service-{value}-{repeat}", args.epochs, extra)
                service[value].append(per_epoch(result, args.epochs))
        report(rows, service, args, time.perf_counter() - started)


def report(rows: dict, service: dict, args: argparse.Namespace, seconds: float) -> None:
    med = statistics.median
    print(f"{args.images} PNGs {args.side}x{args.side} -> 32x32, flip + crop, cache none, "
          "global batch 64, "
          f"{args.epochs} epochs, medians of {args.repeats} alternating runs "
          f"({seconds:.0f} s in all)")
    print(f"{'source':<13} {'workers':>7} {'decoded/worker/epoch':>22} "
          f"{'cluster CPU s/epoch':>20} {'epoch s':>8}")
    for name, runs in rows.items():
        for workers, results in runs.items():
            decoded = " + ".join(f"{med(r['decoded'][i] for r in results):.0f}"
                                 for i in range(len(results[0]["decoded"])))
            print(f"{name:<13} {workers:>7} {decoded:>22} "
                  f"{med(r['cpu_s'] for r in results):>20.2f} "
                  f"{med(r['wall_s'] for r in results):>8.2f}")
        ratio = med(b["cpu_s"] / a["cpu_s"] for a, b in zip(runs[1], runs[2], strict=True))
        what = ("no input work: what a second worker costs by itself" if name == "control"
                else "target <= 1.15")
        print(f"{name:<13} CPU 2 workers / 1 worker: {ratio:.2f} ({what})")
    plain, served = service["none"], service["local:1"]
    if not plain:
        return
    ratio = med(s["wall_s"] / p["wall_s"] for p, s in zip(plain, served, strict=True))
    print(f"one worker, image_folder: epoch {med(p['wall_s'] for p in plain):.2f} s without a "
          f"service, {med(s['wall_s'] for s in served):.2f} s with dataset.service=local:1 "
          f"({ratio:.2f}x); CPU {med(p['cpu_s'] for p in plain):.2f} vs "
          f"{med(s['cpu_s'] for s in served):.2f} s/epoch")


if __name__ == "__main__":
    main()
