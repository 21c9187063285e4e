"""`model=keras_app`: any keras.applications network with a new head, its weights from
nowhere, ImageNet or a local file, and the one-line errors around them."""

from __future__ import annotations

import urllib.error

import keras
import numpy as np
import pytest

from trainer.config.errors import ConfigError
from trainer.models import keras_app
from trainer.run.train import train

SMALL = ["model=keras_app", "model.input_size=32", "dataset=synthetic",
         "dataset.train_examples=32", "dataset.validation_examples=8", "dataset.image_size=16",
         "batch.per_replica=8", "accelerator=cpu", "devices=2"]


def test_an_unknown_network_lists_close_matches():
    with pytest.raises(ConfigError, match=r"model.name='ResNet50v2' is not a keras.applications "
                                          r"network; close matches: ResNet50V2$"):
        keras_app.find("ResNet50v2")
    with pytest.raises(ConfigError, match=r"close matches: .*EfficientNetV2B0"):
        keras_app.find("EfficientNetV2B")
    assert keras_app.find("ConvNeXtTiny") is keras.applications.ConvNeXtTiny


def test_imagenet_weights_offline_is_one_line_naming_the_file(monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("keras.src.utils.file_utils.urlretrieve", offline)
    with pytest.raises(ConfigError) as error:
        keras_app.build((32, 32, 3), 10, name="MobileNetV3Small", weights="imagenet")
    message = str(error.value)
    assert message.startswith("model.weights=imagenet: Keras could not download "
                              "weights_mobilenet_v3_small_224_1.0_float_no_top")
    assert "pass model.weights=/path/to/weights_mobilenet_v3_small" in message
    assert "\n" not in message


def test_a_weights_file_that_does_not_fit_is_one_line(tmp_path):
    other = keras.applications.MobileNetV3Small(include_top=False, weights=None,
                                                input_shape=(32, 32, 3))
    path = tmp_path / "other.weights.h5"
    other.save_weights(path)
    with pytest.raises(ConfigError, match=rf"model.weights={path} does not fit MobileNetV2 at "
                                          r"this input size \("):
        keras_app.build((32, 32, 3), 10, name="MobileNetV2", weights=str(path))
    with pytest.raises(ConfigError, match="does not exist; valid: null, imagenet"):
        keras_app.build((32, 32, 3), 10, name="MobileNetV2", weights=str(tmp_path / "no.h5"))


def test_preprocessing_is_the_familys_own_on_0_255_inputs():
    layer = keras_app.AppPreprocess("keras.src.applications.resnet_v2")
    images = np.full((1, 4, 4, 1), 0.5, np.float32)
    out = keras.ops.convert_to_numpy(layer(images))
    assert out.shape == (1, 4, 4, 3)  # grey to three channels
    expected = keras.applications.resnet_v2.preprocess_input(np.full((1, 4, 4, 3), 127.5))
    np.testing.assert_allclose(out, expected, atol=1e-6)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """MobileNetV3Small trained an epoch on 2 replicas, once for the tests that read it."""
    from tests.conftest import make_config

    run_dir = tmp_path_factory.mktemp("zoo") / "first"
    summary = train(make_config(*SMALL, "model.name=MobileNetV3Small", "epochs=1",
                                "verbose=0", "logger=[]"), run_dir=run_dir)
    return summary, run_dir


@pytest.mark.long
@pytest.mark.parametrize("name", ["ResNet50V2", "EfficientNetV2B0"])  # MobileNetV3Small: below
def test_networks_train_an_epoch_on_two_replicas(make_run, tmp_path, name):
    summary = train(make_run(*SMALL, f"model.name={name}", "epochs=1", "verbose=0",
                             "logger=[]"), run_dir=tmp_path / "run")
    assert summary["replicas"] == 2 and summary["model"] == "keras_app"
    assert np.isfinite(summary["train_metrics"]["loss"])


@pytest.mark.long
def test_weights_from_an_earlier_runs_checkpoint_load_into_the_backbone(finished_run):
    """MobileNetV3Small trains an epoch on 2 replicas, and its checkpoint's backbone loads
    into a new network's."""
    from trainer.evaluate import load_checkpoint

    summary, first = finished_run
    assert summary["replicas"] == 2 and summary["model"] == "keras_app"
    assert np.isfinite(summary["train_metrics"]["loss"])
    saved = load_checkpoint(first / "checkpoints" / "last.keras")
    loaded = keras_app.build((16, 16, 3), 10, name="MobileNetV3Small", input_size=32,
                             weights=str(first / "checkpoints" / "last.keras"))
    scratch = keras_app.build((16, 16, 3), 10, name="MobileNetV3Small", input_size=32)
    for a, b in zip(loaded.get_layer("backbone").get_weights(),
                    saved.get_layer("backbone").get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    # the head is new; the features under it are the earlier run's
    images = np.random.default_rng(0).random((4, 16, 16, 3)).astype(np.float32)
    features = keras.Model(loaded.input, loaded.get_layer("pool").output)
    trained = keras.Model(saved.input, saved.get_layer("pool").output)
    np.testing.assert_allclose(features.predict(images, verbose=0),
                               trained.predict(images, verbose=0), atol=1e-5)
    fresh = keras.Model(scratch.input, scratch.get_layer("pool").output)
    ours, theirs = features.predict(images, verbose=0), fresh.predict(images, verbose=0)
    assert np.max(np.abs(ours - theirs)) > 0.1 * np.max(np.abs(ours))  # not from scratch
