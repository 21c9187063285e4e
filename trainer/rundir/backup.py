"""Fault tolerance: atomic backups to resume from, a clean stop on signals, a NaN guard.

A backup is a directory `backup/ckpt-<epoch>-<step>/` holding the model's and optimizer's
variables (so the learning-rate schedule's position, `optimizer.iterations`, too), the
random states of its dropout layers, the training metrics' state of the epoch in progress
(`metrics.npz`: a mid-epoch backup only, so the resumed epoch reports over all its steps),
and `state.json` with the epoch and the step within it. It is written under a temporary name
and renamed, so a directory named `ckpt-*` is always complete; the newest two are kept, and
a latest one that does not load falls back to the one before, with a warning.

Only the state is taken in the step loop: the variables read into host memory (the next step
changes them), or a copied checkpoint's file opened. The rest runs beside training, in the
run's one background thread (`trainer.rundir.inflight`): the files written, their checksums,
`state.json`, the rename, the old backups pruned, and for a run directory at a URL the upload
(the run's place, `trainer.rundir.remote.RunPlace.committed`: nothing for a local
directory). A backup is complete,
and the newest, only once all of that is done; the next backup, a stop, a recovery's
restore and the run's end wait for it, and raise its failure (the store gone, a full disk)
as the step loop raised it before. A crash in the middle leaves the backup before it as
the newest. `BackupStore.seconds` counts the time the step loop spent: the state taken
and the waits.

At the end of an epoch whose best checkpoint was just written (the same state), the backup
holds a copy of that `best.keras` (`model.keras`, with the checksum it was written with)
instead of saving the model again: a file of its own (a reflink where the file system has
them), never a hard link, so damage to `best.keras`, or a user's `model.save` over it,
leaves the backup whole.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np

from trainer.config.errors import EXIT_INTERRUPTED, ConfigError, Diverged
from trainer.internals.keras_compile import weights_taken
from trainer.rundir.atomic import (
    TMP,
    commit,
    copy_open,
    json_read,
    json_text,
    remove,
    temporary,
    write_json,
)
from trainer.rundir.checksum import read_beside, sha256, verify
from trainer.rundir.inflight import InFlight
from trainer.rundir.layout import CHECKPOINT, METRICS, RNG, STATE, WEIGHTS, RunDir, note_backup
from trainer.rundir.recover import Recovery
from trainer.rundir.remote import RunPlace

log = logging.getLogger(__name__)


def _rng_states(model: keras.Model) -> list:
    """The seed generators' states (dropout masks), which `save_weights` leaves out."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _load_rng_states(model: keras.Model, path: Path) -> None:
    with np.load(path) as saved:
        values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    states = _rng_states(model)
    if len(values) != len(states):
        raise ValueError(f"{path} holds {len(values)} random states, the model has "
                         f"{len(states)}")
    for variable, value in zip(states, values, strict=True):
        variable.assign(value)


def _metrics_taken(variables: list) -> Callable[[Path], None]:
    """The training metrics' variables read now (each replica's summed, as a cross-replica
    read gives it), and the writer of them as `metrics.npz`, for later."""
    values = [np.array(v.numpy(), copy=True) for v in variables]
    names = np.array([str(v.path) for v in variables], dtype=str)
    return lambda path: np.savez(path, *values, names=names)


def _load_metrics(path: Path) -> tuple[tuple[str, ...], tuple[np.ndarray, ...]]:
    with np.load(path) as saved:
        names = tuple(str(n) for n in saved["names"])
        values = tuple(saved[f"arr_{i}"] for i in range(len(names)))
    return names, values


class _CopyOf:
    """Writes the bytes of an open file (a copy, never a link: `copy_open`); `close` closes
    the file."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __call__(self, path: Path) -> None:
        copy_open(self.source, path)

    def close(self) -> None:
        self.source.close()


def _written_as(write: Callable[[str], None]) -> Callable[[Path], None]:
    return lambda path: write(str(path))


@dataclass(frozen=True)
class ResumePoint:
    """Where a backup left off: `step` steps of epoch `epoch` (0-based) are done.

    `metrics` is the training metrics' state at that step ((variable paths), (values)); None
    for a backup without it (an epoch end, or written before backups kept it).
    """

    epoch: int
    step: int
    path: Path
    state: dict
    metrics: tuple | None = None


class BackupStore:
    """Writes and finds backups in one directory.

    Args:
        directory: the run's `backup/` directory.
        keep: how many of the newest backups to keep.
        meta: JSON-ready facts written into every backup's `state.json` (the run's config
            and batch, which a resume is checked against: `trainer.rundir.resume`).
        place: the run's place, which each complete backup reaches (`RunPlace.committed`:
            its URL, for a run directory at one); None: a local directory.
    """

    def __init__(self, directory: Path, keep: int = 2, meta: dict | None = None,
                 place: RunPlace | None = None) -> None:
        self.directory = Path(directory)
        self.place = place
        self.keep = keep
        self.meta = dict(meta or {})
        self.seconds = 0.0  # the step loop's: states taken, waits for a backup in flight
        # The training metrics' variables, kept by mid-epoch backups; None: none kept.
        self.metrics: Callable[[], list] | None = None
        self.flight = InFlight()  # the backup being completed beside training
        self._found_before = self.directory.is_dir()  # removed since: said (`_complete`)

    def save(self, model: keras.Model, epoch: int, step: int, same_as: Path | None = None,
             history: dict | None = None, recovered: list | None = None) -> Path:
        """Backs up `model` at `epoch` (0-based) after `step` steps of it; returns where the
        backup goes once complete.

        The model's state is taken now, into host memory (the next step changes it); the
        rest (the files written, their checksums, `state.json`, the rename, the old backups
        pruned, the upload where the run directory is at a URL) runs beside training
        (`InFlight`), after the backup before it, which this call waits for first. `wait`
        waits for it.

        `same_as` is a `.keras` checkpoint of this very state (with its `.sha256` beside
        it), copied instead of saved again; None writes the weights. `history` is the
        run's per-epoch metrics of its `epoch` whole epochs, kept in `state.json` (a rerun
        that has nothing left to train reports them), `recovered` the run's recoveries
        from a loss blow-up (`trainer.rundir.recover`). A `backup/` directory removed
        meanwhile is made again (once).

        Raises:
            What the backup before it failed with in the background (a store gone: the
            mirror's `Interrupted`; a full disk: `OSError`).
        """
        began = time.perf_counter()
        try:
            self.flight.wait()  # at most one in flight; its failure is raised here
            writes, state = self._capture(model, epoch, step, same_as)
            state.update(self.meta)
            if history is not None:
                state["history"] = {k: list(v) for k, v in history.items()}
            if recovered:
                state["recovered"] = [dict(found) for found in recovered]
            final = self.path(epoch, step)
            self.flight.submit(lambda: self._complete(writes, final, state))
            return final
        finally:
            self.seconds += time.perf_counter() - began

    def wait(self) -> None:
        """Blocks until the backup in flight is complete (written, and uploaded where the run
        directory is at a URL); raises its failure (see `save`)."""
        began = time.perf_counter()
        try:
            self.flight.wait()
        finally:
            self.seconds += time.perf_counter() - began

    def close(self, failed: bool = False) -> None:
        """Waits for the backup in flight and ends its thread (the run's owner calls it);
        with the run `failed` already, the backup's failure is logged, not raised."""
        self.flight.close(failed)

    def path(self, epoch: int, step: int = 0) -> Path:
        """Where the backup at (`epoch`, `step`) is (`step` 0: the epoch's start)."""
        return self.directory / f"ckpt-{epoch:06d}-{step:09d}"

    def _capture(self, model: keras.Model, epoch: int, step: int, same_as: Path | None
                 ) -> tuple[dict[str, Callable[[Path], None]], dict]:
        """The model's state, taken into host memory (or, for a copy of `same_as`, its file
        opened: a checkpoint renamed over it later leaves these bytes); returns what writes
        each of the backup's files, and the `state.json` begun (a copy's checksum is the
        one it was written with)."""
        writes, sums = {}, {}
        digest = read_beside(same_as) if same_as is not None else None
        if digest is not None:
            source = open(same_as, "rb")  # noqa: SIM115 - closed once the backup is written
            writes[CHECKPOINT] = _CopyOf(source)
            sums[CHECKPOINT] = digest  # as written: a damaged source is found in the copy
        else:
            writes[WEIGHTS] = _written_as(weights_taken(model))
        rng = [np.array(v.numpy(), copy=True) for v in _rng_states(model)]
        writes[RNG] = lambda path: np.savez(path, *rng)
        if step > 0 and self.metrics is not None:
            writes[METRICS] = _metrics_taken(list(self.metrics()))
        return writes, {"epoch": epoch, "step": step, "sha256": sums}

    def _complete(self, writes: dict[str, Callable[[Path], None]], final: Path,
                  state: dict) -> None:
        """The backup's slow part (in the background): its files written under a
        temporary name (made again, once, where `backup/` was removed meanwhile), their
        checksums and `state.json`, the rename into place, the old backups pruned, then,
        for a run directory at a URL, the upload (`RunPlace.committed`)."""
        tmp = temporary(final)
        self._check_directory()
        try:
            try:
                self._write(writes, tmp, state)
            except FileNotFoundError:
                log.warning("%s vanished while a backup was written; writing it again",
                            self.directory)
                self._write(writes, tmp, state)
            commit(tmp, final)
        except BaseException:
            remove(tmp)
            raise
        finally:
            for write in writes.values():
                getattr(write, "close", lambda: None)()  # a copy's source file
        for old in self._found()[self.keep:]:
            if old != final:  # never the one just written
                shutil.rmtree(old, ignore_errors=True)
        if self.place is not None:
            self.place.committed()  # a run directory at a URL: it reaches it
        note_backup(final.name)

    @staticmethod
    def _write(writes: dict[str, Callable[[Path], None]], tmp: Path, state: dict) -> None:
        """The backup's files into the folder `tmp` (made anew), `state.json` last."""
        remove(tmp)
        tmp.mkdir(parents=True)
        sums = state["sha256"]
        for name, write in writes.items():
            write(tmp / name)
            if name not in sums:  # a copy's is the one it was written with
                sums[name] = sha256(tmp / name)
        (tmp / STATE).write_text(json_text(state, indent=None))

    def _check_directory(self) -> None:
        """Says so where `backup/` was removed since the last backup (it is made again with
        this one; the backups it held are gone), and stops the run in one line where a file
        stands in its place.

        Raises:
            ConfigError: `backup/` is a file.
        """
        if self.directory.is_dir() or not self._found_before:
            self._found_before = self._found_before or self.directory.is_dir()
            return
        if self.directory.exists():
            raise ConfigError(f"{self.directory} is a file now, not the run's backup folder "
                              "(replaced during the run): move it away, then rerun the same "
                              "command; checkpoints/ is kept")
        log.warning("%s was removed during the run, with the backups it held; this backup "
                    "makes it again", self.directory)

    def prune(self, keep: int) -> None:
        """Removes all but the newest `keep` backups (the one in flight complete first)."""
        for old in self.backups()[keep:]:
            shutil.rmtree(old, ignore_errors=True)

    def backups(self) -> list[Path]:
        """Complete backups, newest first (the one in flight once complete)."""
        self.wait()
        return self._found()

    def _found(self) -> list[Path]:
        """The backups in place, newest first."""
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("ckpt-*"), reverse=True)

    def restore(self, model: keras.Model) -> ResumePoint | None:
        """Loads the newest backup that loads into `model`; None when there is none.

        Raises:
            ConfigError: there are backups but none loads: starting afresh would silently
                replace the run they hold.
        """
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        failures, damaged = [], []
        for path in self.backups():
            try:
                state = json_read((path / STATE).read_text())
                for name, expected in state.get("sha256", {}).items():
                    verify(path / name, expected)
                weights = path / CHECKPOINT if (path / CHECKPOINT).exists() else path / WEIGHTS
                model.load_weights(weights)
                _load_rng_states(model, path / RNG)
                metrics = _load_metrics(path / METRICS) if (path / METRICS).exists() else None
            except Exception as error:  # noqa: BLE001 - any unreadable backup falls back
                why = str(error).splitlines()[0] if str(error) else type(error).__name__
                log.warning("backup %s does not load (%s); trying the one before", path, why)
                failures.append(f"{path.name}: {why}")
                damaged.append(path)
                continue
            _set_aside(damaged)
            return ResumePoint(int(state["epoch"]), int(state["step"]), path, state, metrics)
        if failures:
            raise ConfigError(f"no backup in {self.directory} loads into this model ("
                              f"{'; '.join(failures)}); starting afresh would replace that run: "
                              "move the directory away, or choose a new run directory")
        return None


def _set_aside(damaged: list[Path]) -> None:
    """Renames backups that did not load to `damaged-*`, out of the rotation: their names are
    newer than the resumed run's new backups, which they would otherwise push out."""
    for path in damaged:
        aside = path.with_name(f"damaged-{path.name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(path, aside)
        log.warning("set %s aside as %s (it does not load)", path.name, aside.name)


def tidy(run_dir: Path) -> None:
    """Removes what a kill in the middle of a write left in a run directory: the temporary
    names (`.tmp-*`, `trainer.rundir.atomic`) of backups, checkpoints, exports, the summary
    and the rest; never a complete file."""
    layout = RunDir(run_dir)
    leftovers = [*layout.backup.glob(f"{TMP}*"), *layout.checkpoints.glob(f"{TMP}*"),
                 *layout.root.glob(f"{TMP}*"),
                 *layout.root.glob(".*.tmp")]  # the temporary names of earlier versions
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def write_finished(run_dir: Path, summary: dict, place: RunPlace | None = None) -> dict:
    """A finished run's directory: `summary.json` written (last: the run finished), the
    newest two backups kept (what `resume=DIR` extends the run from: the one before when the
    newest is damaged, as during training), leftovers tidied.
    A run directory at a URL is named by its URL in the summary (`place`: its local mirror
    is removed when the command ends); returns the summary as written."""
    summary = place.by_url(summary) if place is not None else summary
    layout = RunDir(run_dir)
    write_json(layout.summary, summary)
    BackupStore(layout.backup).prune(keep=2)
    tidy(run_dir)
    return summary


class StopNow(Exception):  # noqa: N818 - a control-flow signal, caught by trainer.run.train
    """Raised by `Backup` once a stop request's backup is written, to leave fit at once."""


# The signals that ask for the agreed stop: SIGTERM (a scheduler's stop, Kubernetes' eviction),
# Ctrl-C, and SIGUSR1, the notice a scheduler sends ahead of a preemption (SLURM's
# `--signal=B:USR1@120`), whose default action would end the process without a backup.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    """Set by SIGTERM, SIGINT or SIGUSR1 (`STOP_SIGNALS`); read at the next step boundary.

    Attributes:
        signal: the signal that asked, or None.
        stepped: whether a training step has ended (the first one compiles the step).
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self.stepped = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signum


# How long a stop asked for before the first step has ended may wait for it: the first step
# traces and compiles the step (with XLA, minutes), inside TensorFlow's C++ code, which no
# signal interrupts; no step has been trained, so there is nothing to back up.
HELD_S = 8.0


@contextmanager
def stop_on_signals(request: StopRequest) -> Iterator[StopRequest]:
    """Routes `STOP_SIGNALS` to `request` while training runs (main thread only); a stop
    asked for while the first step compiles ends the process after `HELD_S` seconds, one
    line and its exit code (`_held`)."""
    names = STOP_SIGNALS
    try:
        previous = {s: signal.signal(s, request) for s in names}
    except ValueError:  # not the main thread: leave signals alone
        yield request
        return
    # The C-level handler writes each signal's number here at once, even while the main
    # thread is in TensorFlow's C++ code (its Python handler runs only once it is back).
    read, write = os.pipe()
    os.set_blocking(write, False)
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    done = threading.Event()
    watcher = threading.Thread(target=_held, args=(read, request, done), daemon=True)
    watcher.start()
    try:
        yield request
    finally:
        done.set()
        signal.set_wakeup_fd(wakeup)
        for s, handler in previous.items():
            signal.signal(s, handler)
        os.close(write)  # the watcher's read ends


def _held(read: int, request: StopRequest, done: threading.Event) -> None:
    """Watches the signals: one of `STOP_SIGNALS` before the first step has ended, and
    still not acted on after `HELD_S` seconds (the step compiling in C++), ends the process
    with the stop's line and exit code: nothing was trained since the last backup. Training
    that ended meanwhile (`done`) handles the stop itself."""
    try:
        while chunk := os.read(read, 64):
            asked = [s for s in chunk if s in STOP_SIGNALS]
            if not asked or request.stepped:
                continue
            deadline = time.monotonic() + HELD_S
            while time.monotonic() < deadline and not (request.stepped or done.is_set()):
                time.sleep(0.1)
            if not (request.stepped or done.is_set()):
                name = signal.Signals(asked[0]).name
                line = (f"interrupted: {name} while the first training step compiled, which "
                        f"TensorFlow does not interrupt: stopped after {HELD_S:.0f} s, no step "
                        "trained since the last backup; rerun the same command to resume")
                print(line, file=sys.stderr, flush=True)
                os._exit(130 if asked[0] == signal.SIGINT else EXIT_INTERRUPTED)
    finally:
        os.close(read)


class Backup(keras.callbacks.Callback):
    """Backs up every `every` steps and at each epoch end; stops cleanly; guards against NaN.

    With several workers a signal reaches one of them (a preempted machine) while the others
    train on; `agree` makes them all stop at the same step: every `check_every` steps each
    worker says whether it was asked to stop, and all stop together when one was (the chief
    writing its backup), instead of the others failing on a lost peer.

    Args:
        store: where backups go.
        every: steps between backups; 0 for epoch ends only.
        check_every: steps between NaN checks (each reads the loss: a device sync), and
            between stop agreements with several workers.
        request: the stop request set by signals.
        initial_epoch: the epoch a resumed run starts in.
        initial_step: steps of `initial_epoch` already done before the resume.
        agree: with several workers, `agree(asked)` returns whether any worker was asked to
            stop (a collective: every worker calls it at the same steps); None for one.
        best: the best-checkpoint callback (`AtomicModelCheckpoint`), called before this
            one at epoch ends: an epoch whose best checkpoint it wrote copies it.
        history: the per-epoch metrics of the epochs done before `initial_epoch` (from the
            backup resumed); each epoch's end adds its own, and every backup keeps them.

    `metric_source` gives the variables of the training metrics (None: the model's
    `metrics_variables`, as `fit` updates them; the custom loop has its own); mid-epoch
    backups keep them. `resumed_metrics` (a `ResumePoint.metrics`) is assigned back at the
    start of the resumed epoch, after the loop has reset its metrics, so that epoch's loss
    and metrics count every one of its steps, as an uninterrupted run's do.
    """

    def __init__(self, store: BackupStore, every: int, check_every: int, request: StopRequest,
                 initial_epoch: int = 0, initial_step: int = 0,
                 agree: Callable[[bool], bool] | None = None, best: Any = None,
                 history: dict | None = None) -> None:
        super().__init__()
        self.best = best
        self.history = {k: list(v) for k, v in (history or {}).items()}
        self.store, self.every, self.check_every = store, every, max(check_every, 1)
        self.request, self.agree = request, agree
        self.initial_epoch, self.initial_step = initial_epoch, initial_step
        self.epoch, self.offset, self.interrupted = initial_epoch, 0, False
        self.reached = initial_step  # the last step of `epoch` trained (a restart's count)
        self.stopped_by_peer = False
        # A stop asked at an epoch's last step waits for that epoch's end (`on_epoch_end`).
        self._stop_at_end = False
        # The epochs whose end this run backed up (what an evaluator is handed).
        self.ended: set[int] = set()
        self.metric_source: Callable[[], list] | None = None
        self.resumed_metrics: tuple | None = None
        self.recovery = Recovery()  # `checkpoint.recover`: off unless the wiring sets it
        store.metrics = self._metric_variables

    def _metric_variables(self) -> list:
        if self.metric_source is not None:
            return list(self.metric_source())
        return list(self.model.metrics_variables)

    def on_train_begin(self, logs=None):
        # before any checkpoint: checkpoints without backup/ then mean it was removed
        self.store.directory.mkdir(parents=True, exist_ok=True)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.offset = self.initial_step if epoch == self.initial_epoch else 0
        self._checked = 0
        if self.offset and self.resumed_metrics is not None:
            # The loop reset the metrics just before this call (fit and the custom loop).
            self._restore_metrics(*self.resumed_metrics)
        self.resumed_metrics = None

    def _restore_metrics(self, names: tuple, values: tuple) -> None:
        """Assigns the saved metric state; a different set of metrics (`metrics=` changed on
        resume) keeps the reset one, with a warning."""
        variables = self._metric_variables()
        now = tuple(str(v.path) for v in variables)
        if now != tuple(names) or any(tuple(v.shape) != np.shape(value)
                                      for v, value in zip(variables, values, strict=True)):
            log.warning("the backup's training metrics (%s) are not this run's (%s): epoch "
                        "%d reports its loss and metrics over the steps after the resume only",
                        ", ".join(names), ", ".join(now), self.epoch + 1)
            return
        for variable, value in zip(variables, values, strict=True):
            # A cross-replica assign of a SUM on-read variable splits the value over the
            # replicas, so the read (their sum) gives it back.
            variable.assign(value)

    def _stop_requested(self, batch: int) -> bool:
        asked = self.request.signal is not None
        if self.agree is None:
            return asked
        # Whenever a multiple of check_every steps is passed (chunks of steps_per_execution
        # may skip the multiple itself), and at the epoch's last step: the same on all workers.
        bucket = (batch + 1) // self.check_every
        last = batch + 1 == (self.params or {}).get("steps")
        if bucket == self._checked and not last:
            return False
        self._checked = bucket
        stop = self.agree(asked)
        self.stopped_by_peer = stop and not asked
        return stop

    def on_train_batch_end(self, batch, logs=None):
        self.request.stepped = True
        step = self.reached = self.offset + batch + 1
        if self._stop_requested(batch):
            self._check(logs, step)
            if batch + 1 == (self.params or {}).get("steps"):
                # The epoch's last step: its end (validation, the best checkpoint, the
                # evaluator's hand-off) runs first; stopped here, a resume would start the
                # next epoch and that end would never run.
                self._stop_at_end = True
                return
            self._save(self.epoch, step)
            self.store.wait()  # the stop's backup complete (uploaded) before the exit
            self.interrupted = True
            self.model.stop_training = True
            # Out of fit at once: `stop_training` alone would still run the epoch's whole
            # validation (and other workers may be gone).
            raise StopNow(f"stopped at epoch {self.epoch + 1}, step {step}")
        elif self.every and step % self.every == 0:
            self._check(logs, step)
            self._save(self.epoch, step)
        elif step % self.check_every == 0 or (
                self.recovery.on and batch + 1 == (self.params or {}).get("steps")):
            # with recovery on, the epoch's last step too: its end would only stop the run
            self._check(logs, step)

    def on_epoch_end(self, epoch, logs=None):
        self._check(logs, None)
        if not self.interrupted:
            for key, value in (logs or {}).items():
                if isinstance(value, (int, float, np.number)) or np.ndim(value) == 0:
                    self.history.setdefault(key, []).append(float(value))
            same = None
            if self.best is not None and self.best.saved_epoch == epoch:
                same = Path(self.best.filepath)
            self._save(epoch + 1, 0, same_as=same)
            self.ended.add(epoch + 1)
        if self._stop_at_end:  # asked at the last step: stopped now, the epoch's end done
            self._stop_at_end = False
            self.store.wait()  # the stop's backup complete (uploaded) before the exit
            self.interrupted = True
            self.model.stop_training = True

    def _save(self, epoch: int, step: int, same_as: Path | None = None) -> None:
        """A backup at (`epoch`, `step`), with the history and the recoveries so far (a
        resumed run's summary names them)."""
        self.store.save(self.model, epoch, step, same_as=same_as, history=self.history,
                        recovered=self.recovery.recovered)

    def _check(self, logs, step: int | None) -> None:
        """Raises `Diverged` where the training loss is not finite; at an epoch's end (step
        None) every loss the epoch logged, validation's too (`val_loss`, an output's
        `val_label_loss`): a model whose weights became NaN may show it there first."""
        logs = logs or {}
        names = ["loss"] if step is not None else [
            k for k in logs if k == "loss" or k.endswith("_loss")]
        for name in names:
            loss = float(logs.get(name, 0.0))
            if (name == "loss" and step is not None and self.recovery.on
                    and self.recovery.blown_up(loss)):
                self._recover(step, loss)
                return
            if not math.isfinite(loss):
                where = f"epoch {self.epoch + 1}" + (f", step {step}" if step else " end")
                kept = (f"the last good backup is in {self.store.directory} and checkpoints "
                        "are kept" if self.store.backups() else "no backup was written "
                        "before it")
                raise Diverged(f"{name} became {loss} at {where}; {kept}; lower optimizer.lr "
                               "or add warm-up")

    def recover_with(self, loss_upper_bound: float | None, max_trials: int) -> None:
        """Turns on recovery from a loss blow-up (`checkpoint.recover`)."""
        self.recovery = Recovery(loss_upper_bound, max_trials)

    def _recover(self, step: int, loss: float) -> None:
        """Restores the last backup (weights, optimizer, random states, the epoch's metrics
        so far) and lets training go on from the batch after `step`: the batches since the
        backup are skipped. Raises `Diverged` once `checkpoint.recover.max_trials` are used,
        or where no backup was written before the blow-up."""
        epoch = self.epoch + 1
        if not self.recovery.trials_left():
            raise Diverged(self.recovery.exhausted(epoch, step, loss))
        point = self.store.restore(self.model)
        if point is None:
            raise Diverged(f"{self.recovery.why(loss)} at epoch {epoch}, step {step}, before "
                           f"any backup to recover from; {self.recovery.remedy(loss)}")
        for variable in self._metric_variables():  # the blown-up steps leave the mean
            variable.assign(np.zeros(variable.shape, variable.dtype))
        since = point.step if point.epoch == self.epoch else 0
        if since and point.metrics is not None:
            self._restore_metrics(*point.metrics)
        found = self.recovery.record(epoch, step, loss, point.path.name, since)
        log.warning("loss became %s at epoch %d, step %d: restored backup %s and skipped "
                    "batches %d-%d of the epoch (recovery %d of %d)", loss, epoch, step,
                    point.path.name, *found["skipped"], len(self.recovery.recovered),
                    self.recovery.max_trials)
