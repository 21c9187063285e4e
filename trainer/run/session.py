"""One run's session: the owner of each phase of a checked run, and its guards.

`trainer.run.train.run` reads as the recipe (open the devices, assemble, restore, fit,
evaluate, export, finish); this class holds what the phases hand each other (the device
plan, the callbacks, the stop request). Its guards are the first of the run's one stack
(`trainer.run.prepare.owner.Owner`, which calls `close` when the run ends): the watchdog stopped,
the trackers finished, a failure turned into the error a user reads (a lost worker, a full
disk, an image that does not decode). Another worker of a cluster saves what the chief
saves (some reads of distributed variables are collectives every worker must join) into a
scratch place of its own, removed at the end.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from trainer.distribute.devices import open_devices, set_determinism
from trainer.run.assembly.assemble import Run, assemble, release
from trainer.run.assembly.resume import Start, restore_backup
from trainer.run.assembly.wiring import Callbacks, build_callbacks
from trainer.run.end.finish import (
    Outcome,
    check_export,
    export,
    final_evaluations,
    stop_if_asked,
    stopped,
)
from trainer.run.end.summary import build_summary, process_seconds, write_summary
from trainer.run.fit.drive import Trained, prepare_finetune, train_epochs
from trainer.run.guards import check_space, say_progress, translate
from trainer.run.prepare.inputs import record as record_inputs
from trainer.run.prepare.preflight import Checked
from trainer.rundir.backup import StopRequest, stop_on_signals
from trainer.track.trackers import finish_trackers, logged_to


class Session:
    """The phases of one checked run, in the order `run` calls them; its owner (held:
    `with checked.owned()`) closes it when the run ends."""

    runs_in_process: ClassVar[int] = 0  # sessions begun in this process before this one

    def __init__(self, checked: Checked, extra: Sequence[Any] = ()) -> None:
        self.checked, self.spec, self.cluster = checked, checked.spec, checked.cluster
        self.extra = tuple(extra)
        self.started = time.perf_counter()
        # The summary's "start-up before it": from the process's start for its first run
        # (the interpreter, the imports, the checks), from the run's pre-flight for a later
        # one (a second `trainer.fit` in one script is not charged the first's time)
        first = Session.runs_in_process == 0
        self.startup = (process_seconds() if first
                        else time.perf_counter() - checked.owner.began)
        Session.runs_in_process += 1
        self.request = StopRequest()
        self.run_dir = checked.run_dir
        self.place = checked.owner.place  # a run directory at a URL: its mirror and lease
        self.plan: Any = None  # the DevicePlan
        self.run: Run | None = None
        self.callbacks: Callbacks | None = None
        self.start: Start | None = None
        self.phases: Any = None
        self._needed = 0
        self._scratch = False
        self._trackers_done = False
        # an evaluator validates beside the workers (trainer.run.prepare.sidecar): none here
        self.evaluator = self.cluster is not None and self.cluster.evaluator is not None
        checked.owner.adopt(self)  # its guards: the first of the run's one stack
        if self.run_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(
                prefix=f"trainer-worker{self.cluster.task_id}-"))
            self._scratch = True

    def close(self, error: BaseException | None) -> None:
        """The session's guards, called once by the run's owner as the run ends: the
        watchdog stopped, the trackers finished as FAILED after a failure, the failure
        raised as the error a user reads where it has one, the tf.data servers of
        `dataset.service=local:K` stopped, a scratch directory removed."""
        try:
            if self.callbacks is not None and self.callbacks.watchdog is not None:
                self.callbacks.watchdog.stop()  # a failed fit never reaches on_train_end
            if error is not None and self.callbacks is not None and not self._trackers_done:
                finish_trackers(list(self.callbacks.trackers), None, "FAILED")
            if error is not None and self.callbacks is not None and self.run is not None:
                say_progress(self.callbacks.backup, self.run.steps, self.cluster)
            if isinstance(error, Exception):
                epoch = self.callbacks.backup.epoch if self.callbacks is not None else None
                translate(error, self.run, self.run_dir, self._needed, self.cluster,
                                 epoch)
        finally:
            try:
                if self.callbacks is not None:  # the backup in flight: complete, or said
                    self.callbacks.backup.store.close(failed=error is not None)
            finally:
                release()
                if self._scratch:
                    shutil.rmtree(self.run_dir, ignore_errors=True)

    def open_devices(self) -> Any:
        """Chooses this process's devices, hides the others and sets their options."""
        self.plan = open_devices(self.spec.devices, self.cluster)
        set_determinism(self.spec.deterministic)
        return self.plan

    def assemble(self) -> Run:
        """Builds the run, its optimizer over every variable, and checks the free space and
        that the model exports to the formats `export` names."""
        run = assemble(self.spec, self.plan, self.cluster, self.run_dir)
        self.spec = run.spec or self.spec  # as the data made it: its batch, the monitor
        if self.evaluator:  # validation and test are the evaluator's, never the workers'
            run.check_evaluable(self.spec.checkpoint)  # before training, not after
            run = replace(run, data=replace(run.data, validation=None, test=None))
        with run.strategy.scope():  # the optimizer's slots are distributed variables
            if not run.model.optimizer.built:  # built now: the space estimate counts them
                run.model.optimizer.build(run.model.trainable_variables)
        self._needed = check_space(run, self.run_dir, self.spec.export, self.spec.checkpoint)
        check_export(run, self.spec.export)
        self.run = run
        return run

    def restore(self, run: Run) -> Start:
        """Restores the newest backup (its data and batch checked), records the run's config
        where the entry point left that until now (`Checked.record`) and what its model
        takes (`model_inputs.json`), then wires the callbacks from that point."""
        self.start = start = restore_backup(self.checked, run, self.run_dir)
        if run.is_chief:
            if self.checked.record is not None:
                self.checked.record()
            record_inputs(self.run_dir, run.data.source)  # what prediction takes
        # after the optimizer is built over every variable (in assemble)
        self.phases = prepare_finetune(run.model, self.spec.finetune, self.spec.epochs)
        self.callbacks = build_callbacks(
            self.spec, run, self.run_dir, self.started, start.at, self.request, self.extra,
            history=start.history, evaluator=self.evaluator, place=self.place)
        self.callbacks.backup.resumed_metrics = start.metrics  # the resumed epoch's metrics
        self.callbacks.backup.recovery.recovered.extend(start.recovered)  # the run's, so far
        return start

    @contextmanager
    def listening(self) -> Iterator[None]:
        """SIGTERM and Ctrl-C become a stop request: a clean stop with a backup, in the
        training steps and in the end of the run (final evaluations, export) alike."""
        with stop_on_signals(self.request):
            yield

    def fit(self, run: Run, start: Start) -> Trained:
        """Trains from `start` to the last epoch with the run's loop."""
        return train_epochs(self.spec, run, self.callbacks, start.at)

    def evaluate(self, run: Run, trained: Trained) -> Outcome:
        """Validation and test, each example once."""
        return final_evaluations(run, self.callbacks, trained, self.spec.epochs,
                                        self.spec.checkpoint.test_with, self.request,
                                        self.startup, self.spec.checkpoint.average_best)

    def report(self, run: Run, outcome: Outcome) -> dict[str, Any] | None:
        """The summary of a run that was not stopped (None for one that was), once the last
        backup is complete (uploaded, where the run directory is at a URL)."""
        self.callbacks.backup.store.wait()  # its failure is the run's
        if self.callbacks.backup.interrupted:
            return None
        return build_summary(self.spec, run, self.plan, self.run_dir, outcome,
                                     self.callbacks, self.started, self.start.at,
                                     self.checked.changes)

    def export(self, run: Run, report: dict[str, Any] | None) -> None:
        """The formats `export` names, into the summary; then a stop asked for is honoured."""
        if report is None:
            return
        export(run, self.run_dir, self.spec.export, report, self.spec.checkpoint.export_with)
        stop_if_asked(self.request, "the export", self.run_dir, run.is_chief)

    def finish(self, run: Run, report: dict[str, Any] | None) -> dict[str, Any]:
        """Writes and prints the summary, finishes the trackers; a stopped run raises
        `Interrupted` with where its backup is."""
        callbacks = self.callbacks
        self._trackers_done = True
        if callbacks.backup.interrupted:
            if run.is_chief:  # what its epochs' ends left undrawn: the backup's epochs
                callbacks.curves.draw(callbacks.curves.history())
            finish_trackers(list(callbacks.trackers), None, "KILLED")
            raise stopped(run, callbacks.backup, self.request, self.run_dir)
        report["loggers"] = logged_to(callbacks.trackers, self.run_dir)
        report["finetune"] = self.phases
        if run.is_chief:
            if callbacks.handoff is not None:  # validated by an evaluator: its result
                report = callbacks.handoff.validated(report, self.spec.strategy.start_timeout_s)
            callbacks.curves.draw(report["history"])  # what epoch ends left undrawn
            write_summary(report, self.run_dir, self.place)
            finish_trackers(list(callbacks.trackers), report, "FINISHED")
        else:
            cluster = self.cluster
            print(f"worker {cluster.task_id} of {cluster.num_workers} finished; the chief "
                  f"({cluster.addresses[0]}) wrote the checkpoints and summary", flush=True)
        return report
