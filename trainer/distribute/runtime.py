"""The strategy made real in TensorFlow: the strategy and its cross-device ops created for
the devices, the precision policy set (a GPU's compute capability read for it), and a
model's batch normalization synchronized across the replicas (`sync_batchnorm`). A build
module (TensorFlow at the top): which ones is decided in `trainer.distribute.strategy` and
`trainer.plan.speed`.
"""

from __future__ import annotations

import itertools
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.framework import kernels

from trainer.config.errors import ConfigError
from trainer.distribute.cluster import Cluster
from trainer.distribute.inputs import dataset_function
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
    return SharedInput(cluster_resolver=resolver, communication_options=options)


class SharedInput(tf.distribute.MultiWorkerMirroredStrategy):
    """MultiWorkerMirroredStrategy that reads a dataset built as one worker's share
    (`trainer.distribute.inputs.read_per_worker`) through `distribute_datasets_from_function`
    with TensorFlow's `InputContext`, where a worker reads, decodes and caches its share of
    every global batch alone; any other dataset is distributed as TensorFlow does (each
    worker reads all of it and keeps its share)."""

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        dataset_fn = dataset_function(dataset)
        if dataset_fn is None:
            return super().experimental_distribute_dataset(dataset, options)
        return self.distribute_datasets_from_function(dataset_fn, options)


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


# `sync_batchnorm=true`, as PyTorch Lightning's `Trainer(sync_batchnorm=True)`. Without it every
# replica normalizes with its own share of the global batch: a model with BatchNormalization
# trains differently on 1 and on N replicas (other means and variances in the forward pass,
# so other gradients, and per-replica moving statistics of which a checkpoint keeps the first
# replica's). Keras's layer reads its `synchronized` attribute on each training call
# (TensorFlow backend: `ops.moments(..., synchronized=True)` all-reduces the sums, squared
# sums and counts of the replicas in sync), so the layers of a built model are switched
# before its first training step is traced: no cloning, the same weights in the same order.
# Every such layer counts, in nested models (a Keras application's backbone) and inside a
# user's own layers alike. On one replica nothing is switched: nothing to synchronize.


def batch_norm_layers(model: Any) -> list:
    """Every `keras.layers.BatchNormalization` (or subclass) in `model`, nested ones too."""
    # Keras's own walk over tracked layers: nested models and a layer's sublayers included.
    return [layer for layer in model._flatten_layers(include_self=True, recursive=True)
            if isinstance(layer, keras.layers.BatchNormalization)]


def synchronize_batch_norm(model: Any, asked: bool, replicas: int,
                           accumulate: int = 1) -> str | None:
    """Synchronizes the model's batch normalization across `replicas` where `asked`.

    Args:
        model: the built model, before its first training step.
        asked: the config's `sync_batchnorm`.
        replicas: replicas in sync (every worker's).
        accumulate: micro-batches per optimizer step (`batch.accumulate`, resolved).

    Returns:
        What the summary says of the model's batch normalization; None where there is
        nothing to say (no such layer and not asked, or one replica and not asked).

    Raises:
        ConfigError: asked with several replicas and micro-batches, where batch norm's
            all-reduces would sit inside the micro-batch loop.
    """
    layers = batch_norm_layers(model)
    count = f"{len(layers)} BatchNormalization layer{'s' if len(layers) != 1 else ''}"
    if not layers:
        return ("sync_batchnorm=true: the model has no BatchNormalization layer, nothing to "
                "synchronize") if asked else None
    if replicas == 1:
        return (f"sync_batchnorm=true: one replica, nothing to synchronize ({count})"
                if asked else None)
    if not asked and all(layer.synchronized for layer in layers):
        return (f"synchronized across {replicas} replicas: {count}, synchronized by the "
                "model itself")
    if not asked:
        return (f"per replica: {count} normalize with each replica's share of the batch, so "
                f"the weights depend on the replica count (sync_batchnorm=true synchronizes "
                "them)")
    if accumulate > 1:
        raise ConfigError("sync_batchnorm=true cannot synchronize batch norm inside "
                          "batch.accumulate's micro-batch loop (tf.distribute refuses an "
                          "all-reduce inside a graph loop); received: "
                          f"batch.accumulate={accumulate} on {replicas} replicas (set "
                          "batch.accumulate=1, or sync_batchnorm=false)")
    for layer in layers:
        layer.synchronized = True
    return (f"synchronized across {replicas} replicas: {count} normalize with the global "
            "batch's mean and variance")
