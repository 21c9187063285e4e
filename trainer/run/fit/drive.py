"""Who drives the epochs: Keras's `fit` (`loop=fit`) or trainer's own loop (`loop=custom`,
`trainer.run.fit.loop`), over the run's segments of epochs.

A run resumed mid-epoch first finishes that epoch's remaining steps, then trains whole
epochs; a fine-tuning phase change starts a new segment, whose step is compiled anew. The
history starts with the epochs done before a resume (kept in the backups), so a run resumed
after its last epoch reports what the uninterrupted run would have.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from trainer.internals.keras_optimizer import raw_weights_kept
from trainer.internals.keras_step import forget_train_function
from trainer.run.assembly.assemble import Run
from trainer.run.assembly.callbacks import RunProgress
from trainer.run.assembly.wiring import Callbacks
from trainer.run.fit.loop import CustomLoop
from trainer.run.prepare.resolve import Spec
from trainer.rundir.backup import StopNow
from trainer.task.finetune import boundaries, phase_at
from trainer.task.freeze import apply_phase, phase_report, scale_backbone_gradients


@dataclass(frozen=True)
class Trained:
    """What the epochs did: the per-epoch history, how many epochs are done, whether a
    callback stopped training early, whether any step ran, and the custom loop (None under
    `fit`) that evaluates after."""

    history: dict[str, list]
    epochs_done: int
    stopped_early: bool
    trained: bool
    loop: Any
    build_s: float  # train() to the first fit: devices, TensorFlow, data, model


def train_epochs(spec: Spec, run: Run, callbacks: Callbacks, start: tuple[int, int]
                 ) -> Trained:
    """Trains from `start` (epoch, step) to the last epoch, or until a stop."""
    backup = callbacks.backup
    history = {k: list(v) for k, v in backup.history.items()}
    build_s = time.perf_counter() - callbacks.throughput.started
    driver = _Driver(spec, run, callbacks, start)
    trained = stopped_early = False
    for first, end, steps, dataset in segments(spec, run, start):
        part = driver.train(first, end, steps, dataset)
        if part is None:  # a stop request, with its backup written
            break
        trained = trained or bool(part.history)
        for key, values in part.history.items():
            history.setdefault(key, []).extend(values)
        # A callback (early stopping) ended training before the last epoch.
        stopped_early = bool(run.model.stop_training) and not backup.interrupted
        if backup.interrupted or stopped_early:
            break
    epochs_done = backup.epoch + 1 if trained else start[0]
    return Trained(history, epochs_done, stopped_early, trained, driver.loop, build_s)


def prepare_finetune(model: Any, finetune: Any, epochs: int) -> Any:
    """The fine-tuning phases the summary reports (None without a backbone to tune), with
    the backbone's gradients scaled; the optimizer must be built over every variable."""
    phases = phase_report(model, finetune, epochs)
    if phases is not None:
        scale_backbone_gradients(model, finetune.backbone_lr_scale)
    return phases


def segments(spec: Spec, run: Run, start: tuple[int, int]) -> list:
    """(first epoch, end epoch, steps per epoch, dataset) to train, in order; each dataset
    starts exactly where the interrupted run would have been."""
    epoch, step = start
    make = run.data.make_train
    found = []
    if step:
        found.append((epoch, epoch + 1, run.steps - step, make(epoch, epoch + 1, step)))
        epoch += 1
    ends = sorted({*(b for b in boundaries(spec.finetune, spec.epochs) if b > epoch),
                   spec.epochs})
    for end in ends:
        if epoch < end:
            found.append((epoch, end, run.steps, make(epoch, end, 0)))
            epoch = end
    return found


class _Driver:
    """Trains one segment at a time with the run's loop, in the segment's fine-tuning
    phase."""

    def __init__(self, spec: Spec, run: Run, callbacks: Callbacks,
                 start: tuple[int, int]) -> None:
        self.spec, self.run, self.callbacks = spec, run, callbacks
        self.loop = self._new_loop() if run.loop == "custom" else None
        self.phase = None
        self.progress = ([RunProgress(spec.epochs, run.steps, start)] if spec.verbose != 0
                         else [])

    def _new_loop(self) -> CustomLoop:
        run = self.run
        return CustomLoop(run.model, run.strategy, run.speed.steps_per_execution,
                          jit_compile=run.speed.jit_compile is True)

    def _enter_phase(self, first: int) -> None:
        phase = phase_at(first, self.spec.finetune)
        if phase == self.phase:
            return
        if self.phase is not None:  # the trainable variables change: compile the step anew
            forget_train_function(self.run.model)
            self.loop = self._new_loop() if self.loop is not None else None
        self.phase = phase
        apply_phase(self.run.model, phase, self.spec.finetune.unfreeze_layers)

    def train(self, first: int, end: int, steps: int, dataset: Any) -> Any:
        """Keras's `History` of the segment; None where a stop request ended it."""
        run, spec = self.run, self.spec
        if self.callbacks.backup.resumed_metrics is not None:
            build_compiled_metrics(run, dataset.element_spec)
        self._enter_phase(first)
        kwargs = dict(initial_epoch=first, epochs=end, steps_per_epoch=steps,
                      validation_data=run.data.validation,
                      callbacks=[*self.callbacks.all(), *self.progress], verbose=spec.verbose)
        try:
            if self.loop is not None:
                return self.loop.fit(dataset, **kwargs)
            kwargs["callbacks"] = [*run.fit_callbacks, *kwargs["callbacks"]]
            # fit would end by swapping an EMA into the weights: they stay as trained (the
            # next segment goes on from them); the average is tested at the run's end
            with raw_weights_kept(run.model.optimizer):
                return run.model.fit(dataset, shuffle=False, **kwargs)  # already shuffled
        except StopNow:
            if spec.verbose in (1, "auto"):
                print(flush=True)  # end the progress bar's line
            return None


def build_compiled_metrics(run: Run, element_spec: Any) -> None:
    """Creates the compiled metrics' variables before `fit` (on one device it creates them
    only when it traces its first step), so the resumed epoch's saved state can be assigned
    to them at its start; from one example of zeros, whose update `fit` resets."""
    model = run.model
    if all(getattr(m, "built", True) for m in model.metrics):
        return
    zeros = tf.nest.map_structure(lambda s: tf.zeros([1, *s.shape[1:]], s.dtype), element_spec)
    x, y, weights = keras.utils.unpack_x_y_sample_weight(zeros)
    with run.strategy.scope():
        model.compute_metrics(x, y, model(x, training=False), sample_weight=weights)
