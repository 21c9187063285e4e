"""Fine-tuning phases: the backbone frozen (head only), then unfrozen from an epoch on.

`finetune.freeze_backbone: true` trains the head only: the model's `backbone` layer (what
`model=keras_app` builds) is not trainable, so its batch-norm layers run in inference mode,
as Keras's transfer-learning guide prescribes. `finetune.unfreeze_at_epoch: N` makes the
backbone trainable from epoch N on (counted from 1, as the progress bar shows), its last
`finetune.unfreeze_layers` layers only where set; batch-norm layers stay in inference mode
(the guide again: unfreezing them would wreck what they learnt on small batches).
`finetune.backbone_lr_scale` scales the backbone's gradients, which sets its step size
relative to the head's for SGD (Adam-type optimizers normalise a gradient's scale away, so
it is refused with them).

The optimizer is built over every variable before the first phase, so a phase change adds
no optimizer state, and a backup restores the same variables whatever the phase. A run
trains in segments split at the unfreeze epoch; each starts with its phase applied and the
compiled step rebuilt, so a run resumed on either side of it trains as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

from trainer.config.errors import ConfigError

BACKBONE = "backbone"
HEAD, FULL, ALL = "head", "head and backbone", "all"  # what trains in a phase


def phase_at(epoch: int, finetune: Any) -> str:
    """What trains in epoch `epoch` (counted from 0): `head`, `head and backbone` or `all`."""
    if not finetune.freeze_backbone:
        return ALL
    at = finetune.unfreeze_at_epoch
    return FULL if at is not None and epoch + 1 >= at else HEAD


def boundaries(finetune: Any, epochs: int) -> list[int]:
    """Epochs (from 0) at which a new phase starts, inside a run of `epochs`."""
    at = finetune.unfreeze_at_epoch
    if finetune.freeze_backbone and at is not None and 1 < at <= epochs:
        return [at - 1]
    return []


def check(finetune: Any, optimizer_target: str) -> None:
    """The options the schema cannot check (before TensorFlow starts)."""
    at, layers, scale = (finetune.unfreeze_at_epoch, finetune.unfreeze_layers,
                         finetune.backbone_lr_scale)
    if at is not None and (not isinstance(at, int) or isinstance(at, bool) or at < 1):
        raise ConfigError(f"finetune.unfreeze_at_epoch must be an epoch >= 1, or null; "
                          f"received: {at!r}")
    if at is not None and not finetune.freeze_backbone:
        raise ConfigError("finetune.unfreeze_at_epoch needs finetune.freeze_backbone=true "
                          "(nothing is frozen to unfreeze)")
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool)
                               or layers < 1):
        raise ConfigError(f"finetune.unfreeze_layers must be a positive number of layers, "
                          f"or null for all; received: {layers!r}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise ConfigError(f"finetune.backbone_lr_scale must be a positive number; received: "
                          f"{scale!r}")
    if scale != 1 and not str(optimizer_target).endswith(".SGD"):
        raise ConfigError(f"finetune.backbone_lr_scale={scale} scales the backbone's "
                          "gradients, which sets its step only with SGD; "
                          f"{optimizer_target.rsplit('.', 1)[-1]} normalises the scale away: "
                          "use optimizer=sgd, or backbone_lr_scale=1")
