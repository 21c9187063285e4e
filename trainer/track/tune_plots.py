"""The tuner's pictures: `lr_find.png` (smoothed loss against the learning rate, log scale,
the suggestion marked) and `batch_find.png` (examples/s against the per-replica batch, the
knee marked). Each PNG carries the data it was drawn from (a `trainer:tune` text chunk,
JSON), so what it shows can be read back (`read_plot`). matplotlib is imported when a
picture is drawn (its Agg canvas, never pyplot), not when this module is."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainer.rundir.atomic import written

KEY = "trainer:tune"


def draw_lr_find(found: dict[str, Any], path: Path) -> None:
    """The range test's curve: raw and smoothed loss, log rate, the suggestion marked."""
    figure, axes = _figure()
    rates = found["rates"]
    axes.plot(rates, [_nan(v) for v in found["losses"]], alpha=0.3, label="loss")
    axes.plot(rates, [_nan(v) for v in found["smoothed"]], label="smoothed loss")
    if found.get("suggested_rate"):
        axes.axvline(found["suggested_rate"], color="tab:red", linestyle="--",
                     label=f"suggested {found['suggested_rate']:.3g}")
    finite = [v for v in found["smoothed"] if v is not None and math.isfinite(v)]
    if finite:  # the descent, not a diverged tail, fills the picture
        low, high = min(finite), finite[0]
        axes.set_ylim(low - 0.1 * (high - low + 1e-9), high + 0.5 * (high - low + 1e-9))
    axes.set_xscale("log")
    axes.set_xlabel("learning rate (at the run's global batch)")
    axes.set_ylabel("training loss")
    _save(figure, axes, path, found)


def draw_batch_find(found: dict[str, Any], path: Path) -> None:
    """Throughput against the per-replica batch, the knee marked."""
    figure, axes = _figure()
    axes.plot(found["batches"], found["examples_per_sec"], marker="o", label="examples/s")
    if found.get("suggested"):
        axes.axvline(found["suggested"], color="tab:red", linestyle="--",
                     label=f"knee: {found['suggested']} per replica")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("batch per replica")
    axes.set_ylabel("training examples/s")
    _save(figure, axes, path, found)


def read_plot(path: str | Path) -> dict[str, Any]:
    """What a tuner's picture was drawn from."""
    from PIL import Image  # lazy: matplotlib's own dependency, only to read a picture back

    with Image.open(path) as image:
        return json.loads(image.text[KEY])


def _figure() -> tuple[Any, Any]:
    # lazy: matplotlib takes about a second to import; only a tuner's picture pays it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot(1, 1, 1)


def _save(figure: Any, axes: Any, path: Path, found: dict[str, Any]) -> None:
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.subplots_adjust(left=0.14, right=0.97, bottom=0.14, top=0.95)
    with written(path) as tmp:
        figure.savefig(tmp, format="png", metadata={KEY: json.dumps(found)})


def _nan(value: float) -> float:
    return value if value is not None and math.isfinite(value) else float("nan")
