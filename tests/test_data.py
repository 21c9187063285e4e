"""Data: TFDS (mocked, offline), image folders, the shared pipeline, exact evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.conftest import error_lines, run_main
from trainer.data import image_folder, synthetic
from trainer.data.pipeline import Batches, DataError, Order, Prep, build_pipeline
from trainer.run.train import train

# The small network (tests/small_model.py): what these runs check is the data's way in.
FAST = ["epochs=1", "verbose=0", "logger=[]", "accelerator=cpu", "devices=2", "model=small"]


@pytest.mark.parametrize("name, extra", [
    ("mnist", []),
    ("cifar10", []),
    ("cats_vs_dogs", ["dataset.image_size=32"]),  # images of varying size, resized
])
def test_tfds_datasets_train_on_two_replicas(make_run, tmp_path, name, extra):
    with tfds.testing.mock_data(num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE):
        summary = train(make_run(f"dataset={name}", *FAST, *extra,
                                 f"dataset.data_dir={tmp_path / 'tfds'}"), run_dir=tmp_path)
    assert summary["dataset"] == "tfds" and summary["replicas"] == 2
    assert summary["train_examples"] > 0 and summary["validation_examples"] > 0
    assert summary["batch"]["global"] == 128


def test_tfds_shapes_follow_the_dataset(tmp_path):
    from trainer.data import tfds as tfds_source

    with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
        mnist = tfds_source.load("mnist", data_dir=str(tmp_path))
        cats = tfds_source.load("cats_vs_dogs", "train[:80%]", "train[80%:]",
                                data_dir=str(tmp_path), image_size=224)
    assert mnist.input_shape == (28, 28, 1) and mnist.num_classes == 10
    assert cats.input_shape == (224, 224, 3) and cats.num_classes == 2
    image, _ = next(iter(cats.train.map(cats.preprocess)))
    assert tuple(image.shape) == (224, 224, 3)


def test_tfds_offline_and_not_prepared_is_one_clear_error(tmp_path):
    empty = tmp_path / "tfds"
    out = run_main("dataset=mnist", "dataset.download=false", f"dataset.data_dir={empty}",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=180)
    lines = error_lines(out.stderr)
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1, lines
    assert "dataset mnist is not prepared in" in lines[0] and str(empty) in lines[0]
    assert "tfds build mnist" in lines[0] and "dataset.download=true" in lines[0]
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not list((tmp_path / "run").rglob("*.keras"))


def write_images(root, classes=("cat", "dog"), per_class=10):
    """PNG and JPEG files of varied sizes, one sub-folder per class."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            size = (20 + 7 * i, 30 + 3 * i, 3)
            pixels = tf.constant(rng.integers(0, 256, size=size, dtype=np.uint8) // (c + 1))
            encoded = tf.io.encode_png(pixels) if i % 2 else tf.io.encode_jpeg(pixels)
            suffix = ".png" if i % 2 else ".jpg"
            (folder / f"{i}{suffix}").write_bytes(encoded.numpy())


def test_image_folder_trains(make_run, tmp_path):
    write_images(tmp_path / "images")
    cfg = make_run("dataset=image_folder", f"dataset.path={tmp_path / 'images'}",
                   "dataset.image_size=32", *FAST, "batch.per_replica=4")
    summary = train(cfg, run_dir=tmp_path / "run")
    assert summary["train_examples"] == 16 and summary["validation_examples"] == 2
    assert summary["test_examples"] == 2 and summary["test_metrics"] is not None
    assert summary["dataset"] == "image_folder"


def test_image_folder_source(tmp_path):
    write_images(tmp_path / "images", classes=("a", "b", "c"), per_class=5)
    source = image_folder.load(str(tmp_path / "images"), image_size=16, channels=1,
                               validation_fraction=0.2)
    assert source.num_classes == 3 and source.input_shape == (16, 16, 1)
    assert (source.train_size, source.validation_size, source.test_size) == (9, 3, 3)
    everything = source.train.concatenate(source.validation).concatenate(source.test)
    labels = sorted(int(y) for _, y in everything)
    assert labels == [0] * 5 + [1] * 5 + [2] * 5


@pytest.mark.parametrize("setup, message", [
    (lambda root: None, "does not exist"),
    (lambda root: (root / "empty_class").mkdir(parents=True), "holds no images"),
])
def test_image_folder_missing_or_empty(tmp_path, setup, message):
    root = tmp_path / "images"
    setup(root)
    with pytest.raises(DataError, match=f"dataset.path={root} {message}; expected one sub-folder"):
        image_folder.load(str(root))
    out = run_main("dataset=image_folder", f"dataset.path={root}",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=180)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.stderr[-2000:]


def first_epoch_labels(seed):
    source = synthetic.load(train_examples=64, validation_examples=8, image_size=4, seed=1)
    ds = build_pipeline(source.train, Batches(16), training=True, order=Order(seed),
                        prep=Prep(scale=source.scale))
    return np.concatenate([y.numpy() for _, y in ds])


def test_resized_byte_images_are_cached_as_bytes():
    """A resize makes float32 of uint8 images; the cache keeps them uint8 (4x smaller)."""
    from trainer.data.pipeline import prepare

    images = tf.data.Dataset.from_tensor_slices(
        (tf.constant([[[[0, 128, 255]]]], tf.uint8), tf.constant([1])))

    def resize(image, label):
        return tf.image.resize(image, (2, 2)), label

    cached = prepare(images, Prep(resize, 1 / 255))
    assert cached.element_spec[0].dtype == tf.uint8
    assert next(iter(cached))[0].numpy().tolist() == [[[0, 128, 255]] * 2] * 2
    assert prepare(images, Prep(resize, 1 / 255, "none")).element_spec[0].dtype == tf.float32
    assert prepare(images, Prep(resize, 1.0)).element_spec[0].dtype == tf.float32


def test_pipeline_order_is_deterministic_with_a_seed():
    np.testing.assert_array_equal(first_epoch_labels(7), first_epoch_labels(7))
    assert not np.array_equal(first_epoch_labels(7), first_epoch_labels(8))


def test_evaluation_and_prediction_batches_keep_the_input_order_without_a_seed():
    """Prediction writes each output beside its input. Without a seed, tf.data was allowed
    to hand over what its parallel maps (the per-batch scaling) finished first: then
    `trainer.predict` on images sometimes wrote a batch's predictions beside the next
    batch's files. Evaluation batches keep the input order; training batches without a seed
    may come in any order (their order is random anyway)."""
    source = synthetic.load(train_examples=10, validation_examples=10, image_size=4, seed=1)
    scaled = Prep(scale=source.scale)
    evaluation = build_pipeline(source.validation, Batches(4), training=False, prep=scaled)
    assert evaluation.options().deterministic is True
    training = build_pipeline(source.train, Batches(4), training=True, prep=scaled)
    assert training.options().deterministic is False
    seeded = build_pipeline(source.train, Batches(4), training=True, prep=scaled,
                            order=Order(seed=3))
    assert seeded.options().deterministic is True


def test_pipeline_keeps_the_last_partial_batch_and_scales():
    source = synthetic.load(train_examples=10, validation_examples=10, image_size=4, seed=1)
    scaled = Prep(scale=source.scale)
    sizes = [int(x.shape[0]) for x, _ in build_pipeline(source.validation, Batches(4),
                                                        training=False, prep=scaled)]
    assert sizes == [4, 4, 2]
    dropped = build_pipeline(source.train, Batches(4, drop_remainder=True), training=True)
    assert [int(x.shape[0]) for x, _ in dropped] == [4, 4]
    x, _ = next(iter(build_pipeline(source.train, Batches(4), training=False, prep=scaled)))
    assert x.dtype == tf.float32
    assert 0.0 <= float(tf.reduce_min(x)) <= float(tf.reduce_max(x)) <= 1.0


@pytest.mark.parametrize("replicas", [1, 3])
def test_reported_validation_accuracy_counts_every_example_once(make_run, tmp_path, replicas):
    """50 examples, global batch 8 x replicas: never a multiple, the last batch uneven (on 3
    replicas a last batch of a few examples; 4 replicas split theirs by the same code)."""
    import keras

    cfg = make_run("dataset=synthetic", "dataset.train_examples=50",
                   "dataset.validation_examples=50", "dataset.image_size=8",
                   "epochs=1", "verbose=0", "logger=[]", "accelerator=cpu",
                   f"devices={replicas}", "batch.per_replica=8", "model=small")
    summary = train(cfg, run_dir=tmp_path)
    model = keras.models.load_model(tmp_path / "checkpoints" / "last.keras")
    source = synthetic.load(train_examples=50, validation_examples=50, image_size=8,
                            seed=cfg.seed)
    x = np.stack([image.numpy() for image, _ in source.validation]) * source.scale
    y = np.array([int(label) for _, label in source.validation])
    expected = model.evaluate(x, y, batch_size=7, return_dict=True, verbose=0)
    predicted = np.argmax(model.predict(x, verbose=0), axis=1)
    assert summary["validation_metrics"]["accuracy"] == pytest.approx(expected["accuracy"],
                                                                       abs=1e-7)
    assert summary["validation_metrics"]["accuracy"] == pytest.approx(np.mean(predicted == y),
                                                                       abs=1e-7)
    assert summary["validation_metrics"]["loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_no_replica_gets_an_empty_share_of_the_last_batch():
    source = synthetic.load(train_examples=50, validation_examples=10, image_size=4, seed=1)
    ds = build_pipeline(source.train, Batches(24, 3, 50), training=True, order=Order(seed=0))
    assert [int(x.shape[0]) for x, _ in ds] == [24, 23, 3]


def test_an_image_that_does_not_decode_is_found_after_tensorflow_fails(tmp_path):
    """Found only when decoding failed: by the byte size TensorFlow's message gives, else
    among all the files; a failure that is not a decoder's is not the folder's."""
    write_images(tmp_path / "images", per_class=4)
    broken = tmp_path / "images" / "dog" / "2.jpg"
    broken.write_bytes(broken.read_bytes()[:100] + b"\0" * 300 + broken.read_bytes()[-2:])
    source = image_folder.load(str(tmp_path / "images"), image_size=8)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        for name in sorted(str(p) for p in (tmp_path / "images").rglob("*.jpg")):
            source.preprocess(tf.constant(name), 0)
    message = source.explain(error.value)
    assert message.startswith(f"dataset=image_folder: {broken} does not decode as an image (")
    assert message.endswith("); remove it or replace it with a good copy")
    # a message without the size: still found
    assert source.explain(RuntimeError("Invalid JPEG data")).startswith(
        f"dataset=image_folder: {broken} does not decode")
    assert source.explain(RuntimeError("out of memory")) is None
    # replaced since, so nothing fails to decode: the folder and the remedy
    broken.write_bytes((tmp_path / "images" / "dog" / "0.jpg").read_bytes())
    assert source.explain(RuntimeError("Invalid JPEG data")) == (
        f"dataset=image_folder: an image under {tmp_path / 'images'} does not decode (Invalid "
        "JPEG data); find it (e.g. open each with an image viewer) and remove or replace it")


@pytest.mark.parametrize("where", ["file", "class folder"])
def test_a_name_that_is_not_utf8_is_one_line_naming_it(tmp_path, where, capsys):
    """TensorFlow's own error ("Error converting unicode string") named no file; the
    TFRecord writer splits folders the same way, and says the same line."""
    import os

    from trainer.data import tfrecords

    root = tmp_path / "images"
    write_images(root)
    if where == "file":
        bad = os.fsencode(root / "cat") + b"/caf\xe9.png"
        os.rename(os.fsencode(root / "cat" / "1.png"), bad)
    else:
        bad = os.fsencode(root) + b"/caf\xe9"
        os.rename(os.fsencode(root / "cat"), bad)
    shown = bad.decode("utf-8", "backslashreplace")
    line = (f"the {where} {shown} has a name that is not UTF-8, which TensorFlow reads file "
            "names as; rename it (e.g. convmv, or mv with the name in UTF-8)")
    with pytest.raises(DataError) as raised:
        image_folder.load(str(root), image_size=8)
    assert str(raised.value) == line
    assert tfrecords.main([str(root), str(tmp_path / "records")]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"
