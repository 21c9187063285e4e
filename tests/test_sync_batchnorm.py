"""`sync_batchnorm=true`: batch normalization with the global batch's statistics, so a model
with BatchNormalization ends with the same weights (moving mean and variance included) on 1
and 2 replicas at the same global batch; without it, each replica normalizes with its own
share and the weights differ. The runs are the parity tests' (`tests/test_parity.py`): plain
SGD, a fixed data order, 301 rows at a global batch of 64 (a last batch split 23/22).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tests.test_parity import run, same
from trainer.config.errors import ConfigError
from trainer.distribute.runtime import batch_norm_layers, synchronize_batch_norm
from trainer.rundir.resume import check_resume

BN = ["model._target_=parity_task.batchnorm_model", "dataset._target_=parity_task.dict_inputs",
      "epochs=1"]


def test_sync_batchnorm_makes_two_replicas_end_with_one_replicas_weights(tiny_config,
                                                                         tmp_path):
    one, w1 = run(tiny_config, tmp_path, 1, *BN, "sync_batchnorm=true", name="one")
    apart, w_apart = run(tiny_config, tmp_path, 2, *BN, name="apart")
    synced, w_synced = run(tiny_config, tmp_path, 2, *BN, "sync_batchnorm=true", name="sync")
    # embedding, dense, 2 x (gamma, beta, moving mean, moving variance), dense
    assert len(w1) == len(w_synced) == 1 + 2 + 2 * 4 + 2
    with pytest.raises(AssertionError):  # per-replica statistics: another training
        same(w1, w_apart)
    same(w1, w_synced)
    assert synced["batch_norm"] == ("synchronized across 2 replicas: 2 BatchNormalization "
                                    "layers normalize with the global batch's mean and "
                                    "variance")
    assert apart["batch_norm"].startswith("per replica: 2 BatchNormalization layers")
    assert one["batch_norm"] == ("sync_batchnorm=true: one replica, nothing to synchronize "
                                 "(2 BatchNormalization layers)")


class Block(keras.layers.Layer):
    """A user's own layer holding a BatchNormalization."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.norm = keras.layers.BatchNormalization()

    def call(self, x, training=None):
        return self.norm(x, training=training)


def test_every_batch_norm_is_switched_nested_and_inside_a_users_layer():
    """MobileNetV2 (Keras's application, nested as a layer), and a user's own layer."""
    backbone = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35,
                                              weights=None, include_top=False)
    inputs = keras.Input((32, 32, 3))
    outputs = Block()(keras.layers.GlobalAveragePooling2D()(backbone(inputs)))
    model = keras.Model(inputs, outputs)
    layers = batch_norm_layers(model)
    assert len(layers) == 1 + sum(isinstance(layer, keras.layers.BatchNormalization)
                                  for layer in backbone.layers) > 30
    assert synchronize_batch_norm(model, True, 1).startswith("sync_batchnorm=true: one")
    assert not any(layer.synchronized for layer in layers)  # one replica: untouched
    assert synchronize_batch_norm(model, False, 2).startswith("per replica")
    assert synchronize_batch_norm(model, True, 2).startswith("synchronized across 2")
    assert all(layer.synchronized for layer in layers)
    assert synchronize_batch_norm(model, False, 2).endswith("synchronized by the model itself")
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert synchronize_batch_norm(plain, False, 2) is None
    assert "no BatchNormalization" in synchronize_batch_norm(plain, True, 2)
    assert np.isfinite(model.predict(np.zeros((2, 32, 32, 3)), verbose=0)).all()


def test_micro_batches_on_several_replicas_are_refused_in_one_line(tiny_config, tmp_path):
    """tf.distribute refuses an all-reduce inside the micro-batch loop (a `merge_call`
    RuntimeError deep in the first trace): refused before training, in one line."""
    with pytest.raises(ConfigError, match=r"^sync_batchnorm=true cannot synchronize batch "
                       r"norm inside batch.accumulate's micro-batch loop .*received: "
                       r"batch.accumulate=2 on 2 replicas"):
        run(tiny_config, tmp_path, 2, *BN, "sync_batchnorm=true", "batch.accumulate=2")


def test_a_backup_from_before_the_option_resumes_as_false_and_a_change_is_refused(tmp_path):
    old = {"epoch": 1, "step": 0, "config": {"epochs": 2, "seed": 42}}
    assert check_resume(tmp_path, old, {"epochs": 3, "seed": 42, "sync_batchnorm": False}) \
        == {"epochs": [2, 3]}
    with pytest.raises(ConfigError, match="sync_batchnorm"):
        check_resume(tmp_path, old, {"epochs": 3, "seed": 42, "sync_batchnorm": True})
