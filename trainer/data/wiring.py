"""A run's data wired from its config: the source built, its splits batched for training
(epoch by epoch, resumable mid-epoch), validation and test; class weights and label mixing
checked against the source.

A build module: TensorFlow is imported at the top; the run imports it after the devices are
set.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tensorflow as tf

from trainer.config.build import build_object, options_for
from trainer.config.errors import ConfigError
from trainer.config.schema import DataService, PipelineOptions
from trainer.data.augment import check_inputs, listed, mixers
from trainer.data.caching import check_memory, element_bytes, worker_memory_limit_mb
from trainer.data.given import as_source
from trainer.data.pipeline import (
    Batches,
    DataError,
    Epochs,
    Order,
    Prep,
    Source,
    build_pipeline,
    build_stream_epochs,
    build_training_epochs,
    non_finite_found,
)
from trainer.data.service import Service, out_of_order_message, service_report, stop_local
from trainer.data.shares import Place
from trainer.distribute.inputs import read_per_worker
from trainer.plan.scaling import check_micro_batches, steps_per_epoch
from trainer.rundir.layout import RunDir


@dataclass(frozen=True)
class Data:
    """A run's data: the source, a maker of training epochs, the validation batches, and the
    test batches (None without a test split).

    `make_train(first_epoch, end_epoch, skip_steps)` returns the training batches of those
    epochs as one dataset, skipping the steps a resumed run already did. On one worker of
    several, each is this worker's share (`trainer.distribute.inputs`: the strategy reads
    it through `distribute_datasets_from_function`). `reading` says how, for the summary.
    """

    source: Any
    make_train: Callable[[int, int, int], Any]
    validation: Any
    test: Any = None
    reading: dict[str, Any] | None = None
    # batches that show the model's inputs and targets: the validation batches, or without
    # validation (None) the first training examples, batched as evaluation batches them
    probe: Any = None


@dataclass(frozen=True)
class Batching:
    """How the run batches: the global batch over `shards` (replicas x micro-batches, so
    every shard of a last partial batch is non-empty), and evaluation's `eval_batch` over
    `replicas` (one micro-batch per replica; None: the global batch over the shards), on
    worker `worker` of `workers`."""

    global_batch: int
    shards: int
    eval_batch: int | None = None
    replicas: int = 1
    drop_remainder: bool = False
    workers: int = 1
    worker: int = 0
    local_workers: int = 1  # the workers on this machine, which share its memory
    steps_per_epoch: int | None = None  # `steps_per_epoch`: None, one pass over the data


def build_data(source: Source, options: PipelineOptions, batching: Batching, *,
               seed: int | None = None, augment: Any = None,
               class_weight: dict[int, float] | None = None, run_dir: Path | None = None,
               cache_from_data: bool = False) -> Data:
    """A loaded source's training epochs and evaluation batches, its data checked.

    Args:
        source: the source `load_source` loaded (and `bounded` bounded).
        options: the dataset node's pipeline options, as the run read them
            (`Spec.pipeline`).
        batching: the batch sizes and this worker's place.
        seed: the run's runtime seed (shuffling, augmentation).
        augment: the `augment` presets and nodes (training only).
        class_weight: per-class weights of the training examples.
        run_dir: where this process writes: `dataset.cache=disk` keeps its files there
            (`RunDir.input_cache`); None: nowhere (disk reads once, uncached).
        cache_from_data: the run's data was given to `trainer.fit` and no `dataset.cache`
            set (`Spec.cache_from_data`): a given dataset is read anew every epoch.
    """
    target = options._target_
    if source.check is not None:  # the workers check their shares: the data once
        source.check(batching.workers, batching.worker)
    check_inputs(augment, source.input_shape, target)
    source = checked_sizes(source, target)
    source = finite_explained(source, target)
    source = served_explained(source, options.served)
    source = one_hot_if_mixing(augment, source)
    check_class_weight(class_weight, source)
    check_no_missing_inputs(source, max(batching.shards, batching.replicas))
    if not batching.drop_remainder:  # else steps_per_epoch refuses a batch above the examples
        check_micro_batches(source.train_size, batching.replicas,
                            batching.shards // batching.replicas)
    if "train" in source.endless:
        _check_stream(augment, options)
        options = replace(options, cache="none")  # a stream has no end to cache up to
    elif cache_from_data and source.fingerprint is None:
        # a given dataset (not arrays) may draw anew each pass (random augmentation in its
        # map): read anew every epoch, as Keras's fit reads it, unless dataset.cache is set
        options = replace(options, cache="none")
    reading = Reading.of(options, batching, run_dir)
    reading.check_memory(source)
    order = Order(seed, options.buffer, reading.lanes)
    if "train" in source.endless:
        make_train = _stream_maker(source, batching, order, class_weight)
    else:
        make_train = _epochs_maker(source, batching, reading, order, augment, class_weight)
    validation, test, probe = _evaluations(source, batching, reading, order)
    return Data(source=source, make_train=make_train, validation=validation, test=test,
                reading=reading.report(source), probe=probe)


def _epochs_maker(source: Source, batching: Batching, reading: Reading, order: Order,
                  augment: Any,
                  class_weight: dict[int, float] | None) -> Callable[[int, int, int], Any]:
    """`make_train` of a finite training split: epochs of one pass each; with
    `steps_per_epoch`, epochs of that many steps read one after another from the passes
    (which `bounded` made a divisor of a pass's batches), as Keras's one iterator reads a
    finite dataset with `steps_per_epoch`."""
    steps = batching.steps_per_epoch
    per_pass = steps_per_epoch(source.train_size, batching.global_batch, batching.drop_remainder)
    prep = reading.prep(source, "train", shard=source.shard)
    batches = Batches(batching.global_batch, batching.shards, source.train_size,
                      batching.drop_remainder)

    def make_train(first_epoch: int, epochs: int, skip_steps: int):
        first, last = (first_epoch * steps + skip_steps, epochs * steps) if steps else (
            first_epoch * per_pass + skip_steps, epochs * per_pass)

        def build(place: Place) -> Any:
            found = build_training_epochs(
                source.train, batches, Epochs(first // per_pass, -(-last // per_pass),
                                              first % per_pass),
                prep=prep, order=order, place=place, augment=augment,
                class_weight=class_weight, service=reading.service())
            if not steps:
                return found
            return found.take((last - first) * (place.replicas if place.several else 1))

        return reading.shared(build)

    return make_train


def _stream_maker(source: Source, batching: Batching, order: Order,
                  class_weight: dict[int, float] | None) -> Callable[[int, int, int], Any]:
    """`make_train` of a training split that repeats for ever (`build_stream_epochs`); on
    several workers the strategy shards its global batches by element."""
    prep = Prep(source.preprocess, source.scale, "none", role="train")

    def make_train(first_epoch: int, epochs: int, skip_steps: int):
        return build_stream_epochs(
            source.train, batching.global_batch, Epochs(first_epoch, epochs, skip_steps),
            steps_per_epoch=batching.steps_per_epoch, prep=prep, order=order,
            class_weight=class_weight)

    return make_train


def _check_stream(augment: Any, options: PipelineOptions) -> None:
    """Refuses what a training split that repeats for ever cannot have: augmentation (its
    seeds come from each example's place in an epoch) and a tf.data service."""
    target = options._target_
    if listed(augment):
        raise DataError(f"dataset {target}: its training split repeats for ever, and augment "
                        f"seeds each example by its place in an epoch; received augment="
                        f"{list(augment)}: augment in the dataset's own map, or give it "
                        "without repeat()")
    if options.served is not None:
        raise DataError(f"dataset {target}: its training split repeats for ever; "
                        f"dataset.service={options.service} serves finite splits: set "
                        "dataset.service=null, or give it without repeat()")


def _evaluations(source: Source, batching: Batching, reading: Reading,
                 order: Order) -> tuple[Any, Any, Any]:
    """(validation, test, probe) batches: None for a split the source does not have; the
    probe is the validation batches, or without them the first training examples."""
    # The test split is read once, at the end: no cache holding it through the run.
    test = (_evaluation(source.test, source.test_size, batching, reading.shared,
                        reading.prep(source, "test", cache="none"), order)
            if source.test is not None and source.test_size > 0 else None)
    validation = (_evaluation(source.validation, source.validation_size, batching,
                              reading.shared, reading.prep(source, "validation"), order)
                  if source.validation is not None and source.validation_size > 0 else None)
    probe = validation
    if probe is None:
        first = min(source.train_size, batching.eval_batch or batching.global_batch)
        probe = _evaluation(source.train.take(first), first, batching, reading.shared,
                            reading.prep(source, "train", cache="none"), order)
    return validation, test, probe


def load_source(dataset: dict[str, Any], seed: int | None = None,
                defaults: tuple[str, ...] = (), validation_split: float | None = None,
                streams: tuple[str, ...] = ()) -> Source:
    """The `Source` of the dataset a config node names (its builder called with its options,
    the pipeline's keys left out): a `Source` it returned, or data as Keras's `fit` takes it
    turned into one (`trainer.data.given.as_source`), with the last `validation_split` of
    its training examples held out for validation where set (`held_out`); `streams` are the
    roles the run gives steps (`trainer.data.given.as_source`)."""
    pipeline = PipelineOptions.keys()
    options = options_for({k: v for k, v in dataset.items() if k not in pipeline},
                          (*defaults, "seed"))
    # `seed` for a loader that takes it (a function returning arrays may take nothing)
    seeded = {"seed": seed} if taken_by_target(options, "seed") else {}
    found = build_object(options, "dataset", **seeded)
    source = as_source(found, str(options["_target_"]), streams)
    return held_out(source, validation_split, str(options["_target_"]))


def held_out(source: Source, split: float | None, target: str) -> Source:
    """The source with the last `split` of its training examples (in the source's order,
    before shuffling) as its validation split, as Keras's `fit(validation_split=...)`;
    unchanged for None.

    Raises:
        DataError: the source has a validation split already, or the fraction leaves no
            example on one side.
    """
    if split is None:
        return source
    if "train" in source.endless:
        raise DataError(f"validation_split={split} holds out the last examples of the "
                        f"training split; dataset {target} repeats for ever or has an unknown "
                        "length: give a validation split instead, or remove validation_split")
    if source.validation is not None and source.validation_size:
        raise DataError(f"validation_split={split} holds out training examples for "
                        f"validation; dataset {target} has a validation split already "
                        f"({source.validation_size} examples): remove validation_split")
    kept = int(source.train_size * (1 - split))  # as Keras rounds it
    if kept < 1 or kept >= source.train_size:
        raise DataError(f"validation_split={split} of {source.train_size} training examples "
                        "leaves none on one side; choose a fraction that holds out at least "
                        "one example and keeps one")
    return dataclasses.replace(source, train=source.train.take(kept), train_size=kept,
                               validation=source.train.skip(kept),
                               validation_size=source.train_size - kept)


def bounded(source: Source, target: str, global_batch: int, eval_batch: int,
            steps: int | None = None, validation_steps: int | None = None,
            drop_remainder: bool = False) -> Source:
    """The source with its splits bounded by the run's steps, as Keras's `fit` reads them.

    A training split that repeats for ever needs `steps`; its `train_size` becomes the
    examples an epoch reads (`steps` global batches). A finite one with `steps` is read
    `steps` batches an epoch, one pass after another; `steps` must divide a pass's batches
    (Keras's `fit` would end an epoch early wherever a pass runs out, so its epochs would
    differ in length). `validation_steps` bounds validation to its first `validation_steps`
    batches of `eval_batch`, the same examples at every epoch (Keras's `fit` goes on through
    the validation data from one epoch to the next; a fixed set compares epochs alike and
    resumes alike); a validation split that repeats for ever needs it.

    Raises:
        DataError: a stream without its steps, or `steps` that do not divide a pass.
    """
    if "train" in source.endless and steps is None:
        raise DataError(f"dataset {target}: its training split repeats for ever (repeat()) "
                        "or its length is unknown; set steps_per_epoch=N (the training steps "
                        "of an epoch), as Keras's fit(steps_per_epoch=N) needs")
    if "validation" in source.endless and validation_steps is None:
        raise DataError(f"dataset {target}: its validation split repeats for ever (repeat()) "
                        "or its length is unknown; set validation_steps=N (the validation "
                        "batches read at each epoch's end), or give it without repeat()")
    changes: dict[str, Any] = {}
    if "train" in source.endless:
        changes["train_size"] = steps * global_batch
    elif steps is not None:
        per_pass = steps_per_epoch(source.train_size, global_batch, drop_remainder)
        if per_pass % steps:
            divisors = [d for d in range(1, per_pass + 1) if per_pass % d == 0]
            raise DataError(
                f"steps_per_epoch={steps} does not divide the {per_pass} batches of "
                f"{global_batch} in one pass over the {source.train_size} training examples "
                "(Keras's fit would end epochs early where the data runs out); valid: "
                f"{', '.join(map(str, divisors[-8:]))}, or repeat() the dataset")
    if validation_steps is not None and source.validation is not None:
        size = validation_steps * eval_batch
        if "validation" not in source.endless:
            size = min(size, source.validation_size)
        changes.update(validation=source.validation.take(size), validation_size=size)
    return dataclasses.replace(source, **changes) if changes else source


def taken_by_target(node: dict[str, Any], key: str) -> bool:
    """Whether the node's `_target_` takes `key` (by name or `**kwargs`); True where its
    signature cannot be read or it does not import (`build_object` then says why)."""
    return key in options_for({**node, key: None}, (key,))


def data_notes(source: Source, global_batch: int, per_replica: int, monitor: str,
               replaced: bool = False, steps: tuple[int | None, int | None] = (None, None)
               ) -> tuple[str, ...]:
    """What the summary says of the data as given: a batched dataset rebatched, a split
    read by `steps` (`steps_per_epoch`, `validation_steps`), no validation set choosing the
    checkpoint."""
    notes = []
    if source.given_batch is not None:
        notes.append(f"the dataset came in batches of {source.given_batch}: trainer unbatched "
                     f"it and batches it to the global batch {global_batch} "
                     f"({per_replica} per replica)")
    train_steps, validation_steps = steps
    if "train" in source.endless:
        notes.append(f"the training split is a stream (repeat(), or of unknown length): each "
                     f"epoch reads its next {train_steps} global batches (steps_per_epoch), "
                     "one stream across epochs as in Keras's fit")
    elif train_steps is not None:
        notes.append(f"steps_per_epoch={train_steps}: each epoch reads the next {train_steps} "
                     f"global batches of the training split, pass after pass")
    if validation_steps is not None and source.validation is not None:
        notes.append(f"validation_steps={validation_steps}: every epoch validates on the same "
                     f"first {source.validation_size} validation examples")
    if source.validation is None or not source.validation_size:
        notes.append(f"no validation set: the training {monitor} chose the best checkpoint")
    elif monitor == "val_loss" and replaced:
        notes.append("no accuracy is logged: val_loss chose the best checkpoint "
                     "(checkpoint.monitor's default is val_accuracy)")
    return tuple(notes)


def stop_services() -> None:
    """Stops the tf.data servers `dataset.service=local:K` started in this process (the
    run's end; idempotent)."""
    stop_local()


def _evaluation(split: Any, examples: int, batching: Batching,
                shared: Callable[[Callable[[Place], Any]], Any], prep: Prep,
                order: Order) -> Any:
    """A split's evaluation batches (this worker's share of each, on several, as `shared`
    hands them to the strategy), made ready as `prep` says."""
    replicas = batching.shards if batching.eval_batch is None else batching.replicas
    batches = Batches(batching.eval_batch or batching.global_batch, replicas, examples)

    def build(place: Place) -> Any:
        return build_pipeline(split, batches, training=False, prep=prep, order=order,
                              place=place)

    return shared(build)


@dataclass(frozen=True)
class Reading:
    """How this worker reads the data: the cache mode and its files, the lanes of the
    training order, its place among the workers (`trainer.data.shares`)."""

    cache: str
    lanes: int
    place: Place
    memory_limit_mb: int | None
    run_dir: Path | None = None
    served: DataService | None = None
    _service: list = dataclasses.field(default_factory=list, compare=False)

    @classmethod
    def of(cls, options: PipelineOptions, batching: Batching, run_dir: Path | None) -> Reading:
        workers = batching.workers
        place = Place(workers, batching.worker, max(1, batching.replicas // workers))
        mode = options.cache
        if mode == "disk" and run_dir is None:  # a finished run evaluated: read once
            mode = "none"
        return cls(mode, options.lanes, place,
                   worker_memory_limit_mb(options.memory_limit_mb, batching.local_workers),
                   run_dir, options.served)

    def prep(self, source: Source, role: str, cache: str | None = None,
             shard: Callable | None = None) -> Prep:
        """How a split of `source` in `role` is made ready: this worker's cache (or
        `cache`) and its files, the source's preprocessing and scale."""
        return Prep(source.preprocess, source.scale, cache or self.cache, self.file(role),
                    role, shard)

    def service(self) -> Service | None:
        """The tf.data service the training split is read on (`dataset.service`), started
        or checked the first time training asks for it (evaluation never does); None
        without one."""
        if not self._service:
            self._service.append(Service.of(self.served))
        return self._service[0]

    def file(self, split: str) -> Callable[[int | None], Path] | None:
        """`lane -> prefix` of a split's disk cache files; None unless `cache=disk`."""
        if self.cache != "disk" or self.run_dir is None:
            return None
        layout, worker = RunDir(self.run_dir), self.place.worker
        return lambda lane: layout.input_cache(worker, split, lane)

    def shared(self, build: Callable[[Place], Any]) -> Any:
        """The dataset this worker reads: on one worker of several, its share, which the
        strategy distributes through `distribute_datasets_from_function`."""
        if not self.place.several:
            return build(self.place)
        return read_per_worker(lambda context: build(Place.of(context)), self.place.context())

    def check_memory(self, source: Source) -> None:
        """Refuses `cache=memory` where this worker's share would not fit its limit."""
        place = self.place
        train = (place.examples_below(source.train_size) if place.owns_lanes(self.lanes)
                 else source.train_size)
        validation = place.examples_below(source.validation_size)
        size = element_bytes(_cached_spec(source))
        check_memory(self.cache, {"training": (train, size), "validation": (validation, size)},
                     self.memory_limit_mb)

    def report(self, source: Source) -> dict[str, Any]:
        """What the summary says about reading: the cache, and what each worker reads."""
        place, cached = self.place, self.cache != "none"
        notes = []
        if not place.several:
            reads = "one worker reads every example"
        elif not source.reads_in_preprocess and not (source.shard is not None
                                                      and place.owns_lanes(self.lanes)):
            reads = (f"each of {place.workers} workers reads the whole training split and "
                     "keeps its share of every global batch")
            notes.append("the dataset reads its examples in its own tf.data pipeline, not in "
                         "Source.preprocess, so every worker reads them all (element "
                         "sharding); a Source.shard function (and dataset.lanes a multiple "
                         "of the workers) reads a share")
        elif cached and not place.owns_lanes(self.lanes):
            reads = (f"each of {place.workers} workers decodes and caches the whole training "
                     "split once, then takes its share of every global batch")
            notes.append(f"dataset.lanes={self.lanes} is not a multiple of {place.workers} "
                         "workers, so a worker's examples change every epoch; "
                         f"dataset.lanes={place.workers} (or a multiple) fixes them, and each "
                         "worker caches its share alone")
        else:
            reads = (f"each of {place.workers} workers reads"
                     f"{', decodes and caches' if cached else ' and decodes'} only its share "
                     "of every global batch")
        return {"cache": self.cache, "lanes": self.lanes, "workers": place.workers,
                "reads": reads, "memory_limit_mb": self.memory_limit_mb, "notes": notes,
                "service": service_report(self.served)}


def _cached_spec(source: Source) -> Any:
    """The spec of one element as the cache keeps it (preprocessed; float32 images in the
    byte range as uint8, as `prepare` keeps them)."""
    spec = source.train.element_spec
    if source.preprocess is not None:
        spec = source.train.map(source.preprocess).element_spec
    features = spec[0]
    byte_range = source.scale is not None and abs(source.scale - 1 / 255) < 1e-12
    if byte_range and isinstance(features, tf.TensorSpec) and features.dtype == tf.float32:
        spec = (tf.TensorSpec(features.shape, tf.uint8), *spec[1:])
    return spec


# TensorFlow's words where `assert_cardinality` finds a split longer or shorter than declared.
COUNT_MISMATCH = re.compile(r"Input dataset was expected to contain (\d+) elements? but "
                            r"contained (only|at least) (\d+) elements?")


def checked_sizes(source: Source, target: str) -> Source:
    """The source, its splits holding the examples its sizes declare: a split whose length
    tf.data knows is checked now (one line naming both numbers, before training); one whose
    length it does not know (`filter`, files read line by line) is checked as it is read,
    and fails at the first pass with the same line instead of training epochs of the wrong
    number of steps."""
    splits, unknown = {}, []
    for role in ("train", "validation", "test"):
        dataset, size = getattr(source, role), getattr(source, f"{role}_size")
        if dataset is None:
            continue
        count = int(dataset.cardinality())
        if count == tf.data.INFINITE_CARDINALITY and role in source.endless:
            continue  # a stream, read `steps_per_epoch` batches an epoch
        if count == tf.data.INFINITE_CARDINALITY:
            raise DataError(f"dataset {target}: its {role} split repeats for ever (repeat()?);"
                            f" a Source's splits hold {role}_size={size} examples, once")
        if count >= 0 and count != size:
            raise DataError(_mismatch(target, role, size, f"holds {count}"))
        if count < 0:
            splits[role] = dataset.apply(tf.data.experimental.assert_cardinality(size))
            unknown.append(role)
    if not unknown:
        return source
    explain = source.explain

    def explained(error: BaseException) -> str | None:
        found = COUNT_MISMATCH.search(str(error))
        if found is None:
            return explain(error) if explain is not None else None
        expected, bound, actual = found.groups()
        roles = [r for r in unknown if getattr(source, f"{r}_size") == int(expected)]
        role = roles[0] if len(roles) == 1 else "/".join(unknown)
        yields = f"yields {'only ' if bound == 'only' else 'at least '}{actual}"
        return _mismatch(target, role, int(expected), yields)

    return dataclasses.replace(source, explain=explained, **splits)


def finite_explained(source: Source, target: str) -> Source:
    """The source, a non-finite value its splits were found to hold as they were read
    (`trainer.data.pipeline.finite_checked`) explained in one line naming the dataset, the
    split, the row and the part."""
    explain = source.explain

    def explained(error: BaseException) -> str | None:
        found = non_finite_found(error)
        if found is None:
            return explain(error) if explain is not None else None
        role, row, part = found
        return (f"dataset {target}: its {role} split holds NaN or inf in its {part}, first at "
                f"row {row} (counted from 0); the weights would train to NaN on it: drop or "
                "fill such rows (numpy.isfinite finds them)")

    return dataclasses.replace(source, explain=explained)


def served_explained(source: Source, served: DataService | None) -> Source:
    """The source, an example a tf.data service sent out of place (`dataset.service`)
    explained in one line naming the service and the remedy."""
    if served is None:
        return source
    explain = source.explain

    def explained(error: BaseException) -> str | None:
        message = out_of_order_message(error, served.value)
        if message is None and explain is not None:
            return explain(error)
        return message

    return dataclasses.replace(source, explain=explained)


def _mismatch(target: str, role: str, size: int, found: str) -> str:
    return (f"dataset {target}: its {role} split {found} examples, but its Source declares "
            f"{role}_size={size}; the steps per epoch come from {role}_size: make it what "
            "the dataset yields")


def check_no_missing_inputs(source: Any, shards: int) -> None:
    """Refuses an input given as None (a Keras model's optional input) where a batch is
    split over replicas or micro-batches: tf.distribute cannot split a None component
    (one device trains it, as Keras's fit does)."""
    if shards <= 1:
        return
    paths = [path for path, spec in _flat_specs(source.train.element_spec[0])
             if type(spec).__name__ == "NoneTensorSpec"]
    if paths:
        raise DataError(f"the dataset gives input {paths[0] or 'x'} as None (an optional "
                        f"input left out): a batch split over {shards} replicas or "
                        "micro-batches cannot hold None; give it as zeros, or train on one "
                        "device without batch.accumulate")


def _flat_specs(spec: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(spec, dict):
        return [f for k, v in spec.items() for f in _flat_specs(v, f"{path}/{k}".lstrip("/"))]
    if isinstance(spec, (tuple, list)):
        return [f for i, v in enumerate(spec) for f in _flat_specs(v, f"{path}/{i}".lstrip("/"))]
    return [(path, spec)]


def check_class_weight(weights: dict[int, float] | None, source: Any) -> None:
    """Refuses class weights Keras would refuse or that name no class of the dataset."""
    if weights is None:
        return
    spec = source.train.element_spec
    # Keras's rule: one target tensor, read as class indices (cast to integers) or, with
    # a last axis above 1, as one-hot rows (their argmax)
    if len(spec) < 2 or not isinstance(spec[1], tf.TensorSpec):
        raise ConfigError("class_weight weighs the classes of one class target; this dataset "
                          + ("has no targets" if len(spec) < 2 else "has a target per output")
                          + "; remove class_weight")
    if len(spec) > 2:
        raise ConfigError("class_weight and the dataset's own sample weights cannot be combined "
                          "(as in Keras's fit); remove class_weight or the sample weights")
    beyond = sorted(k for k in weights if source.num_classes is not None
                    and k >= source.num_classes)
    if beyond:
        raise ConfigError(f"class_weight names class {beyond[0]}; this dataset has "
                          f"{source.num_classes} classes (0-{source.num_classes - 1})")
    missing = sorted(set(range(source.num_classes or 0)) - {int(k) for k in weights})
    if missing:
        # Keras reads a class above the largest key out of its table: a graph error in the
        # first step, on one device too
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise ConfigError(f"class_weight={dict(weights)} gives no weight to class(es) {shown} "
                          f"of this dataset's {source.num_classes} (0-"
                          f"{source.num_classes - 1}): give every class a weight (1.0 for "
                          "those you do not weigh)")


def one_hot_if_mixing(augment: Any, source: Any) -> Any:
    """Every split's labels one-hot where MixUp or CutMix mixes them (the same shape for
    training and evaluation, so the loss and the metrics read both)."""
    names = mixers(list(augment or []))
    if not names:
        return source
    if source.num_classes is None:
        raise ConfigError(f"augment {', '.join(names)} mixes class labels; this dataset's "
                          "targets are not classes")
    classes = source.num_classes

    def hot(split):
        if split is None:
            return None
        return split.map(lambda x, y, *rest: (x, tf.one_hot(tf.cast(y, tf.int32), classes),
                                              *rest))

    return dataclasses.replace(source, train=hot(source.train),
                               validation=hot(source.validation), test=hot(source.test))


def loss_for_labels(loss: Any, augment: Any) -> Any:
    """The loss that reads the labels as the pipeline gives them: MixUp / CutMix make every
    split's labels one-hot, so `sparse_categorical_crossentropy` becomes
    `categorical_crossentropy` there."""
    if mixers(list(augment or [])) and loss == "sparse_categorical_crossentropy":
        return "categorical_crossentropy"
    return loss


def model_ready(source: Source) -> tf.data.Dataset:
    """The training split as the model takes it, unbatched, in the source's order: each
    element preprocessed and scaled as the training pipeline does, without augmentation
    (what a builder `adapt`s its preprocessing layers on)."""
    dataset = source.train
    if source.preprocess is not None:
        dataset = dataset.map(source.preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    if source.scale is not None:
        scale = source.scale
        dataset = dataset.map(lambda x, *rest: (tf.cast(x, tf.float32) * scale, *rest),
                              num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options)
