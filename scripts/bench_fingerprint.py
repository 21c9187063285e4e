"""What an image folder's content fingerprint costs, next to one epoch of reading it.

Makes `--images` small PNG files (32x32, in 10 class folders) in a temporary folder, then
times, alternating the sides `--rounds` times:

- cold: the fingerprint with an empty hash cache (every file read and hashed);
- warm: the fingerprint again (every file's size, times and inode as cached: no file read),
  as `image_folder.load` takes it: with the `stat` its listing took of each file; and the
  same with a `stat` of its own per file (what it costs where nothing was listed);
- epoch: what a run's first epoch reads through the project's input pipeline: a pass over
  the folder's training files and one over its validation files (`image_folder.load`'s
  decode and resize, then `build_pipeline`: parallel map, cache, shuffle, batch, scale,
  prefetch); the training pass alone is shown too.

Prints each side's median and the ratios to the epoch and to its training pass. Goal: warm
under 5% of the epoch.
The files stay in the page cache throughout (cold means "not in the hash cache", not "not
in memory"): a folder on a cold disk costs both sides more.

    python scripts/bench_fingerprint.py --images 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.data import fingerprint, image_folder  # noqa: E402
from trainer.data.pipeline import Batches, Order, Prep, build_pipeline  # noqa: E402

CLASSES, SIDE, BATCH = 10, 32, 64


def make_folder(root: Path, count: int) -> None:
    """`count` PNG files of smooth random 32x32 images, spread over 10 class folders."""
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        small = rng.integers(0, 256, size=(5, 5, 3)).astype(np.float32)
        image = tf.image.resize(small, (SIDE, SIDE)).numpy().clip(0, 255).astype(np.uint8)
        (folder / f"{i:05d}.png").write_bytes(tf.io.encode_png(image).numpy())


def load(root: Path) -> tuple[image_folder.Source, dict]:
    """The folder's `Source`, and the arguments its load gave the fingerprint."""
    seen = {}
    real = image_folder.of_folder

    def keep(roles, folder, cache=None, stats=None):
        seen.update(roles=roles, root=folder, stats=stats)
        return real(roles, folder, cache, stats)

    image_folder.of_folder = keep
    try:
        source = image_folder.load(str(root), image_size=SIDE, channels=3)
        source.fingerprint()  # hashed where asked for (a run's chief), not by the load
    finally:
        image_folder.of_folder = real
    return source, seen


def time_fingerprint(seen: dict, cold: bool, own_stats: bool = False) -> tuple[float, int]:
    """Seconds of the fingerprint as `load` takes it (with the listing's stats; or, with
    `own_stats`, stat'ing each file itself), cache file read and written included."""
    if cold:
        shutil.rmtree(fingerprint.cache_dir(), ignore_errors=True)
    start = time.perf_counter()
    cache = fingerprint.HashCache(seen["root"])
    fingerprint.of_folder(seen["roles"], seen["root"], cache,
                          None if own_stats else seen["stats"])
    return time.perf_counter() - start, cache.hashed


def time_epoch(source: image_folder.Source) -> tuple[float, float]:
    """Seconds of a first epoch's training pass, and of its validation pass."""
    times = []
    for data, size, training in ((source.train, source.train_size, True),
                                 (source.validation, source.validation_size, False)):
        start = time.perf_counter()
        dataset = build_pipeline(data, Batches(BATCH, examples=size), training=training,
                                 prep=Prep(source.preprocess, source.scale, "memory"),
                                 order=Order(seed=0, shuffle_buffer=10000))
        for _ in dataset:
            pass
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fingerprint-") as scratch:
        os.environ[fingerprint.CACHE_ENV] = str(Path(scratch) / "cache")
        root = Path(scratch) / "images"
        made = time.perf_counter()
        make_folder(root, args.images)
        print(f"{args.images} PNG files ({SIDE}x{SIDE}, {CLASSES} classes) made in "
              f"{time.perf_counter() - made:.1f} s; "
              f"{sum(p.stat().st_size for p in root.rglob('*.png')) / 1e6:.1f} MB")
        # The cache keeps no file changed within RACY_NS of its hashing.
        time.sleep(fingerprint.RACY_NS / 1e9 + 0.1)
        source, seen = load(root)
        time_epoch(source)  # tf.data's and the decoder's first-use costs, once
        times: dict[str, list[float]] = {"cold": [], "warm": [], "own": [], "train": [],
                                         "epoch": []}
        for round_ in range(args.rounds):
            # alternate which side goes first
            order = ("fingerprint", "epoch") if round_ % 2 == 0 else ("epoch", "fingerprint")
            for side in order:
                if side == "epoch":
                    train, validation = time_epoch(source)
                    times["train"].append(train)
                    times["epoch"].append(train + validation)
                    continue
                cold, hashed = time_fingerprint(seen, cold=True)
                warm, rehashed = time_fingerprint(seen, cold=False)
                own, _ = time_fingerprint(seen, cold=False, own_stats=True)
                assert hashed == args.images and rehashed == 0, (hashed, rehashed)
                times["cold"].append(cold)
                times["warm"].append(warm)
                times["own"].append(own)
        epoch, train = statistics.median(times["epoch"]), statistics.median(times["train"])
        print(f"{'side':<44} {'median s':>8} {'/epoch':>7} {'/train':>7}  runs (s)")
        for name, label in (
                ("epoch", f"one epoch ({source.train_size} train + {source.validation_size} "
                          "val.)"),
                ("train", f"its training pass ({source.train_size} files)"),
                ("cold", f"fingerprint, cold ({args.images} files hashed)"),
                ("warm", "fingerprint, warm (cache hits)"),
                ("own", "  the same, stat'ing each file itself")):
            median = statistics.median(times[name])
            runs = " ".join(f"{t:.3f}" for t in times[name])
            print(f"{label:<44} {median:>8.3f} {median / epoch:>7.1%} {median / train:>7.1%}  "
                  f"{runs}")

if __name__ == "__main__":
    main()
