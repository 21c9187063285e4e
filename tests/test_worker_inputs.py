"""2 workers see 1 worker's global batches, bit for bit, from every kind of source: the
elements worker `w` trains on in its `k`-th step are positions `w, w + 2, ...` of 1 worker's
`k`-th global batch, pixel for pixel, at any image size, lane count and cache mode
(`trainer.data.shares`). What then still tells 2 workers from 1 is the arithmetic of the
step, which tests/test_sharded_input.py measures.

The pipelines are built in this process for each place (`Place`), as each worker builds its
own; no cluster is started. The axes are paired, not crossed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from trainer.data import image_folder, tfrecords
from trainer.data import tfds as tfds_source
from trainer.data.pipeline import Batches, Epochs, Order, Prep, Source, build_training_epochs
from trainer.data.shares import Place

# Each case builds 3 pipelines of 2 epochs (measured 27-52 s each on 2 cores shared with
# 8 other busy processes; several seconds alone): CI's long pass runs them.
pytestmark = pytest.mark.long

GLOBAL_BATCH = 8


def pngs(root: Path, count: int = 44, side: int = 16) -> Path:
    """`count` random PNGs of `side` pixels in 3 class folders."""
    rng = np.random.default_rng(1)
    for i in range(count):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 256, (side, side, 3)).astype(np.uint8)
        (folder / f"{i:03d}.png").write_bytes(tf.io.encode_png(image).numpy())
    return root


def user_source(image_size: int) -> Source:
    """A user's in-memory arrays, resized in their own `preprocess`."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (50, 10, 10, 1)).astype(np.float32)
    y = (np.arange(50) % 2).astype(np.int32)

    def resize(image, label):
        return tf.image.resize(image, (image_size, image_size)), label

    return Source.from_arrays(x[:42], y[:42], x[42:], y[42:], num_classes=2,
                              preprocess=resize, scale=1 / 255,
                              input_shape=(image_size, image_size, 1))


def load(kind: str, tmp_path: Path, image_size: int) -> Source:
    """A source of `kind`, its images resized to `image_size`."""
    if kind == "tfrecord":
        out = tmp_path / "records"
        assert tfrecords.main([str(pngs(tmp_path / "images")), str(out), "--shards", "3"]) == 0
        return tfrecords.load(str(out), image_size=image_size)
    if kind == "image_folder":
        return image_folder.load(str(pngs(tmp_path / "images")), image_size=image_size, seed=3)
    if kind == "tfds":
        return tfds_source.load("mnist", data_dir=str(tmp_path / "tfds"), image_size=image_size,
                                seed=3)
    return user_source(image_size)


def batches(source: Source, place: Place, lanes: int, cache: str,
            cache_dir: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two epochs of `place`'s training batches, as the run wires them."""
    def cache_file(lane):
        return cache_dir / f"worker-{place.worker}-of-{place.workers}-lane-{lane}"

    data = build_training_epochs(
        source.train, Batches(GLOBAL_BATCH, 1, source.train_size), Epochs(0, 2),
        prep=Prep(source.preprocess, source.scale, cache, cache_file, "train", source.shard),
        order=Order(seed=5, lanes=lanes), place=place)
    return [(x.numpy(), y.numpy()) for x, y, *_ in data]


@pytest.mark.parametrize(("kind", "image_size", "lanes", "cache"), [
    ("tfrecord", 12, 1, "none"),  # the reported case: shards interleaved, resized, no cache
    ("tfrecord", 8, 2, "memory"),
    ("tfrecord", 16, 3, "disk"),  # 3 lanes on 2 workers: shares change every epoch
    ("image_folder", 12, 2, "none"),
    ("tfds", 12, 2, "disk"),
    ("user", 8, 3, "memory"),
])
def test_two_workers_read_one_workers_global_batches_bit_for_bit(tmp_path, kind, image_size,
                                                                  lanes, cache):
    with tfds.testing.mock_data(num_examples=42, policy=tfds.testing.MockPolicy.USE_CODE):
        source = load(kind, tmp_path, image_size)
        one = batches(source, Place(1, 0, 1), lanes, cache, tmp_path / "cache")
        shares = [batches(source, Place(2, w, 1), lanes, cache, tmp_path / "cache")
                  for w in range(2)]
    assert one and all(len(share) == len(one) for share in shares)
    assert one[0][0].shape[1:3] == (image_size, image_size)
    seen = 0
    for step, (x, y) in enumerate(one):
        for worker, share in enumerate(shares):
            np.testing.assert_array_equal(share[step][1], y[worker::2], err_msg=f"step {step}")
            np.testing.assert_array_equal(share[step][0], x[worker::2], err_msg=f"step {step}")
            seen += len(share[step][1])
    assert seen == 2 * source.train_size  # two epochs, every example once each
