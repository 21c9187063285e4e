"""tf.data's private structure, where trainer reads the batch a user's dataset was built with.

A `tf.data.Dataset` does not say whether its elements are batches: Keras's `fit` assumes
they are. trainer takes batched and unbatched datasets alike (it rebatches to the global
batch), so it walks the dataset's chain of transformations (`_input_dataset`) back to the
last `batch` (`_batch_size`) or `rebatch` (`_batch_sizes`), or to an `unbatch` or its
source. Written for TensorFlow 2.19-2.21.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainer.internals import check_version

check_version("tensorflow", tf.__version__)

# What `batch_size_of` returns for a dataset whose batches' size its chain does not say.
UNKNOWN = -1


def batch_size_of(dataset: Any) -> int | None:
    """The batch size a dataset's last `batch` (or `padded_batch`, `rebatch`) set; None for
    a dataset of single examples (no batch, or an `unbatch` after it); `UNKNOWN` for one
    whose chain cannot be read (several inputs zipped, a transformation of another kind),
    whose every part has an unknown first axis (what `batch` gives)."""
    found = dataset
    while found is not None:
        kind = type(found).__name__
        if "Unbatch" in kind:
            return None
        size = getattr(found, "_batch_size", None)
        if size is not None:
            return int(size)
        sizes = getattr(found, "_batch_sizes", None)
        if sizes is not None:
            return int(tf.reshape(sizes, [-1])[0])
        if not hasattr(found, "_input_dataset"):
            break
        found = found._input_dataset
    specs = tf.nest.flatten(dataset.element_spec)
    leading = [s.shape[0] if s.shape.rank else 0 for s in specs if hasattr(s, "shape")]
    return UNKNOWN if leading and all(d is None for d in leading) else None


def repeats_for_ever(dataset: Any) -> bool:
    """Whether a dataset whose length tf.data does not know never ends: its chain holds a
    `repeat()` without a count (`_count` -1) below every transformation of unknown length
    (`repeat().filter(...)`); False where a transformation of known length bounds it
    (`repeat().take(n)`) or the chain cannot be read (several inputs)."""
    found = dataset
    while found is not None:
        if int(found.cardinality()) >= 0:
            return False
        count = getattr(found, "_count", None)
        if "Repeat" in type(found).__name__ and count is not None and int(count) == -1:
            return True
        found = getattr(found, "_input_dataset", None)
    return False


def dataset_graph(dataset: Any) -> bytes:
    """A dataset's pipeline as a serialized graph (`DatasetToGraphV2`, what the tf.data
    service sends its workers): its transformations, functions already traced (AutoGraph
    read their source here) and in-memory tensors, lazily, `repeat()` included; one with
    state outside the graph (a Python generator, a `py_function`) fails with
    `FailedPreconditionError`."""
    graph = dataset._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL,
        strip_device_assignment=True)
    return graph.numpy()


def dataset_of_graph(graph: bytes, element_spec: Any) -> tf.data.Dataset:
    """The dataset `dataset_graph` serialized, rebuilt in this process
    (`DatasetFromGraph`)."""
    return tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=graph),
                                             element_spec)


class LaterDataset:
    """A dataset `dataset_graph` serialized, rebuilt (`dataset_of_graph`) on its first use,
    not when it is unpickled: a cluster worker's fresh process unpickles its call before the
    run creates the multi-worker strategy, which must come before any TensorFlow op.
    `isinstance(later, tf.data.Dataset)` holds without rebuilding it, and every attribute is
    the rebuilt dataset's."""

    def __init__(self, graph: bytes, element_spec: Any) -> None:
        self._graph, self._spec, self._dataset = graph, element_spec, None

    @property
    def __class__(self) -> type:  # noqa: D105 - isinstance(later, tf.data.Dataset)
        return tf.data.Dataset

    def rebuilt(self) -> tf.data.Dataset:
        """The dataset itself, rebuilt once."""
        if self._dataset is None:
            self._dataset = dataset_of_graph(self._graph, self._spec)
        return self._dataset

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_graph", "_spec", "_dataset"):
            raise AttributeError(name)
        return getattr(self.rebuilt(), name)

    def __iter__(self) -> Any:
        return iter(self.rebuilt())

    def __len__(self) -> int:
        return len(self.rebuilt())

    def __bool__(self) -> bool:
        return True

    def __reduce__(self) -> Any:
        return LaterDataset, (self._graph, self._spec)
