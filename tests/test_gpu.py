"""On a GPU: device visibility, memory growth, the memory cap, and 1 vs 2 logical GPUs.

Skipped where TensorFlow sees no GPU (conftest); `python -m pytest -m gpu` runs them, and so
does scripts/gpu_check.py. Each check runs in a fresh Python: TensorFlow sets its devices up
once per process, and this one's runtime started in conftest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.conftest import GPUS, REPO

pytestmark = pytest.mark.gpu

MEMORY = '''
import subprocess


def gpu_memory():
    """(used, total) MiB of every GPU by nvidia-smi; None without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [[int(float(v)) for v in line.split(",")] for line in out.stdout.splitlines()
            if line.strip()]
'''

GROWTH = MEMORY + '''
import json
import tensorflow as tf
from trainer.distribute.device_plan import memory_option, plan_devices
from trainer.distribute.devices import configure_devices

gpus = tf.config.list_physical_devices("GPU")
before = gpu_memory()
plan = plan_devices("gpu", [0], len(gpus))
configure_devices(plan, memory_option(True, None))
with tf.device("/gpu:0"):
    total = float(tf.reduce_sum(tf.ones((1024, 1024))))
print(json.dumps({
    "physical": [g.name for g in gpus],
    "visible": [g.name for g in tf.config.get_visible_devices("GPU")],
    "logical": len(tf.config.list_logical_devices("GPU")),
    "growth": tf.config.experimental.get_memory_growth(gpus[0]),
    "sum": total, "before": before, "after": gpu_memory()}))
'''

LIMIT = '''
import json
import tensorflow as tf
from trainer.distribute.device_plan import memory_option, plan_devices
from trainer.distribute.devices import configure_devices


def fits(mb):
    try:
        with tf.device("/gpu:0"):
            float(tf.reduce_sum(tf.zeros((mb * 2**18,), tf.float32)[:1]))
        return True
    except tf.errors.ResourceExhaustedError:
        return False


gpus = tf.config.list_physical_devices("GPU")
configure_devices(plan_devices("gpu", [0], len(gpus)), memory_option(True, 512))
limits = [c.memory_limit for c in tf.config.get_logical_device_configuration(gpus[0])]
print(json.dumps({"limits": limits, "small": fits(128), "big": fits(768)}))
'''

EQUAL = '''
import json, sys
import keras
import numpy as np
import tensorflow as tf
from trainer.distribute.runtime import (
    apply_precision,
    build_strategy,
    compute_capability,
    nccl_available,
)
from trainer.distribute.strategy import choose_cross_device_ops
from trainer.run.fit.loop import CustomLoop

loop = sys.argv[1]
gpu = tf.config.list_physical_devices("GPU")[0]
tf.config.set_visible_devices([gpu], "GPU")
tf.config.set_logical_device_configuration(
    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=2048)] * 2)
# TF32 rounds float32 matmuls to a 10-bit mantissa: far coarser than the 1e-5 compared.
tf.config.experimental.enable_tensor_float_32_execution(False)
cross = choose_cross_device_ops("auto", "gpu", 2, nccl_available(), physical_gpus=1)
rng = np.random.default_rng(3)
x = rng.normal(size=(256, 12)).astype("float32")
y = rng.integers(0, 5, size=256).astype("int32")


def make_model():
    init = keras.initializers.GlorotUniform(seed=1)
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(32, activation="relu", kernel_initializer=init)(inputs)
    return keras.Model(inputs, keras.layers.Dense(5, activation="softmax",
                                                  kernel_initializer=init)(hidden))


initial = make_model().get_weights()


def train(replicas):
    names = tuple(f"/gpu:{i}" for i in range(replicas))
    strategy = (build_strategy("one_device", names, "none") if replicas == 1
                else build_strategy("mirrored", names, cross))
    with strategy.scope():
        model = make_model()
        model.set_weights(initial)
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy())
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    if loop == "fit":
        model.fit(data, epochs=2, verbose=0, shuffle=False)
    else:
        CustomLoop(model, strategy).fit(data.repeat(2), epochs=2, steps_per_epoch=8, verbose=0)
    return model.get_weights()


one, two = train(1), train(2)
print(json.dumps({
    "cross": cross, "ops": type(build_strategy("mirrored", ("/gpu:0", "/gpu:1"), cross)
                                .extended._cross_device_ops).__name__,
    "gap": max(float(np.max(np.abs(a - b))) for a, b in zip(one, two)),
    "within": all(np.allclose(b, a, rtol=1e-5, atol=1e-5) for a, b in zip(one, two)),
    "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(initial, one))}))
'''


def run_python(code: str, *args: str, timeout: float = 600) -> dict:
    """Runs `code` in a fresh Python; returns the JSON object of its last stdout line."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p)}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_this_process_grows_its_gpu_memory():
    """conftest sets growth before the runtime starts, leaving the GPU to the subprocesses."""
    assert GPUS and all(tf.config.experimental.get_memory_growth(g) for g in GPUS)


def test_devices_0_sees_gpu_0_only_with_memory_growth():
    found = run_python(GROWTH)
    assert found["visible"] == found["physical"][:1] and found["logical"] == 1, found
    assert found["growth"] is True and found["sum"] == 1024 * 1024
    if found["before"] is not None:  # nvidia-smi: the process did not take the GPU
        taken = max((a[0] - b[0]) / a[1] for a, b in zip(found["after"], found["before"],
                                                      strict=True))
        assert taken < 0.5, found


def test_memory_limit_mb_caps_the_gpu():
    found = run_python(LIMIT)
    assert found == {"limits": [512], "small": True, "big": False}


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_one_and_two_logical_gpus_of_one_gpu_train_to_the_same_weights(loop):
    found = run_python(EQUAL, loop)
    assert found["cross"] == "reduction_to_one_device", found
    assert found["ops"] == "ReductionToOneDevice"
    assert found["within"] and found["moved"] > 1e-3, found
