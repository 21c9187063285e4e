"""Callbacks Keras does not ship: time to first step and steady throughput, atomic
checkpoints (the k best among them), the run's progress bar, the watchdog, the chief's
hand-off to an evaluator beside the workers."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np

from trainer.distribute.multiworker import weights_digest
from trainer.internals.keras_callbacks import CheckpointHooks, ProgbarAt
from trainer.run.prepare.sidecar import EvaluatorDir, await_result, clear_result, merged
from trainer.rundir.atomic import commit, copy, temporary, write_json, written
from trainer.rundir.checkpoint import KeptBest
from trainer.rundir.checksum import read_beside
from trainer.rundir.layout import CHECKPOINT, WEIGHTS, RunDir


class Throughput(keras.callbacks.Callback):
    """Measures time to the first training step and steady examples per second.

    The first step traces and optimises the step function (one copy per replica) and the
    first epoch fills the input cache, so both are reported apart: the steady rate covers
    the training steps of epochs 2..E (of epoch 1 after its first step, in a one-epoch run),
    validation excluded.

    Args:
        train_examples: training examples per epoch.
        global_batch: examples per step over all replicas.
        started: `time.perf_counter()` at the start of the run, for time to first step.
    """

    def __init__(self, train_examples: int, global_batch: int, started: float) -> None:
        super().__init__()
        self.train_examples = train_examples
        self.global_batch = global_batch
        self.started = started
        self.first_step_s: float | None = None
        self.first_epoch_s: float | None = None
        self.epochs: list[tuple[float, int]] = []  # (seconds, examples) timed per epoch
        self._begin = self._last = 0.0
        self._examples = self._skipped = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._begin = self._last = time.perf_counter()
        self._examples = self._skipped = 0

    def on_train_batch_end(self, batch, logs=None):
        self._last = time.perf_counter()
        # With steps_per_execution > 1, `batch` is the last step of the chunk.
        self._examples = min((batch + 1) * self.global_batch, self.train_examples)
        if self.first_step_s is None:
            self.first_step_s = self._last - self.started
            self._begin, self._skipped = self._last, self._examples

    def on_epoch_end(self, epoch, logs=None):
        if self.first_epoch_s is None:
            self.first_epoch_s = self._last - self.started
        self.epochs.append((self._last - self._begin, self._examples - self._skipped))

    @property
    def epoch_rates(self) -> list[float]:
        """Examples per second of each epoch's timed steps."""
        return [n / s if s > 0 else 0.0 for s, n in self.epochs]

    @property
    def examples_per_sec(self) -> float | None:
        """Steady training examples per second, None before any timed step."""
        timed = self.epochs[1:] if len(self.epochs) > 1 else self.epochs
        seconds, examples = sum(s for s, _ in timed), sum(n for _, n in timed)
        return examples / seconds if seconds > 0 and examples > 0 else None


class RunProgress(ProgbarAt):
    """Keras's progress bar, numbered in the whole run.

    A run resumed mid-epoch trains that epoch's rest as a `fit` call of its own; Keras would
    show it as "Epoch 1/1" with a short bar. This shows the epoch of the run's total and the
    steps from where it resumed.

    Args:
        epochs: the run's epochs.
        steps: steps in a whole epoch.
        start: (epoch, step) the run resumed from.
    """

    def __init__(self, epochs: int, steps: int, start: tuple[int, int]) -> None:
        super().__init__()
        self.total_epochs, self.total_steps = epochs, steps
        self.start_epoch, self.start_step = start
        self.offset = 0

    def set_params(self, params):
        super().set_params(params)
        self.epochs, self.target = self.total_epochs, self.total_steps

    def on_epoch_begin(self, epoch, logs=None):
        self.offset = self.start_step if epoch == self.start_epoch else 0
        super().on_epoch_begin(epoch, logs)

    def shown_step(self, step: int) -> int:
        return step + self.offset


class AtomicModelCheckpoint(CheckpointHooks):
    """Keras's ModelCheckpoint, writing to a temporary name then renaming.

    A crash while saving leaves the previous checkpoint whole instead of a truncated file;
    a `NAME.sha256` beside it lets `trainer.evaluate.load_checkpoint` find a damaged one.
    With `save_best_only`, the best value so far is kept in `NAME.best.json` and read back
    by a resumed run, so its first epoch does not replace a better checkpoint. With
    `at_end`, it writes once, when training ends (`last.keras`: during the run the backup
    holds the same state). `saved_epoch` is the epoch it last wrote (None before). Every
    file is its own (`trainer.rundir.atomic`): `last.keras` written at the epoch of the best
    is a copy of `best.keras`, never a link to it.
    """

    def __init__(self, filepath, monitor="val_loss", *args, at_end: bool = False,
                 **kwargs) -> None:
        self.at_end = at_end
        self.same_as: AtomicModelCheckpoint | None = None  # copied by at_end where equal
        self.saved_epoch: int | None = None
        self.seconds = 0.0  # spent writing
        self._ended: tuple | None = None
        kept = RunDir.best_record(filepath)
        if kwargs.get("save_best_only") and kept.exists():
            try:
                with open(kept) as f:
                    saved = json.load(f)
            except (OSError, ValueError):
                saved = {}
            if saved.get("monitor") == monitor and saved.get("best") is not None:
                kwargs["initial_value_threshold"] = float(saved["best"])  # Keras's own way
        super().__init__(filepath, monitor, *args, **kwargs)

    def on_epoch_end(self, epoch, logs=None):
        if self.at_end:
            self._ended = (epoch, dict(logs or {}))
            return
        super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        if self.at_end and self._ended is not None:
            epoch, logs_then = self._ended
            if not self._copy_same(epoch):
                self.save_checkpoint(epoch, None, logs_then)
            self._ended = None
        super().on_train_end(logs)

    def _copy_same(self, epoch: int) -> bool:
        """Where `same_as` (the best checkpoint) was written at this very epoch, the final
        state is in it already: a copy (with its checksum as written), not a second save."""
        same = self.same_as
        if same is None or same.saved_epoch != epoch or not os.path.exists(same.filepath):
            return False
        copy(Path(same.filepath), Path(self.filepath), read_beside(same.filepath) or True)
        self.saved_epoch = epoch
        return True

    def writing_path(self, final: str) -> str:
        # The temporary name keeps the suffix Keras dispatches on (.keras / .weights.h5).
        self._pending = (temporary(Path(final)), Path(final))
        self._pending[0].unlink(missing_ok=True)
        return str(self._pending[0])

    def save_checkpoint(self, epoch, batch, logs):
        began = time.perf_counter()
        try:
            self._write(epoch, batch, logs)
        finally:
            self.seconds += time.perf_counter() - began

    def _write(self, epoch, batch, logs):
        self._pending = None
        self.keras_save(epoch, batch, logs)
        if self._pending and self._pending[0].exists():
            commit(*self._pending, checksum=True)
            self.saved_epoch = epoch
            if self.save_best_only:
                write_json(RunDir.best_record(self._pending[1]),
                           {"monitor": self.monitor, "best": float(self.best)})


class StepWatchdog(keras.callbacks.Callback):
    """Fails a run that stops making progress: a peer worker alive but stuck.

    A crashed or unreachable peer is caught by TensorFlow's heartbeats within seconds; a peer
    that is alive but stuck (a hung input pipeline, a wedged file system) would hang every
    other worker's collectives for ever. TensorFlow's own per-collective timeout
    (`CommunicationOptions.timeout_seconds`) starts a thread per collective, thousands on a
    real run (measured: 3400 threads after 20 s of digits), so this watches from outside:
    when no training step, and no epoch end, has finished for `timeout_s`, it calls
    `on_timeout`. What traces a function is exempt, as it may take minutes: the first step
    of each `fit` call, and the first epoch's validation; so is validation itself (one call
    over the whole validation set, however large).

    Args:
        timeout_s: seconds allowed without progress.
        on_timeout: called once, from the watchdog's thread, with the seconds waited.
    """

    def __init__(self, timeout_s: float, on_timeout) -> None:
        super().__init__()
        self.timeout_s, self.on_timeout = timeout_s, on_timeout
        self._since: float | None = None  # None: not watching
        self._validated = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_begin(self, logs=None):
        self._since = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="step-watchdog")
        self._thread.start()

    def on_train_batch_end(self, batch, logs=None):
        last = batch + 1 == (self.params or {}).get("steps")
        # Before the first validation (which traces), stop watching until the epoch ends.
        self._since = None if last and not self._validated else time.monotonic()

    def on_test_begin(self, logs=None):
        self._since = None  # one call over the whole validation set: not a step

    def on_test_end(self, logs=None):
        self._validated = True
        self._since = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        self._validated = True
        self._since = time.monotonic()

    def on_train_end(self, logs=None):
        self.stop()

    def stop(self) -> None:
        """Stops watching (also after a failed `fit`, which never reaches `on_train_end`)."""
        self._since = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 10)):
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout_s:
                self.on_timeout(time.monotonic() - since)
                return


class KeepBestCheckpoints(keras.callbacks.Callback):
    """Keeps the k best epochs by the monitored metric as checkpoints of their own
    (`checkpoint.keep_best`), `best-epoch003-val_loss0.1234.keras`, each written under a
    temporary name and renamed with its hash beside it; the list and the pruning are
    `trainer.rundir.checkpoint.KeptBest`'s. An epoch `best.keras` was just written at is a
    copy of it (a file of its own), not a second save.

    Args:
        kept: the list of the k best (read back on a resume).
        best: the `best.keras` callback, called before this one at epoch ends (None).
    """

    def __init__(self, kept: KeptBest, best: AtomicModelCheckpoint | None = None) -> None:
        super().__init__()
        self.kept, self.best = kept, best
        self.seconds = 0.0  # spent writing

    @classmethod
    def of(cls, layout: RunDir, saving: Any, mode: str, done: int,
           best: AtomicModelCheckpoint | None) -> KeepBestCheckpoints:
        """The k best of `saving` (the checkpoint config) in a run directory, `done` epochs
        into the run (later ones, from before a resume, are dropped)."""
        return cls(KeptBest(layout, saving.keep_best, saving.monitor, mode, done), best)

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.kept.monitor)
        if value is None:
            return
        value = float(value)
        path = self.kept.place(epoch + 1, value)
        if path is None:
            return
        began = time.perf_counter()
        if self._same(epoch):
            copy(Path(self.best.filepath), path, read_beside(self.best.filepath) or True)
        else:
            with written(path, checksum=True) as tmp:
                self.model.save(tmp)
        self.kept.add(path, epoch + 1, value)
        self.seconds += time.perf_counter() - began

    def _same(self, epoch: int) -> bool:
        return (self.best is not None and self.best.saved_epoch == epoch
                and os.path.exists(self.best.filepath))


class HandOff(keras.callbacks.Callback):
    """Puts every epoch's backup in an evaluator's inbox (`trainer.run.prepare.sidecar`), after
    `Backup`; never waits for the evaluator while the workers train.

    The weights are copied from the backup the epoch's end just wrote (a file of their
    own: the backup's rotation or damage never reaches them), then the epoch's training
    logs are written, atomically: an entry whose `.json` is there is whole. At the run's
    end, `validated` waits (bounded) for the evaluator's result.

    Args:
        backup: the run's `Backup` callback (its store's directory, whether it stopped).
        place: the run's `evaluator/` directory.
    """

    def __init__(self, backup: keras.callbacks.Callback, place: EvaluatorDir) -> None:
        super().__init__()
        self.backup, self.place = backup, place

    @classmethod
    def of(cls, backup: keras.callbacks.Callback, run_dir: Any) -> HandOff:
        return cls(backup, EvaluatorDir.of(run_dir))

    def on_train_begin(self, logs=None):
        clear_result(self.place)  # a stopped run's end, if any: this run ends anew

    def validated(self, report: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        """The summary with the evaluator's validation and test merged in, once it has
        validated every epoch (waiting at most `timeout_s`, None: no limit)."""
        limit = "" if timeout_s is None else f" (at most {timeout_s:g} s)"
        print(f"training ended; waiting for the evaluator's validation{limit}", flush=True)
        result, why = await_result(self.place, report["epochs_done"], timeout_s)
        return merged(report, result, why)

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 not in self.backup.ended:  # no backup of this epoch's end
            return
        self.backup.store.wait()  # that backup complete, in its place
        saved = self.backup.store.path(epoch + 1)
        source = next((saved / n for n in (CHECKPOINT, WEIGHTS) if (saved / n).is_file()),
                      None)
        if source is None:
            return
        self.place.inbox.mkdir(parents=True, exist_ok=True)
        suffix = ".keras" if source.name.endswith(".keras") else ".weights.h5"
        target = self.place.weights(epoch + 1, suffix)
        copy(source, target, checksum=False)  # the backup's checksum covers it
        write_json(self.place.logs(epoch + 1),
                   {k: float(v) for k, v in (logs or {}).items()
                    if isinstance(v, (int, float, np.number)) or np.ndim(v) == 0})


class LastValidation(keras.callbacks.Callback):
    """Keeps the last validation run during training, with a digest of the weights it
    scored (`trainer.distribute.multiworker.weights_digest`), so the run's final validation
    can take those numbers instead of a second pass over the same split: only where the
    model still holds exactly those weights on every replica (no moving average swapped
    in, no best weights restored, no callback's change since) and nothing else differs.

    Args:
        strategy: the run's strategy (the digest compares its replicas' copies).
    """

    def __init__(self, strategy: Any) -> None:
        super().__init__()
        self.strategy = strategy
        self._training = False
        self._found: tuple[bytes, dict[str, float]] | None = None

    def on_train_begin(self, logs=None):
        self._training, self._found = True, None

    def on_train_end(self, logs=None):
        self._training = False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_test_end(self, logs=None):
        if not self._training:
            return
        epochs = (self.params or {}).get("epochs")  # Keras's fit says how many
        if epochs is not None and getattr(self, "_epoch", None) != epochs - 1:
            self._found = None  # not the last epoch's: reading the weights would be waste
            return
        digest = weights_digest(self.strategy, self.model)
        try:
            numbers = {k: float(v) for k, v in (logs or {}).items()}
        except (TypeError, ValueError):
            numbers = None  # not numbers: evaluate again
        self._found = None if digest is None or not numbers else (digest, numbers)

    def reusable(self) -> dict[str, float] | None:
        """The last validation's numbers where the model still holds the weights it scored
        on every replica; None where the final validation must run."""
        if self._found is None:
            return None
        digest, numbers = self._found
        return dict(numbers) if weights_digest(self.strategy, self.model) == digest else None
