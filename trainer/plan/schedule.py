"""The learning-rate schedule: linear warm-up from the unscaled to the scaled rate, then decay."""

from __future__ import annotations

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="trainer")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Ramps the rate linearly per step, then holds it or decays it.

    At step `s < warmup_steps` the rate is `base + (scaled - base) * s / warmup_steps`
    (Goyal et al. 2017). From `warmup_steps` on, with `t` steps after warm-up, it is:
    `scaled` (decay `none`); `scaled * (1 + cos(pi * t / (total_steps - warmup_steps))) / 2`
    (decay `cosine`, zero at `total_steps`); or `scaled * decay_rate ** (t / decay_steps)`
    (decay `exponential`, the exponent floored with `staircase`, as in the CIFAR-10
    multi-GPU tutorial).

    Args:
        base_lr: the unscaled rate (`optimizer.lr`), where warm-up starts.
        scaled_lr: the rate scaled to the global batch, where warm-up ends.
        warmup_steps: steps of warm-up; 0 for none.
        total_steps: steps of the whole run, where a cosine decay reaches zero.
        decay: `none`, `cosine` or `exponential`.
        decay_rate: factor per `decay_steps` of an exponential decay.
        decay_steps: steps per factor of an exponential decay.
        staircase: apply an exponential decay in whole steps of `decay_steps`.
    """

    def __init__(self, base_lr: float, scaled_lr: float, warmup_steps: int, total_steps: int,
                 decay: str = "none", decay_rate: float = 0.1, decay_steps: int = 1,
                 staircase: bool = True) -> None:
        self.base_lr = float(base_lr)
        self.scaled_lr = float(scaled_lr)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay
        self.decay_rate = float(decay_rate)
        self.decay_steps = max(int(decay_steps), 1)
        self.staircase = bool(staircase)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = max(self.warmup_steps, 1)
        ramp = self.base_lr + (self.scaled_lr - self.base_lr) * step / warm
        return ops.where(step < self.warmup_steps, ramp, self._after_warmup(step))

    def _after_warmup(self, step):
        after = ops.maximum(step - self.warmup_steps, 0.0)
        if self.decay == "cosine":
            t = ops.clip(after / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
            return self.scaled_lr * 0.5 * (1.0 + ops.cos(math.pi * t))
        if self.decay == "exponential":
            exponent = after / self.decay_steps
            if self.staircase:
                exponent = ops.floor(exponent)
            return self.scaled_lr * ops.power(self.decay_rate, exponent)
        return ops.full_like(step, self.scaled_lr)

    def get_config(self) -> dict:
        return {"base_lr": self.base_lr, "scaled_lr": self.scaled_lr,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "decay": self.decay, "decay_rate": self.decay_rate,
                "decay_steps": self.decay_steps, "staircase": self.staircase}
