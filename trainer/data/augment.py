"""Training-data augmentation in the input pipeline: seeded, after the cache, training only.

`augment: [flip, crop, rotation, zoom, contrast]` names presets (and `randaugment`, `mixup`,
`cutmix`, below); each is applied to every training image with its own random draw. They
run in tf.data on the CPU (beside the accelerators, overlapped with training by the
prefetch), after the in-memory cache, so every epoch sees new variants of the cached images;
validation and test never see them.

Every random number comes from a stateless op seeded by (run seed, epoch, example's position
in that epoch's order): the same seed gives the same augmented batches on any run, a resumed
run sees exactly the images the interrupted one would have, and two epochs differ.

`mixup` and `cutmix` mix each batch with a seeded permutation of itself (images and labels
in one proportion); with them every split's labels are one-hot (see
`trainer.run.assembly.assemble`).

`randaugment` (Keras's RandAugment) and a node with `_target_` (a Keras preprocessing
layer, e.g. `{_target_: keras.layers.RandomBrightness, factor: 0.2, value_range: [0, 1]}`)
run on whole batches after scaling to [0, 1]; such layers draw from their own seed
generators, so they are random but not reproduced bit for bit on resume.
"""

from __future__ import annotations

from typing import Any

from trainer.config.errors import ConfigError

PRESETS = ("flip", "crop", "rotation", "zoom", "contrast")
# Mix pairs of images and their labels within a batch (labels become one-hot everywhere, and
# sparse_categorical_crossentropy becomes categorical_crossentropy).
MIXERS = ("mixup", "cutmix")
# Keras's RandAugment on whole batches in [0, 1] (its own seed generator: random, but not
# reproduced bit for bit on resume).
LAYERS = ("randaugment",)
MIXUP_ALPHA, CUTMIX_ALPHA = 0.2, 1.0
# Strengths: crop pads by 1/8 of the side and crops back; rotation up to 10% of a turn
# either way; zoom in or out by up to 10%; contrast by a factor in [0.8, 1.2].
CROP_PAD, ROTATION, ZOOM, CONTRAST = 1 / 8, 0.1, 0.1, 0.2


def listed(augment: Any) -> list:
    """The config's `augment` as a list (None: empty; a name alone: a list of one)."""
    if augment is None:
        return []
    return list(augment) if not isinstance(augment, str) else [augment]


def check(augment: Any) -> list:
    """The config's `augment` as a list of preset names and `_target_` nodes, each known."""
    items = listed(augment)
    for item in items:
        if isinstance(item, str):
            if item not in (*PRESETS, *MIXERS, *LAYERS):
                raise ConfigError(f"unknown augment preset {item!r}; available: "
                                  f"{', '.join((*PRESETS, *MIXERS, *LAYERS))}, or a node "
                                  "with _target_ (a Keras preprocessing layer)")
        elif not (hasattr(item, "get") and item.get("_target_")):
            raise ConfigError(f"augment takes preset names or nodes with _target_; received: "
                              f"{item!r}")
    return items


# What each built-in augmentation transforms: images of (height, width, channels), or any
# one array of features (MixUp's weighted sum of two examples).
NEEDS_IMAGES = (*PRESETS, "cutmix", "randaugment")


def check_inputs(augment: Any, input_shape: Any, dataset: str) -> None:
    """Refuses built-in augmentations the dataset's features cannot take, before any batch
    is read: an image augmentation on rows of tabular features, MixUp on several inputs.

    Args:
        augment: the config's `augment`.
        input_shape: the source's `input_shape` (a tuple, or a dict or tuple of them).
        dataset: the dataset's name for the message (its `_target_`).

    Raises:
        ConfigError: naming the augmentation, the dataset and the shape of its features.
    """
    names = [i for i in listed(augment) if isinstance(i, str)]
    if not names:
        return
    several = isinstance(input_shape, dict) or (
        isinstance(input_shape, (tuple, list)) and input_shape
        and all(isinstance(s, (tuple, list)) for s in input_shape))
    if several:
        parts = (input_shape.items() if isinstance(input_shape, dict)
                 else enumerate(input_shape))
        shapes = ", ".join(f"{k}: {tuple(v)}" for k, v in parts)
        raise ConfigError(f"augment {names[0]} needs one array of features; dataset {dataset} "
                          f"gives several inputs ({shapes}): drop it (augment=[])")
    wrong = [n for n in names if n in NEEDS_IMAGES and len(input_shape) != 3]
    if wrong:
        raise ConfigError(f"augment {wrong[0]} needs image inputs (height, width, channels); "
                          f"dataset {dataset} gives features of shape {tuple(input_shape)}: "
                          "drop it (augment=[]), or keep only mixup")


def describe(augment: Any) -> dict[str, Any] | None:
    """What the summary says: which augmentations, where they run."""
    items = listed(augment)
    if not items:
        return None
    names = [i if isinstance(i, str) else str(i["_target_"]).rsplit(".", 1)[-1] for i in items]
    return {"applied": names, "where": "input pipeline (tf.data, CPU), training data only, "
                                       "after the cache"}


def mixers(items: list) -> list[str]:
    """The batch-mixing presets among the config's `augment`."""
    return [i for i in items if isinstance(i, str) and i in MIXERS]
