"""The augmentations themselves: per-image presets, batch layers and batch mixers, built
into the training pipeline. A build module (TensorFlow at the top); which ones, and whether
they apply, is `trainer.data.augment`'s (no TensorFlow, checked in the pre-flight)."""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from trainer.config.build import build_object
from trainer.data.augment import CONTRAST, CROP_PAD, CUTMIX_ALPHA, MIXUP_ALPHA, ROTATION, ZOOM


def element_augmenter(presets: list[str]):
    """`(image, label, seed) -> (image, label)`: the presets on one image, float32 out."""
    def augment(image, label, seed):
        image = tf.cast(image, tf.float32)
        for i, name in enumerate(presets):
            step_seed = tf.random.experimental.stateless_fold_in(seed, i)
            image = _PRESET_OPS[name](image, step_seed)
        return image, label

    return augment


def _flip(image, seed):
    return tf.image.stateless_random_flip_left_right(image, seed)


def _crop(image, seed):
    height, width = image.shape[0], image.shape[1]
    pad = max(1, round(min(height, width) * CROP_PAD))
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(padded, tf.shape(image), seed)


def _contrast(image, seed):
    return tf.image.stateless_random_contrast(image, 1 - CONTRAST, 1 + CONTRAST, seed)


def _affine(image, angle, scale):
    """Rotates by `angle` (radians) and zooms by `scale` around the centre (reflected edges)."""
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
    angle = tf.random.stateless_uniform([], seed, -ROTATION, ROTATION) * 2 * math.pi
    return _affine(image, angle, tf.constant(1.0))


def _zoom(image, seed):
    scale = tf.random.stateless_uniform([], seed, 1 - ZOOM, 1 + ZOOM)
    return _affine(image, tf.constant(0.0), scale)


_PRESET_OPS = {"flip": _flip, "crop": _crop, "rotation": _rotation, "zoom": _zoom,
               "contrast": _contrast}


def batch_layers(items: list, seed: int | None = None) -> list:
    """The layers applied to whole batches: `randaugment`, and the `_target_` nodes built."""
    layers = []
    for item in items:
        if item == "randaugment":
            layers.append(keras.layers.RandAugment(value_range=(0, 1), seed=seed))
        elif not isinstance(item, str):
            layers.append(build_object(dict(item), "augment"))
    return layers


def batch_mixer(names: list[str]):
    """`(images, one_hot_labels, seed) -> (images, labels)`: MixUp / CutMix on a batch, each
    image paired with another of the same batch; labels mixed in the same proportion."""
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
    first = tf.random.stateless_gamma([], seed, alpha)
    second = tf.random.stateless_gamma([], tf.random.experimental.stateless_fold_in(seed, 7),
                                       alpha)
    return first / (first + second)


def _cutmix(images, other, seed):
    """Pastes a box of `other` into every image; returns the images and the kept share."""
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
