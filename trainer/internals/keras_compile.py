"""Keras 3.15's compile and saving internals that trainer's task building reads: the
wrapper `compile` puts around a loss function, the metric `compile` resolves a name to, the
compiled loss's entries, a compiled model's own `compile` arguments, and saving a model's
weights into a `.keras` archive of trainer's, or taking them into memory to be written later
as the `.weights.h5` file `save_weights` writes (a backup's, beside training); the saving
walk's attribute skip-sets computed once per process (`keep_skipsets`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras.src import backend
from keras.src.losses import LossFunctionWrapper
from keras.src.saving import saving_lib
from keras.src.saving.serialization_lib import ObjectSharingScope
from keras.src.trainers.compile_utils import CompileMetrics, get_metric

from trainer.internals import check_version

check_version("keras", keras.__version__)


def keep_skipsets() -> None:
    """Makes Keras's saving walk compute each object type's attribute skip-set once per
    process. Keras 3.13-3.15's `saving_lib.get_attr_skipset` reads its cache under
    `saving_attr_skiplist_<type>` but stores it under `saving_attr_skipset_<type>`, so the
    cache never hits: every layer walked builds a reference `Layer()` again (about 1 ms).
    That is 0.1 s of every `model.save` and backup of MobileNetV2 (157 layers), half of the
    walk. A set depends only on the type (the `dir()` of a fresh reference object of a
    Keras class), so one per type per process is what the cache meant to keep. Idempotent;
    installed when this module is imported."""
    original = saving_lib.get_attr_skipset
    if getattr(original, "kept_by_trainer", False):
        return
    kept: dict[str, set[str]] = {}

    def get_attr_skipset(obj_type: str) -> set[str]:
        if obj_type not in kept:
            kept[obj_type] = original(obj_type)
        return kept[obj_type]

    get_attr_skipset.kept_by_trainer = True
    saving_lib.get_attr_skipset = get_attr_skipset


keep_skipsets()


def wrapped_loss(function: Callable, name: str | None, **keywords: Any) -> keras.losses.Loss:
    """A loss function as Keras's `compile` wraps it (`LossFunctionWrapper`, which Keras does
    not export)."""
    return LossFunctionWrapper(function, name=name, **keywords)


def metric_for(name: str, y_true: Any, y_pred: Any) -> keras.metrics.Metric:
    """The metric Keras's `compile` makes of a name for these targets and outputs
    (`accuracy` becomes sparse or categorical by their shapes)."""
    return get_metric(name, y_true, y_pred)


def output_spec(model: keras.Model, x: Any) -> Any:
    """The model's outputs for symbolic inputs, building its variables as `fit` does."""
    return backend.compute_output_spec(model, x, training=False)


def named_metrics(metric: keras.metrics.Metric) -> list[tuple[str, keras.metrics.Metric]]:
    """`(logged name, metric)` pairs of one of `model.metrics`: each compiled metric by the
    name Keras logs it under, any other metric by its own name."""
    if isinstance(metric, CompileMetrics):
        return list(zip(metric.result(), metric.metrics, strict=True))
    return [(metric.name, metric)]


def direction(metric: Any) -> str | None:
    """Which way a Keras metric says it improves (`up`/`down`), or None."""
    return getattr(metric, "_direction", None)


def compile_arguments(model: keras.Model) -> dict[str, Any]:
    """What a compiled model's `compile` was called with (loss, metrics, optimizer, ...)."""
    return dict(model._compile_config.config)


def compiled_losses(model: keras.Model) -> list | None:
    """The compiled loss's entries, one per output with a loss (each has `loss`, `name`
    and `path`), or None where the loss is not compiled or built."""
    compiled = getattr(model, "_compile_loss", None)
    if compiled is None or not compiled.built:
        return None
    return list(compiled._flat_losses)


def config_saves(model: keras.Model) -> None:
    """Serializes the model's config as `model.save` does (objects shared between layers
    once), raising what saving would raise."""
    with ObjectSharingScope():
        keras.saving.serialize_keras_object(model)


def save_weights_only(model: keras.Model, path: str) -> None:
    """Writes the model's weights (and optimizer state) as a `.weights.h5` file, as a
    `.keras` archive holds them."""
    saving_lib.save_weights_only(model, path)


class _Taken(saving_lib.H5IOStore):
    """Keras's weights store, keeping in host memory what `save_weights` would write: each
    entry's path and metadata, and its values (read now: the next step changes the
    variables; Keras's read of a variable is a copy)."""

    def __init__(self) -> None:  # no file: written later, by `weights_taken`'s writer
        self.mode = "w"
        self.entries: list[tuple[str, Any, dict[str, np.ndarray]]] = []

    def __bool__(self) -> bool:
        return True

    def make(self, path, metadata=None):
        self.entries.append((path, metadata, {}))
        return self

    def __setitem__(self, key, value):
        self.entries[-1][2][key] = np.asarray(keras.ops.convert_to_numpy(value))

    def close(self) -> None:
        pass


def weights_taken(model: keras.Model) -> Callable[[str], None]:
    """The model's weights and optimizer state, taken into host memory now as
    `model.save_weights` reads them (Keras's walk over the model and the reads: the file's
    writing is what is left for later).

    Returns:
        A function writing them, later and in any thread, to a `.weights.h5` path: the
        file `save_weights` would have written now, which `load_weights` reads.
    """
    if not model.built:
        raise ValueError("a model that is not built has no weights to save")
    taken = _Taken()
    saving_lib._save_state(model, weights_store=taken, assets_store=None, inner_path="",
                           visited_saveables=set())

    def write(path: str) -> None:
        store = saving_lib.H5IOStore(path, mode="w")
        try:
            for inner, metadata, values in taken.entries:  # the calls saving made, again
                entry = store.make(inner, metadata=metadata) if metadata else store.make(inner)
                for key, value in values.items():
                    entry[key] = value
        finally:
            store.close()

    return write
