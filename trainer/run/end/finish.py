"""The end of a run: every validation example evaluated once, the test split once with the
checkpoint validation chose, the averaged model (the optimizer's EMA, or the mean of the
best checkpoints) saved and tested once, and a stop asked for there honoured before the
summary.

Every worker decides alike (each has its own copy of the checkpoints), and every replica of
every worker evaluates the chief's weights, which the checkpoints hold (batch normalization's
per-replica statistics included); a run that ended no epoch tests the weights as they are.
The last weights come back after the test, for the export and anything the caller does with
the model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config.errors import Interrupted
from trainer.config.messages import one_line
from trainer.distribute.multiworker import backup_place, hold_first_replicas_weights
from trainer.internals.keras_optimizer import ema_momentum, swap_in_ema, uses_ema
from trainer.models.export import check_exportable, export_model
from trainer.run.assembly.assemble import Run
from trainer.run.assembly.wiring import Callbacks
from trainer.run.fit.drive import Trained
from trainer.run.fit.loop import CustomLoop
from trainer.rundir.backup import StopRequest
from trainer.rundir.checkpoint import intact, save_checkpoint
from trainer.rundir.layout import RunDir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What training did: per-epoch history, the final validation metrics, where it stopped."""

    history: dict[str, list]
    validation: dict[str, float]
    epochs_done: int
    stopped_early: bool
    test: dict[str, float] | None = None
    test_checkpoint: str | None = None
    startup_s: float | None = None  # process start to train()
    build_s: float | None = None  # train() to the first fit: devices, TensorFlow, data, model
    evaluation_s: float | None = None  # the final validation and test evaluations
    averaged: dict[str, Any] | None = None  # the averaged model's test (`test_averaged`)


@dataclass(frozen=True)
class Averaged:
    """The averaged model's weights: `ema` (the optimizer's moving average, `optimizer.ema`)
    or `best` (the mean of the best checkpoints, `checkpoint.average_best`), and what the
    summary says of it (`about`)."""

    kind: str
    weights: list
    about: dict[str, Any]


def final_evaluations(run: Run, callbacks: Callbacks, trained: Trained, epochs: int,
                      test_with: str, request: StopRequest, startup_s: float | None,
                      average_best: int = 0) -> Outcome:
    """Validation, then test, once each, then the averaged model's test where the run
    keeps one; a stopped run is not evaluated (other workers may be gone). The validation
    is training's last where it scored the weights the model holds (`LastValidation`)."""
    done, model = trained.epochs_done, run.model
    if callbacks.backup.interrupted:
        return Outcome(trained.history, {}, done, False, startup_s=startup_s,
                       build_s=trained.build_s)
    if not trained.trained and done:
        # Nothing left to train (stopped after the last epoch's backup): the final state is
        # the backup's; last.keras is written now where the stop came before it.
        ensure_last(callbacks.checkpoints[0], model, done - 1)
    evaluating = time.perf_counter()
    run_dir = callbacks.backup.store.directory.parent
    final = final_validation(run, callbacks, trained)
    stop_if_asked(request, "the final validation", run_dir, run.is_chief)
    # before a test checkpoint's load, which restores that epoch's optimizer (its EMA) too
    averaged = averaged_weights(run, callbacks, average_best)
    test, checkpoint = None, None
    if run.data.test is not None:
        checkpoint = (test_checkpoint(test_with, callbacks) if trained.history else None)
        last = model.get_weights() if checkpoint is not None else None
        if checkpoint is not None:
            checkpoint = load_for_test(model, checkpoint, callbacks)
            # the chief's file on every worker (the others loaded their own copies)
            hold_first_replicas_weights(run.strategy, model)
        test = test_metrics(run, trained.loop)
        if last is not None:
            model.set_weights(last)
        stop_if_asked(request, "the test evaluation", run_dir, run.is_chief)
    tested = None if averaged is None else test_averaged(run, averaged, trained.loop, run_dir)
    stop_if_asked(request, "the averaged model's test", run_dir, run.is_chief)
    return Outcome(trained.history, final, done, trained.stopped_early and done < epochs,
                   test, None if checkpoint is None else str(checkpoint), startup_s,
                   trained.build_s, time.perf_counter() - evaluating, tested)


def final_validation(run: Run, callbacks: Callbacks, trained: Trained) -> dict[str, float]:
    """The validation split scored with the weights `last.keras` holds, on every replica
    (they are made the first replica's): training's last validation where it scored these
    very weights on every replica (`LastValidation`; a second pass would repeat it), else
    one pass now. Empty without a validation split."""
    reused = (callbacks.validated.reusable() if callbacks.validated is not None
              and trained.trained and run.data.validation is not None else None)
    hold_first_replicas_weights(run.strategy, run.model)  # last.keras's, on every replica
    if run.data.validation is None or reused is not None:
        return reused or {}
    return evaluate_split(run, run.data.validation, trained.loop)


def averaged_weights(run: Run, callbacks: Callbacks, average_best: int) -> Averaged | None:
    """The averaged model's weights, the model left holding its last ones: the optimizer's
    moving average where it keeps one, else the element-wise mean of the `average_best`
    best checkpoints (a damaged one left out, with a warning); None where the run keeps
    no averaged model."""
    model = run.model
    if uses_ema(model.optimizer):
        last = model.get_weights()
        swap_in_ema(model.optimizer)
        found = model.get_weights()
        model.set_weights(last)
        return Averaged("ema", found, {"momentum": ema_momentum(model.optimizer)})
    if not average_best or callbacks.kept is None:
        return None
    paths = [r.path for r in callbacks.kept.kept.kept[:average_best]]
    whole = [p for p in paths if intact(p)]
    for path in sorted(set(paths) - set(whole)):
        log.warning("%s is damaged (its SHA-256 does not match); the average leaves it out",
                    path)
    if not whole:
        return None
    last = model.get_weights()
    total = None
    for path in whole:
        model.load_weights(path)
        found = model.get_weights()
        total = found if total is None else [_add(a, b) for a, b in zip(total, found,
                                                                          strict=True)]
    model.set_weights(last)
    mean = [_mean(t, len(whole), like) for t, like in zip(total, last, strict=True)]
    return Averaged("best", mean, {"of": [str(p) for p in whole]})


def _add(total: Any, value: Any) -> Any:
    """A running sum of one weight over checkpoints (a whole-number weight: the best's)."""
    if not np.issubdtype(np.asarray(value).dtype, np.floating):
        return total
    return np.asarray(total, np.float64) + value


def _mean(total: Any, count: int, like: Any) -> Any:
    like = np.asarray(like)
    if not np.issubdtype(like.dtype, np.floating):
        return np.asarray(total)
    return (np.asarray(total, np.float64) / count).astype(like.dtype)


def test_averaged(run: Run, averaged: Averaged, loop: Any, run_dir: Path) -> dict[str, Any]:
    """Saves the averaged model as `checkpoints/averaged.keras` (atomically, its hash
    beside it) and evaluates it once on the test split (the validation split where there
    is no test split); the model holds its last weights again after."""
    model = run.model
    last = model.get_weights()
    model.set_weights(averaged.weights)
    hold_first_replicas_weights(run.strategy, model)
    path = RunDir(run_dir).checkpoint("averaged")
    save_checkpoint(model, path)
    split, data = (("test", run.data.test) if run.data.test is not None
                   else ("validation", run.data.validation))
    metrics = evaluate_split(run, data, loop)
    model.set_weights(last)
    hold_first_replicas_weights(run.strategy, model)
    return {"kind": averaged.kind, **averaged.about, "checkpoint": str(path), "split": split,
            "metrics": metrics}


def check_export(run: Run, formats: tuple[str, ...]) -> None:
    """Refuses, before training, an export format the built model does not export to (a
    model taking strings in TFLite or ONNX): one line instead of a failure after training."""
    check_exportable(run.model, formats, run.data.probe)


def export(run: Run, run_dir: Path, formats: tuple[str, ...], report: dict[str, Any],
           export_with: str = "last") -> None:
    """Writes the formats `export` names (each checked against the Keras outputs) and says
    where in the summary: the final weights, or with `export_with=averaged` the averaged
    model's (`checkpoints/averaged.keras`, loaded into the model)."""
    if not formats:
        return
    averaged = (report.get("averaged") or {}).get("checkpoint")
    if export_with == "averaged" and averaged is not None:
        model = run.model
        model.load_weights(averaged)
        hold_first_replicas_weights(run.strategy, model)
        report["exported_model"] = averaged
    report["exports"] = export_model(run.model, run_dir, formats, run.data.probe)
    if "saved_model" in report["exports"]:  # its key before export formats
        report["saved_model"] = report["exports"]["saved_model"]


def stopped(run: Run, backup: Any, request: StopRequest, run_dir: Path) -> Interrupted:
    """The error of a run stopped by a signal (here or on another worker), with where its
    backup is."""
    why = ("another worker was asked to stop" if backup.stopped_by_peer
           else f"stopped by signal {request.signal}")
    who = "; every worker stopped" if run.workers > 1 else ""
    return Interrupted(f"{why}{who} at epoch {backup.epoch + 1}; backup in "
                       f"{backup_place(run_dir, run.is_chief)}; rerun the same command to "
                       "resume")


def stop_if_asked(request: StopRequest, during: str, run_dir: Path, chief: bool) -> None:
    """A signal received after training (the final evaluations, the export): stop there,
    before the summary; the final epoch's backup lets a rerun finish exactly what is left."""
    if request.signal is not None:
        raise Interrupted(f"stopped by signal {request.signal} during {during}, after the "
                          f"last epoch; backup in {backup_place(run_dir, chief)}; rerun the "
                          "same command to finish the run")


def test_metrics(run: Run, loop: Any = None) -> dict[str, float]:
    """Every test example evaluated once, by the run's loop."""
    return evaluate_split(run, run.data.test, loop)


def evaluate_split(run: Run, dataset: Any, loop: Any = None) -> dict[str, float]:
    """Loss and metrics over every example of a split, once: Keras's `evaluate` under
    `fit` (its symbolic build reads no batch once the model is built, see
    `trainer.run.assembly.step`), the custom loop's evaluation under `loop=custom`."""
    if run.loop == "fit":
        found = run.model.evaluate(dataset, return_dict=True, verbose=0)
    else:
        if loop is None:
            loop = CustomLoop(run.model, run.strategy)
        found = loop.evaluate(dataset)
    return {k: float(v) for k, v in found.items()}


def test_checkpoint(test_with: str, callbacks: Callbacks) -> Path:
    """The checkpoint the test split is evaluated with: `checkpoint.test_with` (best, or
    last where no best is kept)."""
    saved = {Path(c.filepath).stem: Path(c.filepath) for c in callbacks.checkpoints}
    which = test_with if test_with in saved else "last"
    return saved[which]


def ensure_last(last: Any, model: Any, epoch: int) -> None:
    """Writes `last.keras` from the model where it is missing or damaged (a stop between the
    last epoch's backup and the end of training)."""
    path = Path(last.filepath)
    if intact(path):
        return
    log.warning("%s is missing or damaged; writing it from the last backup", path)
    last.set_model(model)
    last._ended = (epoch, {})  # noqa: SLF001 - its own at-end write, as at the end of fit
    last.same_as = None
    last.on_train_end()


def load_for_test(model: Any, checkpoint: Path, callbacks: Callbacks) -> Path | None:
    """Loads the test checkpoint into `model`; a damaged one (its hash, or a file that does
    not load) is one warning naming it and the fallback: the last weights, which the model
    holds already. Returns the checkpoint whose weights the model then holds (None: the
    final weights, no file)."""
    fallback = Path(callbacks.checkpoints[0].filepath)
    try:
        if not checkpoint.is_file():
            raise ValueError("missing")
        if not intact(checkpoint):
            raise ValueError("its SHA-256 does not match the one written with it")
        model.load_weights(checkpoint)
        return checkpoint
    except Exception as error:  # noqa: BLE001 - any unreadable checkpoint falls back
        if checkpoint == fallback:
            log.warning("%s does not load (%s); testing the final weights", checkpoint,
                        one_line(error))
            return None
        log.warning("%s does not load (%s); testing with %s (the final weights) instead",
                    checkpoint, one_line(error), fallback.name)
        return fallback if intact(fallback) else None
