"""Each worker's share of every global batch, in one process: the workers' batches together
are one worker's, whatever the workers, lanes or the last batch (`trainer.data.shares`)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.data import image_folder
from trainer.data.pipeline import (
    Batches,
    Epochs,
    Order,
    Prep,
    build_pipeline,
    build_training_epochs,
)
from trainer.data.shares import Place
from trainer.plan.scaling import global_batch_sizes, worker_batch_sizes

EXAMPLES = 50  # global batches of 16: 16, 16, 16 and 2 (14 and 4 for 4 replicas)
IMAGES = np.random.default_rng(0).integers(0, 256, (EXAMPLES, 4, 4, 3)).astype(np.uint8)
LABELS = np.arange(EXAMPLES, dtype=np.int32)  # each label names its image


def test_a_worker_takes_its_places_of_every_global_batch():
    assert global_batch_sizes(50, 16, 4) == [16, 16, 14, 4]
    assert global_batch_sizes(50, 16, 4, drop_remainder=True) == [16, 16, 16]
    # positions 0-15, 16-31, 32-45, 46-49: worker 1 of 2 has the odd ones, on 2 replicas
    assert worker_batch_sizes([16, 16, 14, 4], 2, 1, 2) == [4, 4, 4, 4, 4, 3, 1, 1]
    assert worker_batch_sizes([16, 16, 14, 4], 2, 0, 2) == [4, 4, 4, 4, 4, 3, 1, 1]
    assert worker_batch_sizes([16, 16, 15], 2, 1, 1) == [8, 8, 7]
    with pytest.raises(ConfigError, match="leaves a replica of worker 1 of 2 no example"):
        worker_batch_sizes([16, 1], 2, 1, 1)


def epochs(place=None, lanes=1, augment=(), drop_remainder=False, count=2, shard=None,
           cache="memory", first=0, skip=0):
    """Each step's batches: one per replica of `place` (one global batch without)."""
    data = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS))
    batches = build_training_epochs(data, Batches(16, 4, EXAMPLES, drop_remainder),
                                    Epochs(first, first + count, skip),
                                    prep=Prep(scale=1 / 255, cache=cache, shard=shard),
                                    order=Order(7, 50, lanes), place=place,
                                    augment=list(augment))
    found = [(x.numpy(), y.numpy()) for x, y in batches]
    per_step = place.replicas if place is not None else 1
    return [found[i:i + per_step] for i in range(0, len(found), per_step)]


def together(*workers):
    """Each step's examples over all workers: `{label: image}`."""
    return [{int(label): image for batches in step for x, y in batches
             for image, label in zip(x, y, strict=True)} for step in zip(*workers, strict=True)]


@pytest.mark.parametrize("lanes, replicas, augment, drop", [
    (1, 1, (), False), (2, 2, ("flip", "crop"), False), (4, 1, ("flip",), True),
    (3, 1, (), False)])
def test_the_workers_batches_together_are_one_workers(lanes, replicas, augment, drop):
    """Two workers (lanes 3: a worker's examples change every epoch) see one machine's
    global batches, augmented alike, an uneven last batch included."""
    alone = together(epochs(None, lanes, augment, drop))
    shares = [epochs(Place(2, w, replicas), lanes, augment, drop) for w in range(2)]
    assert len(shares[0]) == len(shares[1]) == len(alone)
    assert len(alone) == 2 * (3 if drop else 4)
    for mine, theirs in zip(together(*shares), alone, strict=True):
        assert sorted(mine) == sorted(theirs)
        for label, image in mine.items():
            np.testing.assert_array_equal(image, theirs[label])
    # the global batches differ from epoch to epoch
    assert sorted(alone[0]) != sorted(alone[len(alone) // 2])


def test_with_the_workers_dividing_the_lanes_a_worker_keeps_its_examples():
    def seen(lanes, worker):
        steps = epochs(Place(2, worker), lanes, count=2)
        return [sorted(int(y) for step in steps[i:i + 4] for _, labels in step for y in labels)
                for i in (0, 4)]

    first, second = seen(2, 1)
    assert first == second == list(range(1, EXAMPLES, 2))  # its lanes: the odd examples
    assert seen(1, 1)[0] != seen(1, 1)[1]  # one lane: a worker's examples change


def test_the_sources_own_reader_of_a_share_is_used():
    asked = []

    def shard(context):
        asked.append((context.num_input_pipelines, context.input_pipeline_id))
        data = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS))
        return data.shard(context.num_input_pipelines, context.input_pipeline_id)

    own = epochs(Place(2, 1), lanes=4, shard=shard)
    assert asked == [(2, 1)]
    for mine, theirs in zip(together(own), together(epochs(Place(2, 1), lanes=4)), strict=True):
        assert sorted(mine) == sorted(theirs)


def test_a_resumed_worker_skips_its_replicas_batches_of_the_steps_done():
    place = Place(2, 0, 2)
    whole = epochs(place, count=1, cache="none")
    resumed = epochs(place, count=1, skip=2, cache="none")
    assert [[y.tolist() for _, y in s] for s in resumed] == \
        [[y.tolist() for _, y in s] for s in whole[2:]]


def test_evaluation_shares_every_global_batch():
    data = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS))
    alone = [y.numpy().tolist() for _, y in build_pipeline(data, Batches(16, 4, EXAMPLES),
                                                                    training=False)]
    shares = [[y.numpy().tolist() for _, y in build_pipeline(
        data, Batches(16, 4, EXAMPLES), training=False, place=Place(2, w, 2))]
        for w in range(2)]
    steps = [sorted(a + b + c + d) for a, b, c, d in
             zip(shares[0][::2], shares[0][1::2], shares[1][::2], shares[1][1::2], strict=True)]
    assert steps == [sorted(batch) for batch in alone]


def test_an_image_folder_is_checked_once_between_the_workers_and_hashed_on_demand(
        tmp_path, monkeypatch):
    from PIL import Image

    for name in ("cat", "dog"):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(4):
            Image.new("RGB", (8, 8), (i * 60, 20, 200)).save(folder / f"{i}.png")
    hashed = []
    monkeypatch.setattr(image_folder, "of_folder", lambda *a, **k: hashed.append(a) or {})
    source = image_folder.load(str(tmp_path), image_size=8, validation_fraction=0.25,
                               test_fraction=0.25)
    assert hashed == []  # only where a fingerprint is asked for (the chief)
    source.fingerprint()
    assert len(hashed) == 1
    with open(tmp_path / "dog" / "2.png", "wb") as out:
        out.write(b"")
    raised = []
    for worker in range(2):  # each checks every other file: one of them finds it
        try:
            source.check(2, worker)
        except ConfigError as error:
            raised.append(str(error))
    assert len(raised) == 1 and "dog/2.png is empty" in raised[0]
    with pytest.raises(ConfigError, match="is empty"):
        source.check(1, 0)


def test_a_workers_dataset_is_handed_to_the_strategy_as_built_for_its_place():
    """`trainer.distribute.inputs`: the strategy's `distribute_datasets_from_function` gets
    the dataset built for this worker (its cache kept from epoch to epoch), and builds
    another place's anew; a dataset not built as a share is not one."""
    from trainer.distribute.inputs import dataset_function, read_per_worker

    built = []

    def build(context):
        built.append(context.input_pipeline_id)
        return tf.data.Dataset.range(context.input_pipeline_id, 10, context.num_input_pipelines)

    mine = read_per_worker(build, tf.distribute.InputContext(2, 1, 2))
    dataset_fn = dataset_function(mine)
    assert dataset_fn(tf.distribute.InputContext(2, 1, 2)) is mine
    assert list(dataset_fn(tf.distribute.InputContext(2, 0, 2)).as_numpy_iterator()) == [
        0, 2, 4, 6, 8]
    assert built == [1, 0]
    assert dataset_function(tf.data.Dataset.range(3)) is None


def _between_batch_and_shuffle(dataset: tf.data.Dataset) -> list[list[str]]:
    """For each batching op in the dataset's graph (its functions too: an epoch is a
    `flat_map`'s), the ops its input passes through back to the shuffle, newest first."""
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    chains = []
    for function in graph.library.function:
        nodes = {node.name: node for node in function.node_def}
        for node in function.node_def:
            if not node.op.startswith("BatchDataset"):
                continue
            chain, current = [], nodes.get(node.input[0].split(":")[0])
            while current is not None and not current.op.startswith("ShuffleDataset"):
                chain.append(current.op)
                current = nodes.get(current.input[0].split(":")[0]) if current.input else None
            if current is not None:
                chains.append(chain)
    return chains


@pytest.mark.parametrize("place", [None, Place(2, 1, 1)], ids=["one worker", "worker 1 of 2"])
def test_an_epochs_elements_pass_no_per_element_function_where_nothing_reads_a_position(place):
    """Between the shuffle and the batch, nothing that calls a function per element: a map
    there cost about 35 microseconds an element (9 ms of CPU a batch of 256, where the
    tutorial's whole pipeline takes 1 ms; scripts/bench_input.py's cached epochs). A worker
    of several takes its share by position with `shard`, not a `filter`."""
    data = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS))
    built = build_training_epochs(data, Batches(16, 4, EXAMPLES), Epochs(0, 2),
                                  prep=Prep(scale=1 / 255), order=Order(7, 50, 1), place=place)
    chains = _between_batch_and_shuffle(built)
    assert chains, "no shuffle feeds a batch"
    for chain in chains:
        assert not [op for op in chain if "Map" in op or "Filter" in op], chain
