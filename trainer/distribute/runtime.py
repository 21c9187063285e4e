"""The strategy made real in TensorFlow: the strategy and its cross-device ops created for
the devices (a cluster's workers meet first, and agree on their data once it is read), the
precision policy set (a GPU's compute capability read for it), and a model's batch
normalization synchronized across the replicas (`sync_batchnorm`). A build
module (TensorFlow at the top): which ones is decided in `trainer.distribute.strategy` and
`trainer.plan.speed`.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import keras
import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.config.strategies import located
from trainer.distribute.cluster import Cluster
from trainer.distribute.inputs import dataset_function
from trainer.distribute.multiworker import from_every_worker
from trainer.distribute.rendezvous import IN_USE, difference, facts, meet
from trainer.distribute.strategy import strategy_kind
from trainer.internals.keras_step import layers_within
from trainer.internals.tf_runtime import has_kernel
from trainer.rundir.resume import flatten
from trainer.version import __version__

# Every MirroredStrategy numbers its collective groups from 1. A second strategy in the same
# process over another device count then joins group 1 with a different size, and TensorFlow
# aborts ("joining a group with size 4, but that group has size 2"). TF's own tests avoid
# this with `_collective_key_base`; we give each strategy a key range of its own the same way.
# Ranges start at 1: range 0 stays TensorFlow's default, for strategies built by other code.
_KEY_RANGE = 100_000
_strategies_built = itertools.count(1)



def nccl_available() -> bool:
    """Whether this TensorFlow build registers the NCCL all-reduce kernel (as TF itself checks)."""
    return has_kernel("NcclAllReduce")


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
                   cluster: Cluster | None = None, communication: str = "auto",
                   meeting: tuple[dict, float] | None = None) -> Any:
    """Creates the strategy with the builder its kind's record names.

    Args:
        name: a resolved strategy name (see `choose_strategy`).
        devices: device names, e.g. `("/gpu:0", "/gpu:1")`.
        cross_device_ops: a resolved name (see `choose_cross_device_ops`).
        cluster: for `multi_worker`: the cluster, or None for one local worker.
        communication: for `multi_worker`: `auto`, `ring` or `nccl`.
        meeting: for `multi_worker`: (the resolved config, `strategy.start_timeout_s`):
            the workers meet first (`trainer.distribute.rendezvous`).

    Returns:
        A `tf.distribute.Strategy`.
    """
    build = located(strategy_kind(name).build, f"the builder of strategy {name}")
    extra = {} if meeting is None else {"meeting": meeting}  # a multi-worker kind's meeting
    return build(devices=tuple(devices), cross_device_ops=cross_device_ops, cluster=cluster,
                 communication=communication, **extra)


# The built-in kinds' builders (`trainer.config.strategies.KINDS` names them).


def build_mirrored(devices: tuple[str, ...], cross_device_ops: str, **_: Any) -> Any:
    """`strategy=mirrored`: a MirroredStrategy over the devices."""
    return _mirrored(tf, list(devices), build_cross_device_ops(cross_device_ops))


def build_one_device(devices: tuple[str, ...], **_: Any) -> Any:
    """`strategy=one_device`: everything on the one device."""
    return tf.distribute.OneDeviceStrategy(devices[0])


def build_default(**_: Any) -> Any:
    """`strategy=default`: no distribution, TensorFlow's default strategy."""
    return tf.distribute.get_strategy()


def build_multi_worker(devices: tuple[str, ...], cluster: Cluster | None = None,
                       communication: str = "auto",
                       meeting: tuple[dict, float] | None = None, **_: Any) -> Any:
    """`strategy=multi_worker`: a MultiWorkerMirroredStrategy over the cluster, once its
    workers have met at the chief's port and agreed (`meeting`: the run's config and the
    seconds to wait for the others; see `trainer.distribute.rendezvous`)."""
    if cluster is not None and meeting is not None:
        meet(cluster, facts(meeting[0], versions()), meeting[1])
    return _multi_worker(tf, devices, cluster, communication)


def _multi_worker(tf: Any, devices: tuple[str, ...], cluster: Cluster | None,
                  communication: str) -> Any:
    """A MultiWorkerMirroredStrategy over the cluster, on this worker's chosen GPUs (or CPU).

    It must be created before any other TensorFlow op in the process: it starts this
    worker's server and the collective runtime. No per-collective timeout: TensorFlow starts
    a thread for every collective that has one (see `trainer.run.assembly.callbacks.StepWatchdog`).
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
    try:
        return SharedInput(cluster_resolver=resolver, communication_options=options)
    except tf.errors.UnknownError as error:
        # the port was taken between the workers' meeting and TensorFlow's server
        if cluster is None or "Could not start gRPC server" not in str(error):
            raise
        address = cluster.addresses[cluster.task_id]
        raise ConfigError(f"port {address.rpartition(':')[2]} (this worker's address "
                          f"{address}) {IN_USE}; stop that process, or give this worker "
                          "another port") from None


def versions() -> dict[str, str]:
    """The versions every worker of a cluster must share."""
    return {"trainer": __version__, "tensorflow": tf.__version__, "keras": keras.__version__}


def agree_on_data(strategy: Any, cluster: Cluster | None, source: Any) -> None:
    """Checks, before the model is built, that every worker of a cluster read the same
    data: its fingerprint (where the source has one), sizes and shapes; each worker's file
    copies may differ. One all-reduce where they agree (every worker must call it).

    Raises:
        ConfigError: the same line on every worker, naming what differs and both values.
    """
    if cluster is None or cluster.num_workers < 2:
        return
    mine = {f"data.{k}": v for k, v in data_facts(source).items()}
    line = difference(cluster, *from_every_worker(strategy, cluster, mine),
                      fix="give every worker the same data")
    if line is not None:
        raise ConfigError(line)


def data_facts(source: Any) -> dict[str, Any]:
    """What every worker's copy of the data must share, read from a `Source`: a fingerprint
    computed where it is asked for (an image folder's, `Deferred`) by its listing alone (the
    files, sizes and classes: no worker reads a file for it, so each decodes only its share)."""
    fingerprint = source.fingerprint
    if callable(fingerprint):
        fingerprint = getattr(fingerprint, "listing", None)
    found = {"train_size": source.train_size, "validation_size": source.validation_size,
             "test_size": source.test_size, "input_shape": source.input_shape,
             "num_classes": source.num_classes, "num_outputs": source.num_outputs,
             "fingerprint": dict(fingerprint or {})}
    return json.loads(json.dumps(flatten(found), default=str))  # as it travels


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
    return [layer for layer in layers_within(model)
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
