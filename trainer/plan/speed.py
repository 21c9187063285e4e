"""Precision, XLA and steps per execution: `auto` decided by a small table, with reasons.

The table is a pure function of the device kind and, for GPUs, the compute capability, so
it is tested without a GPU. Its CPU rows come from measurements on the 2-core machines this
project runs on (`scripts/bench_precision.py`): through trainer, MobileNetV2
(alpha 0.35, 32x32, batch 256) ran at 0.58x the float32 throughput with mixed_bfloat16,
although the CPU reports AVX512_BF16, and at 0.25x with XLA (plain Keras: 0.33x, 0.15x).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from trainer.config.errors import ConfigError
from trainer.config.schema import PRECISIONS


@dataclass(frozen=True)
class SpeedPlan:
    """What the run uses, and why (one reason per choice), on `replicas` devices of `kind`
    (`cpu`, `gpu`)."""

    precision: str
    jit_compile: bool | str
    steps_per_execution: int
    reasons: tuple[str, ...]
    kind: str = "cpu"
    replicas: int = 1


def choose_speed(precision: str, jit_compile: Any, steps_per_execution: Any, kind: str,
                 replicas: int, loop: str,
                 compute_capability: tuple[int, int] | None = None) -> SpeedPlan:
    """Resolves the `auto` values of the three speed options.

    Args:
        precision: `auto`, `float32`, `mixed_float16` or `mixed_bfloat16`.
        jit_compile: `auto`, true or false.
        steps_per_execution: `auto` or a positive count.
        kind: `gpu` or `cpu`.
        replicas: replicas in sync.
        loop: `fit` or `custom`.
        compute_capability: of the first GPU, e.g. `(8, 0)`; None on CPUs.

    Returns:
        A `SpeedPlan`.
    """
    p, p_why = _precision(precision, kind, compute_capability)
    j, j_why = _jit(jit_compile, kind, replicas)
    s, s_why = _steps(steps_per_execution, replicas, loop)
    return SpeedPlan(p, j, s, (p_why, j_why, s_why), kind, replicas)


def with_compiled_jit(speed: SpeedPlan, compiled: Any, asked: Any) -> SpeedPlan:
    """The plan with a model's own `compile(jit_compile=True)` honoured where the config
    leaves XLA to trainer (`jit_compile=auto`), as Keras's `fit` would compile the step.
    Where it cannot be (the config says `jit_compile=false`, or the replicas are CPU
    devices), the run trains without XLA and the plan's reason says why: never a refusal
    of the user's own argument.

    Args:
        speed: the plan `choose_speed` made.
        compiled: the `jit_compile` the model was compiled with (None: not compiled).
        asked: the config's `jit_compile`.
    """
    if compiled is not True or speed.jit_compile is True:
        return speed
    said = "the model was compiled with jit_compile=True"
    if asked is False:
        why = f"jit_compile=false: asked for by the config, over {said}"
    elif speed.kind == "cpu" and speed.replicas > 1:
        why = (f"jit_compile=false: {said}, but XLA cannot run on {speed.replicas} CPU "
               "replicas (it compiles each replica's step into one CPU device's cluster, "
               "which cannot update the variables mirrored on the others): trained without")
    else:
        why = f"jit_compile=true: {said}"
    reasons = tuple(why if r.startswith("jit_compile=") else r for r in speed.reasons)
    return replace(speed, jit_compile=why.startswith("jit_compile=true"), reasons=reasons)


def _precision(value: str, kind: str, cc: tuple[int, int] | None) -> tuple[str, str]:
    if value not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}; "
                          f"received: {value!r}")
    if value != "auto":
        return value, f"precision={value}: asked for"
    if kind == "gpu" and cc is not None and cc >= (7, 0):
        return "mixed_float16", (f"precision=mixed_float16: GPU compute capability "
                                 f"{cc[0]}.{cc[1]} >= 7.0 has float16 tensor cores; the loss "
                                 "is scaled, outputs stay float32")
    if kind == "gpu":
        return "float32", "precision=float32: GPU below compute capability 7.0, no tensor cores"
    return "float32", ("precision=float32: mixed_bfloat16 measured at 0.58x float32's "
                       "throughput on this kind of CPU")


def _jit(value: Any, kind: str, replicas: int = 1) -> tuple[bool | str, str]:
    if value is True and kind == "cpu" and replicas > 1:
        raise ConfigError(f"jit_compile=true cannot run on {replicas} CPU replicas: XLA "
                          "compiles each replica's step (as Keras's fit does) into one CPU "
                          "device's cluster, which cannot update the variables mirrored on "
                          "the others; use jit_compile=auto (off on CPUs, where XLA measured "
                          "0.25x) or devices=1")
    if value in (True, False):
        return value, f"jit_compile={str(value).lower()}: asked for"
    if value != "auto":
        raise ConfigError(f"jit_compile must be auto, true or false; received: {value!r}")
    if kind == "cpu":
        return False, ("jit_compile=false: XLA measured at 0.25x the throughput for "
                       "MobileNetV2 on CPU")
    return "auto", "jit_compile=auto: Keras decides per model on GPUs"


def _steps(value: Any, replicas: int, loop: str) -> tuple[int, str]:
    if value == "auto":
        return 1, "steps_per_execution=1: no measured gain from more on these machines yet"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("steps_per_execution must be auto or a positive integer; "
                          f"received: {value!r}")
    return value, f"steps_per_execution={value}: asked for"
