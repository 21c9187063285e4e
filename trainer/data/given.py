"""Data as Keras's `fit` takes it, turned into a `Source`: a `tf.data.Dataset` (batched or
not), arrays `(x, y)`, `(x, y, sample_weight)` or `x` alone, a `keras.utils.PyDataset`, a
Python generator of batches, a dict of such splits, or a callable returning any of those.

One small adapter per kind, as Keras's `fit` reads its data
(`keras/src/trainers/data_adapters/`), each answering the same questions (the examples, the
batch they came in, their count and classes): `_arrays`, `_dataset`, `_py_dataset`,
`_generator`. Lists are read as tuples, as Keras's adapters read them (`[x, y]` is `(x, y)`;
`([a, b], y)` two inputs), a 1-tuple `(x,)` is inputs alone, and an input given as None is
an optional input left out. A `PyDataset` is read batch after batch each epoch
(`on_epoch_end` after each pass), so what it draws anew is drawn anew; one whose
`num_batches` is None repeats for ever (a stream). A generator can be read once: with
`steps_per_epoch` it is a stream; without, it is read whole, once, into memory (Keras's
`fit` reads it for its first epoch alone).

`load` is the builder behind `dataset._target_=trainer.data.given.load`: the object given to
`trainer.fit(data=...)` (`trainer.config.given`). `as_source` converts what any dataset
builder returned (a builder named by its dotted name may return these too).

A dict whose keys are among `train`, `validation` and `test` is a dict of splits; anything
else is the training split alone, with no validation (Keras's `fit(x, y)` without
`validation_data`). A batched dataset is unbatched here and batched again by trainer to the
run's global batch; `Source.given_batch` keeps its own batch for the run's summary (and, from
`trainer.fit`, as the global batch where the config sets none).

A training or validation dataset that repeats for ever (`repeat()`, as Keras's `fit` takes
it with `steps_per_epoch` / `validation_steps`) is a stream: it is not counted, its role is
named in `Source.endless`, and `trainer.data.wiring.bounded` gives it its steps. So is one of
unknown length where the run gives its role steps (`streams`): it is read pass after pass
(`repeat()`), never counted (counting a stream would never end).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.config.given import lookup
from trainer.data.fingerprint import of_arrays
from trainer.data.pipeline import DataError, Source
from trainer.internals.tf_data import UNKNOWN, batch_size_of, repeats_for_ever

SPLITS = ("train", "validation", "test")


def load(given: str | None = None, seed: int | None = None, **_: Any) -> Any:
    """The data object given to this call (`trainer.fit(data=...)`), called where it is a
    function (with `seed` where it names it); `given` says what it was, for the message when
    it is missing (`trainer.config.given.lookup`)."""
    found = lookup("data", given)
    if callable(found) and not isinstance(found, tf.data.Dataset):
        try:
            takes_seed = "seed" in inspect.signature(found).parameters
        except (TypeError, ValueError):
            takes_seed = False
        found = found(seed=seed) if takes_seed else found()
    return found


def as_source(found: Any, target: str, streams: tuple[str, ...] = ()) -> Source:
    """What a dataset builder returned as a `Source` (unchanged where it is one).

    Args:
        found: what the builder returned.
        target: its name, for the messages.
        streams: the roles the run gives steps (`train` with `steps_per_epoch`, `validation`
            with `validation_steps`): a dataset of unknown length there is read as a stream.

    Raises:
        DataError: something else (one line naming `target`, what it returned and what it
            may return), a test split that repeats for ever, or an empty split.
    """
    if isinstance(found, Source):
        return found
    if target == f"{__name__}.load":  # the object given to trainer.fit
        target = "trainer.fit(data=...)"
    if _is_splits(found):
        _check_split_keys(found, target)
        splits = {role: _split(value, target, role, role in streams)
                  for role, value in found.items()}
    else:
        splits = {"train": _split(found, target, "train", "train" in streams)}
    train = splits["train"]
    none = _Split(None, 0, None, None, None)
    validation, test = splits.get("validation", none), splits.get("test", none)
    features = train.dataset.element_spec[0]
    return Source(train=train.dataset, validation=validation.dataset, train_size=train.size,
                  validation_size=validation.size, test=test.dataset, test_size=test.size,
                  input_shape=_shapes(features), num_classes=train.classes,
                  num_outputs=None if train.classes is not None else _outputs(train.dataset),
                  reads_in_preprocess=train.fingerprint is not None,
                  fingerprint=_fingerprint(splits), given_batch=train.batch,
                  endless=tuple(role for role, s in splits.items() if s.endless),
                  read_as=_read_as(found.get("train") if _is_splits(found) else found))


def _is_splits(found: Any) -> bool:
    """Whether a dict is one of splits (its values whole splits: tuples, lists, datasets,
    PyDatasets, generators), not one split's named inputs (arrays)."""
    if not isinstance(found, Mapping) or not found:
        return False
    return set(found) <= set(SPLITS) or any(
        isinstance(v, (tuple, list, tf.data.Dataset, keras.utils.PyDataset, Iterator, Source))
        for v in found.values())


def _check_split_keys(found: Mapping, target: str) -> None:
    """A dict of splits holds `train`, and only the keys of splits."""
    unknown = [key for key in found if key not in SPLITS]
    if unknown:
        raise DataError(f"dataset {target}: a dict of splits takes the keys "
                        f"{', '.join(SPLITS)}; received {unknown[0]!r}")
    if "train" not in found:
        raise DataError(f"dataset {target}: a dict of splits needs `train`; received "
                        f"{', '.join(found)}")


class _Split:
    """One split as unbatched `(x, y[, w])` or `(x,)` elements, its examples, the batch it
    came in (None: unbatched), its classes (integer targets: the largest plus one) and its
    arrays' fingerprint (None for a dataset)."""

    def __init__(self, dataset: Any, size: int, batch: int | None, classes: int | None,
                 fingerprint: Any, endless: bool = False) -> None:
        self.dataset, self.size, self.batch = dataset, size, batch
        self.classes, self.fingerprint, self.endless = classes, fingerprint, endless


def _split(value: Any, target: str, role: str, stream: bool = False) -> _Split:
    """One split through the adapter of its kind."""
    if isinstance(value, Source):
        raise DataError(f"dataset {target}: a Source holds all its splits; return it alone, "
                        "not inside a dict")
    if isinstance(value, tf.data.Dataset):
        return _dataset(value, target, role, stream)
    if isinstance(value, keras.utils.PyDataset):
        return _py_dataset(value, target, role, stream)
    if isinstance(value, Iterator):
        return _generator(value, target, role, stream)
    return _arrays(value, target, role)


def _arrays(value: Any, target: str, role: str) -> _Split:
    """Arrays `(x, y)`, `(x, y, sample_weight)`, `(x,)` or `x`, lists read as tuples."""
    read_as, value = _read_as(value), keras.tree.lists_to_tuples(value)
    parts = value if isinstance(value, tuple) and len(value) in (1, 2, 3) else (value,)
    _check_arrays(parts, target, role)
    sizes = {int(np.shape(leaf)[0]) for leaf in tf.nest.flatten(parts) if leaf is not None}
    if len(sizes) != 1:
        raise DataError(f"dataset {target}: the {role} arrays hold different numbers of "
                        f"examples ({', '.join(str(s) for s in sorted(sizes))}); they must "
                        "match" + (f" ({read_as})" if read_as else ""))
    size = sizes.pop()
    if size == 0:
        raise DataError(f"dataset {target}: the {role} split holds no example")
    if len(parts) == 3:
        _check_weights(np.min(parts[2]), target, role)
        _check_weight_shape(parts, target, role)
    dataset = tf.data.Dataset.from_tensor_slices(tuple(parts))
    classes = _classes(parts[1]) if len(parts) > 1 else None
    return _Split(dataset, size, None, classes, of_arrays(*parts))


def _read_as(value: Any) -> str | None:
    """How a list of 2 or 3 parts was read (Keras reads `[x, y]` as `(x, y)`), for a
    refusal that may come from reading it so; None for any other form."""
    if not (isinstance(value, list) and len(value) in (2, 3)):
        return None
    parts = "(x, y" + (", sample_weight)" if len(value) == 3 else ")")
    return (f"a list of {len(value)} is read as {parts}, as Keras reads it; for "
            f"{len(value)} inputs alone give a tuple holding their tuple "
            f"(({', '.join('abc'[:len(value)])}),) or a dict by input name")


def _check_weight_shape(parts: tuple, target: str, role: str) -> None:
    """Sample weights as Keras takes them: one per example (`(N,)` or `(N, 1)`), or one per
    target value where the targets are sequences (their shape)."""
    weights, targets = np.shape(parts[2]), [np.shape(t) for t in tf.nest.flatten(parts[1])]
    if len(weights) == 1 or weights[1:] == (1,) or weights in targets:
        return
    raise DataError(f"dataset {target}: its {role} sample weights have shape {weights}, and "
                    f"its targets {', '.join(map(str, targets))}: give one weight per example "
                    f"(shape ({weights[0]},)), as model.fit takes them")


def _check_weights(lowest: Any, target: str, role: str) -> None:
    """Refuses negative sample weights (training would maximize those examples' loss), as
    negative class and loss weights are refused."""
    if float(lowest) < 0:
        raise DataError(f"dataset {target}: its {role} sample weights hold {float(lowest):g}; "
                        "sample weights must be 0 or more")


def _same_shapes(batches: list, target: str, role: str) -> None:
    """Refuses a generator whose batches change shape past their first axis (Keras's fit
    fails on it too): they could not be one dataset."""
    shapes = [tuple(tuple(np.shape(leaf)[1:]) for leaf in keras.tree.flatten(b))
              for b in batches]
    for index, shape in enumerate(shapes[1:], 1):
        if shape != shapes[0]:
            raise DataError(
                f"dataset {target}: its {role} generator's batch {index} has parts of shape "
                f"{_shown(shape)} past the batch axis, and batch 0 {_shown(shapes[0])}; every "
                "batch must have the same shape but for its size (pad them, or give a "
                "tf.data.Dataset with padded_batch)")


def _shown(shapes: tuple) -> str:
    return ", ".join(str((None, *s)) for s in shapes)


def _check_arrays(parts: tuple, target: str, role: str) -> None:
    for leaf in tf.nest.flatten(parts):
        if leaf is None:  # an optional input left out (one device trains it)
            continue
        if isinstance(leaf, np.ndarray) and leaf.dtype == object and not all(
                isinstance(v, (str, bytes)) for v in leaf.reshape(-1)[:100]):
            raise DataError(
                f"dataset {target}: a {role} array is a NumPy array of objects of shape "
                f"{leaf.shape} ({type(leaf.reshape(-1)[0]).__name__} rows of different "
                "lengths?), not numbers or strings: give a rectangular array (pad the rows: "
                "keras.utils.pad_sequences), or a tf.data.Dataset of ragged tensors")
        if not isinstance(leaf, (np.ndarray, tf.Tensor)) or not np.ndim(leaf):
            raise DataError(
                f"dataset {target} returned {type(leaf).__name__} in its {role} split; it may "
                "return a Source, a tf.data.Dataset, a keras.utils.PyDataset, a generator of "
                "batches, arrays (x, y), (x, y, sample_weight) or x (NumPy arrays, or "
                "tuples or dicts of them by input name), a dict of such splits (train, "
                "validation, test), or a function returning one")


def _py_dataset(given: Any, target: str, role: str, stream: bool = False) -> _Split:
    """A `keras.utils.PyDataset`: its batches read in order each pass, `on_epoch_begin` and
    `on_epoch_end` around each (so what it draws anew is drawn anew every epoch), as a
    batched dataset; one whose `num_batches` is None repeats for ever."""
    count = given.num_batches

    def batches():
        given.on_epoch_begin()
        try:
            for index in range(count) if count is not None else itertools.count():
                yield _standard_batch(given[index], target)
        finally:  # also where a pass stops at its last example, before the generator's end
            given.on_epoch_end()

    first = [_standard_batch(given[i], target) for i in range(min(2, count or 2))]
    if not first:
        raise DataError(f"dataset {target}: its {role} PyDataset holds no batch")
    dataset = tf.data.Dataset.from_generator(batches, output_signature=_batch_spec(first))
    if count is None:
        dataset = dataset.repeat()  # for ever: read as a stream, bounded by its steps
    else:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    return _dataset(dataset, target, role, stream)


def _generator(given: Iterator, target: str, role: str, stream: bool = False) -> _Split:
    """A Python generator of batches: read once. Where the run gives this role steps, a
    stream; else read whole into memory (it cannot be read a second time), its first
    batch's size the batch it came in."""
    first = next(given, None)
    if first is None:
        raise DataError(f"dataset {target}: its {role} generator yields no batch")
    first = _standard_batch(first, target)
    batch = int(np.shape(keras.tree.flatten(first)[0])[0])
    if stream:  # read once, as it runs: its batch and classes from its first batch alone
        rest = (_standard_batch(b, target) for b in given)
        dataset = tf.data.Dataset.from_generator(_replaying(first, rest),
                                                 output_signature=_batch_spec([first]))
        # a generator that ends ends the repeat too (tf.data stops on an empty pass)
        return _Split(dataset.unbatch().repeat(), 0, batch,
                      _classes(first[1]) if len(first) > 1 else None, None, endless=True)
    batches = [first, *(_standard_batch(b, target) for b in given)]
    _same_shapes(batches, target, role)
    arrays = keras.tree.map_structure(lambda *leaves: np.concatenate(leaves), *batches)
    found = _arrays(arrays, target, role)
    found.batch = batch
    return found


# Batches of a generator's stream kept for the passes that read its start again: the
# checks before training read its first batches, then training reads it from the start.
REPLAYED = 16


def _replaying(first: Any, rest: Iterator) -> Any:
    """A function giving the stream's batches from its start on every call: the first
    `REPLAYED` batches read are kept and given again, then the generator goes on."""
    kept = [first]

    def batches():
        yield from list(kept)
        for batch in rest:
            if len(kept) < REPLAYED:
                kept.append(batch)
            yield batch

    return batches


def _standard_batch(batch: Any, target: str) -> tuple:
    """A batch as `(x,)`, `(x, y)` or `(x, y, sample_weight)` of arrays, lists read as
    tuples, as Keras's PyDataset and generator adapters read them."""
    if isinstance(batch, (np.ndarray, tf.Tensor, Mapping)):
        batch = (batch,)
    batch = keras.tree.lists_to_tuples(batch)
    if not isinstance(batch, tuple) or len(batch) not in (1, 2, 3):
        raise DataError(f"dataset {target}: a batch must be (x,), (x, y) or (x, y, "
                        f"sample_weight); received {type(batch).__name__}")
    return keras.tree.map_structure(np.asarray, batch)


def _batch_spec(batches: list) -> Any:
    """The spec of batches like these: the batch axis, and any axis on which they differ,
    of unknown size."""
    def spec(*leaves):
        shapes = {np.shape(leaf)[1:] for leaf in leaves}
        shape = [d if all(s[i] == d for s in shapes) else None
                 for i, d in enumerate(np.shape(leaves[0])[1:])]
        return tf.TensorSpec((None, *shape), tf.as_dtype(leaves[0].dtype))

    return keras.tree.map_structure(spec, *batches)


def _dataset(dataset: tf.data.Dataset, target: str, role: str,
             stream: bool = False) -> _Split:
    """A `tf.data.Dataset`, batched or not, finite or repeating for ever."""
    batch = batch_size_of(dataset)
    count = int(dataset.cardinality())
    if count == tf.data.INFINITE_CARDINALITY and role == "test":
        raise DataError(f"dataset {target}: its test dataset repeats for ever (repeat()?); "
                        "the test split is evaluated once, whole: give it without repeat()")
    elements = dataset.unbatch() if batch is not None else dataset
    spec = elements.element_spec
    if not (isinstance(spec, tuple) and len(spec) in (1, 2, 3)):
        elements = elements.map(lambda *x: (x[0] if len(x) == 1 else x,))  # x alone
    unknown = count == tf.data.UNKNOWN_CARDINALITY
    if count == tf.data.INFINITE_CARDINALITY or (unknown and (
            stream or repeats_for_ever(dataset))):  # `repeat().filter(...)`: never counted
        return _stream_split(dataset, elements, batch, count)
    size, classes = _count(elements, target, role)
    if size == 0:
        raise DataError(f"dataset {target}: its {role} dataset holds no example")
    if batch == UNKNOWN:  # batched by something trainer cannot read: its first batch's size
        batch = int(tf.shape(tf.nest.flatten(next(iter(dataset)))[0])[0])
    return _Split(elements.apply(tf.data.experimental.assert_cardinality(size)), size,
                  batch, classes, None)


# Examples of a stream whose integer targets are read for its classes (it cannot be read
# whole): a class first seen later is beyond the count; name the classes in the model then.
CLASSES_SEEN = 1024


def _stream_split(dataset: tf.data.Dataset, elements: tf.data.Dataset, batch: int | None,
                  count: int) -> _Split:
    """A split that repeats for ever, or one of unknown length read pass after pass: its
    elements, size 0 (its steps bound it), classes from its first `CLASSES_SEEN` examples."""
    if count != tf.data.INFINITE_CARDINALITY:
        elements = elements.repeat()
    if batch == UNKNOWN:
        batch = int(tf.shape(tf.nest.flatten(next(iter(dataset)))[0])[0])
    classes = _count(elements.take(CLASSES_SEEN))[1] if _integer_target(elements) else None
    return _Split(elements, 0, batch, classes, None, endless=True)


def _count(elements: tf.data.Dataset, target: str = "", role: str = "train"
           ) -> tuple[int, int | None]:
    """(examples, classes): one pass over a dataset; classes where the targets are integer
    scalars (or of shape (1,)), else None. Refuses negative sample weights on the way."""
    integer, weighted = _integer_target(elements), len(elements.element_spec) == 3

    def step(state, element):
        top = tf.cast(tf.reduce_max(element[1]), tf.int64) if integer else state[1]
        low = tf.cast(tf.reduce_min(element[2]), tf.float64) if weighted else state[2]
        return state[0] + 1, tf.maximum(state[1], top), tf.minimum(state[2], low)

    # reduce passes (state, element): a tuple element stays one argument, never unpacked
    size, top, lowest = elements.reduce((np.int64(0), np.int64(-1), np.float64(0)), step)
    _check_weights(lowest, target, role)
    return int(size), int(top) + 1 if int(top) >= 1 else None


def _integer_target(elements: tf.data.Dataset) -> bool:
    """Whether each element's target is one integer (a scalar, or of shape (1,))."""
    spec = elements.element_spec
    target = spec[1] if len(spec) > 1 else None
    return (isinstance(target, tf.TensorSpec) and target.dtype.is_integer
            and target.shape.num_elements() == 1)


def _classes(y: Any) -> int | None:
    """Classes of integer targets (one per example): the largest plus one; None otherwise."""
    if not isinstance(y, (np.ndarray, tf.Tensor)):
        return None
    array = np.asarray(y)
    if not np.issubdtype(array.dtype, np.integer) or array.size != len(array):
        return None
    top = int(array.max())
    return top + 1 if top >= 1 else None


def _outputs(dataset: tf.data.Dataset) -> int:
    spec = dataset.element_spec
    target = spec[1] if len(spec) > 1 else None
    if isinstance(target, tf.TensorSpec) and target.shape.rank:
        return int(target.shape.num_elements() or 1)
    return 1


def _shapes(spec: Any) -> Any:
    """One example's shape from its spec: a tuple, or a dict or tuple of them per input."""
    if isinstance(spec, Mapping):
        return {k: _shapes(v) for k, v in spec.items()}
    if isinstance(spec, tuple):
        return tuple(_shapes(v) for v in spec)
    return tuple(spec.shape) if hasattr(spec, "shape") else None  # an input left out: None


def _fingerprint(splits: dict[str, _Split]) -> dict[str, Any] | None:
    """The arrays' fingerprints by role; None where a split is a dataset (its counts stand
    in, as for any source without one)."""
    if any(s.fingerprint is None for s in splits.values()):
        return None
    return {role: s.fingerprint for role, s in splits.items()}

