"""The evaluator beside the workers: validates each epoch's weights the chief hands it
(`trainer.run.prepare.sidecar`), keeps `best.keras` by `checkpoint.monitor`, and runs the
final test.

It builds the run as `trainer.evaluate` does (`RUN_DIR/.hydra/config.yaml` composed again
for this machine's devices, `trainer.run.prepare.reopen`; the strategy, data and model built by
`trainer.run.assembly.assemble`), so each epoch's validation metrics are the numbers
`python -m trainer.evaluate` gives for that epoch's weights. It needs the run directory the
chief writes (a shared file system on several machines). It never joins the workers'
collectives, and they never wait for it while they train; it ends once the chief says
training ended (`evaluator/trained.json`) and every epoch is validated, or, without that,
once the chief no longer holds the run directory's lock (a run that stopped: its resume
starts an evaluator again, which goes on from `evaluator/history.jsonl`).

A build module: TensorFlow is imported at the top.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.config.messages import one_line
from trainer.distribute.devices import open_devices
from trainer.run.assembly.assemble import Run, assemble
from trainer.run.end.finish import evaluate_split
from trainer.run.prepare.preflight import check_config
from trainer.run.prepare.reopen import compose_run_config
from trainer.run.prepare.resolve import Spec, resolve
from trainer.run.prepare.sidecar import (
    BEAT_S,
    EvaluatorDir,
    best_record,
    chief_holds,
    done_line,
    final_summary,
    improved,
    read_history,
    read_trained,
    ready_epochs,
    wait_for_run,
    write_history,
)
from trainer.rundir.atomic import write_json
from trainer.rundir.checkpoint import save_checkpoint
from trainer.rundir.layout import RunDir


def say(line: str) -> None:
    print(f"evaluator: {line}", flush=True)


def build(run_dir: Path) -> tuple[Spec, Run]:
    """The run's spec and its strategy, data and model on this machine's devices."""
    cfg, _ = compose_run_config(run_dir, [])
    spec = resolve(cfg, parsed=check_config(cfg))
    run = assemble(spec, open_devices(spec.devices))
    spec = run.spec or spec
    if run.data.validation is None:
        raise ConfigError(f"the dataset of {run_dir} has no validation split: there is "
                          "nothing for an evaluator to validate; run without one")
    with run.strategy.scope():  # a backup's weights hold the optimizer's too
        if run.model.optimizer is not None and not run.model.optimizer.built:
            run.model.optimizer.build(run.model.trainable_variables)
    return spec, run


class Evaluator:
    """Validates the inbox's epochs in order and keeps the record, best.keras, TensorBoard.

    Args:
        run_dir: the chief's run directory.
        spec: the run's spec (its `checkpoint.monitor`, `mode`, `test_with`).
        run: the run built on this machine.
    """

    def __init__(self, run_dir: Path, spec: Spec, run: Run) -> None:
        self.run_dir, self.spec, self.run = Path(run_dir), spec, run
        self.place, self.layout = EvaluatorDir.of(run_dir), RunDir(run_dir)
        self.monitor = spec.checkpoint.monitor
        self.mode = run.monitor_mode(self.monitor, spec.checkpoint.mode)
        self.records = read_history(self.place.history)  # a restarted evaluator goes on
        self.writer: Any = None

    @property
    def done(self) -> set[int]:
        return {int(r["epoch"]) for r in self.records}

    def step(self) -> int:
        """Validates every epoch ready in the inbox; returns how many."""
        epochs = ready_epochs(self.place.inbox, self.done)
        for epoch in epochs:
            self.validate(epoch)
        return len(epochs)

    def _weights(self, epoch: int) -> Path:
        keras_file = self.place.weights(epoch, ".keras")
        return keras_file if keras_file.is_file() else self.place.weights(epoch)

    def validate(self, epoch: int) -> None:
        """One epoch: validation metrics, best.keras where it improves, its record, then the
        inbox entry removed."""
        weights = self._weights(epoch)
        self.load(weights, f"epoch {epoch}'s weights")
        metrics = evaluate_split(self.run, self.run.data.validation)
        logs = json.loads(self.place.logs(epoch).read_text())
        record = {"epoch": epoch, **logs, **{f"val_{k}": float(v) for k, v in metrics.items()}}
        best = best_record(self.records, self.monitor, self.mode)
        value = record.get(self.monitor)
        if value is not None and improved(float(value), None if best is None
                                          else float(best[self.monitor]), self.mode):
            self.save_best(epoch, float(value))
        self.records.append(record)
        write_history(self.place.history, self.records)
        self.log_scalars(epoch, metrics)
        say(f"epoch {epoch}: " + ", ".join(f"val_{k} {v:.4f}" for k, v in metrics.items()))
        for path in (self.place.logs(epoch), weights):
            path.unlink(missing_ok=True)

    def load(self, path: Path, what: str) -> None:
        """Loads weights (a backup's, or a checkpoint with the optimizer, which evaluation
        does not need); a file that does not load is one line."""
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Skipping variable loading")
                self.run.model.load_weights(path)
        except Exception as error:  # noqa: BLE001 - a damaged file fails in many ways
            raise ConfigError(f"{what} {path} do not load into the evaluator's model "
                              f"({one_line(error)}); the workers train on, the summary will "
                              "say validation was incomplete") from None

    def save_best(self, epoch: int, value: float) -> None:
        """`checkpoints/best.keras` (atomically, its hash beside it) holds `epoch`'s
        weights; `best.keras.best.json` says which value it holds, as the chief's does."""
        final = self.layout.checkpoint("best")
        save_checkpoint(self.run.model, final)
        write_json(RunDir.best_record(final), {"monitor": self.monitor, "best": value,
                                                "epoch": epoch})

    def log_scalars(self, epoch: int, metrics: dict[str, float]) -> None:
        """TensorBoard's validation scalars, where the run logs to TensorBoard: named and
        stepped as Keras's TensorBoard callback names them (`epoch_loss` at epoch - 1)."""
        if self.writer is None:
            if not self.layout.tensorboard.is_dir():
                return
            self.writer = tf.summary.create_file_writer(str(self.layout.tensorboard
                                                            / "validation"))
        with self.writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar(f"epoch_{name}", value, step=epoch - 1)
        self.writer.flush()

    def finish(self, trained: dict[str, Any]) -> dict[str, Any]:
        """The final test with the checkpoint `checkpoint.test_with` names (best.keras, or the
        last epoch's weights), then `evaluator/summary.json`."""
        best = best_record(self.records, self.monitor, self.mode)
        test, used = None, None
        if self.run.data.test is not None and self.records:
            if self.spec.checkpoint.test_with == "best" and self.layout.checkpoint(
                    "best").is_file():
                used = self.layout.checkpoint("best")
                self.load(used, "the best epoch's weights")
            metrics = evaluate_split(self.run, self.run.data.test)
            test = {k: float(v) for k, v in metrics.items()}
            say("test: " + ", ".join(f"{k} {v:.4f}" for k, v in test.items()))
        result = final_summary(self.records, trained, best, test,
                               None if used is None else str(used))
        write_json(self.place.summary, result)
        shutil.rmtree(self.place.inbox, ignore_errors=True)
        return result


def beating(alive: Path, every_s: float = BEAT_S) -> threading.Event:
    """Touches `alive` every `every_s` seconds from a daemon thread (a long evaluation
    included) until the returned event is set: the chief's sign that it still works."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            try:
                alive.parent.mkdir(parents=True, exist_ok=True)
                alive.touch()
            except OSError:
                pass  # the run directory is being removed: nothing to say
            stop.wait(every_s)

    threading.Thread(target=beat, name="evaluator-alive", daemon=True).start()
    return stop


def run_evaluator(run_dir: str | Path, timeout_s: float | None, poll_s: float = 0.5) -> int:
    """The evaluator's process: validates each epoch as the chief hands it over, until the
    chief says training ended (then the final test) or stops. Returns the exit code."""
    run_dir = Path(run_dir)
    say(f"validating the run in {run_dir} as the chief writes it")
    wait_for_run(run_dir, timeout_s, poll_s)
    stop = beating(EvaluatorDir.of(run_dir).alive)
    try:
        return _evaluate(run_dir, *build(run_dir), poll_s)
    finally:
        stop.set()


def _evaluate(run_dir: Path, spec: Spec, run: Run, poll_s: float) -> int:
    """Validates epochs until the chief ends training (then tests) or stops."""
    evaluator = Evaluator(run_dir, spec, run)
    seen = False  # whether the chief held the run directory's lock yet
    while True:
        seen = seen or chief_holds(run_dir)
        evaluator.step()
        trained = read_trained(evaluator.place)
        if trained is not None and not ready_epochs(evaluator.place.inbox, evaluator.done):
            evaluator.finish(trained)
            say(done_line(trained, evaluator.done))
            return 0
        if trained is None and seen and not chief_holds(run_dir):
            evaluator.step()  # what the chief handed over before it stopped
            say("the chief stopped before training ended; a resume starts an evaluator again")
            return 0
        time.sleep(poll_s)

