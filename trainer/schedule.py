"""The learning-rate schedule: linear warm-up from the unscaled to the scaled rate, then decay."""

from __future__ import annotations

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="trainer")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Ramps the rate linearly per step, then holds it or follows a cosine to zero.

    At step `s < warmup_steps` the rate is `base + (scaled - base) * s / warmup_steps`
    (Goyal et al. 2017); from `warmup_steps` on it is `scaled`, or with `decay="cosine"`
    `scaled * (1 + cos(pi * t)) / 2` where `t` runs from 0 at the end of warm-up to 1 at
    `total_steps`.

    Args:
        base_lr: the unscaled rate (`optimizer.lr`), where warm-up starts.
        scaled_lr: the rate scaled to the global batch, where warm-up ends.
        warmup_steps: steps of warm-up; 0 for none.
        total_steps: steps of the whole run, where a cosine decay reaches zero.
        decay: `none` or `cosine`.
    """

    def __init__(self, base_lr: float, scaled_lr: float, warmup_steps: int, total_steps: int,
                 decay: str = "none") -> None:
        self.base_lr = float(base_lr)
        self.scaled_lr = float(scaled_lr)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = max(self.warmup_steps, 1)
        ramp = self.base_lr + (self.scaled_lr - self.base_lr) * step / warm
        after = self._after_warmup(step)
        return ops.where(step < self.warmup_steps, ramp, after)

    def _after_warmup(self, step):
        if self.decay != "cosine":
            return ops.full_like(step, self.scaled_lr)
        span = max(self.total_steps - self.warmup_steps, 1)
        t = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        return self.scaled_lr * 0.5 * (1.0 + ops.cos(math.pi * t))

    def get_config(self) -> dict:
        return {"base_lr": self.base_lr, "scaled_lr": self.scaled_lr,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "decay": self.decay}
