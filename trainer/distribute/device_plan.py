"""The device plan: which devices a run uses, hiding the rest, memory options, the logical
CPU split.

The decisions are pure functions of the device list (`plan_devices`, `memory_option`), so they
are tested without a GPU; `trainer.distribute.devices.configure_devices` applies a plan to
TensorFlow, which must happen before its runtime starts. A decide module: no TensorFlow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from trainer.config.errors import ConfigError

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
        devices: `"auto"`, a count N, or a sequence of indices, as the config's check
            parsed it (`trainer.config.validate.parse_devices`, once, into the run's
            `Spec`); a SLURM task's share of a node's GPUs is a list.
        num_gpus: physical GPUs TensorFlow sees (after `CUDA_VISIBLE_DEVICES`).
        soft_placement: use what exists, with a warning, instead of failing.

    Returns:
        A `DevicePlan`.
    """
    spec = devices if isinstance(devices, (str, int)) else tuple(devices)
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
