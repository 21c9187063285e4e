"""What the workers of a multi-worker run hand each other, and how a run ends when one is lost.

The chief's resume point and variables, the vote on whether any worker was asked to stop,
the one-line message naming a lost peer, and what the step watchdog does when a step hangs.
Each hand-off is a collective: every worker calls it at the same place.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from trainer.config.errors import EXIT_WORKER_LOST
from trainer.distribute.cluster import Cluster, lost_tasks
from trainer.rundir.backup import ResumePoint
from trainer.rundir.layout import RunDir


def share_from_chief(strategy: Any, model: keras.Model,
                     point: ResumePoint | None) -> ResumePoint | None:
    """Gives every worker of a multi-worker run the chief's resume point and variables.

    Only the chief keeps backups, and the other workers need not see its disk: one
    all-reduce, to which only the chief's first replica (replica 0) contributes, carries the
    chief's point, then another its restored model and optimizer variables, to every worker.
    Every worker must call this at the same place (it runs collectives).

    Args:
        strategy: the MultiWorkerMirroredStrategy.
        model: the built model, with its optimizer built.
        point: what this worker restored (None on workers other than the chief).

    Returns:
        The chief's resume point, or None where the chief had no backup.
    """
    import tensorflow as tf

    found = [1.0, point.epoch, point.step] if point is not None else [0.0, 0.0, 0.0]
    from_chief = replica_sum(strategy, replica_zero_only=True)
    shared = from_chief([tf.constant(found, tf.float64)])[0].numpy()
    if shared[0] == 0:
        return None
    take_chiefs(strategy, [*model.variables, *model.optimizer.variables])
    # The backup's state (the history so far: what the end of the run validates and
    # reports from) and the training metrics' state at a mid-epoch backup: every worker
    # takes the chief's, or the workers part ways (one validating what the other reads from
    # the history, their collectives mismatched) and a resumed epoch reports its metrics
    # over the steps after the backup only. Every worker assigns the metrics (a sum on-read
    # variable takes its share on each replica).
    given = ({"state": point.state, "metrics": _metrics_json(point.metrics)}
             if point is not None else None)
    chiefs = chiefs_json(strategy, given)
    return ResumePoint(int(shared[1]), int(shared[2]),
                       point.path if point is not None else Path("the chief's backup"),
                       chiefs["state"], _metrics_of(chiefs["metrics"]))


def _metrics_json(metrics: tuple | None) -> dict | None:
    """A backup's training metrics ((paths), (arrays)) as JSON (float32 and integers are
    exact through it)."""
    if metrics is None:
        return None
    names, values = metrics
    return {"names": list(names), "values": [v.tolist() for v in values],
            "dtypes": [str(v.dtype) for v in values]}


def _metrics_of(found: dict | None) -> tuple | None:
    """`_metrics_json` read back."""
    if not found:
        return None
    import numpy as np

    return tuple(found["names"]), tuple(np.array(v, dtype) for v, dtype in
                                        zip(found["values"], found["dtypes"], strict=True))


def chiefs_json(strategy: Any, mine: Any) -> Any:
    """The chief's JSON-able `mine` on every worker (the others pass None), by two
    all-reduces from the chief's first replica alone: its length, then its bytes. Every
    worker must call it at the same place."""
    import numpy as np
    import tensorflow as tf

    from_chief = replica_sum(strategy, replica_zero_only=True)
    payload = (np.frombuffer(json.dumps(mine).encode(), np.uint8) if mine is not None
               else np.zeros(0, np.uint8))
    length = int(from_chief([tf.constant([float(payload.size)], tf.float64)])[0].numpy()[0])
    table = np.zeros(length)
    table[:payload.size] = payload
    found = from_chief([tf.constant(table, tf.float64)])[0].numpy()
    return json.loads(found.astype(np.uint8).tobytes())


def hold_first_replicas_weights(strategy: Any, model: keras.Model) -> None:
    """Makes every replica of every worker hold the model weights of the first replica (the
    chief's), which are what a checkpoint saves: where batch normalization is not
    synchronized, each replica keeps moving statistics of its own, and an evaluation on
    several replicas would otherwise score a mix that no checkpoint holds. Nothing to do on
    one replica.

    On one worker, each weight's first copy is assigned to its other devices' copies, eagerly
    (MobileNetV2's 262 weights: 0.2 s; the traced all-reduce took 15 s to trace, on each of
    a run's calls). Across workers, one all-reduce, traced once per run: every worker must
    call it at the same place."""
    import tensorflow as tf

    if strategy.num_replicas_in_sync == 1:
        return
    if strategy.num_replicas_in_sync == len(strategy.extended.worker_devices):
        for weight in model.weights:  # this process holds every replica
            if isinstance(weight.value, tf.distribute.DistributedValues):
                first, *others = weight.value.values
                for copy in others:
                    copy.assign(first)
        return
    take_chiefs(strategy, model.weights)


def weights_digest(strategy: Any, model: keras.Model) -> bytes | None:
    """A digest of the model's weights where every replica of this process holds the same
    values (then an evaluation scores exactly what `last.keras` holds); None where two
    replicas differ (batch normalization's own statistics per replica), or where replicas
    live in other processes (several workers: comparing them would take a collective).

    It reads every weight once (a model of 14 MB: about 20 ms)."""
    import hashlib

    import numpy as np
    import tensorflow as tf

    if (strategy.num_replicas_in_sync > 1
            and strategy.num_replicas_in_sync != len(strategy.extended.worker_devices)):
        return None
    digest = hashlib.blake2b(digest_size=16)
    for weight in model.weights:
        value = weight.value
        copies = (value.values if isinstance(value, tf.distribute.DistributedValues)
                  else (value,))
        first = np.asarray(copies[0])
        if any(not np.array_equal(first, np.asarray(other)) for other in copies[1:]):
            return None
        digest.update(f"{weight.path}{first.dtype}{first.shape}".encode())
        digest.update(first.tobytes())
    return digest.digest()


def take_chiefs(strategy: Any, variables: list) -> None:
    """Assigns every replica of every worker the values the chief's first replica holds
    (one all-reduce to which only it contributes). Every worker must call it at the same
    place."""
    import tensorflow as tf

    variables = list({id(v): v for v in variables}.values())
    values = replica_sum(strategy, replica_zero_only=True)([v.value for v in variables])
    for variable, value in zip(variables, values, strict=True):
        variable.assign(tf.cast(value, variable.dtype))


# The traced sums of each strategy, by `replica_zero_only`: a run calls them several times
# (the end's evaluations, the stop vote), and a trace over a model's weights costs seconds.
_SUMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def replica_sum(strategy: Any, replica_zero_only: bool = False):
    """A function summing tensors over every replica of every worker (one all-reduce).

    `replica_sum(strategy)(tensors)` returns this worker's copy of the sums, as float64
    (exact for floats and for integers below 2**53). With `replica_zero_only`, only replica
    0 (on the chief) contributes: the chief's values, handed to every worker. The tensors
    travel packed in one vector (one collective, not one per tensor), and the function is
    traced once per strategy (any number and shapes of tensors: they are packed outside
    it), so calling it often (the stop vote) costs one small collective and never a trace.
    """
    import tensorflow as tf

    kept = _SUMS.setdefault(strategy, {})
    if replica_zero_only in kept:
        return kept[replica_zero_only]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)])
    def total(flat):
        def replica_fn():
            context = tf.distribute.get_replica_context()
            keep = (tf.equal(context.replica_id_in_sync_group, 0) if replica_zero_only
                    else tf.constant(True))
            # tf.where (not the tensor itself) makes it a value of this replica.
            return context.all_reduce("sum", tf.where(keep, flat, tf.zeros_like(flat)))

        return strategy.run(replica_fn)

    def run(tensors: list) -> list:
        if not tensors:  # a model with no weights: an all-reduce of nothing fails
            return []
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        flat = tf.concat([tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors], 0)
        flat = strategy.experimental_local_results(total(flat))[0]
        parts = tf.split(flat, [int(tf.size(t)) for t in tensors])
        return [tf.reshape(part, t.shape) for part, t in zip(parts, tensors, strict=True)]

    kept[replica_zero_only] = run
    return run


def from_every_worker(strategy: Any, cluster: Cluster,
                      mine: dict[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """Every worker's `mine` (JSON-able), by the cluster's collectives: two all-reduces, the
    lengths then the bytes, to which each worker contributes its own row (each of its
    replicas alike: the sums are divided by the replicas per worker). Every worker must
    call it at the same place.

    Returns:
        (the chief's, {task id: another worker's}).
    """
    import numpy as np
    import tensorflow as tf

    workers, me = cluster.num_workers, cluster.task_id
    per_worker = max(1, strategy.num_replicas_in_sync // workers)
    total = replica_sum(strategy)
    payload = np.frombuffer(json.dumps(mine).encode(), np.uint8)
    lengths = np.zeros(workers)
    lengths[me] = payload.size
    lengths = (total([tf.constant(lengths)])[0].numpy() / per_worker).astype(int)
    table = np.zeros((workers, int(lengths.max())))
    table[me, :payload.size] = payload
    table = total([tf.constant(table)])[0].numpy() / per_worker
    found = [json.loads(table[i, :lengths[i]].astype(np.uint8).tobytes())
             for i in range(workers)]
    return found[0], dict(enumerate(found[1:], start=1))


def stop_agreement(strategy: Any) -> Callable[[bool], bool]:
    """`agree(asked) -> bool`: whether any worker was asked to stop (one small all-reduce)."""
    import tensorflow as tf

    votes = replica_sum(strategy)

    def agree(asked: bool) -> bool:
        return float(votes([tf.constant(1.0 if asked else 0.0)])[0]) > 0

    return agree


def peer_failure(error: BaseException) -> bool:
    """Whether a collective failed because a peer crashed, vanished or timed out."""
    import tensorflow as tf

    return isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                              tf.errors.AbortedError, tf.errors.CancelledError))


def backup_place(run_dir: Path, chief: bool) -> str:
    """Where the backup to resume from is, as this worker can say it."""
    return str(RunDir(run_dir).backup) if chief else "the chief's run directory"


def lost_message(error: BaseException, cluster: Cluster, epoch: int | None,
                 backup: str) -> str:
    """One line: which peer was lost, when, and how to resume."""
    lost = lost_tasks(str(error), cluster)
    who = " and ".join(lost) if lost else "a peer worker"
    what = f"lost {who}: it stopped responding (crashed, killed or unreachable)"
    when = f"during epoch {epoch + 1}" if epoch is not None else "before training"
    return (f"{what} {when}; this worker stopped. The last backup is in "
            f"{backup}; start every worker again with the same command to resume")


def on_stuck(timeout_s: float, chief: bool, run_dir: Path, backup: Any) -> Callable:
    """What the step watchdog does: one line, the scratch directory removed, exit code 4."""

    def on_timeout(waited: float) -> None:
        where = backup_place(run_dir, chief)
        print(f"error: a training step has not finished after {waited:.0f} s "
              f"(strategy.timeout_s={timeout_s:g}) during epoch "
              f"{backup.epoch + 1}: a peer worker is stuck, or the network between the workers "
              f"is; this worker stopped. The last backup is in {where}; start every worker "
              "again with the same command to resume", file=sys.stderr, flush=True)
        if not chief:
            shutil.rmtree(run_dir, ignore_errors=True)
        os._exit(EXIT_WORKER_LOST)  # the main thread is blocked in the stuck collective

    return on_timeout
