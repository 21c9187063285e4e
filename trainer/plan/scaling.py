"""Pure arithmetic of data parallelism: batch sizes, the learning-rate rule, warm-up steps."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from trainer.config.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """Batch sizes of a run.

    Each replica computes gradients on micro-batches of `per_replica` examples, sums those
    of `accumulate` micro-batches, and the replicas' sums are all-reduced once into one
    optimizer step over `global_size = per_replica * replicas * accumulate` examples.
    """

    per_replica: int
    global_size: int
    replicas: int
    accumulate: int = 1

    @property
    def shards(self) -> int:
        """Micro-batches one global batch is cut into: replicas x accumulate."""
        return self.replicas * self.accumulate


# Keras's `fit(x, y)` batch where it is given none (`batch_size=None`).
KERAS_BATCH = 32


def batch_of_data(batch: Any, lr: Any, given_batch: int | None, replicas: int) -> tuple[Any, Any]:
    """The batch config and learning-rate plan of a run given data by `trainer.fit(data=...)`
    whose overrides set no batch (`Spec.batch_from_data`): Keras's `fit` batch as the
    global batch, a batched dataset's own batch (`given_batch`: `fit(dataset)`), else
    Keras's 32 (`fit(x, y)`); `reference_batch: auto` follows it, so the model's rate is
    its rate at that batch on any device count.

    Keras's strategies split a batch unevenly over the replicas (32 over 3: 11, 11, 10);
    trainer splits evenly, so a batch nobody chose that does not divide rounds up to the
    next multiple of `replicas` (33 on 3), and the rate scales with it as with any batch.
    A batch the user sets is never changed (`batch.global_size` that does not divide is
    refused, naming both numbers).

    Args:
        batch: the `batch` node's record (`BatchConfig`).
        lr: the learning-rate plan (`LrPlan`), `reference_auto` saying whether
            `reference_batch` was `auto`.
        given_batch: the batch the given dataset came in, or None.
        replicas: the replicas in sync.

    Returns:
        `(batch, lr)`, the global batch set.
    """
    size = given_batch or KERAS_BATCH
    if lr.reference_auto:
        lr = dataclasses.replace(lr, reference_batch=size)
    even = -(-size // replicas) * replicas
    return dataclasses.replace(batch, per_replica=None, global_size=even), lr


def _multiples_near(value: int, step: int) -> str:
    low = value // step * step
    near = [n for n in (low, low + step) if n > 0]
    return " or ".join(str(n) for n in near)


def plan_batch(per_replica: int | None, global_size: int | None, replicas: int,
               accumulate: int | str = 1, max_per_replica: int | None = None) -> BatchPlan:
    """Resolves the batch sizes from exactly one of `per_replica` and `global_size`.

    Args:
        per_replica: examples per replica and micro-batch (weak scaling: the global batch
            grows with replicas and accumulation).
        global_size: examples per optimizer step over all replicas (strong scaling: split
            into replicas x accumulate micro-batches).
        replicas: replicas in sync.
        accumulate: micro-batches per optimizer step, or `auto`: the smallest count that
            keeps a micro-batch within `max_per_replica` (1 without a cap).
        max_per_replica: the most examples a replica may take at once; None for no cap.

    Returns:
        A `BatchPlan`.
    """
    if (per_replica is None) == (global_size is None):
        raise ConfigError("set exactly one of batch.per_replica and batch.global_size; "
                          f"received: per_replica={per_replica}, global_size={global_size}")
    cap = max_per_replica
    if per_replica is not None:
        if cap is not None and per_replica > cap:
            raise ConfigError(f"batch.per_replica={per_replica} is above batch.max_per_replica="
                              f"{cap}; use batch.per_replica<={cap} with batch.accumulate, or "
                              "batch.global_size with batch.accumulate=auto")
        n = 1 if accumulate == "auto" else accumulate
        return BatchPlan(per_replica, per_replica * replicas * n, replicas, n)
    if accumulate != "auto":
        shards = replicas * accumulate
        if global_size % shards:
            over = (f"{replicas} replicas" if accumulate == 1 else
                    f"{replicas} replicas x {accumulate} micro-batches")
            raise ConfigError(f"batch.global_size={global_size} does not divide evenly over "
                              f"{over}; use a multiple of {shards}: "
                              f"{_multiples_near(global_size, shards)}")
        micro = global_size // shards
        if cap is not None and micro > cap:
            raise ConfigError(f"batch.global_size={global_size} over {replicas} replicas x "
                              f"{accumulate} micro-batches is {micro} per replica, above "
                              f"batch.max_per_replica={cap}; use batch.accumulate=auto")
        return BatchPlan(micro, global_size, replicas, accumulate)
    if global_size % replicas:
        raise ConfigError(f"batch.global_size={global_size} has no whole split over {replicas} "
                          f"replicas; the nearest valid global sizes are "
                          f"{_multiples_near(global_size, replicas)}")
    per_step = global_size // replicas
    n = next(n for n in range(1, per_step + 1)
             if per_step % n == 0 and (cap is None or per_step // n <= cap))
    return BatchPlan(per_step // n, global_size, replicas, n)


def scaled_learning_rate(lr: float, global_batch: int, reference_batch: int, rule: str) -> float:
    """Scales a learning rate tuned at `reference_batch` to `global_batch`.

    Args:
        lr: the learning rate at `reference_batch`.
        global_batch: examples per step over all replicas.
        reference_batch: the batch `lr` was tuned for.
        rule: `linear` (Goyal et al. 2017), `sqrt`, or `none`.

    Returns:
        The learning rate for `global_batch`.
    """
    ratio = global_batch / reference_batch
    factors = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}
    if rule not in factors:
        raise ConfigError("optimizer.lr_scaling must be one of linear, sqrt, none; "
                          f"received: {rule!r}")
    scaled = lr * factors[rule]
    if not math.isfinite(scaled):
        raise ConfigError(f"optimizer.lr={lr} scaled to the global batch {global_batch} "
                          f"({rule}, from optimizer.reference_batch={reference_batch}) "
                          "overflows a float; lower optimizer.lr")
    return scaled


def steps_per_epoch(examples: int, global_batch: int, drop_remainder: bool = False) -> int:
    """Training steps in one pass over `examples` (a last partial batch counts unless dropped)."""
    if examples < 1:
        raise ConfigError("the dataset has no training examples; check the dataset's size "
                          "options and files")
    steps = examples // global_batch if drop_remainder else math.ceil(examples / global_batch)
    if steps < 1:
        raise ConfigError(f"the global batch {global_batch} is larger than the {examples} "
                          "training examples with batch.drop_remainder=true; use a smaller batch")
    return steps


# Steps past this overflow the int32 step counters of TensorFlow's schedules.
STEP_LIMIT = 2**31 - 1


def warmup_steps(warmup_epochs: float, steps_in_epoch: int, key: str = "warmup_epochs") -> int:
    """Converts warm-up (or decay) epochs, fractions allowed, to whole steps.

    Raises:
        ConfigError: more steps than a schedule counts (`optimizer.KEY` named).
    """
    steps = warmup_epochs * steps_in_epoch
    if not steps <= STEP_LIMIT:
        raise ConfigError(f"optimizer.{key}={warmup_epochs} is {steps:g} steps of "
                          f"{steps_in_epoch} an epoch, past the {STEP_LIMIT} a schedule "
                          "counts; give it in epochs of this run")
    return int(round(steps))


def check_micro_batches(examples: int, replicas: int, accumulate: int) -> None:
    """Refuses more micro-batches per step (replicas x accumulate) than training examples:
    a pass's one batch could not give each micro-batch an example.

    Raises:
        ConfigError: naming the micro-batches, the examples and the largest count that fits.
    """
    if examples < 1 or examples >= replicas * accumulate:
        return
    if accumulate == 1 or examples < replicas:
        raise ConfigError(f"{examples} training examples cannot feed {replicas} replicas (each "
                          f"needs one); use at most {examples} devices")
    raise ConfigError(f"batch.accumulate={accumulate} cuts each optimizer step into {replicas} "
                      f"replica{'s' if replicas > 1 else ''} x {accumulate} micro-batches, more "
                      f"than the {examples} training examples (each micro-batch needs one); "
                      f"use batch.accumulate<={examples // replicas}")


def balanced_batch_sizes(examples: int, global_batch: int, replicas: int) -> list[int] | None:
    """Batch sizes for one pass that leave no replica without an example.

    A last partial batch of fewer examples than replicas would leave some replicas an empty
    batch, which TensorFlow's oneDNN CPU kernels reject ("input depth must be evenly
    divisible by filter depth"). Moving a few examples from the second-last batch to the
    last fixes that without dropping or repeating any example.

    Args:
        examples: examples in one pass.
        global_batch: the configured global batch.
        replicas: replicas in sync.

    Returns:
        The size of every batch of the pass, or None where plain batching is already fine.
    """
    full, last = divmod(examples, global_batch)
    if last == 0 or last >= replicas:
        return None
    if full == 0:
        raise ConfigError(f"{examples} examples cannot feed {replicas} replicas; use at most "
                          f"{examples} devices")
    moved = replicas - last
    return [global_batch] * (full - 1) + [global_batch - moved, last + moved]


def global_batch_sizes(examples: int, global_batch: int, shards: int,
                       drop_remainder: bool = False) -> list[int]:
    """The size of every global batch of one pass, in order: full batches, then the last
    partial one (none with `drop_remainder`), balanced as `balanced_batch_sizes` says."""
    full, last = divmod(examples, global_batch)
    if drop_remainder or not last:
        return [global_batch] * full
    return balanced_batch_sizes(examples, global_batch, shards) or [global_batch] * full + [last]


def worker_positions(end: int, workers: int, worker: int) -> int:
    """How many of the positions `0 .. end - 1` a worker takes: those `worker` mod `workers`."""
    return max(0, (end - worker + workers - 1) // workers)


def worker_batch_sizes(batches: list[int], workers: int, worker: int,
                       replicas: int) -> list[int]:
    """Each local replica's batch, in order, when a worker takes the positions `worker` mod
    `workers` of every global batch and splits them over its `replicas` replicas.

    Args:
        batches: the size of every global batch of the pass (`global_batch_sizes`).
        workers: workers in the cluster.
        worker: this worker's index.
        replicas: this worker's replicas.

    Returns:
        `len(batches) * replicas` sizes: replica 0's, 1's, ... share of batch 0, then of
        batch 1, ...

    Raises:
        ConfigError: a global batch leaves a replica of this worker no example.
    """
    sizes, start = [], 0
    for size in batches:
        mine = (worker_positions(start + size, workers, worker)
                - worker_positions(start, workers, worker))
        share, extra = divmod(mine, replicas)
        if share == 0:
            raise ConfigError(f"a global batch of {size} examples leaves a replica of worker "
                              f"{worker} of {workers} no example; use a global batch of at "
                              f"least {workers * replicas}")
        sizes += [share + (r < extra) for r in range(replicas)]
        start += size
    return sizes
