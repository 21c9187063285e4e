"""Devices: the pure decisions, how they are applied to TensorFlow, and the listing helper."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import tensorflow as tf

from tests.conftest import LOGICAL_CPUS, REPO
from trainer.distribute.device_plan import DeviceError, DevicePlan, memory_option, plan_devices
from trainer.distribute.devices import configure_devices


@pytest.mark.parametrize("devices, visible", [
    ("auto", (0, 1, 2, 3)), (2, (0, 1)), ([1, 3], (1, 3)), ([2], (2,)),
])
def test_gpu_selection(devices, visible):
    plan = plan_devices("auto", devices, num_gpus=4)
    assert plan.kind == "gpu" and plan.visible == visible
    # The selected GPUs are renumbered from 0 once the others are hidden.
    assert plan.names == tuple(f"/gpu:{i}" for i in range(len(visible)))
    assert plan.logical_cpus == 0


def test_auto_without_gpus_is_the_cpu_as_one_replica():
    plan = plan_devices("auto", "auto", num_gpus=0)
    assert plan == DevicePlan("cpu", (), 0, ("/cpu:0",))


@pytest.mark.parametrize("devices, names", [
    ([0, 1], ("/cpu:0", "/cpu:1")), (2, ("/cpu:0", "/cpu:1")), ([1, 3], ("/cpu:1", "/cpu:3"))])
def test_a_device_request_without_gpus_runs_on_logical_cpus_and_says_so(devices, names):
    """`devices=[0,1]` (the README's GPUs 0 and 1) on a machine without a GPU: the same
    replicas on logical CPU devices, as accelerator=cpu gives, with a note for the summary."""
    plan = plan_devices("auto", devices, num_gpus=0)
    assert plan.kind == "cpu" and plan.names == names and plan.warnings == ()
    assert replace(plan, notes=()) == plan_devices("cpu", devices, num_gpus=0)
    shown = "[" + ",".join(map(str, devices)) + "]" if isinstance(devices, list) else devices
    assert plan.notes == (f"no GPU: devices={shown} runs on 2 logical CPU devices",)
    assert plan_devices("cpu", devices, num_gpus=0).notes == ()  # asked for: nothing to say


def test_cpu_split_into_logical_devices():
    plan = plan_devices("cpu", 4, num_gpus=2)
    assert plan.kind == "cpu" and plan.visible == ()  # every GPU hidden: no memory taken there
    assert plan.logical_cpus == 4
    assert plan.names == ("/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3")
    assert plan_devices("cpu", 1, 0).logical_cpus == 0
    assert plan_devices("cpu", [1, 2], 0).names == ("/cpu:1", "/cpu:2")


@pytest.mark.parametrize("devices, bad", [([0, 5], "GPU 5"), (3, "GPU 2"), ([7], "GPU 7")])
def test_missing_gpu_lists_what_exists(devices, bad):
    with pytest.raises(DeviceError) as info:
        plan_devices("gpu", devices, num_gpus=2)
    message = str(info.value)
    assert bad in message and "available GPUs: 0, 1" in message


def test_soft_placement_warns_and_uses_what_exists():
    plan = plan_devices("gpu", [0, 5], num_gpus=2, soft_placement=True)
    assert plan.visible == (0,) and plan.names == ("/gpu:0",)
    assert "GPU 5" in plan.warnings[0]
    fallback = plan_devices("gpu", 2, num_gpus=0, soft_placement=True)
    assert fallback.kind == "cpu" and "no GPU" in fallback.warnings[0]


def test_gpu_requested_without_any():
    with pytest.raises(DeviceError, match="sees no GPU; available: cpu"):
        plan_devices("gpu", "auto", num_gpus=0)


def test_memory_option_decisions():
    assert memory_option(True, None) == ("growth", None)
    assert memory_option(False, None) == ("all", None)
    # A cap and growth exclude each other in TensorFlow; the cap wins.
    assert memory_option(True, 2048) == ("limit", 2048)
    with pytest.raises(DeviceError, match="received: 0"):
        memory_option(True, 0)


class FakeConfig:
    """Records what configure_devices asks of tf.config, for a machine with 3 GPUs."""

    def __init__(self):
        self.gpus = [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(3)]
        self.calls = []
        self.experimental = SimpleNamespace(
            set_memory_growth=lambda d, v: self.calls.append(("growth", d.name, v)))

    def list_physical_devices(self, kind=None):
        return self.gpus if kind == "GPU" else [SimpleNamespace(name="/physical_device:CPU:0")]

    def set_visible_devices(self, devices, kind=None):
        self.calls.append(("visible", [d.name for d in devices], kind))

    def set_logical_device_configuration(self, device, configs):
        limits = [c.memory_limit for c in configs]
        self.calls.append(("logical", device.name, limits))

    LogicalDeviceConfiguration = tf.config.LogicalDeviceConfiguration

    def set_soft_device_placement(self, value):
        self.calls.append(("soft", value))


@pytest.fixture
def fake_tf_config(monkeypatch):
    fake = FakeConfig()
    monkeypatch.setattr(tf, "config", fake)
    monkeypatch.setattr(tf.debugging, "set_log_device_placement",
                        lambda v: fake.calls.append(("log", v)))
    return fake


def test_configure_hides_unselected_gpus_and_sets_growth(fake_tf_config):
    configure_devices(plan_devices("gpu", [0, 2], 3), ("growth", None), True, True)
    calls = fake_tf_config.calls
    assert ("visible", ["/physical_device:GPU:0", "/physical_device:GPU:2"], "GPU") in calls
    growth = [c for c in calls if c[0] == "growth"]
    assert growth == [("growth", "/physical_device:GPU:0", True),
                      ("growth", "/physical_device:GPU:2", True)]
    assert ("soft", True) in calls and ("log", True) in calls


def test_configure_caps_memory_per_selected_gpu(fake_tf_config):
    configure_devices(plan_devices("gpu", [1], 3), ("limit", 1024))
    assert ("logical", "/physical_device:GPU:1", [1024]) in fake_tf_config.calls
    assert not [c for c in fake_tf_config.calls if c[0] == "growth"]


def test_configure_cpu_hides_every_gpu(fake_tf_config):
    configure_devices(plan_devices("cpu", 2, 3), ("growth", None))
    assert ("visible", [], "GPU") in fake_tf_config.calls
    assert ("logical", "/physical_device:CPU:0", [None, None]) in fake_tf_config.calls


def test_started_runtime_accepts_devices_it_already_has():
    # conftest split the CPU into 4 before the runtime started; 2 of them is fine.
    configure_devices(plan_devices("cpu", 2, 0), ("growth", None))
    assert len(tf.config.list_logical_devices("CPU")) == LOGICAL_CPUS


def test_started_runtime_refuses_devices_it_cannot_create():
    with pytest.raises(DeviceError, match="already started .* 4 logical CPU"):
        configure_devices(plan_devices("cpu", 8, 0), ("growth", None))


def test_devices_helper_lists_logical_cpus():
    out = subprocess.run([sys.executable, "-m", "trainer.distribute.devices", "--cpus", "3"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "physical devices:" in out.stdout and "/physical_device:CPU:0" in out.stdout
    assert all(f"/device:CPU:{i} (CPU)" in out.stdout for i in range(3))
