"""Which examples each worker reads: the one global order of an epoch, each worker's places in
every global batch, and its replicas' batches.

The order is dealt from `lanes`: example `i` of a split (in the source's own order) is in lane
`i mod lanes`; each epoch shuffles every lane on its own (seeded by the epoch and the lane)
and deals the lanes round-robin, so position `p` of the epoch holds an example of lane
`p mod lanes`. With one lane (the default) that is one seeded shuffle of the whole split.

Worker `w` of `W` takes the positions `p` with `p mod W == w` of every global batch, and
splits them over its replicas: the global batches are those of one machine whatever `W`, and
every worker runs the same number of steps (a last partial batch included: it holds at least
one example per replica, `trainer.plan.scaling.balanced_batch_sizes`). Where `W` divides
`lanes` those positions are always the same examples (its lanes): a worker then reads,
decodes and caches those alone. Otherwise a worker's examples change from epoch to epoch: it
reads the cheap elements of every lane (paths, indices) and decodes its positions only, and
a cache has to hold every example.

A build module: TensorFlow is imported at the top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from trainer.plan.scaling import worker_batch_sizes, worker_positions


@dataclass(frozen=True)
class Place:
    """Where a process reads: worker `worker` of `workers`, feeding `replicas` replicas of
    its own (its dataset yields each replica's batch in turn)."""

    workers: int = 1
    worker: int = 0
    replicas: int = 1

    @classmethod
    def of(cls, context: tf.distribute.InputContext) -> Place:
        """The place TensorFlow's `InputContext` gives a worker's input pipeline."""
        workers = context.num_input_pipelines
        return cls(workers, context.input_pipeline_id,
                   context.num_replicas_in_sync // workers)

    def context(self) -> tf.distribute.InputContext:
        """This place as TensorFlow's `InputContext`."""
        return tf.distribute.InputContext(self.workers, self.worker,
                                          self.workers * self.replicas)

    @property
    def several(self) -> bool:
        """Whether several workers share every global batch."""
        return self.workers > 1

    def owns_lanes(self, lanes: int) -> bool:
        """Whether this worker's examples are the same every epoch: its lanes."""
        return lanes % self.workers == 0

    def lanes_read(self, lanes: int) -> list[int]:
        """The lanes this worker reads: its own where the workers divide the lanes, else
        every lane."""
        if self.owns_lanes(lanes):
            return [lane for lane in range(lanes) if lane % self.workers == self.worker]
        return list(range(lanes))

    def examples_below(self, end: int) -> int:
        """How many of the positions before `end` are this worker's."""
        return worker_positions(end, self.workers, self.worker)

    def batch_sizes(self, batches: list[int]) -> list[int]:
        """Each of this worker's replicas' batch, in order, for global batches of these
        sizes (`trainer.plan.scaling.worker_batch_sizes`)."""
        return worker_batch_sizes(batches, self.workers, self.worker, self.replicas)


def lane(dataset: tf.data.Dataset, lanes: int, index: int) -> tf.data.Dataset:
    """The examples `index`, `index + lanes`, ... of a split (all of it for one lane)."""
    return dataset if lanes == 1 else dataset.shard(lanes, index)


def dealt(streams: list[tuple[int, tf.data.Dataset]], lanes: int, epoch_seed: Any,
          shuffle_buffer: int, positioned: bool = True) -> tf.data.Dataset:
    """One epoch's `(position, element)` (the elements alone where not `positioned`):
    every lane shuffled on its own, then dealt round-robin (position `j * lanes + lane` is
    the lane's `j`-th), in position order.

    The positions come from a counter zipped beside each lane, never from a map: a
    per-element `map` inside the epochs' `flat_map` costs about 35 microseconds an element
    on these machines (9 ms of CPU per batch of 256; a batch's own copy costs 1 ms).

    Args:
        streams: `(lane, elements)` of the lanes read, in lane order.
        lanes: how many lanes the split is dealt from.
        epoch_seed: the epoch's shuffle seed (None: unseeded).
        shuffle_buffer: examples in the shuffle buffer of all lanes together (0: none).
        positioned: pair each element with its position.
    """
    buffer = -(-shuffle_buffer // lanes) if shuffle_buffer else 0
    shuffled = []
    for index, elements in streams:
        if buffer:
            # one lane: the epoch's seed itself, the order a single shuffle always gave
            seed = epoch_seed if lanes == 1 or epoch_seed is None else epoch_seed * 1009 + index
            elements = elements.shuffle(buffer, seed=seed, reshuffle_each_iteration=False)
        if positioned:  # (j * lanes + index, element), as enumerate() pairs (j, element)
            elements = tf.data.Dataset.zip(
                (tf.data.Dataset.range(index, tf.int64.max, lanes), elements))
        shuffled.append(elements)
    if len(shuffled) == 1:
        return shuffled[0]
    choice = tf.data.Dataset.range(len(shuffled)).repeat()
    return tf.data.Dataset.choose_from_datasets(shuffled, choice,
                                                stop_on_empty_dataset=False)


def keeps_all(place: Place, lanes: int | None) -> bool:
    """Whether this worker keeps every element it reads (one worker, or its own lanes)."""
    return not place.several or (lanes is not None and place.owns_lanes(lanes))


def positions_of(place: Place, positioned: tf.data.Dataset, lanes: int | None,
                 end: int | None = None) -> tf.data.Dataset:
    """This worker's `(position, element)`: those `worker` mod `workers`, below `end`
    (the full batches' where a last partial one is dropped; None: all). Every element is
    still read, so a cache before this sees the whole pass."""
    keep_all = keeps_all(place, lanes)
    if keep_all and end is None:
        return positioned
    workers, worker = place.workers, place.worker
    if end is None:  # positions 0, 1, 2, ... in order: every workers-th from worker's
        return positioned.shard(workers, worker)

    def kept(position, element):
        own = tf.constant(True) if keep_all else tf.equal(position % workers, worker)
        return tf.logical_and(own, position < end)

    return positioned.filter(kept)


def mine(place: Place, elements: tf.data.Dataset, lanes: int | None) -> tf.data.Dataset:
    """This worker's elements of an epoch's elements in position order (`dealt` without
    positions): `positions_of` without a bound, for no position's cost."""
    return elements if keeps_all(place, lanes) else elements.shard(place.workers, place.worker)


def replica_batches(elements: tf.data.Dataset, place: Place,
                    batches: list[int]) -> tf.data.Dataset:
    """This worker's replicas' batches, each in turn, for global batches of these sizes."""
    sizes = place.batch_sizes(batches)
    return elements.batch(max(sizes)).rebatch(tf.constant(sizes, tf.int64))


def replica_index(place: Place, batch: Any) -> Any:
    """The place among all replicas' batches of the pass of this worker's `batch`-th
    replica batch (what seeds a batch mixer, the same whatever the workers)."""
    step, replica = batch // place.replicas, batch % place.replicas
    return step * place.workers * place.replicas + place.worker * place.replicas + replica
