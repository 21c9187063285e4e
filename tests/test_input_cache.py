"""`dataset.cache: memory | disk | none`: tf.data's file cache under the run directory, a
memory cache refused where a worker's share would not fit, data larger than that limit
trained from disk or read every epoch (`trainer.data.caching`)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import error_lines, make_config, run_main

from trainer.config.errors import ConfigError
from trainer.config.schema import DataService
from trainer.config.validate import cache_mode, validate
from trainer.data.pipeline import Batches, Epochs, Order, Prep, build_training_epochs
from trainer.evaluate import load_checkpoint
from trainer.run.train import train
from trainer.rundir.resume import check_resume


def test_cache_modes_and_the_older_booleans():
    assert [cache_mode(v) for v in (True, False, "true", "False", "memory", "disk", "none")] \
        == ["memory", "none", "memory", "none", "memory", "disk", "none"]
    with pytest.raises(ConfigError, match="dataset.cache must be memory, disk or none .*"
                                          "received: 'ram'"):
        cache_mode("ram")


def test_the_check_reads_the_pipeline_options_for_the_spec():
    """What the `Spec` holds as `pipeline`: the schema's `PipelineOptions`, `cache` as its
    mode, the shuffle buffer 0 without shuffling, the service parsed; the source's builder
    never sees these keys."""
    cfg = make_config("dataset.cache=true", "dataset.shuffle=false", "dataset.service=local:2",
                      "dataset.lanes=4")
    options = validate(cfg).pipeline
    assert (options.cache, options.buffer, options.lanes) == ("memory", 0, 4)
    assert options.served == DataService("local", 2, "local:2")
    assert options._target_ == cfg.dataset._target_
    plain = validate(make_config("dataset.cache=none", "dataset.shuffle_buffer=64")).pipeline
    assert (plain.cache, plain.buffer, plain.served, plain.service) == ("none", 64, None, None)
    assert set(type(options).keys()) == {"cache", "shuffle", "shuffle_buffer",
                                         "memory_limit_mb", "lanes", "service"}


def test_a_resume_reads_the_older_booleans_as_their_modes(tmp_path):
    state = {"epoch": 0, "step": 0, "config": {"epochs": 2, "dataset": {"cache": True}}}
    assert check_resume(tmp_path, state, {"epochs": 2, "dataset": {"cache": "memory"}}) == {}
    # memory and disk keep the same elements; none keeps them unrounded: another run
    assert check_resume(tmp_path, state, {"epochs": 2, "dataset": {"cache": "disk"}}) == {
        "dataset.cache": ["memory", "disk"]}
    with pytest.raises(ConfigError, match="dataset.cache from 'memory' to 'none'"):
        check_resume(tmp_path, state, {"epochs": 2, "dataset": {"cache": "none"}})


IMAGES = np.random.default_rng(0).integers(0, 256, (40, 4, 4, 3)).astype(np.uint8)


def counted_epochs(log, cache_file, epochs=2):
    """Training epochs whose preprocessing writes a line per example it runs on."""
    def record(label):
        with open(log, "a") as out:
            out.write(f"{int(label)}\n")
        return label

    def preprocess(image, label):
        return tf.cast(image, tf.float32) * 2, tf.py_function(record, [label], tf.int32)

    data = tf.data.Dataset.from_tensor_slices((IMAGES, np.arange(40, dtype=np.int32)))
    batches = build_training_epochs(data, Batches(8, examples=40), Epochs(0, epochs),
                                    prep=Prep(preprocess, cache="disk", cache_file=cache_file),
                                    order=Order(seed=3, lanes=2))
    return [y.numpy().tolist() for _, y in batches]


def test_a_disk_cache_is_written_once_and_read_by_a_new_pipeline(tmp_path):
    log = tmp_path / "preprocessed"

    def file(lane):
        return tmp_path / "cache" / f"train-lane-{lane}"

    first = counted_epochs(log, file)
    assert len(log.read_text().split()) == 40  # decoded in the first epoch only
    assert sorted(p.name for p in (tmp_path / "cache").glob("*.index")) == [
        "train-lane-0.index", "train-lane-1.index"]
    assert first[:5] != first[5:]  # two epochs, two orders
    again = counted_epochs(log, file)  # a resumed run: the files are read, nothing decoded
    assert again == first and len(log.read_text().split()) == 40
    # a cache never finished (a run stopped in its first pass) is written anew
    for index in (tmp_path / "cache").glob("*lane-1.index"):
        index.unlink()
    (tmp_path / "cache" / "train-lane-1_0.lockfile").write_text("")
    assert counted_epochs(log, file) == first and len(log.read_text().split()) == 60


def test_a_disk_cached_run_trains_as_a_memory_cached_one(tmp_path, tiny_config):
    runs = {}
    for mode in ("memory", "disk"):
        runs[mode] = tmp_path / mode
        summary = train(tiny_config("epochs=2", f"dataset.cache={mode}"), run_dir=runs[mode])
        assert summary["input"]["cache"] == mode
    files = sorted(p.relative_to(runs["disk"] / "input_cache").as_posix()
                   for p in (runs["disk"] / "input_cache").rglob("*.index"))
    assert files == ["worker-0/train.index", "worker-0/validation.index"]
    assert not (runs["memory"] / "input_cache").exists()
    for a, b in zip(load_checkpoint(runs["disk"] / "checkpoints" / "last.keras").get_weights(),
                    load_checkpoint(runs["memory"] / "checkpoints" / "last.keras")
                    .get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def image_folder(root, count=400, side=64):
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / ("b" if i % 2 else "a")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (side, side, 3)).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def test_data_larger_than_the_memory_limit_trains_from_disk_or_uncached_not_in_memory(
        tmp_path):
    """400 PNGs of 64x64: 360 training and validation images, 4.2 MiB decoded, over a
    limit of 1 MiB: cache=memory is one line before training (nothing written), disk and
    none train."""
    folder = image_folder(tmp_path / "images")
    common = ["dataset=image_folder", f"dataset.path={folder}", "dataset.image_size=64",
              "dataset.memory_limit_mb=1", "model=small", "epochs=1", "logger=[]",
              "verbose=0", "dataset.test_fraction=0.1"]
    refused = tmp_path / "refused"
    out = run_main(*common, "dataset.cache=memory", f"hydra.run.dir={refused}", cwd=tmp_path)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0] == (
        "error: dataset.cache=memory would keep 320 training and 40 validation examples of "
        "this worker (4.2 MiB decoded) in memory, over "
        "dataset.memory_limit_mb=1; use dataset.cache=disk (files under the run directory) or "
        "dataset.cache=none (read and decode every epoch), or raise dataset.memory_limit_mb")
    assert not refused.exists()
    for mode in ("disk", "none"):
        out = run_main(*common, f"dataset.cache={mode}", f"hydra.run.dir={tmp_path / mode}",
                       cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "disk" / "input_cache" / "worker-0" / "train.index").is_file()


def test_a_damaged_disk_cache_is_one_line_naming_its_file_and_the_remedy(tmp_path, tiny_config):
    """A resumed run reads the cache its first run finished: bytes changed there were a
    92-line DataLossError."""
    from conftest import TINY

    run_dir = tmp_path / "run"
    train(tiny_config("dataset.cache=disk"), run_dir=run_dir)
    data = next((run_dir / "input_cache" / "worker-0").glob("train.data-*"))
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2:len(damaged) // 2 + 64] = b"\xff" * 64
    data.write_bytes(bytes(damaged))
    out = run_main(*TINY, "model=small", "dataset.cache=disk", "epochs=2",
                   f"resume={run_dir}", cwd=tmp_path)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: the input cache {run_dir}/input_cache/worker-0/train "
                               "(dataset.cache=disk) is damaged ("), lines[0]
    assert lines[0].endswith(f"; delete {run_dir / 'input_cache'} and run again: the data is "
                             "then read and cached anew")
