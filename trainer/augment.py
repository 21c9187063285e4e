"""Training-data augmentation in the input pipeline: seeded, after the cache, training only.

`augment: [flip, crop, rotation, zoom, contrast]` names presets; each is applied to every
training image with its own probability draw. They run in tf.data on the CPU (beside the
accelerators, overlapped with training by the prefetch), after the in-memory cache, so every
epoch sees new variants of the cached images; validation and test never see them.

Every random number comes from a stateless op seeded by (run seed, epoch, example's position
in that epoch's order): the same seed gives the same augmented batches on any run, a resumed
run sees exactly the images the interrupted one would have, and two epochs differ.

A node with `_target_` (a Keras preprocessing layer, e.g. `{_target_:
keras.layers.RandAugment, value_range: [0, 1]}`) is applied to whole batches after scaling
to [0, 1]; such layers draw from their own seed generators, so they are random but not
reproduced bit for bit on resume.
"""

from __future__ import annotations

import math
from typing import Any

from trainer.errors import ConfigError

PRESETS = ("flip", "crop", "rotation", "zoom", "contrast")
# Strengths: crop pads by 1/8 of the side and crops back; rotation up to 10% of a turn
# either way; zoom in or out by up to 10%; contrast by a factor in [0.8, 1.2].
CROP_PAD, ROTATION, ZOOM, CONTRAST = 1 / 8, 0.1, 0.1, 0.2


def check(augment: Any) -> list:
    """The config's `augment` as a list of preset names and `_target_` nodes."""
    if augment is None:
        return []
    items = list(augment) if not isinstance(augment, str) else [augment]
    for item in items:
        if isinstance(item, str):
            if item not in PRESETS:
                raise ConfigError(f"unknown augment preset {item!r}; available: "
                                  f"{', '.join(PRESETS)}, or a node with _target_ (a Keras "
                                  "preprocessing layer)")
        elif not (hasattr(item, "get") and item.get("_target_")):
            raise ConfigError(f"augment takes preset names or nodes with _target_; received: "
                              f"{item!r}")
    return items


def describe(augment: Any) -> dict[str, Any] | None:
    """What the summary says: which augmentations, where they run."""
    items = check(augment)
    if not items:
        return None
    names = [i if isinstance(i, str) else str(i["_target_"]).rsplit(".", 1)[-1] for i in items]
    return {"applied": names, "where": "input pipeline (tf.data, CPU), training data only, "
                                       "after the cache"}


def element_augmenter(presets: list[str]):
    """`(image, label, seed) -> (image, label)`: the presets on one image, float32 out."""
    import tensorflow as tf

    def augment(image, label, seed):
        image = tf.cast(image, tf.float32)
        for i, name in enumerate(presets):
            step_seed = tf.random.experimental.stateless_fold_in(seed, i)
            image = _PRESET_OPS[name](image, step_seed)
        return image, label

    return augment


def _flip(image, seed):
    import tensorflow as tf

    return tf.image.stateless_random_flip_left_right(image, seed)


def _crop(image, seed):
    import tensorflow as tf

    height, width = image.shape[0], image.shape[1]
    pad = max(1, round(min(height, width) * CROP_PAD))
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(padded, tf.shape(image), seed)


def _contrast(image, seed):
    import tensorflow as tf

    return tf.image.stateless_random_contrast(image, 1 - CONTRAST, 1 + CONTRAST, seed)


def _affine(image, angle, scale):
    """Rotates by `angle` (radians) and zooms by `scale` around the centre (reflected edges)."""
    import tensorflow as tf

    height = tf.cast(tf.shape(image)[0], tf.float32)
    width = tf.cast(tf.shape(image)[1], tf.float32)
    cos, sin = tf.cos(angle) / scale, tf.sin(angle) / scale
    cx, cy = (width - 1) / 2, (height - 1) / 2
    # output (x, y) reads input (a0 x + a1 y + a2, b0 x + b1 y + b2)
    transform = tf.stack([cos, -sin, cx - cos * cx + sin * cy,
                          sin, cos, cy - sin * cx - cos * cy, 0.0, 0.0])
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform[None],
        output_shape=tf.shape(image)[:2], fill_value=0.0, interpolation="BILINEAR",
        fill_mode="REFLECT")
    return out[0]


def _rotation(image, seed):
    import tensorflow as tf

    angle = tf.random.stateless_uniform([], seed, -ROTATION, ROTATION) * 2 * math.pi
    return _affine(image, angle, tf.constant(1.0))


def _zoom(image, seed):
    import tensorflow as tf

    scale = tf.random.stateless_uniform([], seed, 1 - ZOOM, 1 + ZOOM)
    return _affine(image, tf.constant(0.0), scale)


_PRESET_OPS = {"flip": _flip, "crop": _crop, "rotation": _rotation, "zoom": _zoom,
               "contrast": _contrast}


def batch_layers(items: list) -> list:
    """The `_target_` nodes, built (Keras preprocessing layers applied to whole batches)."""
    from trainer.task import build_object

    return [build_object(dict(item), "augment") for item in items if not isinstance(item, str)]
