"""Preprocessing state adapted once per run, not once per worker.

A model builder that names `train` adapts its preprocessing layers on the training split
(`trainer.task.build.build_model`). On several workers only the chief reads the split for
it: each other worker's builder receives a stand-in (one element of zeros, or empty strings,
with the split's structure: no example of the split is read), and right after the build the
chief's adapted state is sent to every worker through the strategy's own collectives
(`take_chiefs`: the chief's replica 0 alone contributing), then each layer refreshes what
it derives from it (`finalize_state`).

That works where every layer with `adapt` keeps its state in variables: Keras's
`Normalization` (mean, variance, count). A lookup table (`TextVectorization`,
`StringLookup`, `IntegerLookup`), a Python list (`Discretization`'s boundaries) or a layer
of the user's own holds state no collective sends, and may shape the layers after it (an
`Embedding` of the vocabulary's size): there every worker adapts on the whole split, as
it would alone, and the summary says so. Which case a run is in is decided before the build
from the layers alone: a worker other than the chief first builds the model outside the
strategy's scope on the stand-in (no variable of it is shared), and the chief, whose build
reads the split either way, from its own model, the same layer types.

A resumed run's adapted state is its backup's: the chief adapts again as it builds, and the
restored weights overwrite the result (`Normalization` refreshes its mean and variance as
it loads them).

A build module: TensorFlow is imported at the top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from trainer.distribute.multiworker import take_chiefs
from trainer.internals.keras_step import layers_within

# Layers whose adapted state is all in their variables, so the chief's can be sent.
SENT = (keras.layers.Normalization,)

PER_WORKER = ("each worker adapted the model's preprocessing on the whole training split: "
              "{layers} keep state no collective sends (a lookup table, a list), so the "
              "chief's cannot be handed on; Normalization alone is adapted on the chief")
ONCE = ("the chief adapted the model's preprocessing ({layers}) on the training split "
        "once; the other workers received its state")


def adapted_layers(model: Any) -> list:
    """The model's outermost layers that have an `adapt` method (Keras's preprocessing
    layers, a user's own; a `TextVectorization`, not the `StringLookup` inside it), the
    model itself left out."""
    found = [layer for layer in layers_within(model)
             if layer is not model and callable(getattr(layer, "adapt", None))]
    inner = {id(sub) for layer in found for sub in layers_within(layer) if sub is not layer}
    return [layer for layer in found if id(layer) not in inner]


def sent_from_chief(model: Any) -> bool:
    """Whether every layer with `adapt` keeps its state in variables (`SENT`), so the chief's
    adapted state can be sent to the other workers."""
    return all(isinstance(layer, SENT) for layer in adapted_layers(model))


def stand_in(elements: tf.data.Dataset) -> tf.data.Dataset:
    """One element with the structure of `elements` and no example of it read: zeros (empty
    strings), each unknown dimension 1 (a scalar where even the rank is unknown)."""
    def zeros(spec: Any) -> Any:
        dims = spec.shape if spec.shape.rank is not None else []
        shape = [1 if d is None else d for d in dims]
        if spec.dtype == tf.string:
            return tf.fill(shape, "")
        return tf.zeros(shape, spec.dtype)

    return tf.data.Dataset.from_tensors(tf.nest.map_structure(zeros, elements.element_spec))


def send_adapted(strategy: Any, model: Any) -> None:
    """Assigns the chief's adapted variables to every worker's (one all-reduce in which only
    the chief's first replica contributes) and refreshes what each layer derives from them.
    Every worker must call it at the same place."""
    layers = adapted_layers(model)
    variables = [v for layer in layers for v in layer.variables]
    if not variables:
        return
    take_chiefs(strategy, variables)
    for layer in layers:
        layer.finalize_state()


def adapt_note(model: Any, once: bool) -> str | None:
    """What the summary says of a several-worker run's adapted layers; None without any."""
    names = sorted({type(layer).__name__ for layer in adapted_layers(model)})
    if not names:
        return None
    if once:
        return ONCE.format(layers=", ".join(names))
    kept = sorted({n for n in names if n not in {c.__name__ for c in SENT}})
    return PER_WORKER.format(layers=", ".join(kept))


def decided_apart(build: Callable[[Callable[[], Any]], Any], train: Callable[[], Any]) -> bool:
    """Whether the chief's adapted state can be sent (`sent_from_chief`), decided on a worker
    other than the chief before its real build: `build(maker)` is called outside the
    strategy's scope (its variables are this process's alone, shared with no worker) on
    the stand-in, so no example of the split is read for it."""
    return sent_from_chief(build(lambda: stand_in(train())))


def build_adapting(build: Callable[[Callable[[], Any]], Any], train: Callable[[], Any],
                   strategy: Any, once: bool | None) -> tuple[Any, str | None]:
    """(the model, the summary's note) of a builder that takes `train` on one worker of
    several, built in the strategy's scope by `build(maker)`; `train` makes the split.

    Args:
        once: on a worker other than the chief, what `decided_apart` found (True: build on
            the stand-in, then receive the chief's state); None on the chief, which builds
            on the split and decides from its own model.
    """
    if once is None:
        model = build(train)
        once = sent_from_chief(model)
    else:
        model = build((lambda: stand_in(train())) if once else train)
    if once:
        send_adapted(strategy, model)
    return model, adapt_note(model, once)
