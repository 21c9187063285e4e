"""The learning-rate schedule: linear warm-up from the unscaled to the scaled rate, then decay.

Wherever Keras has the schedule built in, the optimizer gets Keras's own object, so a run's
checkpoint loads with plain `keras.models.load_model` in a process that never imports
trainer: a number (no warm-up, no decay), `CosineDecay` (a cosine decay, or any warm-up:
its linear warm-up, then a decay to `alpha` = 1, a constant rate, for `none`), or
`ExponentialDecay` (an exponential decay without warm-up). Keras has no warm-up before an
exponential decay; that one case keeps trainer's registered `WarmupSchedule`, and its
checkpoints load through `trainer.evaluate.load_checkpoint` (or with
`custom_objects`), as the run's summary says (`checkpoints load with`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import keras
from keras import ops

from trainer.config.schema import LrPlan
from trainer.plan.scaling import scaled_learning_rate
from trainer.plan.scaling import warmup_steps as to_steps


@keras.saving.register_keras_serializable(package="trainer")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Ramps the rate linearly per step, then holds it or decays it (a run's schedule only
    for an exponential decay after warm-up; see `keras_schedule`, which gives the same rate
    at every step).

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


def keras_schedule(base_lr: float, scaled_lr: float, warmup_steps: int, total_steps: int,
                   decay: str = "none", decay_rate: float = 0.1, decay_steps: int = 1,
                   staircase: bool = True) -> Any:
    """The schedule `WarmupSchedule` describes (same arguments, same rate at every step), as
    Keras's built-in object wherever one expresses it exactly.

    - no warm-up, no decay: the number `scaled_lr`;
    - a warm-up (then decay `none` or `cosine`): `CosineDecay(base_lr, total_steps -
      warmup_steps, alpha, warmup_target=scaled_lr, warmup_steps)`, whose rate rises
      linearly from `base_lr` at step 0 to `scaled_lr` at `warmup_steps`, then follows
      `scaled_lr * ((1 - alpha) * (1 + cos(pi * t / decay_steps)) / 2 + alpha)`: alpha 0 for
      the cosine decay (zero at `total_steps`), 1 for a constant rate;
    - a cosine decay without warm-up: `CosineDecay(scaled_lr, total_steps)`;
    - an exponential decay without warm-up: `ExponentialDecay(scaled_lr, decay_steps,
      decay_rate, staircase)`;
    - an exponential decay after a warm-up: trainer's `WarmupSchedule` (no Keras object does
      both).
    """
    after = max(total_steps - warmup_steps, 1)
    if decay == "exponential":
        if warmup_steps:
            return WarmupSchedule(base_lr, scaled_lr, warmup_steps, total_steps, decay,
                                  decay_rate, decay_steps, staircase)
        return keras.optimizers.schedules.ExponentialDecay(
            float(scaled_lr), max(int(decay_steps), 1), float(decay_rate), bool(staircase))
    alpha = 0.0 if decay == "cosine" else 1.0
    if warmup_steps:
        return keras.optimizers.schedules.CosineDecay(
            float(base_lr), after, alpha, warmup_target=float(scaled_lr),
            warmup_steps=int(warmup_steps))
    if decay == "cosine":
        return keras.optimizers.schedules.CosineDecay(float(scaled_lr), after, alpha)
    return float(scaled_lr)


@dataclass(frozen=True)
class LearningRate:
    """The learning-rate plan: `base` at `reference_batch`, `scaled` to the global batch."""

    base: float
    scaled: float
    rule: str
    reference_batch: int
    warmup_steps: int
    decay: str
    schedule: Any
    # `auto`: the batch of one step of the same config on one device; `set`: the config's
    reference: str = "set"

    def report(self) -> dict[str, Any]:
        """The plan as the summary shows it: the schedule by its class's name (`constant`
        for a number)."""
        kind = self.schedule
        return {"base": self.base, "scaled": self.scaled, "rule": self.rule,
                "reference_batch": self.reference_batch, "reference": self.reference,
                "warmup_steps": self.warmup_steps, "decay": self.decay,
                "schedule": "constant" if isinstance(kind, float) else type(kind).__name__}


def learning_rate(plan: LrPlan, global_batch: int, steps: int, epochs: int) -> LearningRate:
    """The scaled rate, warm-up and decay for a global batch, as one Keras schedule."""
    scaled = scaled_learning_rate(plan.lr, global_batch, plan.reference_batch, plan.lr_scaling)
    warm = to_steps(plan.warmup_epochs, steps)
    schedule = keras_schedule(plan.lr, scaled, warm, steps * epochs, plan.decay,
                              plan.decay_rate, to_steps(plan.decay_epochs, steps, "decay_epochs"),
                              plan.staircase)
    return LearningRate(base=plan.lr, scaled=scaled, rule=plan.lr_scaling,
                        reference_batch=plan.reference_batch, warmup_steps=warm,
                        decay=plan.decay, schedule=schedule,
                        reference="auto" if plan.reference_auto else "set")
