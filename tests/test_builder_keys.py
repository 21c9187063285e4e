"""A builder gets only what it takes: where `model._target_` or `dataset._target_` replaces
the default group's builder, the group's own keys (`dropout`, `image_size`, ...) reach it
only where its signature names them (or takes `**kwargs`); a key the user sets is passed,
and refused in one line by a builder that does not take it."""

from __future__ import annotations

import textwrap

import pytest
from omegaconf import OmegaConf

from tests.conftest import make_config
from trainer.config.build import group_defaults, taken_by
from trainer.config.errors import ConfigError
from trainer.config.schema import CnnConfig, DigitsConfig
from trainer.run.prepare.resolve import resolve
from trainer.run.train import train

STRICT = """
import keras
import numpy as np

from trainer.data.pipeline import Source


def build(input_shape, num_classes):  # no dropout, no **kwargs: a script's own function
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes, activation="softmax")])


def load(seed):  # no image_size, validation_fraction, ...
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 4)).astype("float32"), rng.integers(0, 3, 96)
    return Source.from_arrays(x[:64], y[:64], x[64:], y[64:], num_classes=3)
"""


@pytest.fixture
def strict_module(tmp_path, monkeypatch):
    (tmp_path / "strict_task.py").write_text(textwrap.dedent(STRICT))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "strict_task"


def test_the_default_groups_keys_are_named_only_where_the_target_is_replaced(strict_module):
    cfg = make_config("model._target_=strict_task.build", "dataset._target_=strict_task.load")
    spec = resolve(cfg)
    assert spec.model_defaults == ("dropout",)
    assert set(spec.dataset_defaults) == {"image_size", "validation_fraction", "test_fraction",
                                          "cache", "shuffle", "shuffle_buffer", "service",
                                          "memory_limit_mb", "lanes"}
    assert resolve(make_config()).model_defaults == ()  # the group's own builder takes them all
    # a key the user set is the user's, passed as it is
    raw = OmegaConf.to_container(make_config("model._target_=strict_task.build",
                                             "model.dropout=0.5").model, resolve=False)
    assert group_defaults(CnnConfig, raw) == ()
    assert group_defaults(dict, {"_target_": "x.build", "dropout": 0.25}) == ()


def test_a_builder_receives_what_its_signature_takes():
    def strict(input_shape, num_classes):
        pass

    def open_ended(input_shape, **options):
        pass

    node = {"_target_": "m.build", "dropout": 0.25, "width": 3}
    assert taken_by(strict, node, ("dropout",)) == {"_target_": "m.build", "width": 3}
    assert taken_by(open_ended, node, ("dropout",)) == node
    assert group_defaults(DigitsConfig, {"_target_": "m.load",
                                         "image_size": "${trainer.image_size:8}"}) == (
        "image_size",)


def test_a_script_function_without_the_groups_keys_trains(tiny_config, strict_module, tmp_path):
    summary = train(tiny_config(f"model._target_={strict_module}.build",
                                f"dataset._target_={strict_module}.load",
                                "checkpoint.monitor=val_loss"), run_dir=tmp_path / "run")
    assert summary["epochs_done"] == 1


def test_a_key_the_user_sets_reaches_the_builder_and_is_refused_there(tiny_config,
                                                                      strict_module, tmp_path):
    with pytest.raises(ConfigError, match="unexpected keyword argument 'dropout'"):
        train(tiny_config(f"model._target_={strict_module}.build", "model.dropout=0.5",
                          f"dataset._target_={strict_module}.load"), run_dir=tmp_path / "run")
