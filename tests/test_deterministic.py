"""Exact means exact: `deterministic=true` switches oneDNN's CPU kernels off before
TensorFlow starts, a rerun repeats bit for bit, devices that compute the same sums (1 device
with 2 micro-batches of 32, 2 devices of 32) end within 1e-5, and the summary says how exact
a run is and which other runs end with its weights."""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest

from tests.conftest import make_config, run_cli
from trainer.run.end.summary import exactness, random_layers
from trainer.run.prepare.preflight import ONEDNN, exact_kernels, preflight
from trainer.run.train import train


def test_deterministic_switches_onednn_off_unless_the_user_chose():
    environ: dict[str, str] = {}
    exact_kernels(True, environ)
    assert environ == {ONEDNN: "0"}
    chosen = {ONEDNN: "1"}
    exact_kernels(True, chosen)
    assert chosen == {ONEDNN: "1"}
    untouched: dict[str, str] = {}
    exact_kernels(False, untouched)
    assert untouched == {}


def test_the_preflight_sets_it_in_the_environment_tensorflow_starts_with(tmp_path):
    environ: dict[str, str] = {}
    checked = preflight(make_config("deterministic=true", "logger=[]"),
                        run_dir=tmp_path / "run", environ=environ)
    checked.owner.end()
    assert environ.get(ONEDNN) == "0"
    environ = {}
    preflight(make_config("logger=[]"), run_dir=tmp_path / "other",
              environ=environ).owner.end()
    assert ONEDNN not in environ


def test_the_summary_says_how_exact_a_run_is():
    assert exactness(False, "cpu", False, [], 32) is None
    exact = exactness(True, "cpu", False, [], 32)
    assert "oneDNN's CPU kernels off" in exact and "repeats bit for bit" in exact
    assert ("with plain SGD, a run on 2 devices or 2 workers of 32 examples and one on 1 "
            "device with 2 micro-batches of 32 (batch.accumulate=auto "
            "batch.max_per_replica=32) compute the same sums (two partial sums added) and "
            "end within 1e-5") in exact
    assert "a ReLU or max-pooling comparison" in exact
    # 2 workers against 1 worker summing 64 at once (docs/several-machines.md measures it,
    # tests/test_sharded_input.py tests the sums that agree): the inputs are the same, the
    # sums are not
    assert "other device and worker counts differ in their sums' last bits" in exact
    assert "oneDNN's CPU kernels on (TF_ENABLE_ONEDNN_OPTS=1" in exactness(
        True, "cpu", True, [], 32)
    dropout = exactness(True, "cpu", False, ["Dropout"], 32)
    assert "its Dropout layers draw" in dropout and "within 1e-5" not in dropout
    assert "oneDNN" not in exactness(True, "gpu", True, [], 32)


def test_random_layers_are_found_in_nested_models_and_only_when_they_draw():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.GaussianNoise(0.1)])
    inputs = keras.Input((4,))
    x = keras.layers.Dropout(0.0)(inner(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.SpatialDropout1D(0.2)(
        keras.layers.Reshape((2, 2))(x))))
    assert random_layers(model) == ["GaussianNoise", "SpatialDropout1D"]
    assert random_layers(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])) == []


# The default CNN without dropout (which draws each replica's masks on its own), plain SGD
# at 0.05, one epoch at a global batch of 64.
EXACT = ["model=cnn", "model.dropout=0", "optimizer=sgd", "optimizer.lr=0.05", "epochs=1",
         "accelerator=cpu", "batch.per_replica=null", "batch.global_size=64",
         "deterministic=true", "logger=[]", "verbose=0"]


def cli_weights(tmp_path, name: str, *overrides: str, env: dict | None = None):
    run_dir = tmp_path / name
    env = {k: v for k, v in os.environ.items() if k != ONEDNN} | (env or {})
    out = run_cli(*EXACT, *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    model = keras.models.load_model(run_dir / "checkpoints" / "last.keras", compile=False)
    return summary, model.get_weights()


@pytest.mark.long  # two fresh processes: the variable counts only as TensorFlow starts
def test_devices_computing_the_same_micro_batches_end_within_1e_5(tmp_path, monkeypatch):
    """1 replica with 2 micro-batches of 32 and 2 replicas of 32 (measured: 1e-7 apart,
    with oneDNN on or off and one thread per kernel or TensorFlow's); the summary says
    oneDNN was off, and keeps a value the user set (read by the pre-flight from the
    environment, so that run is in this process)."""
    monkeypatch.delenv(ONEDNN, raising=False)
    one, w1 = cli_weights(tmp_path, "one", "devices=1", "batch.accumulate=auto",
                              "batch.max_per_replica=32")
    two, w2 = cli_weights(tmp_path, "two", "devices=2")
    assert (one["replicas"], one["batch"]["accumulate"], two["replicas"]) == (1, 2, 2)
    for a, b in zip(w1, w2, strict=True):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(a)), "relative to the largest"
    assert "oneDNN's CPU kernels off" in two["deterministic"]
    assert ("micro-batches of 32 (batch.accumulate=auto batch.max_per_replica=32)"
            in one["deterministic"])
    monkeypatch.setenv(ONEDNN, "1")
    forced = train(make_config(*EXACT, "devices=1"), run_dir=tmp_path / "forced")
    assert "oneDNN's CPU kernels on (TF_ENABLE_ONEDNN_OPTS=1" in forced["deterministic"]
