"""The arithmetic of tuning a run before it trains (`tune=lr`, `tune=batch`): the rates of a
learning-rate range test, the smoothed loss and the suggestion drawn from it, the knee of a
throughput curve, and the search for the largest batch that fits. Pure functions: no
TensorFlow.

The learning-rate range test (Smith 2017, "Cyclical Learning Rates", as fastai's and
PyTorch Lightning's `lr_find` run it): the loss is smoothed with an exponential moving
average (bias-corrected), and the suggestion is the first rate at which the smoothed loss
has come a quarter of the way down from its start to its minimum: the loss clearly falls
there, an order of magnitude or so below the minimum, which sits at the edge of
divergence. (The steepest-slope rule Lightning uses moved by a factor of 5 between two runs
of the same config here: the slope of a 100-step curve is noise.) When not to trust it: a
curve with no clear descent (too few steps, a loss already at its floor, a model that does
not learn at any rate tried; the JSON says `"clear": false` where the descent is under 10%
of the starting loss), a noisy loss (tiny batches), a range whose lower end is already too
high, and a change of global batch afterwards: the suggestion is converted to the reference
batch by the run's scaling rule, which for Adam-like optimizers overstates the change
(their good rate moves less than linearly with the batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def range_rates(lr_min: float, lr_max: float, steps: int) -> list[float]:
    """`steps` rates growing exponentially from `lr_min` to `lr_max`."""
    if steps < 2:
        return [lr_min]
    ratio = lr_max / lr_min
    return [lr_min * ratio ** (i / (steps - 1)) for i in range(steps)]


def smoothed(losses: Sequence[float], beta: float = 0.98) -> list[float]:
    """Exponential moving average of the losses, bias-corrected; NaN stays NaN and stops
    the average (a diverged loss is part of the curve)."""
    found, average = [], 0.0
    for i, loss in enumerate(losses, start=1):
        if not math.isfinite(loss):
            found.append(float("nan"))
            average = float("nan")
            continue
        average = beta * average + (1 - beta) * loss
        found.append(average / (1 - beta ** i))
    return found


def diverged(smooth: Sequence[float], factor: float = 4.0) -> bool:
    """Whether the last smoothed loss is not finite or `factor` times the best so far."""
    if not smooth:
        return False
    last = smooth[-1]
    finite = [v for v in smooth if math.isfinite(v)]
    return not math.isfinite(last) or (bool(finite) and last > factor * min(finite))


def suggest_rate(rates: Sequence[float], smooth: Sequence[float], skip: int = 3,
                 fraction: float = 0.25) -> tuple[float | None, bool]:
    """(the first rate at which the smoothed loss has fallen `fraction` of the way from its
    start to its minimum, whether that descent is clear); None where the curve has fewer
    than `skip` + 2 finite points. The first `skip` points (the average's warm-up) are left
    out of the start."""
    points = [(r, v) for r, v in zip(rates, smooth, strict=False) if math.isfinite(v)]
    if len(points) < skip + 2:
        return None, False
    start = points[skip][1]
    lowest = min(range(skip, len(points)), key=lambda i: points[i][1])
    target = start - fraction * (start - points[lowest][1])
    found = next(i for i in range(skip, lowest + 1) if points[i][1] <= target)
    clear = start - points[lowest][1] > 0.1 * abs(start)
    return points[found][0], clear


def at_reference_batch(rate: float, scale: float) -> float:
    """The `optimizer.lr` (at the reference batch) whose scaled rate is `rate`, for the
    scaling factor (scaled / base) of the run's global batch."""
    return rate / scale


def knee(batches: Sequence[int], rates: Sequence[float], within: float = 0.05) -> int:
    """The smallest batch whose throughput is within `within` of the best."""
    best = max(rates)
    return min(b for b, r in zip(batches, rates, strict=True) if r >= (1 - within) * best)


def doubling(first: int, limit: int) -> list[int]:
    """first, 2 first, 4 first, ... up to `limit`."""
    sizes = []
    size = first
    while size <= limit:
        sizes.append(size)
        size *= 2
    return sizes


def largest_fitting(fits: Callable[[int], bool], first: int, limit: int, step: int = 8
                    ) -> tuple[int | None, list[tuple[int, bool]]]:
    """The largest size in [first, limit] for which `fits` holds (assumed monotone), by
    doubling then bisection over multiples of `step` (the sizes accelerators favour); and
    every try made, in order. From 64 with a cap near 700: 11 tries.

    Returns:
        (the largest size that fits, None where even `first` does not; the tries as
        (size, fitted)).
    """
    tries: list[tuple[int, bool]] = []

    def attempt(size: int) -> bool:
        ok = fits(size)
        tries.append((size, ok))
        return ok

    if not attempt(first):
        return None, tries
    good, bad = first, None
    while bad is None and good < limit:
        size = min(good * 2, limit)
        if attempt(size):
            good = size
        else:
            bad = size
    while bad is not None and bad - good > step:
        middle = (good + bad) // 2 // step * step
        if middle <= good:
            break
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return good, tries
