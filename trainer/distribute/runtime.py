"""The strategy made real in TensorFlow: the strategy and its cross-device ops created for
the devices, and the precision policy set (a GPU's compute capability read for it). A build
module (TensorFlow at the top): which ones is decided in `trainer.distribute.strategy` and
`trainer.plan.speed`.
"""

from __future__ import annotations

import itertools
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.framework import kernels

from trainer.distribute.cluster import Cluster
from trainer.distribute.strategy import KINDS

# Every MirroredStrategy numbers its collective groups from 1. A second strategy in the same
# process over another device count then joins group 1 with a different size, and TensorFlow
# aborts ("joining a group with size 4, but that group has size 2"). TF's own tests avoid
# this with `_collective_key_base`; we give each strategy a key range of its own the same way.
# Ranges start at 1: range 0 stays TensorFlow's default, for strategies built by other code.
_KEY_RANGE = 100_000
_strategies_built = itertools.count(1)



def nccl_available() -> bool:
    """Whether this TensorFlow build registers the NCCL all-reduce kernel (as TF itself checks)."""
    return bool(kernels.get_registered_kernels_for_op("NcclAllReduce").kernel)


def build_cross_device_ops(name: str) -> Any:
    """Returns the `tf.distribute.CrossDeviceOps` for a resolved name (None: TF's own)."""
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


def compute_capability() -> tuple[int, int] | None:
    """The first visible GPU's compute capability, None without GPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    return details.get("compute_capability")


def apply_precision(precision: str) -> None:
    """Sets Keras's global dtype policy before the model is built."""
    keras.config.set_dtype_policy(precision)
