"""Devices: which ones a run uses, hiding the rest, memory options, the logical CPU split.

The decisions are pure functions of the device list (`plan_devices`, `memory_option`), so they
are tested without a GPU; `configure_devices` applies a plan to TensorFlow, which must happen
before its runtime starts. `python -m trainer.distribute.devices` lists what TensorFlow sees.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from trainer.config.errors import ConfigError
from trainer.config.validate import parse_devices

log = logging.getLogger(__name__)


class DeviceError(ConfigError):
    """A requested device that does not exist, or a device setup TensorFlow refuses."""


@dataclass(frozen=True)
class DevicePlan:
    """The devices a run uses.

    Attributes:
        kind: `"gpu"` or `"cpu"`.
        visible: physical GPU indices to keep visible (empty for a CPU run: all hidden).
        logical_cpus: logical CPU devices to split the host into (0 keeps TensorFlow's one).
        names: the devices the strategy places replicas on, e.g. `("/gpu:0", "/gpu:1")`.
        warnings: what soft placement changed, for the log and the summary.
        notes: how a request was read on this machine (a device list without a GPU), for
            the summary.
    """

    kind: str
    visible: tuple[int, ...]
    logical_cpus: int
    names: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def plan_devices(accelerator: str, devices: Any, num_gpus: int,
                 soft_placement: bool = False) -> DevicePlan:
    """Decides which devices a run uses.

    Args:
        accelerator: `"auto"`, `"gpu"` or `"cpu"`.
        devices: `"auto"`, a count N, or a list of indices (see
            `trainer.config.validate.parse_devices`).
        num_gpus: physical GPUs TensorFlow sees (after `CUDA_VISIBLE_DEVICES`).
        soft_placement: use what exists, with a warning, instead of failing.

    Returns:
        A `DevicePlan`.
    """
    spec = parse_devices(devices)
    kind = accelerator if accelerator != "auto" else ("gpu" if num_gpus else "cpu")
    if kind == "gpu" and not num_gpus:
        if not soft_placement:
            raise DeviceError("accelerator=gpu but TensorFlow sees no GPU; available: cpu "
                              "(use accelerator=cpu, or soft_placement=true)")
        return _cpu_plan(spec, ("no GPU found; using the CPU instead",))
    if kind == "gpu":
        return _gpu_plan(spec, num_gpus, soft_placement)
    plan = _cpu_plan(spec)
    if accelerator == "auto" and spec != "auto":
        # devices=[0,1] or devices=2 on a machine without a GPU: the same replicas on the
        # host CPU split into logical devices (as accelerator=cpu), said in the summary
        count = len(plan.names)
        plan = replace(plan, notes=(f"no GPU: devices={_show(spec)} runs on {count} logical "
                                    f"CPU device{'s' if count > 1 else ''}",))
    return plan


def _gpu_plan(spec: Any, num_gpus: int, soft_placement: bool) -> DevicePlan:
    if spec == "auto":
        wanted = tuple(range(num_gpus))
    elif isinstance(spec, int):
        wanted = tuple(range(spec))
    else:
        wanted = spec
    missing = [i for i in wanted if i >= num_gpus]
    warnings: tuple[str, ...] = ()
    if missing:
        message = (f"GPU {', '.join(map(str, missing))} requested by devices={_show(spec)} does "
                   f"not exist; available GPUs: {', '.join(map(str, range(num_gpus)))}")
        if not soft_placement:
            raise DeviceError(message)
        wanted = tuple(i for i in wanted if i < num_gpus) or (0,)
        warnings = (message + f"; using GPU {', '.join(map(str, wanted))}",)
    names = tuple(f"/gpu:{n}" for n in range(len(wanted)))  # renumbered once the rest are hidden
    return DevicePlan("gpu", wanted, 0, names, warnings)


def _cpu_plan(spec: Any, warnings: tuple[str, ...] = ()) -> DevicePlan:
    if spec == "auto":
        return DevicePlan("cpu", (), 0, ("/cpu:0",), warnings)
    indices = tuple(range(spec)) if isinstance(spec, int) else spec
    logical = max(indices) + 1
    return DevicePlan("cpu", (), logical if logical > 1 else 0,
                      tuple(f"/cpu:{i}" for i in indices), warnings)


def _show(spec: Any) -> str:
    return "[" + ",".join(map(str, spec)) + "]" if isinstance(spec, tuple) else str(spec)


def memory_option(memory_growth: bool, memory_limit_mb: int | None) -> tuple[str, int | None]:
    """Decides how TensorFlow may take GPU memory.

    A memory cap and memory growth exclude each other in TensorFlow (a capped GPU becomes a
    logical device, and growth cannot be set on those), so the cap wins when both are asked.

    Args:
        memory_growth: grow the allocation on demand instead of taking the whole GPU.
        memory_limit_mb: a cap per GPU in MiB, or None.

    Returns:
        `("limit", mb)`, `("growth", None)` or `("all", None)` (TensorFlow's default).
    """
    if memory_limit_mb is not None:
        if memory_limit_mb <= 0:
            raise DeviceError(f"gpu.memory_limit_mb must be a positive number of MiB; "
                              f"received: {memory_limit_mb}")
        return ("limit", memory_limit_mb)
    return ("growth", None) if memory_growth else ("all", None)


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
    import tensorflow as tf

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
    kind = plan.kind.upper()
    # "/device:CPU:3" -> "/cpu:3", the form plan.names uses
    have = {"/" + d.name.lower().split("/device:")[-1]
            for d in tf.config.list_logical_devices(kind)}
    missing = [n for n in plan.names if n.lower() not in have]
    if missing:
        raise DeviceError(
            f"TensorFlow already started in this process with {len(have)} logical {kind} "
            f"device(s), so {', '.join(missing)} cannot be created; run in a new process")


def describe_devices() -> str:
    """Lists the physical and logical devices TensorFlow sees, one per line."""
    import tensorflow as tf

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
