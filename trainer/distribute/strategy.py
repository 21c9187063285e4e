"""Strategy: which tf.distribute strategy, and which cross-device ops, for the chosen devices.

A decide module (no TensorFlow); `trainer.distribute.runtime.build_strategy` creates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config.errors import ConfigError


@dataclass(frozen=True)
class StrategyKind:
    """What differs between the kinds of strategy, in one record per kind.

    Attributes:
        name: the config's name for it.
        several_workers: it spans worker processes (a cluster); one machine otherwise.
        fit_works: Keras 3.15's `fit` trains under it (under MultiWorkerMirroredStrategy it
            fails: keras-team/keras#20585; the custom loop runs instead).
        needs_seed: every worker must shuffle alike, so a run needs a seed.
        resume_from_chief: only the chief keeps backups; every worker continues from its.
        evaluate_as: the kind evaluation uses on one machine.
    """

    name: str
    several_workers: bool = False
    fit_works: bool = True
    needs_seed: bool = False
    resume_from_chief: bool = False
    evaluate_as: str = "auto"


KINDS = {kind.name: kind for kind in (
    StrategyKind("default", evaluate_as="default"),
    StrategyKind("one_device", evaluate_as="one_device"),
    StrategyKind("mirrored", evaluate_as="mirrored"),
    StrategyKind("multi_worker", several_workers=True, fit_works=False, needs_seed=True,
                 resume_from_chief=True),
)}


def choose_strategy(name: str, replicas: int, workers: int = 1, kind: str = "cpu") -> str:
    """Resolves `strategy=auto` and checks the choice fits the devices and the cluster.

    Args:
        name: `auto`, `mirrored`, `one_device`, `multi_worker` or `default`.
        replicas: the number of devices chosen on this machine.
        workers: the number of workers in the cluster (1 without one).
        kind: `gpu` or `cpu`.

    Returns:
        `mirrored`, `one_device`, `multi_worker` or `default`.
    """
    if name == "auto":
        if workers == 1 and replicas == 1:
            # One CPU replica: Keras's default strategy. OneDeviceStrategy copies every batch
            # "to the device" (the host, again): measured on the default run, 380,000 page
            # faults and 1.3 s of system time per epoch, the epoch twice as long.
            return "default" if kind == "cpu" else "one_device"
        if workers == 1:
            return "mirrored"
        name = "multi_worker"
    if workers > 1 and name != "multi_worker":
        raise ConfigError(f"strategy={name} runs on one machine but the cluster has {workers} "
                          "workers; use strategy=multi_worker (or auto)")
    if name == "multi_worker" and kind == "cpu" and replicas > 1:
        raise ConfigError(f"strategy=multi_worker runs one replica per CPU worker, but {replicas} "
                          "CPU devices were chosen; use devices=auto (or 1), and one worker per "
                          "replica (python -m trainer.launch --workers N)")
    if name in ("one_device", "default") and replicas > 1:
        raise ConfigError(f"strategy={name} runs on one device but {replicas} devices were "
                          "chosen; use strategy=mirrored (or auto), or devices=1")
    return name


def choose_cross_device_ops(name: str, kind: str, replicas: int, nccl_available: bool,
                            physical_gpus: int | None = None) -> str:
    """Resolves `strategy.cross_device_ops=auto`.

    On CPUs `auto` keeps MirroredStrategy's own choice, CollectiveAllReduce (ring): measured
    about twice as fast as reduction to one device at 4 logical replicas (plain Keras,
    MobileNetV2 alpha 0.35 at batch 256 on 2 CPU cores: 700-787 against 316 images/s).
    On GPUs it is NCCL, which needs a physical GPU per replica: with logical GPUs carved from
    fewer physical ones it is reduction to one device, TensorFlow's own fallback for virtual
    GPUs (`select_cross_device_ops`).

    Args:
        name: `auto`, `nccl`, `hierarchical_copy`, `reduction_to_one_device` or `collective`.
        kind: `gpu` or `cpu`.
        replicas: the number of replicas.
        nccl_available: whether this TensorFlow build has the NCCL all-reduce kernel.
        physical_gpus: the physical GPUs behind the GPU replicas; None for one per replica.

    Returns:
        The cross-device ops to use, or `none` for a single replica.
    """
    if replicas == 1:
        return "none"
    if name == "nccl" and not (kind == "gpu" and nccl_available):
        raise ConfigError("strategy.cross_device_ops=nccl needs several GPUs and a TensorFlow "
                          f"built with NCCL; received devices of kind {kind}, nccl available: "
                          f"{nccl_available}; valid here: hierarchical_copy, "
                          "reduction_to_one_device, collective")
    # NCCL refuses two ranks on one GPU; several logical GPUs of one physical GPU are that.
    shared = kind == "gpu" and physical_gpus is not None and physical_gpus < replicas
    if name == "nccl" and shared:
        raise ConfigError("strategy.cross_device_ops=nccl needs a physical GPU per replica "
                          "(NCCL cannot all-reduce between logical GPUs of one physical GPU); "
                          "valid here: reduction_to_one_device, hierarchical_copy; received: "
                          f"{replicas} replicas on {physical_gpus} physical GPU(s)")
    if name != "auto":
        return name
    if kind == "gpu":
        if shared:
            return "reduction_to_one_device"
        return "nccl" if nccl_available else "hierarchical_copy"
    return "collective"
