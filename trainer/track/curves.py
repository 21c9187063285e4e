"""`curves.png`: the run's loss and metrics per epoch, train and validation, best epoch marked.

One panel per quantity (`loss`, each metric), the training curve and its `val_` twin in it,
and a dashed line at the epoch the best checkpoint chose (`checkpoint.monitor`, its mode).
It is drawn from the run's per-epoch history: at each epoch's end from the backup's (so a
killed run has it too) and at the run's end from the summary's. The PNG carries the data it
was drawn from (a `trainer:curves` text chunk, JSON), so what it shows can be read back.

matplotlib is imported when a picture is drawn (its Agg canvas, never pyplot: no global
backend is changed, a notebook's included), not when this module is.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import keras

from trainer.rundir.atomic import written
from trainer.rundir.layout import RunDir

log = logging.getLogger(__name__)

KEY = "trainer:curves"  # the PNG text chunk holding what was drawn
# Logged each epoch, but not a quantity trained for: left out of the picture.
LEFT_OUT = ("learning_rate",)
COLUMNS = 3


def best_epoch(history: dict[str, list], monitor: str | None, mode: str | None) -> int | None:
    """The 1-based epoch the best checkpoint chose: the first with the best `monitor`
    (`min` or `max`; a checkpoint replaces the best only on a strict improvement), None
    where the history has no such number."""
    if not monitor or mode not in ("min", "max"):
        return None
    values = [(v, i) for i, v in enumerate(history.get(monitor) or [], 1)
              if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return None
    best = (min if mode == "min" else max)(v for v, _ in values)
    return next(i for v, i in values if v == best)


def panels(history: dict[str, list]) -> list[str]:
    """The quantities drawn, one panel each, in the history's order: `loss` first."""
    names: list[str] = []
    for key in history:
        name = key.removeprefix("val_")
        if name not in names and name not in LEFT_OUT and history[key]:
            names.append(name)
    return sorted(names, key=lambda n: n != "loss")


def draw_curves(history: dict[str, list], path: str | Path, best_epoch: int | None = None,
                monitor: str | None = None) -> dict[str, Any]:
    """Draws the history as `path` (a PNG), written to a temporary name then renamed.

    Args:
        history: per-epoch values by logged name (`loss`, `val_loss`, `accuracy`, ...).
        path: the PNG to write.
        best_epoch: the 1-based epoch to mark, or None.
        monitor: the name the best epoch was chosen by (in the legend).

    Returns:
        What was drawn: `{"history": {name: values}, "best_epoch": ..., "monitor": ...}`,
        also kept in the PNG's `trainer:curves` text chunk.
    """
    # lazy: matplotlib takes about a second to import; nothing before a drawing pays it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = panels(history)
    drawn = {"history": {k: [float(x) for x in history[k]] for k in history
                         if k.removeprefix("val_") in names},
             "best_epoch": best_epoch, "monitor": monitor}
    columns = max(1, min(COLUMNS, len(names)))
    rows = max(1, math.ceil(len(names) / columns))
    figure = Figure(figsize=(4 * columns, 3 * rows), dpi=80)
    FigureCanvasAgg(figure)
    for at, name in enumerate(names, 1):
        axes = figure.add_subplot(rows, columns, at)
        for key, label, style in ((name, "train", "o-"), (f"val_{name}", "validation", "s-")):
            values = drawn["history"].get(key)
            if values:
                axes.plot(range(1, len(values) + 1), values, style, markersize=3, label=label)
        best = drawn["history"].get(monitor or "") or []
        if best_epoch is not None and monitor and monitor.removeprefix("val_") == name \
                and best_epoch <= len(best):
            axes.plot([best_epoch], [best[best_epoch - 1]], "*", color="black", markersize=9)
        if best_epoch is not None:
            axes.axvline(best_epoch, color="grey", linestyle="--", linewidth=1,
                         label=f"best epoch {best_epoch}" + (f" ({monitor})" if monitor else ""))
        axes.set_title(name, y=1.0)  # fixed: its automatic place costs a layout per panel
        axes.set_xlabel("epoch")
        # at most 5 ticks an axis: each tick is a line and a text to lay out and draw,
        # most of a drawing's time (a picture of 6 panels: 0.30 s with the default ~9)
        axes.xaxis.get_major_locator().set_params(integer=True, nbins=4)
        axes.yaxis.get_major_locator().set_params(nbins=4)
        axes.grid(alpha=0.3)
        if at == 1:  # the same lines in every panel: one legend
            axes.legend(fontsize="small")
    if not names:
        figure.text(0.5, 0.5, "no epoch finished yet", ha="center", va="center")
    # fixed margins: matplotlib's tight layout would draw the figure twice
    figure.subplots_adjust(left=0.6 / (4 * columns), right=1 - 0.15 / (4 * columns),
                           bottom=0.5 / (3 * rows), top=1 - 0.35 / (3 * rows),
                           wspace=0.3, hspace=0.45)
    with written(Path(path)) as tmp:
        figure.savefig(tmp, format="png", metadata={KEY: json.dumps(drawn)})
    return drawn


def read_curves(path: str | Path) -> dict[str, Any]:
    """What a `curves.png` was drawn from (`draw_curves`'s return value)."""
    from PIL import Image  # lazy: matplotlib's own dependency, only to read a picture back

    with Image.open(path) as image:
        return json.loads(image.text[KEY])


class Curves(keras.callbacks.Callback):
    """Draws `RUN_DIR/curves.png` at each epoch's end, after the backup (`history()` is the
    backup's per-epoch history, this epoch's included), and once more by `draw` at the end.

    A drawing costs 0.1 to 0.6 s. Drawing takes at most 1/`spacing` of a run's time: after
    a drawing that took t seconds, epochs ending in the next (`spacing` - 1) x t seconds
    are not drawn (epochs of a few seconds and more are all drawn), and the run's end draws
    whatever was skipped. Epochs ending in a run's first `first` seconds of training are not
    drawn either: a run that short ends (or stops, which draws too) before a picture at an
    epoch's end would help anyone, and a drawing per epoch would be a sixth of its time. A
    picture that cannot be drawn is a warning: it never stops a run.

    Args:
        run_dir: the run directory.
        history: returns the per-epoch history so far.
        monitor: the best checkpoint's `checkpoint.monitor`, None where none is kept.
        mode: `min` or `max` for `monitor`.
        spacing: see above; 0 draws at every epoch's end; None: `SPACING`.
        first: see above; None: `FIRST`.
    """

    SPACING = 10.0
    FIRST = 30.0

    def __init__(self, run_dir: Path, history: Any, monitor: str | None, mode: str | None,
                 spacing: float | None = None, first: float | None = None) -> None:
        super().__init__()
        self.path = RunDir(run_dir).curves
        self.history, self.monitor, self.mode = history, monitor, mode
        self.spacing = self.SPACING if spacing is None else spacing
        self.first = self.FIRST if first is None else first
        self.seconds = 0.0  # spent drawing (matplotlib's import left out)
        self.drawings = 0
        self._next = 0.0  # perf_counter before which an epoch's end does not draw
        self._drawn: dict | None = None  # the history last drawn

    def on_train_begin(self, logs=None):
        self._next = max(self._next, time.perf_counter() + self.first)

    def on_epoch_end(self, epoch, logs=None):
        if time.perf_counter() >= self._next:
            self.draw(self.history())

    def draw(self, history: dict[str, list]) -> dict[str, Any] | None:
        """Draws `history` now, unless it is what `curves.png` shows already; returns what
        was drawn (None where nothing was)."""
        history = {k: [float(x) for x in v] for k, v in history.items()}
        if history == self._drawn and self.path.is_file():
            return None
        try:
            # lazy: matplotlib's import (about a second, once) is not a drawing's cost
            import matplotlib.backends.backend_agg  # noqa: F401

            began = time.perf_counter()
            drawn = draw_curves(history, self.path,
                                best_epoch(history, self.monitor, self.mode), self.monitor)
        except Exception as error:  # noqa: BLE001 - a picture never ends a run
            log.warning("could not draw %s: %s", self.path, str(error).splitlines()[0]
                        if str(error) else type(error).__name__)
            return None
        cost = time.perf_counter() - began
        self.seconds += cost
        self.drawings += 1
        self._next = time.perf_counter() + cost * max(self.spacing - 1, 0)
        self._drawn = history
        return drawn
