"""Strategy: one tf.distribute strategy, and its cross-device ops, for the chosen devices."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from trainer.config.errors import ConfigError
from trainer.distribute.cluster import Cluster

# Every MirroredStrategy numbers its collective groups from 1. A second strategy in the same
# process over another device count then joins group 1 with a different size, and TensorFlow
# aborts ("joining a group with size 4, but that group has size 2"). TF's own tests avoid
# this with `_collective_key_base`; we give each strategy a key range of its own the same way.
# Ranges start at 1: range 0 stays TensorFlow's default, for strategies built by other code.
_KEY_RANGE = 100_000
_strategies_built = itertools.count(1)


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


def nccl_available() -> bool:
    """Whether this TensorFlow build registers the NCCL all-reduce kernel (as TF itself checks)."""
    from tensorflow.python.framework import kernels

    return bool(kernels.get_registered_kernels_for_op("NcclAllReduce").kernel)


def build_cross_device_ops(name: str) -> Any:
    """Returns the `tf.distribute.CrossDeviceOps` for a resolved name (None: TF's own)."""
    import tensorflow as tf

    return {
        "nccl": lambda: tf.distribute.NcclAllReduce(),
        "hierarchical_copy": lambda: tf.distribute.HierarchicalCopyAllReduce(),
        "reduction_to_one_device": lambda: tf.distribute.ReductionToOneDevice(),
        "collective": lambda: None,
        "none": lambda: None,
    }[name]()


def build_strategy(name: str, devices: tuple[str, ...], cross_device_ops: str,
                   cluster: Cluster | None = None, communication: str = "auto") -> Any:
    """Creates the strategy.

    Args:
        name: a resolved strategy name (see `choose_strategy`).
        devices: device names, e.g. `("/gpu:0", "/gpu:1")`.
        cross_device_ops: a resolved name (see `choose_cross_device_ops`).
        cluster: for `multi_worker`: the cluster, or None for one local worker.
        communication: for `multi_worker`: `auto`, `ring` or `nccl`.

    Returns:
        A `tf.distribute.Strategy`.
    """
    import tensorflow as tf

    if KINDS[name].several_workers:
        return _multi_worker(tf, devices, cluster, communication)
    if name == "mirrored":
        return _mirrored(tf, list(devices), build_cross_device_ops(cross_device_ops))
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices[0])
    return tf.distribute.get_strategy()


def _multi_worker(tf: Any, devices: tuple[str, ...], cluster: Cluster | None,
                  communication: str) -> Any:
    """A MultiWorkerMirroredStrategy over the cluster, on this worker's chosen GPUs (or CPU).

    It must be created before any other TensorFlow op in the process: it starts this
    worker's server and the collective runtime. No per-collective timeout: TensorFlow starts
    a thread for every collective that has one (see `trainer.run.callbacks.StepWatchdog`).
    """
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation,
                             communication.upper())
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    resolver = None
    if cluster is not None:
        gpus = sum(1 for d in devices if "gpu" in d.lower())
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({job: list(tasks) for job, tasks in cluster.jobs.items()}),
            task_type=cluster.task_type, task_id=cluster.task_index, rpc_layer="grpc",
            num_accelerators={"GPU": gpus})
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                     communication_options=options)


def _mirrored(tf: Any, devices: list[str], cross_device_ops: Any) -> Any:
    """A MirroredStrategy with collective keys of its own (see `_KEY_RANGE`)."""
    cls = tf.distribute.MirroredStrategy
    default = cls._collective_key_base
    cls._collective_key_base = next(_strategies_built) * _KEY_RANGE
    try:
        return cls(devices=devices, cross_device_ops=cross_device_ops)
    finally:
        cls._collective_key_base = default
