"""Train, validation and test roles: every source's splits, the test split read once at the
end with the chosen checkpoint, and `trainer.evaluate split=test` on any replica count."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.conftest import run_main
from tests.test_data import write_images
from trainer.config.errors import ConfigError
from trainer.data import digits, image_folder
from trainer.data.pipeline import DataError
from trainer.data.tfds import resolve_splits
from trainer.run.train import train

FAST = ["epochs=2", "verbose=0", "logger=[]", "accelerator=cpu"]


def elements(dataset) -> list[bytes]:
    return [x.numpy().tobytes() + bytes([int(y)]) for x, y in dataset]


def test_digits_has_a_fixed_test_split_no_example_in_two_roles():
    source = digits.load()
    assert (source.train_size, source.validation_size, source.test_size) == (1437, 180, 180)
    train_, val, test = (elements(d) for d in (source.train, source.validation, source.test))
    assert not set(train_) & set(val) and not set(train_) & set(test) and not set(val) & set(test)
    # fixed: the same test examples on every load, and training keeps its 1437 examples
    assert elements(digits.load(seed=7).test) == test
    assert digits.load(test_fraction=0.0).test is None


@pytest.mark.parametrize("available, asked, expected", [
    # only train and test (mnist, cifar10): validation carved from train, test kept
    (["train", "test"], ("train", "auto", "auto"), ("train[:90%]", "train[90%:]", "test")),
    # a validation split of its own: used as it is
    (["train", "validation", "test"], ("train", "auto", "auto"),
     ("train", "validation", "test")),
    # train only (cats_vs_dogs): no test unless asked
    (["train"], ("train", "auto", "auto"), ("train[:90%]", "train[90%:]", None)),
    (["train", "test"], ("train", "auto", None), ("train[:90%]", "train[90%:]", None)),
    # explicit slices win; test used for validation is not also the test split
    (["train", "test"], ("train", "test", "auto"), ("train", "test", None)),
    (["train"], ("train[:80%]", "train[80%:90%]", "train[90%:]"),
     ("train[:80%]", "train[80%:90%]", "train[90%:]")),
    (["train", "validation", "test"], ("train+validation", "test", None),
     ("train+validation", "test", None)),
])
def test_tfds_split_roles(available, asked, expected):
    assert resolve_splits("d", available, *asked, 0.1) == expected


def test_tfds_split_mistakes_are_one_line():
    with pytest.raises(ConfigError, match=r"dataset.test_split='tst': d has no split 'tst'; "
                                          r"its splits: train, test"):
        resolve_splits("d", ["train", "test"], "train", "auto", "tst", 0.1)
    with pytest.raises(ConfigError, match=r"cannot carve from the slice 'train\[:50%\]'"):
        resolve_splits("d", ["train", "test"], "train[:50%]", "auto", "auto", 0.1)


def test_image_folder_role_folders(tmp_path):
    root = tmp_path / "images"
    write_images(root / "train", per_class=6)
    write_images(root / "val", per_class=2)
    write_images(root / "test", per_class=3)
    source = image_folder.load(str(root), image_size=8)
    assert (source.train_size, source.validation_size, source.test_size) == (12, 4, 6)
    assert source.num_classes == 2
    paths = {role: {p.numpy().decode() for p, _ in getattr(source, role)}
             for role in ("train", "validation", "test")}
    assert all(p.startswith(str(root / "train")) for p in paths["train"])
    assert all(p.startswith(str(root / "val")) for p in paths["validation"])
    assert all(p.startswith(str(root / "test")) for p in paths["test"])
    # without a validation folder, validation is held out of train/, per class
    (root / "val").rename(tmp_path / "elsewhere")
    source = image_folder.load(str(root), image_size=8, validation_fraction=0.5)
    assert (source.train_size, source.validation_size, source.test_size) == (6, 6, 6)


def test_image_folder_single_folder_split_by_fixed_fractions(tmp_path):
    root = tmp_path / "images"
    write_images(root, classes=("a", "b", "c"), per_class=10)
    source = image_folder.load(str(root), image_size=8, validation_fraction=0.2,
                               test_fraction=0.1)
    assert (source.train_size, source.validation_size, source.test_size) == (21, 6, 3)
    roles = [sorted(p.numpy().decode() for p, _ in getattr(source, role))
             for role in ("train", "validation", "test")]
    assert len(set().union(*roles)) == 30  # every image in exactly one role
    labels = [sorted(int(y) for _, y in getattr(source, r)) for r in ("validation", "test")]
    assert labels == [[0, 0, 1, 1, 2, 2], [0, 1, 2]]  # per class
    again = image_folder.load(str(root), image_size=8, validation_fraction=0.2,
                              test_fraction=0.1)
    assert sorted(p.numpy().decode() for p, _ in again.test) == roles[2]
    image, _ = next(iter(source.train.map(source.preprocess)))
    assert image.shape == (8, 8, 3)


def test_image_folder_test_classes_must_be_trained_on(tmp_path):
    root = tmp_path / "images"
    write_images(root / "train", classes=("cat", "dog"), per_class=3)
    write_images(root / "test", classes=("cat", "cow"), per_class=1)
    with pytest.raises(DataError, match="has classes train/ lacks: cow"):
        image_folder.load(str(root))


READS: list[float] = []


def counted_tfds(**options):
    """The TFDS loader, its test split noting the time each element is read."""
    from trainer.data import tfds as tfds_source

    source = tfds_source.load(**options)

    def mark():
        READS.append(time.time())
        return np.int64(0)

    def count(image, label):
        zero = tf.reshape(tf.numpy_function(mark, [], tf.int64), [])
        return image, label + tf.cast(zero, label.dtype)

    source.test = source.test.map(count)
    return source


@pytest.mark.long  # the default run stays under 8 minutes on 2 cores
def test_tfds_without_validation_carves_it_and_reads_test_once_at_the_end(make_run,
                                                                           tmp_path):
    READS.clear()
    with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
        cfg = make_run("dataset=mnist", "dataset._target_=test_splits.counted_tfds",
                       *FAST, "devices=2", "batch.per_replica=8",
                       f"dataset.data_dir={tmp_path / 'tfds'}")
        summary = train(cfg, run_dir=tmp_path / "run")
    # (TFDS's mock gives every split, sliced or not, num_examples examples)
    assert summary["splits"] == {"train": "train[:90%]", "validation": "train[90%:]",
                                 "test": "test"}
    assert summary["test_examples"] == 40
    assert set(summary["test_metrics"]) == {"loss", "accuracy"}
    assert set(summary["validation_metrics"]) == {"loss", "accuracy"}
    assert summary["test_checkpoint"].endswith("best.keras")
    # every test example read exactly once, after the last checkpoint was written
    assert len(READS) == 40
    written = max((tmp_path / "run" / "checkpoints" / n).stat().st_mtime
                  for n in ("best.keras", "last.keras"))
    assert min(READS) >= written


@pytest.mark.long
def test_test_split_evaluated_on_1_3_4_replicas_equals_numpy_over_every_example(tmp_path,
                                                                               capsys):
    """The run and `python -m trainer.evaluate RUN split=test devices=N` in this process
    (its TensorFlow has 4 logical CPUs already): 180 test examples, never a multiple of the
    global batch on any of the counts."""
    from trainer.evaluate import load_checkpoint
    from trainer.evaluate import main as evaluate

    run_dir = tmp_path / "run"
    out = run_main("epochs=1", "verbose=0", "logger=[]", "dataset.image_size=8", "model=small",
                   f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())

    source = digits.load(image_size=8)
    batch = next(iter(source.test.map(source.preprocess).batch(1000)))
    images, labels = tf.cast(batch[0], tf.float32).numpy() / 16.0, batch[1].numpy()
    model = load_checkpoint(run_dir / "checkpoints" / "best.keras")
    probabilities = model.predict(images, verbose=0)
    accuracy = float(np.mean(np.argmax(probabilities, axis=1) == labels))
    loss = float(np.mean(-np.log(probabilities[np.arange(len(labels)), labels])))
    assert len(labels) == 180
    assert summary["test_metrics"]["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    capsys.readouterr()
    for replicas in (1, 3, 4):
        assert evaluate([str(run_dir), "split=test", "accelerator=cpu",
                         f"devices={replicas}"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["split"] == "test" and result["examples"] == 180
        assert result["replicas"] == replicas
        assert result["metrics"]["accuracy"] == pytest.approx(accuracy, abs=1e-6)
        assert result["metrics"]["loss"] == pytest.approx(loss, rel=1e-4)


def test_evaluate_names_a_missing_test_split_and_a_bad_split(make_run, tmp_path):
    from omegaconf import OmegaConf

    from trainer.evaluate import evaluate_run

    run_dir = tmp_path / "run"
    cfg = make_run("dataset=synthetic", "dataset.train_examples=32",
                   "dataset.validation_examples=8", "dataset.image_size=8", "epochs=1",
                   "verbose=0", "logger=[]")
    summary = train(cfg, run_dir=run_dir)
    assert summary["test_metrics"] is None and summary["test_examples"] == 0
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    with pytest.raises(ConfigError, match="split must be validation or test; received: 'trn'"):
        evaluate_run(run_dir, ["split=trn"])
    with pytest.raises(ConfigError, match=f"the dataset of {run_dir} has no test split; valid: "
                                          "split=validation"):
        evaluate_run(run_dir, ["split=test"])
    assert evaluate_run(run_dir, ["split=validation"])["examples"] == 8
