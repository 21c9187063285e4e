"""Pure arithmetic of data parallelism: batch sizes, the learning-rate rule, warm-up steps."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """Batch sizes of a run: each replica gets `per_replica`, one step sees `global_size`."""

    per_replica: int
    global_size: int
    replicas: int


def plan_batch(per_replica: int | None, global_size: int | None, replicas: int) -> BatchPlan:
    """Resolves the batch sizes from exactly one of the two options.

    Args:
        per_replica: examples per replica (weak scaling: the global batch grows with replicas).
        global_size: examples per step over all replicas (strong scaling: it is split).
        replicas: replicas in sync.

    Returns:
        A `BatchPlan`.
    """
    if (per_replica is None) == (global_size is None):
        raise ConfigError("set exactly one of batch.per_replica and batch.global_size; "
                          f"received: per_replica={per_replica}, global_size={global_size}")
    if per_replica is not None:
        return BatchPlan(per_replica, per_replica * replicas, replicas)
    if global_size % replicas:
        raise ConfigError(f"batch.global_size={global_size} does not divide evenly over "
                          f"{replicas} replicas; use a multiple of {replicas}, "
                          "or batch.per_replica")
    return BatchPlan(global_size // replicas, global_size, replicas)


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
    return lr * factors[rule]


def steps_per_epoch(examples: int, global_batch: int, drop_remainder: bool = False) -> int:
    """Training steps in one pass over `examples` (a last partial batch counts unless dropped)."""
    steps = examples // global_batch if drop_remainder else math.ceil(examples / global_batch)
    if steps < 1:
        raise ConfigError(f"the global batch {global_batch} is larger than the {examples} "
                          "training examples with batch.drop_remainder=true; use a smaller batch")
    return steps


def warmup_steps(warmup_epochs: float, steps_in_epoch: int) -> int:
    """Converts warm-up epochs (fractions allowed) to whole steps."""
    return int(round(warmup_epochs * steps_in_epoch))


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
