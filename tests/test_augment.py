"""Training-data augmentation: seeded, per epoch, after the cache, never on evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

from trainer.config.errors import ConfigError
from trainer.data.augment import check, describe
from trainer.data.augmenters import _affine
from trainer.data.pipeline import Batches, Epochs, Order, Prep, build_training_epochs
from trainer.run.train import train

IMAGES = np.random.default_rng(0).integers(0, 256, (48, 12, 12, 3)).astype(np.uint8)
LABELS = np.arange(48, dtype=np.int32)  # each label names its image


def epochs(augment, seed=7, first=0, count=2):
    data = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS))
    batches = build_training_epochs(data, Batches(16, examples=48),
                                    Epochs(first, first + count), prep=Prep(scale=1 / 255),
                                    order=Order(seed, 48), augment=augment)
    out = [(x.numpy(), y.numpy()) for x, y in batches]
    return [out[i:i + 3] for i in range(0, len(out), 3)]  # 3 batches per epoch


def test_presets_are_checked():
    assert check(["flip", "crop"]) == ["flip", "crop"]
    with pytest.raises(ConfigError, match="unknown augment preset 'flop'; available: flip, "
                                          "crop, rotation, zoom, contrast, mixup, cutmix, "
                                          "randaugment"):
        check(["flop"])
    assert describe([]) is None
    assert describe(["flip"])["where"].startswith("input pipeline (tf.data, CPU)")


def test_same_seed_same_batches_new_variants_each_epoch_same_order():
    plain = epochs([])
    first, again = epochs(["flip", "crop", "contrast"]), epochs(["flip", "crop", "contrast"])
    for a, b in zip(first, again, strict=True):  # the same seed: the same augmented batches
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    for epoch in range(2):  # the seed-determined order is the one without augmentation
        assert [y.tolist() for _, y in first[epoch]] == [y.tolist() for _, y in plain[epoch]]
        assert not all(np.allclose(xa, xp) for (xa, _), (xp, _) in
                       zip(first[epoch], plain[epoch], strict=True))
    # the same image looks different in epoch 1 and epoch 2
    seen = [{int(label): image for x, y in epoch for image, label in zip(x, y, strict=True)}
            for epoch in first]
    assert sum(not np.allclose(seen[0][i], seen[1][i]) for i in range(48)) > 24
    # a resumed run's epoch 2 is the uninterrupted run's epoch 2
    resumed = epochs(["flip", "crop", "contrast"], first=1, count=1)
    for (xa, _), (xb, _) in zip(first[1], resumed[0], strict=True):
        np.testing.assert_array_equal(xa, xb)


def test_rotation_and_zoom_of_zero_are_the_identity():
    image = tf.constant(IMAGES[0], tf.float32)
    np.testing.assert_allclose(_affine(image, tf.constant(0.0), tf.constant(1.0)).numpy(),
                               IMAGES[0], atol=1e-3)
    rotated = epochs(["rotation", "zoom"], count=1)[0]
    assert rotated[0][0].shape == (16, 12, 12, 3) and np.isfinite(rotated[0][0]).all()


def test_randaugment_runs_on_whole_batches_and_changes_them():
    plain, augmented = epochs([], count=1)[0], epochs(["randaugment"], count=1)[0]
    for (xp, yp), (xa, ya) in zip(plain, augmented, strict=True):
        np.testing.assert_array_equal(yp, ya)
        assert xa.shape == xp.shape and 0 <= xa.min() and xa.max() <= 1
    assert not all(np.allclose(xa, xp) for (xa, _), (xp, _) in zip(augmented, plain,
                                                                    strict=True))


def test_a_keras_layer_node_runs_on_whole_batches():
    layer = OmegaConf.create({"_target_": "keras.layers.RandomBrightness", "factor": 0.2,
                              "value_range": [0, 1], "seed": 3})
    batches = epochs([layer], count=1)[0]
    assert all(0 <= x.min() and x.max() <= 1 for x, _ in batches)


def test_evaluation_never_sees_augmentation(make_run, tmp_path):
    from omegaconf import OmegaConf as Conf

    from trainer.evaluate import evaluate_run

    run_dir = tmp_path / "run"
    cfg = make_run("dataset=synthetic", "dataset.train_examples=64",
                   "dataset.validation_examples=16", "dataset.image_size=8", "epochs=1",
                   "verbose=0", "logger=[]", "augment=[flip,crop,rotation,zoom,contrast]")
    summary = train(cfg, run_dir=run_dir)
    assert summary["augment"]["applied"] == ["flip", "crop", "rotation", "zoom", "contrast"]
    (run_dir / ".hydra").mkdir()
    Conf.save(cfg, run_dir / ".hydra" / "config.yaml")
    once, twice = evaluate_run(run_dir), evaluate_run(run_dir)
    assert once["metrics"] == twice["metrics"]


def mixed_epoch(name, seed=7):
    hot = np.eye(48, dtype=np.float32)[LABELS]  # 48 classes: label i is image i
    data = tf.data.Dataset.from_tensor_slices((IMAGES, hot))
    batches = build_training_epochs(data, Batches(16, examples=48), Epochs(0, 1),
                                    prep=Prep(scale=1 / 255), order=Order(seed, 48),
                                    augment=[name])
    return [(x.numpy(), y.numpy()) for x, y in batches]


def test_mixup_mixes_images_and_labels_in_one_proportion():
    originals = IMAGES.astype(np.float32) / 255
    batches = mixed_epoch("mixup")
    for images, labels in batches:
        np.testing.assert_allclose(labels.sum(axis=1), 1, atol=1e-5)
        for image, label in zip(images, labels, strict=True):
            sources = np.argsort(label)[::-1][:2]
            share = label[sources[0]]
            other = sources[1] if label[sources[1]] > 0 else sources[0]
            expected = share * originals[sources[0]] + (1 - share) * originals[other]
            np.testing.assert_allclose(image, expected, atol=1e-5)
    again = mixed_epoch("mixup")
    for (xa, ya), (xb, yb) in zip(batches, again, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_cutmix_pastes_a_box_whose_area_is_the_label_share():
    originals = IMAGES.astype(np.float32) / 255
    for images, labels in mixed_epoch("cutmix"):
        for image, label in zip(images, labels, strict=True):
            mine = int(np.argmax(label))
            pasted = ~np.isclose(image, originals[mine]).all(axis=-1)
            assert pasted.mean() == pytest.approx(1 - label[mine], abs=1e-6)


def test_mixing_makes_every_split_one_hot_and_the_loss_categorical(make_run, tmp_path):
    summary = train(make_run("dataset=synthetic", "dataset.train_examples=64",
                             "dataset.validation_examples=16", "dataset.image_size=8",
                             "epochs=1", "verbose=0", "logger=[]", "augment=[cutmix]"),
                    run_dir=tmp_path / "run")
    assert summary["loss"] == "categorical_crossentropy"
    assert 0 <= summary["validation_metrics"]["accuracy"] <= 1


ROWS = """
import keras
import numpy as np

from trainer.data.pipeline import Source

def load(**_):
    x = np.random.default_rng(0).normal(size=(40, 13)).astype("float32")
    y = np.arange(40) % 3
    return Source.from_arrays(x[:32], y[:32], x[32:], y[32:], num_classes=3)

def build(input_shape, num_classes, **_):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(num_classes)])
"""


@pytest.mark.parametrize("augment", ["[flip]", "[mixup,crop]", "[cutmix]"])
def test_an_image_augmentation_on_tabular_rows_is_one_line(make_run, tmp_path, monkeypatch,
                                                           augment):
    (tmp_path / "rows.py").write_text(ROWS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = make_run("dataset._target_=rows.load", "model._target_=rows.build", "epochs=1",
                   "verbose=0", "logger=[]", f"augment={augment}")
    name = augment.strip("[]").split(",")[-1]
    with pytest.raises(ConfigError) as error:
        train(cfg, run_dir=tmp_path / "run")
    assert str(error.value) == (
        f"augment {name} needs image inputs (height, width, channels); dataset rows.load "
        "gives features of shape (13,): drop it (augment=[]), or keep only mixup")
    assert not (tmp_path / "run").exists()


def test_augmentations_are_checked_against_the_shape_of_the_features():
    from trainer.data.augment import check_inputs

    check_inputs(["flip", "mixup", "randaugment"], (8, 8, 3), "digits")
    check_inputs(["mixup"], (13,), "rows")
    check_inputs([], {"num": (4,), "cat": (1,)}, "shop")
    with pytest.raises(ConfigError, match=r"augment mixup needs one array of features; "
                                          r"dataset shop gives several inputs \(num: \(4,\), "
                                          r"cat: \(1,\)\)"):
        check_inputs(["mixup"], {"num": (4,), "cat": (1,)}, "shop")
    with pytest.raises(ConfigError, match=r"augment zoom needs image inputs"):
        check_inputs(["zoom"], (28, 28), "grey rows")


def test_a_users_preprocess_with_python_control_flow_over_tensors_runs_in_every_epoch():
    """trainer's epoch builder is left unconverted by AutoGraph (it costs a run's start
    seconds); a user's preprocess, run there when nothing is cached, is still converted:
    an `if` and a `for` over tensors work as in `Dataset.map`."""
    def preprocess(image, label):
        if tf.reduce_max(image) > 250:  # a tensor condition: AutoGraph's tf.cond
            image = image // 2
        for _ in tf.range(2):  # a tensor loop: AutoGraph's tf.while_loop
            label = label + 1
        return image, label

    data = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS))
    batches = build_training_epochs(data, Batches(16, examples=48), Epochs(0, 2),
                                    prep=Prep(preprocess, scale=1 / 255, cache="none"),
                                    order=Order(7, 48))
    labels = sorted(int(y) for _, ys in batches for y in ys.numpy())
    assert labels == sorted(list(range(2, 50)) * 2)
