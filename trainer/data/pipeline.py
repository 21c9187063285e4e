"""The input pipeline all sources share: parallel preprocess, cache, shuffle, batch, prefetch."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.config.validate import CACHE_MODES
from trainer.data.augment import PRESETS, listed
from trainer.data.augment import mixers as mixer_names
from trainer.data.augmenters import batch_layers, batch_mixer, element_augmenter
from trainer.data.caching import cached
from trainer.data.fingerprint import of_arrays
from trainer.data.shares import (
    Place,
    dealt,
    lane,
    mine,
    positions_of,
    replica_batches,
    replica_index,
)
from trainer.internals.keras_data import class_weight_map_fn
from trainer.plan.scaling import balanced_batch_sizes, global_batch_sizes


@dataclass
class Source:
    """What a data source's `load` returns: examples for training and validation.

    Elements are `(features, target)` pairs: images and class indices, or any tensors (a
    row of tabular features and a regression target, say); nothing here assumes images.

    Three roles: `train` is trained on, `validation` chooses (best checkpoint, early
    stopping, learning-rate plateaus), `test` is read once, at the end, to evaluate the
    chosen checkpoint; a source without a test split leaves it None.

    Attributes:
        train: unbatched `(features, target)` elements for training.
        validation: unbatched `(features, target)` elements for model selection, or None:
            no validation (as Keras's `fit` without `validation_data`), the training loss
            then chooses the best checkpoint.
        train_size: number of training examples.
        validation_size: number of validation examples.
        input_shape: shape of one preprocessed input, e.g. `(32, 32, 1)` or `(10,)`.
        num_classes: number of classes where targets are class indices or one-hot vectors;
            None for a regression target.
        num_outputs: outputs the model needs: `num_classes` when None, else 1 per target.
        preprocess: per-element function applied in parallel before caching (decode,
            resize), or None.
        scale: inputs are cast to float32 and multiplied by it per batch, after the cache,
            so the cache holds the compact raw values (uint8 where the source has them);
            None leaves the inputs as they are.
        test: unbatched elements evaluated once at the end, or None.
        test_size: number of test examples (0 without a test split).
        splits: where each role comes from, for the summary (e.g. TFDS's split strings).
        class_names: the classes' names, in index order, where the source knows them.
        fingerprint: each role's examples in a few bytes (`trainer.data.fingerprint`), kept
            by the run to notice changed data, or a function that computes them where asked
            (an image folder's hashes: on the chief, not on every worker); None: the roles'
            counts stand in.
        explain: turns an error raised while reading elements (a file that does not
            decode, deep inside tf.data) into the one line naming the bad data, or None
            where it is not the source's; see `data_failure`.
        reads_in_preprocess: iterating `train` is cheap (file paths, record bytes, arrays
            in memory) and `preprocess` does the reading and decoding: on several workers
            each then reads and decodes only its share of every global batch (the built-in
            sources). False: each worker iterates all of `train` (`preprocess` still runs
            on its share alone), which the summary says.
        check: checks the data before training, given `(workers, worker)`: this worker's
            share of it, every `workers`-th item from `worker` on (an image folder: each
            file's first and last bytes), so the workers check it once between them; or
            None.
        shard: how a worker of several reads its share of `train` without the others':
            from TensorFlow's `tf.distribute.InputContext`, the elements
            `train.shard(context.num_input_pipelines, context.input_pipeline_id)` would
            give (every `num_input_pipelines`-th from `input_pipeline_id` on, in order),
            e.g. from a file per worker. Used where the workers divide `dataset.lanes`
            (`trainer.data.shares`); None: each worker iterates `train`.
        given_batch: the batch size a batched `tf.data.Dataset` came in
            (`trainer.data.given`), which trainer unbatched and batches again to the run's
            global batch; None: its examples came one by one.
        endless: the roles (`train`, `validation`) whose dataset repeats for ever (a stream,
            as Keras's `fit` takes one with `steps_per_epoch` / `validation_steps`); their
            sizes stay 0 until `trainer.data.wiring.bounded` gives them the examples their
            steps read.
        read_as: how an ambiguous form was read (a list of 2 or 3 arrays as `(x, y)` or
            `(x, y, sample_weight)`), said where the model cannot take it; None where
            nothing was ambiguous.

    Elements may also be `(features,)` alone: a model that trains on its inputs (its own
    `train_step`, or losses from `add_loss`) has no targets.
    """

    train: tf.data.Dataset
    validation: tf.data.Dataset | None
    train_size: int
    validation_size: int
    input_shape: tuple[int, ...]
    num_classes: int | None = None
    num_outputs: int | None = None
    preprocess: Callable[[Any, Any], tuple[Any, Any]] | None = None
    scale: float | None = None
    test: tf.data.Dataset | None = None
    test_size: int = 0
    splits: dict[str, str | None] | None = None
    explain: Callable[[BaseException], str | None] | None = None
    fingerprint: dict[str, Any] | Callable[[], dict[str, Any]] | None = None
    class_names: list[str] | None = None
    reads_in_preprocess: bool = False
    check: Callable[[int, int], None] | None = None
    shard: Callable[[Any], tf.data.Dataset] | None = None
    given_batch: int | None = None
    endless: tuple[str, ...] = ()
    read_as: str | None = None

    def __post_init__(self) -> None:
        if self.num_outputs is None:
            self.num_outputs = self.num_classes if self.num_classes is not None else 1
        if self.test is not None and not self.test_size:
            count = int(self.test.cardinality())
            if count < 0:
                raise ConfigError("Source(test=...) of unknown length needs test_size (the "
                                  "number of test examples)")
            self.test_size = count

    @classmethod
    def from_arrays(cls, x_train: Any, y_train: Any, x_validation: Any, y_validation: Any, *,
                    num_classes: int | None = None, x_test: Any = None, y_test: Any = None,
                    sample_weight: Any = None, **kwargs: Any) -> Source:
        """A source from in-memory arrays, as Keras's `fit(x, y)` takes them.

        Features are an array, a tuple of arrays or a dict of named arrays (one per model
        input); targets an array, or a tuple (a list) or dict of them, one per output; every
        array's first axis the examples. Sizes are counted in examples, and every array of
        a split must hold the same number.

        Args:
            x_train, y_train: training features and targets.
            x_validation, y_validation: the same for validation.
            num_classes: for class targets; None for regression, where the number of
                outputs is the size of a target (1 for scalar targets).
            x_test, y_test: the same for the test split, or None for none.
            sample_weight: one weight per training example (Keras's `sample_weight`), or
                None.
            **kwargs: other `Source` fields (`preprocess`, `scale`, `input_shape` where the
                preprocessing changes it).

        Raises:
            DataError: an argument of the wrong type or size (one line naming it).
        """
        sizes = _checked_sizes(num_classes, x_train=x_train, y_train=y_train,
                               x_validation=x_validation, y_validation=y_validation,
                               x_test=x_test, y_test=y_test, sample_weight=sample_weight)
        outputs = None
        if num_classes is None and _parts(y_train) is None:  # one target
            outputs = int(np.prod(np.shape(y_train)[1:])) or 1

        def slices(x, y, w=None):
            return tf.data.Dataset.from_tensor_slices((_tuple(x), _tuple(y)) if w is None
                                                      else (_tuple(x), _tuple(y), w))

        test = None if x_test is None else slices(x_test, y_test)
        kwargs.setdefault("reads_in_preprocess", True)  # arrays in memory
        kwargs.setdefault("fingerprint", {
            "train": of_arrays(x_train, y_train, sample_weight),
            "validation": of_arrays(x_validation, y_validation),
            **({} if x_test is None else {"test": of_arrays(x_test, y_test)})})
        return cls(train=slices(x_train, y_train, sample_weight),
                   validation=slices(x_validation, y_validation),
                   train_size=sizes["x_train"], validation_size=sizes["x_validation"],
                   input_shape=kwargs.pop("input_shape", shapes_of(x_train)),
                   num_classes=num_classes, num_outputs=outputs, test=test,
                   test_size=sizes.get("x_test", 0), **kwargs)


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, tf.Tensor, tf.RaggedTensor))


def _parts(value: Any) -> dict | None:
    """The arrays of a structure of inputs by name or position; None for one array.

    A dict, a tuple, or a list of arrays is a structure (as Keras reads `x`); a list of
    numbers is one array."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple) or (isinstance(value, list) and value
                                    and all(_is_array(v) for v in value)):
        return dict(enumerate(value))
    return None


def _tuple(x: Any) -> Any:
    """Lists of inputs as tuples, at every depth (`from_tensor_slices` would stack a list
    into one array); named tuples and dicts keep their type."""
    parts = _parts(x)
    if parts is None:
        return x
    if isinstance(x, Mapping):
        return {k: _tuple(v) for k, v in x.items()}
    items = [_tuple(v) for v in x]
    return type(x)(*items) if hasattr(x, "_fields") else tuple(items)


def _leaves(value: Any, where: str = "") -> list[tuple[str, Any]]:
    """The arrays of a nested structure with where each is (`a/0`), None (an optional
    input given as None, as Keras takes it) left out."""
    parts = _parts(value)
    if parts is None:
        return [] if value is None and where else [(where, value)]
    return [leaf for key, item in parts.items()
            for leaf in _leaves(item, f"{where}/{key}" if where else str(key))]


def examples_in(value: Any, name: str) -> int:
    """Examples in an array or a nested structure of arrays (the first axis, the same in
    all); None inside a structure is an optional input left out.

    Raises:
        DataError: `value` holds something that is not an array, or arrays of different
            lengths.
    """
    counts = {}
    for key, leaf in _leaves(value):
        where = f" at {key}" if key else ""
        if not (_is_array(leaf) or isinstance(leaf, list)):
            raise DataError(f"Source.from_arrays({name}=...) must be an array (NumPy, a "
                            f"tensor, a list), or a tuple or dict of arrays; received "
                            f"{type(leaf).__name__}{where}")
        shape = leaf.shape if hasattr(leaf, "shape") else np.shape(leaf)
        if not len(shape):
            raise DataError(f"Source.from_arrays({name}=...) needs a first axis of examples; "
                            f"received a scalar{where}")
        counts[key] = int(shape[0])
    if not counts:
        raise DataError(f"Source.from_arrays({name}=...) holds no array")
    if len(set(counts.values())) > 1:
        found = ", ".join(f"{k}={v}" for k, v in counts.items())
        raise DataError(f"Source.from_arrays({name}=...): its arrays hold different numbers of "
                        f"examples ({found})")
    return next(iter(counts.values()))


def shapes_of(x: Any) -> Any:
    """The shape of one example: a tuple, or a dict or tuple of them per input."""
    parts = _parts(x)
    if parts is None:  # an array; an optional input given as None has shape ()
        return tuple(np.shape(x)[1:])
    shapes = {k: shapes_of(v) for k, v in parts.items()}
    return shapes if isinstance(x, Mapping) else tuple(shapes.values())


class DataError(ConfigError):
    """Data that is not there (not prepared, not downloadable, an empty folder)."""


def data_failure(source: Source, error: BaseException) -> DataError | None:
    """The one-line `DataError` for an error the source's data caused mid-run (a file that
    does not decode: TensorFlow's error names neither the file nor the remedy), or None."""
    if source.explain is None or isinstance(error, ConfigError):
        return None
    try:
        message = source.explain(error)
    except Exception:  # noqa: BLE001 - explaining must not hide the error itself
        return None
    return DataError(message) if message else None


@dataclass(frozen=True)
class Batches:
    """How a split's examples become global batches.

    Attributes:
        global_batch: examples per step over all replicas; the strategy splits each batch.
        replicas: what the batches are split over (replicas, or their micro-batches).
        examples: examples in the split, to keep every replica's share of the last batch
            non-empty (`trainer.plan.scaling.balanced_batch_sizes`); None: not known.
        drop_remainder: drop a last partial training batch (evaluation never drops one).
    """

    global_batch: int
    replicas: int = 1
    examples: int | None = None
    drop_remainder: bool = False


@dataclass(frozen=True)
class Prep:
    """How a split's elements are made ready before they are batched: preprocessed,
    checked finite, cached, scaled.

    Attributes:
        preprocess: per-element function, mapped in parallel before the cache; or None.
        scale: factor that brings the inputs to [0, 1], applied per batch after the cache
            (vectorised); None leaves them as they are.
        cache: where preprocessed elements stay after the first pass: `memory`, `disk` (in
            the files `cache_file` names) or `none`, as the run read `dataset.cache`.
        cache_file: `lane -> prefix` of a disk cache's files (lane None where one set of
            files holds the split); None: no files.
        role: the split's role (`train`, `validation`, `test`): its values are checked
            finite as they are read (`finite_checked`); None checks nothing.
        shard: the source's own reader of a worker's share of the training split
            (`Source.shard`), or None.
    """

    preprocess: Callable | None = None
    scale: float | None = None
    cache: str = "memory"
    cache_file: Callable[[int | None], Path] | None = None
    role: str | None = None
    shard: Callable | None = None

    def __post_init__(self) -> None:
        if self.cache not in CACHE_MODES:  # a bug of the caller's: the run read the mode
            raise ValueError(f"Prep(cache=...) takes one of {', '.join(CACHE_MODES)}; "
                             f"received: {self.cache!r}")

    def file(self, lane: int | None = None) -> Path | None:
        """The prefix of `lane`'s disk cache files; None without a disk cache's files."""
        return None if self.cache_file is None else self.cache_file(lane)


@dataclass(frozen=True)
class Order:
    """The training order: shuffled with `seed` (also augmentation's; None: not
    deterministic) in a buffer of `shuffle_buffer` examples (0: the source's order), dealt
    from `lanes` (`trainer.data.shares`)."""

    seed: int | None = None
    shuffle_buffer: int = 2048
    lanes: int = 1


@dataclass(frozen=True)
class Epochs:
    """Training epochs `first`..`end - 1` as one dataset, the first `skip_steps` steps of
    epoch `first` skipped (those a resumed run already did)."""

    first: int
    end: int
    skip_steps: int = 0


def build_pipeline(dataset: tf.data.Dataset, batches: Batches, *, training: bool,
                   prep: Prep = Prep(), order: Order = Order(),
                   place: Place | None = None) -> tf.data.Dataset:
    """Turns unbatched examples into one pass of global batches, ready for a strategy.

    Args:
        dataset: unbatched `(image, label)` elements.
        batches: the global batch, what it is split over, the examples.
        training: shuffle (and maybe drop a last partial batch); evaluation never drops one
            and keeps the input order, seed or not.
        prep: preprocessing, cache, scale and the role checked finite.
        order: the shuffle's seed and buffer; with a seed the order is deterministic,
            without one training batches may come in the order parallel preprocessing
            finishes them.
        place: evaluation on one worker of several: its positions of every global batch
            alone are read, preprocessed and cached, as its replicas' batches in turn
            (`trainer.data.shares`); needs `batches.examples`.

    Returns:
        A batched, prefetching `tf.data.Dataset`.
    """
    examples = batches.examples
    if place is not None and place.several:
        if training or examples is None:
            raise ValueError("build_pipeline shares evaluation batches among workers, given "
                             "the examples; training goes through build_training_epochs")
        share = prepare(mine(place, dataset, None), prep, prep.file())
        batched = replica_batches(share, place, global_batch_sizes(
            examples, batches.global_batch, batches.replicas))
        if prep.scale is not None:
            batched = batched.map(_scaler(prep.scale), num_parallel_calls=tf.data.AUTOTUNE)
        return batched.prefetch(tf.data.AUTOTUNE).with_options(
            _options(order.seed, ordered=True, per_worker=True))
    prepared = prepare(dataset, prep, prep.file())
    batched = _batches(prepared, replace(batches, drop_remainder=training
                                         and batches.drop_remainder),
                       prep.scale, order if training else None)
    # Evaluation and prediction keep the input order: predictions are written beside their
    # inputs, and a padded last batch is cut off by position.
    return batched.prefetch(tf.data.AUTOTUNE).with_options(_options(order.seed,
                                                                    ordered=not training))


@dataclass(frozen=True)
class _Augmentation:
    """The training batches' augmentation: per-element presets, batch layers, a mixer, and
    the key their seeds start from."""

    per_element: Callable | None
    layers: list
    mix: Callable | None
    base: int

    @classmethod
    def of(cls, augment: Any, seed: int | None) -> _Augmentation:
        items = listed(augment)
        presets = [i for i in items if isinstance(i, str) and i in PRESETS]
        # an unseeded run still needs seeds for the stateless ops: one drawn for this run
        base = seed if seed is not None else int(np.random.default_rng().integers(1, 2**31 - 1))
        return cls(element_augmenter(presets) if presets else None, batch_layers(items, seed),
                   batch_mixer(mixer_names(items)) if mixer_names(items) else None, base)

    def key(self, epoch: Any, offset: int = 0) -> Any:
        return tf.cast(self.base, tf.int64) * 7919 + epoch + offset


def build_training_epochs(dataset: tf.data.Dataset, batches: Batches, epochs: Epochs, *,
                          prep: Prep = Prep(), order: Order = Order(),
                          place: Place | None = None, augment: Any = None,
                          class_weight: dict[int, float] | None = None,
                          service: Any = None) -> tf.data.Dataset:
    """The training batches of epochs `epochs.first`..`epochs.end - 1` as one dataset.

    Each epoch's order comes from the seed and the epoch's number alone, not from how many
    passes the process made before, so a run resumed at epoch e, step k sees exactly the
    batches the interrupted run would have seen (`epochs.skip_steps` skips the k done ones).
    `augment` (the config's list, `trainer.data.augment`) transforms the training images after
    the cache, each with a seed from (seed, epoch, position). `class_weight` gives each
    training example its class's weight as a sample weight, as Keras's `fit` does.

    The order is dealt from `order.lanes` (`trainer.data.shares`). On one worker of several
    (`place`), the dataset holds this worker's replicas' batches in turn: its positions of
    every global batch, read, preprocessed, cached and augmented here alone (a batch mixer
    mixes each replica's batch). `prep.cache_file(lane)` names a disk cache's files (lane
    None where there is one); `prep.shard` is the source's own reader of a worker's share
    (`Source.shard`); `service` reads the elements on a tf.data service (`_served_epochs`).
    The other arguments as `build_pipeline`'s.
    """
    place = place or Place()
    if place.several and batches.examples is None:
        raise ValueError("build_training_epochs shares batches among workers given the examples")
    extra = _Augmentation.of(augment, order.seed)
    reading = _Reading(prep, order, extra)
    weigh = class_weight_map_fn(class_weight) if class_weight else None  # Keras's rule
    sizes = None if batches.examples is None else global_batch_sizes(
        batches.examples, batches.global_batch, batches.replicas, batches.drop_remainder)
    steps = epochs.skip_steps * (place.replicas if place.several else 1)
    if service is not None:
        served = _served_epochs(dataset, service, reading, place, sizes,
                                batches.drop_remainder, (epochs.first, epochs.end), weigh)
        return served.skip(steps).prefetch(tf.data.AUTOTUNE).with_options(
            _options(order.seed, per_worker=place.several))
    streams = reading.streams(dataset, place)  # each lane preprocessed (and cached) apart
    end = sum(sizes) if place.several and batches.drop_remainder else None

    @tf.autograph.experimental.do_not_convert  # trainer's own code: see `_converted`
    def one_epoch(epoch):
        elements = reading.epoch(streams, place, epoch, end)
        if place.several:
            batched = replica_batches(elements, place, sizes)
            if prep.scale is not None:
                batched = batched.map(_scaler(prep.scale), num_parallel_calls=tf.data.AUTOTUNE)
        else:  # shuffled already, as the lanes were dealt
            batched = _batches(elements, batches, prep.scale)
        return _batch_extras(batched, extra, epoch, weigh, place)

    epochs_ds = tf.data.Dataset.range(epochs.first, epochs.end).flat_map(one_epoch)
    return epochs_ds.skip(steps).prefetch(tf.data.AUTOTUNE).with_options(
        _options(order.seed, per_worker=place.several))


def build_stream_epochs(dataset: tf.data.Dataset, global_batch: int, epochs: Epochs, *,
                        steps_per_epoch: int, prep: Prep = Prep(role="train"),
                        order: Order = Order(),
                        class_weight: dict[int, float] | None = None) -> tf.data.Dataset:
    """The training batches of epochs `epochs.first`..`epochs.end - 1` of a split that
    repeats for ever, as Keras's `fit` reads one with `steps_per_epoch`: one stream across
    epochs, epoch `e` its global batches `e * steps_per_epoch` .. `(e + 1) * steps_per_epoch
    - 1`.

    Elements are preprocessed, checked finite, shuffled in a buffer of
    `order.shuffle_buffer` with `order.seed` (0: the dataset's own order) and batched to
    full global batches; nothing is cached, whatever `prep.cache` says (a stream has no end
    to cache up to). A resumed run builds the stream afresh and skips the batches the
    epochs before it read (`epochs.skip_steps` more within its first): the batches it
    trains on are those the interrupted run would have read wherever the dataset yields the
    same elements from a fresh iterator (its own shuffles seeded) and `order.seed` is set.
    Skipping reads those batches again, so a resume late in a long run takes a while. On
    several workers the strategy shards each global batch by element (tf.data's `DATA`
    policy): every worker reads the whole stream and keeps its share.
    """
    batches = _batches(prepare(dataset, replace(prep, cache="none")),
                       Batches(global_batch, drop_remainder=True), prep.scale, order)
    if class_weight:
        batches = batches.map(class_weight_map_fn(class_weight),
                              num_parallel_calls=tf.data.AUTOTUNE)
    first = epochs.first * steps_per_epoch + epochs.skip_steps
    return batches.skip(first).take(epochs.end * steps_per_epoch - first).prefetch(
        tf.data.AUTOTUNE).with_options(_options(order.seed))


@dataclass(frozen=True)
class _Reading:
    """How an epoch's elements are read, preprocessed, cached, dealt and augmented: the
    part a tf.data service runs where `dataset.service` names one."""

    prep: Prep
    order: Order
    extra: _Augmentation

    def streams(self, dataset: tf.data.Dataset, place: Place,
                suffix: str = "") -> list[tuple[int, tf.data.Dataset]]:
        """`(lane, elements)` of the lanes `place` reads, preprocessed and cached (a disk
        cache's files named with `suffix` too)."""
        prep, lanes = self.prep, self.order.lanes
        if prep.cache_file is not None and suffix:
            def file(lane, named=prep.cache_file):
                return named(lane).with_name(named(lane).name + suffix)

            prep = replace(prep, cache_file=file)
        return _cached(_lanes(dataset, lanes, place, prep.shard), lanes, prep)

    def epoch(self, streams: list[tuple[int, tf.data.Dataset]], place: Place, epoch: Any,
              end: int | None, keep_position: bool = False) -> tf.data.Dataset:
        """One epoch's elements of `place` (`(position, element)` with `keep_position`)."""
        seed, lanes = self.order.seed, self.order.lanes
        epoch_seed = None if seed is None else seed * 7919 + epoch
        preprocess = self.prep.preprocess if self.prep.cache == "none" else None
        if end is None and not keep_position and self.extra.per_element is None:
            # no position is read: none is made (see `dealt`; dropping one again took
            # a second per-element map)
            elements = mine(place, dealt(streams, lanes, epoch_seed, self.order.shuffle_buffer,
                                         positioned=False), lanes)
            return elements if preprocess is None else elements.map(
                _converted(preprocess), num_parallel_calls=tf.data.AUTOTUNE)
        positioned = positions_of(place, dealt(streams, lanes, epoch_seed,
                                               self.order.shuffle_buffer), lanes, end)
        return _augmented(positioned, preprocess, self.extra, epoch, keep_position)


def _served_epochs(dataset: tf.data.Dataset, service: Any, reading: _Reading, place: Place,
                   batches: list[int], drop_remainder: bool, span: tuple[int, int],
                   weigh: Callable | None) -> tf.data.Dataset:
    """This worker's batches of the epochs in `span`, their elements read on the tf.data
    service (`trainer.data.service`): service `k` of K produces the elements `k`, `k + K`,
    ... of this worker's share of each epoch (those of worker `w + W * k` of `W * K`, so a
    service caches only its lanes where `W * K` divides them), in order; they come back
    round-robin, each checked at its position, and are batched here as without a service."""
    count, (first_epoch, epochs) = len(service.targets), span
    end = sum(batches) if drop_remainder else None
    per_epoch = place.examples_below(sum(batches))
    produced = []
    for k in range(count):
        sub = Place(place.workers * count, place.worker + place.workers * k, place.replicas)
        lanes = reading.streams(dataset, sub, f"-service{k}" if count > 1 else "")

        def epoch_of(epoch, lanes=lanes, sub=sub):
            return reading.epoch(lanes, sub, epoch, end, keep_position=True)

        stream = tf.data.Dataset.range(first_epoch, epochs).flat_map(epoch_of)
        stream = stream.batch(SERVICE_CHUNK).prefetch(tf.data.AUTOTUNE).with_options(
            _options(reading.order.seed, ordered=True, per_worker=True))
        produced.append(service.distributed(stream, k).unbatch())
    choice = tf.data.Dataset.range(per_epoch).map(lambda m: m % count).repeat(
        epochs - first_epoch)
    merged = tf.data.Dataset.choose_from_datasets(produced, choice, stop_on_empty_dataset=True)
    sizes = place.batch_sizes(batches) if place.several else batches
    batched = _in_order(merged, place, per_epoch).batch(max(sizes)).rebatch(
        tf.constant(sizes, tf.int64))
    if reading.prep.scale is not None:
        batched = batched.map(_scaler(reading.prep.scale), num_parallel_calls=tf.data.AUTOTUNE)
    keyed = batched.enumerate().map(lambda b, batch: (first_epoch + b // len(sizes),
                                                      b % len(sizes), batch))
    return _extras(keyed, reading.extra, weigh, place)


# Elements go over a tf.data service's wire in chunks of this many (one RPC each).
SERVICE_CHUNK = 32
# What the position check of a served element says where a service sent another.
OUT_OF_ORDER = "trainer:service-order"
_OUT_OF_ORDER_FOUND = re.compile(rf"\[{OUT_OF_ORDER}\] \[(\d+)\] \[(\d+)\]")


def _in_order(merged: tf.data.Dataset, place: Place, per_epoch: int) -> tf.data.Dataset:
    """The served `(position, element)`s as elements, each checked to be at the position
    this worker expects (a dispatcher of several workers sends a copy per worker)."""
    def check(index, position, element):
        expected = place.worker + place.workers * (index % per_epoch)
        guard = tf.debugging.Assert(tf.equal(position, expected),
                                    [OUT_OF_ORDER, position, expected])
        with tf.control_dependencies([guard]):
            return tf.nest.map_structure(tf.identity, element)

    return merged.enumerate().map(lambda i, served: check(i, *served),
                                  num_parallel_calls=tf.data.AUTOTUNE)


def out_of_order_found(error: BaseException) -> tuple[int, int] | None:
    """(position received, position expected) where `error` is `_in_order`'s failure."""
    found = _OUT_OF_ORDER_FOUND.search(str(error))
    return None if found is None else (int(found[1]), int(found[2]))


def _lanes(dataset: tf.data.Dataset, lanes: int, place: Place,
           shard: Callable | None) -> list[tuple[int, tf.data.Dataset]]:
    """`(lane, elements)` of the lanes this worker reads: from the source's own reader of
    its share where it has one and the share is fixed (its lanes), else from `dataset`."""
    read = place.lanes_read(lanes)
    if shard is None or not place.several or not place.owns_lanes(lanes):
        return [(index, lane(dataset, lanes, index)) for index in read]
    share = shard(place.context())  # examples worker, worker + workers, ...: its lanes
    return [(index, lane(share, lanes // place.workers, k)) for k, index in enumerate(read)]


def _cached(streams: list[tuple[int, tf.data.Dataset]], lanes: int,
            prep: Prep) -> list[tuple[int, tf.data.Dataset]]:
    """Each lane preprocessed and cached (its disk files named by its lane; one lane's
    by none), checked finite as `prep.role` says; without a cache, only checked
    (preprocessing then runs in every epoch)."""
    if prep.cache == "none":
        return streams if prep.role is None else [
            (index, finite_checked(elements, prep.role)) for index, elements in streams]
    return [(index, prepare(elements, prep, prep.file(None if lanes == 1 else index)))
            for index, elements in streams]


def _augmented(positioned: tf.data.Dataset, preprocess: Callable | None,
               extra: _Augmentation, epoch: Any, keep_position: bool = False) -> tf.data.Dataset:
    """An epoch's elements from `(position, element)`: preprocessed here where nothing was
    cached, then augmented each with the seed (epoch, position); `(position, element)`
    again with `keep_position`."""
    if preprocess is not None:
        converted = _converted(preprocess)
        positioned = positioned.map(lambda p, element: (p, converted(*element)),
                                    num_parallel_calls=tf.data.AUTOTUNE)
    if extra.per_element is not None:
        return _keyed_map(positioned, _converted(extra.per_element), extra.key(epoch),
                          keep_position)
    return positioned if keep_position else positioned.map(lambda _, element: element)


def _batch_extras(batches: tf.data.Dataset, extra: _Augmentation, epoch: Any,
                  weigh: Callable | None, place: Place) -> tf.data.Dataset:
    """Batch layers, the batch mixer (each replica's batch on one worker of several) and
    class weights, on one epoch's batches."""
    return _extras(batches.enumerate().map(lambda k, batch: (epoch, k, batch)), extra, weigh,
                   place)


def _extras(keyed: tf.data.Dataset, extra: _Augmentation, weigh: Callable | None,
            place: Place) -> tf.data.Dataset:
    """`_batch_extras` on `(epoch, index in the epoch, batch)`s."""
    for layer in map(_converted, extra.layers):
        keyed = keyed.map(lambda e, k, batch, layer=layer:
                          (e, k, (layer(batch[0], training=True), *batch[1:])),
                          num_parallel_calls=tf.data.AUTOTUNE)
    if extra.mix is not None:  # a key apart from the images'
        mixer = _converted(extra.mix)

        def mix(e, k, batch):
            index = replica_index(place, k) if place.several else k
            return mixer(*batch, tf.stack([extra.key(e, 104729), index]))

        batches = keyed.map(mix, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        batches = keyed.map(lambda e, k, batch: batch)
    if weigh is not None:
        batches = batches.map(weigh, num_parallel_calls=tf.data.AUTOTUNE)
    return batches


def _converted(fn: Callable) -> Callable:
    """A user's function (a preprocess, an augmenter, a batch layer or mixer) as AutoGraph
    converts it, also inside trainer's epoch builder, which AutoGraph leaves alone: converting
    trainer's own pipeline code cost a run 1-4 s at its start, and it holds no Python control
    flow over tensors. A user's may (`if image.shape[0] > 32:` on a tensor, a `for` over a
    tf.range), and dataset functions nested in an unconverted one are left unconverted too."""
    return tf.function(fn)


def _checked_sizes(num_classes: Any, **arrays: Any) -> dict[str, int]:
    """The examples in each array `Source.from_arrays` was given, which must agree.

    Raises:
        DataError: a bad `num_classes`, a test split half given, or sizes that differ.
    """
    if num_classes is not None and (isinstance(num_classes, bool)
                                    or not isinstance(num_classes, int) or num_classes < 1):
        raise DataError(f"Source.from_arrays(num_classes=...) must be a positive int or "
                        f"None; received: {num_classes!r}")
    if (arrays["x_test"] is None) != (arrays["y_test"] is None):
        raise DataError("Source.from_arrays needs x_test and y_test together; received "
                        f"only {'x_test' if arrays['y_test'] is None else 'y_test'}")
    sizes = {name: examples_in(value, name) for name, value in arrays.items()
             if value is not None}
    for features, targets in (("x_train", "y_train"), ("x_validation", "y_validation"),
                              ("x_test", "y_test"), ("x_train", "sample_weight")):
        if targets in sizes and sizes[features] != sizes[targets]:
            raise DataError(f"Source.from_arrays: {features} holds {sizes[features]} "
                            f"examples, {targets} {sizes[targets]}; they must match")
    return sizes


def _keyed_map(positioned: tf.data.Dataset, fn: Callable, key: Any,
               keep_position: bool = False) -> tf.data.Dataset:
    def apply(position, element):
        out = fn(*element, tf.stack([key, position]))
        return (position, out) if keep_position else out

    return positioned.map(apply, num_parallel_calls=tf.data.AUTOTUNE)


def prepare(dataset: tf.data.Dataset, prep: Prep, file: Path | None = None) -> tf.data.Dataset:
    """Preprocesses elements in parallel, checks them finite and caches them (the part every
    pass shares).

    The check (`finite_checked`, where `prep.role` names the split) runs before the cache,
    so a cached epoch pays nothing for it. Images in the byte range (`prep.scale` 1/255)
    that preprocessing turned into float32 (a resize does) are cached as uint8: a quarter
    of the memory (cats_vs_dogs at 224: 3.5 GB instead of 14 GB). Without a cache they stay
    float32: rounding every pixel costs more (`scripts/bench_input.py`: about 10-30%) than
    the smaller batch copies save.

    Args:
        dataset: unbatched elements.
        prep: the preprocessing, the cache's mode, the source's scale (1/255: images in the
            byte range), the split's role (None: not checked).
        file: where a disk cache's files go.
    """
    if prep.preprocess is not None:
        dataset = dataset.map(prep.preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    if prep.role is not None:
        dataset = finite_checked(dataset, prep.role)
    if prep.cache == "none":
        return dataset
    scale = prep.scale
    byte_range = scale is not None and abs(scale - 1 / 255) < 1e-12
    features = dataset.element_spec[0]
    if byte_range and isinstance(features, tf.TensorSpec) and features.dtype == tf.float32:
        dataset = dataset.map(_to_bytes, num_parallel_calls=tf.data.AUTOTUNE)
    return cached(dataset, prep.cache, file)


# What a non-finite value found as a split is read raises (inside tf.data: an
# InvalidArgumentError), with the split's role, the row and the part; see `non_finite_found`.
NON_FINITE = "trainer:non-finite"
_NON_FINITE_FOUND = re.compile(rf"\[{NON_FINITE}\] \[(\w+)\] \[(\d+)\] \[([^\]]*)\]")


def finite_checked(dataset: tf.data.Dataset, role: str) -> tf.data.Dataset:
    """The elements as they are, each checked finite in its floating-point parts (features,
    targets, sample weights) as it is read; the first with NaN or inf fails the read with
    the role, its row in the split and the part (`non_finite_found` reads them back).

    NaN in the inputs trains silently otherwise: a NaN kernel that the loss need not show
    (a ReLU or a max-pool can hide it) and a model predicting one output for every input.
    Integer parts (uint8 images, class labels) cannot be non-finite and are not read.
    """
    specs = tf.nest.flatten(dataset.element_spec)
    names = tf.nest.flatten(_part_names(dataset.element_spec))
    checked = [(i, name) for i, (spec, name) in enumerate(zip(specs, names, strict=True))
               if isinstance(spec, tf.TensorSpec) and spec.dtype.is_floating]
    if not checked:
        return dataset
    labels = tf.constant([name for _, name in checked])

    def check(row, element):
        flat = tf.nest.flatten(element)
        finite = tf.stack([tf.reduce_all(tf.math.is_finite(flat[i])) for i, _ in checked])
        first = tf.gather(labels, tf.argmin(tf.cast(finite, tf.int32)))
        guard = tf.debugging.Assert(tf.reduce_all(finite), [NON_FINITE, role, row, first])
        with tf.control_dependencies([guard]):
            for i, _ in checked:
                flat[i] = tf.identity(flat[i])
        return tf.nest.pack_sequence_as(element, flat)

    return dataset.enumerate().map(check, num_parallel_calls=tf.data.AUTOTUNE)


def _part_names(spec: Any, where: str = "") -> Any:
    """The structure of an element with each part's name in place of its spec: `features`,
    `targets`, `sample weights` at the top, then the keys or positions (`features num`)."""
    if not where and isinstance(spec, tuple) and 2 <= len(spec) <= 3:
        tops = ("features", "targets", "sample weights")
        return tuple(_part_names(s, top) for s, top in zip(spec, tops, strict=False))
    if isinstance(spec, Mapping):
        return {k: _part_names(v, f"{where} {k}".strip()) for k, v in spec.items()}
    if isinstance(spec, (tuple, list)):
        items = [_part_names(v, f"{where} {i}".strip()) for i, v in enumerate(spec)]
        return type(spec)(*items) if hasattr(spec, "_fields") else type(spec)(items)
    return where or "features"


def non_finite_found(error: BaseException) -> tuple[str, int, str] | None:
    """(role, row, part) of the non-finite value `finite_checked` found where `error` is
    its failure (however TensorFlow wrapped it), else None."""
    found = _NON_FINITE_FOUND.search(str(error))
    return None if found is None else (found[1], int(found[2]), found[3])


def _to_bytes(images, *rest):
    return (tf.saturate_cast(tf.round(images), tf.uint8), *rest)


def _batches(dataset: tf.data.Dataset, batches: Batches, scale: float | None,
             shuffle: Order | None = None) -> tf.data.Dataset:
    """`dataset` in global batches (each replica's share of a last partial one non-empty,
    where the examples are known and it is kept), shuffled first as `shuffle` says (None:
    in its order), then scaled."""
    if shuffle is not None and shuffle.shuffle_buffer:
        dataset = dataset.shuffle(shuffle.shuffle_buffer, seed=shuffle.seed,
                                  reshuffle_each_iteration=True)
    drop = batches.drop_remainder
    dataset = dataset.batch(batches.global_batch, drop_remainder=drop)
    sizes = None if drop or batches.examples is None else balanced_batch_sizes(
        batches.examples, batches.global_batch, batches.replicas)
    if sizes is not None:
        dataset = dataset.rebatch(tf.constant(sizes, tf.int64))
    if scale is None:
        return dataset
    return dataset.map(_scaler(scale), num_parallel_calls=tf.data.AUTOTUNE)


def _scaler(scale: float) -> Callable:
    def to_unit_range(images, *rest):
        return (tf.cast(images, tf.float32) * scale, *rest)

    return to_unit_range


def _options(seed: int | None, ordered: bool = False,
             per_worker: bool = False) -> tf.data.Options:
    """With neither a seed nor `ordered`, parallel maps may hand over what finishes first.

    A dataset of one worker's share (`per_worker`) is not sharded again; any other, handed
    to a strategy of several workers, is sharded by element (tf.data's `DATA` policy: each
    worker keeps its share of every global batch)."""
    options = tf.data.Options()
    options.deterministic = ordered or seed is not None
    # In-memory data cannot be sharded by file; DATA sharding is what AUTO falls back to,
    # set explicitly so no worker logs the fallback warning.
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = (policy.OFF if per_worker
                                                         else policy.DATA)
    return options
