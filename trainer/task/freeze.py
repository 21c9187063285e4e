"""Freezing a model for fine-tuning: the backbone's layers set trainable per phase, the
parameters counted, the backbone's gradients scaled. A build module (Keras at the top); the
phases themselves are decided in `trainer.task.finetune`."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from trainer.config.errors import ConfigError
from trainer.task.finetune import ALL, BACKBONE, HEAD, boundaries, phase_at


def backbone_of(model: Any) -> Any:
    try:
        return model.get_layer(BACKBONE)
    except ValueError:
        raise ConfigError("finetune.freeze_backbone needs a model with a layer named "
                          f"{BACKBONE!r} (model=keras_app builds one); {model.name} has none"
                          ) from None


def apply_phase(model: Any, phase: str, unfreeze_layers: int | None = None) -> None:
    """Sets which layers train for `phase` (no-op for `all`)."""
    if phase == ALL:
        return
    backbone = backbone_of(model)
    if phase == HEAD:
        backbone.trainable = False
        return
    backbone.trainable = True
    layers = backbone.layers
    if unfreeze_layers:
        for layer in layers[:max(len(layers) - unfreeze_layers, 0)]:
            layer.trainable = False
    for layer in layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False


def parameter_counts(model: Any) -> dict[str, int]:
    """Trainable and total parameters of the model as its layers are now."""
    def count(variables) -> int:
        return int(sum(np.prod(v.shape) for v in variables))

    return {"trainable": count(model.trainable_weights), "total": count(model.weights)}


def phase_report(model: Any, finetune: Any, epochs: int) -> list[dict[str, Any]] | None:
    """Each phase's first epoch (from 1) and parameters, for the summary; None without
    fine-tuning. Leaves the model in the first epoch's phase."""
    if not finetune.freeze_backbone:
        return None
    starts = [0, *boundaries(finetune, epochs)]
    report = []
    for start in starts:
        phase = phase_at(start, finetune)
        apply_phase(model, phase, finetune.unfreeze_layers)
        report.append({"from_epoch": start + 1, "trains": phase,
                       **parameter_counts(model)})
    apply_phase(model, phase_at(0, finetune), finetune.unfreeze_layers)
    return report


def scale_backbone_gradients(model: Any, scale: float) -> None:
    """Multiplies the backbone's gradients by `scale` before every optimizer update (both
    loops update through `optimizer.apply`); an instance attribute, so nothing is saved."""
    if scale == 1:
        return
    optimizer = model.optimizer
    backbone = {id(v) for v in backbone_of(model).weights}
    original = optimizer.apply

    def apply(grads, trainable_variables=None):
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            grads = [g * scale if g is not None and id(v) in backbone else g
                     for g, v in zip(grads, trainable_variables, strict=True)]
        return original(grads, trainable_variables)

    optimizer.apply = apply
