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
in one proportion); with them every split's labels are one-hot (see `trainer.run.assemble`).

`randaugment` (Keras's RandAugment) and a node with `_target_` (a Keras preprocessing
layer, e.g. `{_target_: keras.layers.RandomBrightness, factor: 0.2, value_range: [0, 1]}`)
run on whole batches after scaling to [0, 1]; such layers draw from their own seed
generators, so they are random but not reproduced bit for bit on resume.
"""

from __future__ import annotations

import math
from typing import Any

from trainer.config.build import build_object
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


def check(augment: Any) -> list:
    """The config's `augment` as a list of preset names and `_target_` nodes."""
    if augment is None:
        return []
    items = list(augment) if not isinstance(augment, str) else [augment]
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
    names = [i for i in check(augment) if isinstance(i, str)]
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


def batch_layers(items: list, seed: int | None = None) -> list:
    """The layers applied to whole batches: `randaugment`, and the `_target_` nodes built."""
    import keras

    layers = []
    for item in items:
        if item == "randaugment":
            layers.append(keras.layers.RandAugment(value_range=(0, 1), seed=seed))
        elif not isinstance(item, str):
            layers.append(build_object(dict(item), "augment"))
    return layers


def mixers(items: list) -> list[str]:
    """The batch-mixing presets among the config's `augment`."""
    return [i for i in items if isinstance(i, str) and i in MIXERS]


def batch_mixer(names: list[str]):
    """`(images, one_hot_labels, seed) -> (images, labels)`: MixUp / CutMix on a batch, each
    image paired with another of the same batch; labels mixed in the same proportion."""
    import tensorflow as tf

    def mix(images, labels, seed):
        for i, name in enumerate(names):
            step = tf.random.experimental.stateless_fold_in(seed, i)
            order = tf.argsort(tf.random.stateless_uniform(tf.shape(labels)[:1], step))
            other_images, other_labels = tf.gather(images, order), tf.gather(labels, order)
            if name == "mixup":
                share = _beta(step, MIXUP_ALPHA)
                images = share * images + (1 - share) * other_images
            else:
                images, share = _cutmix(images, other_images, step)
            labels = share * labels + (1 - share) * other_labels
        return images, labels

    return mix


def _beta(seed, alpha):
    """A Beta(alpha, alpha) draw from two stateless gamma draws."""
    import tensorflow as tf

    first = tf.random.stateless_gamma([], seed, alpha)
    second = tf.random.stateless_gamma([], tf.random.experimental.stateless_fold_in(seed, 7),
                                       alpha)
    return first / (first + second)


def _cutmix(images, other, seed):
    """Pastes a box of `other` into every image; returns the images and the kept share."""
    import tensorflow as tf

    height, width = tf.shape(images)[1], tf.shape(images)[2]
    cut = tf.sqrt(1 - _beta(seed, CUTMIX_ALPHA))
    box_h = tf.cast(tf.cast(height, tf.float32) * cut, tf.int32)
    box_w = tf.cast(tf.cast(width, tf.float32) * cut, tf.int32)
    centre = tf.random.stateless_uniform([2], tf.random.experimental.stateless_fold_in(seed, 3))
    cy = tf.cast(centre[0] * tf.cast(height, tf.float32), tf.int32)
    cx = tf.cast(centre[1] * tf.cast(width, tf.float32), tf.int32)
    top, bottom = tf.maximum(cy - box_h // 2, 0), tf.minimum(cy + box_h // 2, height)
    left, right = tf.maximum(cx - box_w // 2, 0), tf.minimum(cx + box_w // 2, width)
    rows = tf.logical_and(tf.range(height) >= top, tf.range(height) < bottom)
    cols = tf.logical_and(tf.range(width) >= left, tf.range(width) < right)
    mask = tf.cast(tf.logical_and(rows[:, None], cols[None, :]), images.dtype)[None, :, :, None]
    kept = 1 - tf.cast((bottom - top) * (right - left), tf.float32) / tf.cast(
        height * width, tf.float32)
    return images * (1 - mask) + other * mask, kept
