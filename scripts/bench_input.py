"""Input pipeline alone: `trainer`'s pipeline vs. the MirroredStrategy tutorial's naive one.

Data shaped like cats_vs_dogs as TFDS stores it: JPEG-encoded images of varied size (here
generated, 120 to 500 pixels a side) with labels, decoded and resized to 224x224. The naive
pipeline is the tutorial's `map(decode_resize_scale).shuffle(1024).batch(b)`: no parallelism,
no prefetch. Ours is `trainer.data.pipeline.build_pipeline` as cats_vs_dogs configures it
(no cache): parallel decode and resize, shuffle, batch, scale per batch, prefetch.
The two alternate (A B A B ...), one full pass each; the result is the median of the
per-pair ratios ours / naive. Target: >= 1.8 on 2 cores.

    python scripts/bench_input.py --images 512 --pairs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.data.pipeline import build_pipeline  # noqa: E402

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


def naive(contents, labels, batch):
    def decode_resize_scale(c, y):
        image, y = decode_resize(c, y)
        return image / 255.0, y

    return (tf.data.Dataset.from_tensor_slices((contents, labels))
            .map(decode_resize_scale).shuffle(1024).batch(batch))


def ours(contents, labels, batch):
    return build_pipeline(tf.data.Dataset.from_tensor_slices((contents, labels)), batch,
                          training=True, preprocess=decode_resize, scale=1 / 255.0, seed=0,
                          cache=False, shuffle_buffer=1024)


def examples_per_second(dataset: tf.data.Dataset) -> float:
    start, count = time.perf_counter(), 0
    for images, _ in dataset:
        count += int(images.shape[0])
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    contents, labels = make_jpegs(args.images)
    print(f"{args.images} JPEGs, mean {np.mean([len(c) for c in contents]) / 1024:.0f} KiB, "
          f"batch {args.batch}, {os.cpu_count()} cores")
    examples_per_second(ours(contents, labels, args.batch))  # warm up both code paths
    examples_per_second(naive(contents, labels, args.batch))
    ratios = []
    for pair in range(args.pairs):
        slow = examples_per_second(naive(contents, labels, args.batch))
        fast = examples_per_second(ours(contents, labels, args.batch))
        ratios.append(fast / slow)
        print(f"pair {pair + 1}: naive {slow:7.1f} ex/s  trainer {fast:7.1f} ex/s  "
              f"ratio {fast / slow:.2f}", flush=True)
    print(f"median ratio trainer / naive over {args.pairs} pairs: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
