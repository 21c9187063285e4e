"""Strategy: which tf.distribute strategy, and which cross-device ops, for the chosen devices.

Each kind of strategy is one record (`StrategyKind`, in `trainer.config.strategies`, where
the config's check reads their names): when `strategy=auto` picks it, what it refuses, how
it trains, and its builder's dotted name. A decide module (no TensorFlow);
`trainer.distribute.runtime.build_strategy` creates them.
"""

from __future__ import annotations

from trainer.config.errors import ConfigError
from trainer.config.strategies import KINDS, StrategyKind, situation, strategy_kind

__all__ = ["KINDS", "StrategyKind", "choose_cross_device_ops", "choose_strategy",
           "strategy_kind"]


def choose_strategy(name: str, replicas: int, workers: int = 1, kind: str = "cpu") -> str:
    """Resolves `strategy=auto` and checks the choice fits the devices and the cluster.

    Args:
        name: `auto`, a kind's name (`mirrored`, `one_device`, `multi_worker`, `default`),
            or the dotted name of a `StrategyKind` of your own.
        replicas: the number of devices chosen on this machine.
        workers: the number of workers in the cluster (1 without one).
        kind: `gpu` or `cpu`.

    Returns:
        The kind's name (`auto` resolved): its record is `strategy_kind(name)`.
    """
    if name == "auto":
        now = situation(replicas, workers, kind)
        name = next(k.name for k in KINDS.values() if k.auto == now)
    strategy_kind(name).check(replicas, workers, kind)
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
