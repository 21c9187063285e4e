"""Devices made real in TensorFlow: a device plan (`trainer.distribute.device_plan`) applied
(visibility, memory, the logical CPU split), process-wide determinism, and
`python -m trainer.distribute.devices`, which lists what TensorFlow sees. A build module
(TensorFlow at the top): it must run before TensorFlow's runtime starts.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import tensorflow as tf

from trainer.distribute.cluster import Cluster, slurm_devices
from trainer.distribute.device_plan import DeviceError, DevicePlan, memory_option, plan_devices
from trainer.internals.tf_runtime import disable_op_determinism, onednn_enabled

log = logging.getLogger(__name__)


def open_devices(asked: Any, cluster: Cluster | None = None) -> DevicePlan:
    """Chooses the devices a run asks for on this machine (a SLURM task's share of them in
    a cluster), applies the plan, and returns it.

    Args:
        asked: what the config asks (`accelerator`, `devices`, `soft_placement`,
            `log_placement`, `memory_growth`, `memory_limit_mb`).
        cluster: the multi-worker cluster, or None on one machine.
    """
    gpus = len(tf.config.list_physical_devices("GPU"))
    plan = plan_devices(asked.accelerator,
                        slurm_devices(asked.devices, cluster, gpus, asked.accelerator),
                        gpus, asked.soft_placement)
    configure_devices(plan, memory_option(asked.memory_growth, asked.memory_limit_mb),
                      asked.soft_placement, asked.log_placement)
    return plan


# What `deterministic=true` cannot do in a process whose TensorFlow started with oneDNN's
# kernels on (`train(cfg)` in a notebook, a test session; `trainer.fit` runs in a fresh
# process instead), and what that costs (measured: docs/devices-and-performance.md).
ONEDNN_STAYS_ON = (
    "deterministic=true: oneDNN's CPU kernels stay on in this process (TensorFlow started "
    "before the run could set TF_ENABLE_ONEDNN_OPTS=0): a rerun here repeats bit for bit, but "
    "a run started fresh takes TensorFlow's own kernels and ends 1e-6 to 1e-2 apart (1e-2 "
    "where a ReLU or max-pooling comparison flips); run it in a new process (the command "
    "line, or trainer.fit, which starts one) for the same kernels everywhere")


def set_determinism(on: bool) -> None:
    """TensorFlow's op determinism is process-wide: set it either way, so a second run in one
    process (a notebook, a test session) gets what its own config says. On the CPU, says in
    one line where oneDNN's kernels stay on though the user did not ask for them."""
    if on:
        tf.config.experimental.enable_op_determinism()
        if (onednn_enabled() and os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "1"
                and not tf.config.list_logical_devices("GPU")):
            log.warning(ONEDNN_STAYS_ON)
    else:
        disable_op_determinism()


def configure_devices(plan: DevicePlan, memory: tuple[str, int | None],
                      soft_placement: bool = False, log_device_placement: bool = False) -> None:
    """Applies a plan to TensorFlow: visibility, memory, the logical CPU split.

    Args:
        plan: from `plan_devices`.
        memory: from `memory_option`.
        soft_placement: let ops without a kernel on the chosen device fall back to another.
        log_device_placement: log the device every op runs on.

    Raises:
        DeviceError: when TensorFlow's runtime already started with a different device setup.
    """
    for warning in plan.warnings:
        log.warning(warning)
    gpus = tf.config.list_physical_devices("GPU")
    try:
        tf.config.set_visible_devices([gpus[i] for i in plan.visible], "GPU")
        for i in plan.visible:
            _apply_memory(tf, gpus[i], memory)
        if plan.logical_cpus:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * plan.logical_cpus)
    except RuntimeError:
        _check_already_started(tf, plan)
    tf.config.set_soft_device_placement(soft_placement)
    tf.debugging.set_log_device_placement(log_device_placement)


def _apply_memory(tf: Any, gpu: Any, memory: tuple[str, int | None]) -> None:
    option, limit = memory
    if option == "limit":
        tf.config.set_logical_device_configuration(
            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)])
    elif option == "growth":
        tf.config.experimental.set_memory_growth(gpu, True)


def _check_already_started(tf: Any, plan: DevicePlan) -> None:
    """Accepts a started runtime that already has every device the plan names."""
    missing = missing_devices(plan)
    if missing:
        have = tf.config.list_logical_devices(plan.kind.upper())
        raise DeviceError(
            f"TensorFlow already started in this process with {len(have)} logical "
            f"{plan.kind.upper()} device(s), so {', '.join(missing)} cannot be created; run "
            "in a new process")


def missing_devices(plan: DevicePlan) -> list[str]:
    """The devices of `plan` that this process's TensorFlow does not have: the ones a
    started runtime can no longer create (`trainer.fit` then runs in a fresh process).

    Args:
        plan: from `plan_devices`.

    Returns:
        Their names as `plan.names` spells them (`/cpu:3`); empty where it has them all.
    """
    # "/device:CPU:3" -> "/cpu:3", the form plan.names uses
    have = {"/" + d.name.lower().split("/device:")[-1]
            for d in tf.config.list_logical_devices(plan.kind.upper())}
    return [n for n in plan.names if n.lower() not in have]


def describe_devices() -> str:
    """Lists the physical and logical devices TensorFlow sees, one per line."""
    lines = ["physical devices:"]
    for d in tf.config.list_physical_devices():
        details = tf.config.experimental.get_device_details(d) if d.device_type == "GPU" else {}
        extra = f"  {details.get('device_name', '')}" if details else ""
        lines.append(f"  {d.name} ({d.device_type}){extra}")
    lines.append("logical devices:")
    lines += [f"  {d.name} ({d.device_type})" for d in tf.config.list_logical_devices()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.distribute.devices [--cpus N]`: prints the devices TensorFlow sees."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer.distribute.devices",
                                     description=main.__doc__)
    parser.add_argument("--cpus", type=int, default=0,
                        help="split the host CPU into N logical devices first")
    args = parser.parse_args(argv)
    if args.cpus > 1:
        configure_devices(plan_devices("cpu", args.cpus, 0), ("all", None))
    print(describe_devices())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
