"""Input pipeline alone: `trainer`'s pipeline vs. the MirroredStrategy tutorial's naive one.

Data shaped like cats_vs_dogs as TFDS stores it: JPEG-encoded images of varied size (here
generated, 120 to 500 pixels a side) with labels, decoded and resized to 224x224. The naive
pipeline is the tutorial's `map(decode_resize_scale).shuffle(1024).batch(b)`: no parallelism,
no prefetch. Ours is `trainer.data.pipeline.build_pipeline` as cats_vs_dogs configures it
(no cache): parallel decode and resize, shuffle, batch, scale per batch, prefetch.
The naive pipeline is timed twice: as written (tf.data's default graph rewrites then make
its map parallel and inject a prefetch by themselves) and literally (those rewrites off:
sequential, as the tutorial's code reads). Each naive run alternates with one of ours
(A B A B ...), one full pass each; the results are medians of per-pair ratios ours / naive.
Target: >= 1.8 on 2 cores.

Then the cached epochs of a training run (`--cached` examples at 32x32, in memory): CPU
seconds per global batch of trainer's training epochs (`build_training_epochs`, as a run
of one worker builds them: seeded order, uint8 cache, scaled per batch) against the
tutorial's `map(scale).cache().shuffle().batch()`, each side's epochs read after a warm-up
epoch that fills its cache, the sides in turn (A B, then B A), medians. Target: <= 1.25x:
CPU the pipeline takes is CPU a 2-core step does not get (a per-element map between the
shuffle and the batch once cost 15 ms a batch of 256, against the tutorial's 1 ms).

    python scripts/bench_input.py --images 512 --pairs 3
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.data.pipeline import (  # noqa: E402
    Batches,
    Epochs,
    Order,
    Prep,
    build_pipeline,
    build_training_epochs,
)
from trainer.data.tfds import _decoder as tfds_decoder  # noqa: E402

SIZE = 224


def make_jpegs(count: int, seed: int = 0) -> tuple[list[bytes], np.ndarray]:
    """Smooth random images (JPEG-compressible like photos) of varied size, encoded."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        h, w = rng.integers(120, 500, size=2)
        small = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3)).astype(np.float32)
        image = tf.image.resize(small, (h, w)).numpy().clip(0, 255).astype(np.uint8)
        images.append(tf.io.encode_jpeg(image, quality=90).numpy())
    return images, rng.integers(0, 2, size=count).astype(np.int32)


def decode_resize(contents, label):
    image = tf.io.decode_jpeg(contents, channels=3)
    return tf.image.resize(image, (SIZE, SIZE)), label


def naive(contents, labels, batch, literal=False):
    """The tutorial's pipeline. TF's tf.data rewrites it (parallel map, injected prefetch)
    unless `literal`, which turns those rewrites off: sequential, as the code reads."""

    def decode_resize_scale(c, y):
        image, y = decode_resize(c, y)
        return image / 255.0, y

    dataset = (tf.data.Dataset.from_tensor_slices((contents, labels))
               .map(decode_resize_scale).shuffle(1024).batch(batch))
    if literal:
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        options.autotune.enabled = False
        dataset = dataset.with_options(options)
    return dataset


class JpegFeature:
    """What TFDS's `Image` feature does with a stored example: decode its JPEG bytes."""

    @staticmethod
    def decode_example(contents):
        return tf.io.decode_jpeg(contents, channels=3)


def ours(contents, labels, batch):
    """trainer's cats_vs_dogs chain: its TFDS decoder (decode, resize), then the pipeline."""
    return build_pipeline(tf.data.Dataset.from_tensor_slices((contents, labels)),
                          Batches(batch), training=True,
                          prep=Prep(tfds_decoder(JpegFeature(), SIZE), 1 / 255.0, "none"),
                          order=Order(seed=0, shuffle_buffer=1024))


def examples_per_second(dataset: tf.data.Dataset) -> float:
    start, count = time.perf_counter(), 0
    for images, _ in dataset:
        count += int(images.shape[0])
    return count / (time.perf_counter() - start)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cached_epochs(examples: int, batch: int, pairs: int, epochs: int = 4) -> None:
    """CPU per global batch of cached training epochs: trainer's against the tutorial's."""
    rng = np.random.default_rng(42)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.integers(0, 256, (examples, 32, 32, 3), dtype=np.uint8),
         rng.integers(0, 10, examples, dtype=np.int32)))
    steps = examples // batch

    def tutorial():
        def scale(image, label):
            return tf.cast(image, tf.float32) / 255.0, label

        return data.map(scale).cache().shuffle(2048).batch(batch, drop_remainder=True).repeat()

    def trainer():
        return build_training_epochs(data, Batches(batch, 2, examples, True),
                                     Epochs(0, epochs + 1), prep=Prep(scale=1 / 255),
                                     order=Order(seed=42))

    sides = {"trainer": trainer, "tutorial": tutorial}
    per_batch: dict[str, list[float]] = {name: [] for name in sides}
    for pair in range(pairs):
        for name in (list(sides) if pair % 2 == 0 else list(sides)[::-1]):
            batches = iter(sides[name]())
            for _ in range(steps):  # the first epoch fills the cache
                next(batches)
            start = cpu_seconds()
            for _ in range(steps * epochs):
                next(batches)
            per_batch[name].append((cpu_seconds() - start) / (steps * epochs) * 1e3)
            del batches
            gc.collect()
    ratios = [a / b for a, b in zip(per_batch["trainer"], per_batch["tutorial"], strict=True)]
    print(f"cached epochs, {examples} examples at 32x32, batch {batch}: CPU ms per batch "
          f"trainer {statistics.median(per_batch['trainer']):.2f}, tutorial "
          f"{statistics.median(per_batch['tutorial']):.2f}")
    print(f"median CPU ratio trainer / tutorial (cached epochs) over {pairs} pairs: "
          f"{statistics.median(ratios):.2f}  (each: {', '.join(f'{r:.2f}' for r in ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cached", type=int, default=8192,
                        help="examples of the cached epochs' part (0: not run)")
    parser.add_argument("--cached-batch", type=int, default=256)
    args = parser.parse_args()
    contents, labels = make_jpegs(args.images)
    print(f"{args.images} JPEGs, mean {np.mean([len(c) for c in contents]) / 1024:.0f} KiB, "
          f"batch {args.batch}, {os.cpu_count()} cores")
    examples_per_second(ours(contents, labels, args.batch))  # warm up both code paths
    examples_per_second(naive(contents, labels, args.batch))
    ratios: dict[str, list[float]] = {"as written": [], "literal": []}
    for pair in range(args.pairs):
        rates = {}
        for name in ratios:
            rates[name] = examples_per_second(
                naive(contents, labels, args.batch, literal=name == "literal"))
            rates[f"trainer vs {name}"] = examples_per_second(ours(contents, labels, args.batch))
            ratios[name].append(rates[f"trainer vs {name}"] / rates[name])
        print(f"pair {pair + 1}: " + "  ".join(f"{k} {v:7.1f} ex/s" for k, v in rates.items()),
              flush=True)
    for name, values in ratios.items():
        print(f"median ratio trainer / naive ({name}) over {args.pairs} pairs: "
              f"{statistics.median(values):.2f}  (each: {', '.join(f'{r:.2f}' for r in values)})")
    if args.cached:
        cached_epochs(args.cached, args.cached_batch, max(args.pairs, 2))


if __name__ == "__main__":
    main()
