"""Tune before you train: `tune=lr`, a learning-rate range test, and `tune=batch`, the
per-replica batch to use; on the run's own model, data, devices and global batch.

Both build the run as training would (`trainer.run.session.Session`: the devices, the
strategy, the data, a fresh model) and train nothing that is kept: no checkpoint, backup or
summary; they write `lr_find.png` and `lr_find.json` (or `batch_find.*`) into a new run
directory and print the override to paste. How the suggestions are made, and when not to
trust them: `trainer.plan.tuning` and docs/tuning.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from omegaconf import OmegaConf

from trainer.config.errors import ConfigError
from trainer.plan.scaling import scaled_learning_rate
from trainer.plan.tuning import (
    at_reference_batch,
    diverged,
    doubling,
    knee,
    largest_fitting,
    range_rates,
    smoothed,
    suggest_rate,
)
from trainer.processes import environment, python
from trainer.processes import run as run_process
from trainer.run.prepare.preflight import Checked, preflight
from trainer.run.session import Session
from trainer.rundir.atomic import write_json
from trainer.track.tune_plots import draw_batch_find, draw_lr_find

# A try of `tune=batch`'s memory search that ran out of memory exits with this code.
EXIT_OUT_OF_MEMORY = 17
# An injected memory cap (per-replica examples) for tests on machines without one.
FAIL_ABOVE = "TRAINER_TUNE_FAIL_ABOVE"


def tune(checked: Checked) -> dict[str, Any]:
    """Runs the tuner `tune=` names; returns what it found (also written as JSON)."""
    if checked.record is not None:
        checked.record()  # the run's `.hydra/`, where the entry point left it until now
    found = find_lr(checked) if checked.spec.tune == "lr" else find_batch(checked)
    print(found["line"], flush=True)
    return found


def _tuning_spec(checked: Checked, **batch: Any) -> Checked:
    """The run's spec for a tuning pass: Keras's fit, one step per call (a loss per step),
    no warm-up or decay, the batch given."""
    spec = checked.spec
    lr = replace(spec.lr, warmup_epochs=0, decay="none")
    new = replace(spec, loop="fit", steps_per_execution=1, lr=lr,
                  batch=replace(spec.batch, **batch) if batch else spec.batch)
    return replace(checked, spec=new)


class _Losses(keras.callbacks.Callback):
    """Each step's loss (from Keras's running mean), stopping once the loss diverges."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor, self.losses, self._mean = factor, [], 0.0

    def on_train_batch_end(self, batch, logs=None):
        mean = float((logs or {}).get("loss", float("nan")))
        loss = (batch + 1) * mean - batch * self._mean if batch else mean
        self._mean = mean
        self.losses.append(loss if math.isfinite(loss) else float("nan"))
        if diverged(smoothed(self.losses), self.factor):
            self.model.stop_training = True


def find_lr(checked: Checked) -> dict[str, Any]:
    """The range test: `tuner.steps` steps at rates from `tuner.lr_min` to `tuner.lr_max`
    (exponentially), on a fresh copy of the run's model; the suggestion at the reference
    batch."""
    tuner, checked = checked.spec.tuner, _tuning_spec(checked)
    session = Session(checked)  # closed by the run's owner (`trainer.run.prepare.owner`)
    session.open_devices()
    run = session.assemble()
    steps = tuner.steps
    run.model.optimizer.learning_rate = keras.optimizers.schedules.ExponentialDecay(
        tuner.lr_min, max(steps - 1, 1), tuner.lr_max / tuner.lr_min)
    recorder = _Losses(tuner.diverge_factor)
    epochs = -(-steps // run.steps)
    run.model.fit(run.data.make_train(0, epochs, 0), epochs=1, steps_per_epoch=steps,
                  callbacks=[*run.fit_callbacks, recorder], verbose=0, shuffle=False)
    rates = range_rates(tuner.lr_min, tuner.lr_max, steps)[:len(recorder.losses)]
    return _lr_report(checked, run, session.run_dir, rates, recorder.losses)


def _lr_report(checked: Checked, run: Any, run_dir: Path, rates: list[float],
               losses: list[float]) -> dict[str, Any]:
    spec = checked.spec
    smooth = smoothed(losses)
    rate, clear = suggest_rate(rates, smooth)
    scale = scaled_learning_rate(1.0, run.batch.global_size, spec.lr.reference_batch,
                                 spec.lr.lr_scaling)
    base = None if rate is None else at_reference_batch(rate, scale)
    found = {"rates": rates, "losses": losses, "smoothed": smooth, "suggested_rate": rate,
             "suggested_lr": base, "clear": clear, "global_batch": run.batch.global_size,
             "replicas": run.batch.replicas, "reference_batch": spec.lr.reference_batch,
             "lr_scaling": spec.lr.lr_scaling, "stopped_early": len(losses) < spec.tuner.steps,
             "rule": "the first rate at which the smoothed loss is a quarter of the way down "
                     "from its start to its minimum"}
    if base is None:
        found["line"] = ("tune=lr: no suggestion (the loss diverged within the first steps); "
                         f"lower tuner.lr_min (now {spec.tuner.lr_min:g})")
    else:
        found["line"] = (f"suggested: optimizer.lr={base:.3g} (the rate at reference batch "
                         f"{spec.lr.reference_batch}; {rate:.3g} at this run's global batch "
                         f"{run.batch.global_size})"
                         + ("" if clear else "; the curve shows no clear descent: see "
                            "lr_find.png before trusting it"))
    _write(run_dir, "lr_find", found, draw_lr_find)
    return found


def _write(run_dir: Path, name: str, found: dict[str, Any], draw: Any) -> None:
    clean = json.loads(json.dumps(found, default=str).replace("NaN", "null"))
    write_json(Path(run_dir) / f"{name}.json", clean)
    draw(clean, Path(run_dir) / f"{name}.png")


def find_batch(checked: Checked) -> dict[str, Any]:
    """Throughput against the per-replica batch (doubling), its knee; where memory bounds
    the batch, the largest that runs first (each try in a fresh process)."""
    spec = checked.spec
    limit, tries = spec.tuner.batch_max, []
    if _memory_bound(spec):
        largest, tries = largest_fitting(lambda size: _fits(checked, size),
                                         spec.tuner.batch_min, limit)
        if largest is None:
            raise ConfigError(f"tune=batch: even batch.per_replica={spec.tuner.batch_min} "
                              "runs out of memory; lower tuner.batch_min")
        limit = largest
    batches, rates, replicas = [], [], 1
    for size in doubling(spec.tuner.batch_min, limit):
        rate, replicas = _throughput(checked, size)
        if rate is None:
            break  # fewer training examples than one global batch
        batches.append(size)
        rates.append(rate)
    return _batch_report(checked, batches, rates, tries, limit, replicas)


def _batch_report(checked: Checked, batches: list[int], rates: list[float],
                  tries: list, limit: int, replicas: int) -> dict[str, Any]:
    spec = checked.spec
    if not batches:
        raise ConfigError(f"tune=batch: the training split is smaller than one global batch of "
                          f"{spec.tuner.batch_min} per replica; lower tuner.batch_min")
    best = knee(batches, rates)
    global_batch = best * replicas
    scaled = scaled_learning_rate(spec.lr.lr, global_batch, spec.lr.reference_batch,
                                  spec.lr.lr_scaling)
    found = {"batches": batches, "examples_per_sec": rates, "suggested": best,
             "largest_that_fits": limit if tries else None,
             "memory_tries": [list(t) for t in tries], "replicas": replicas,
             "rule": "the smallest batch within 5% of the best throughput",
             "line": (f"suggested: batch.per_replica={best} (global batch {global_batch} on "
                      f"{replicas} replica{'s' if replicas > 1 else ''}; optimizer.lr "
                      f"{spec.lr.lr:g} scales to {scaled:.3g})")}
    _write(checked.run_dir, "batch_find", found, draw_batch_find)
    return found


def _throughput(checked: Checked, per_replica: int, steps: int = 6
                ) -> tuple[float | None, int]:
    """(training examples/s at a per-replica batch, the first (traced) step not timed; the
    replicas); None where the training split is smaller than one global batch."""
    tuning = _tuning_spec(checked, per_replica=per_replica, global_size=None, accumulate=1)
    session = Session(tuning)  # in place of the last try's, closed by the run's owner
    session.open_devices()
    run = session.assemble()
    if run.data.source.train_size < run.batch.global_size:
        return None, run.batch.replicas
    stamps = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: times.append(time.perf_counter()))
    times: list[float] = []
    run.model.fit(run.data.make_train(0, -(-steps // run.steps) + 1, 0), epochs=1,
                  steps_per_epoch=steps, callbacks=[*run.fit_callbacks, stamps],
                  verbose=0, shuffle=False)
    return (run.batch.global_size * (len(times) - 1) / (times[-1] - times[0]),
            run.batch.replicas)


def _memory_bound(spec: Any) -> bool:
    """Whether memory bounds the batch here: a GPU, a memory cap, or an injected one."""
    return (spec.devices.memory_limit_mb is not None or bool(os.environ.get(FAIL_ABOVE))
            or bool(tf.config.list_physical_devices("GPU")))


def _fits(checked: Checked, per_replica: int) -> bool:
    """Whether one training step at this batch runs, in a fresh process (TensorFlow does
    not reliably give memory back after running out of it)."""
    with tempfile.TemporaryDirectory(prefix="trainer-tune-") as folder:
        record = Path(folder) / "spec.json"
        record.write_text(json.dumps({"config": checked.spec.record,
                                      "per_replica": per_replica}, default=str))
        done = run_process(python(str(record), module="trainer.run.tune"), environment(),
                           timeout=600)
    if done.returncode not in (0, EXIT_OUT_OF_MEMORY):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"tune=batch: a try at batch.per_replica={per_replica} failed: "
                          f"{last}")
    return done.returncode == 0


def try_one_step(record: Path) -> int:
    """A memory search's try, in its own process: one training step at the batch asked;
    0 if it ran, `EXIT_OUT_OF_MEMORY` if memory ran out."""
    saved = json.loads(Path(record).read_text())
    per_replica = saved["per_replica"]
    cfg = OmegaConf.create(saved["config"])
    cfg.tune, cfg.resume, cfg.logger = None, None, {}
    scratch = Path(record).parent / "run"
    checked = preflight(cfg, run_dir=scratch)
    with checked.owned():
        try:
            if per_replica > int(os.environ.get(FAIL_ABOVE) or sys.maxsize):
                raise tf.errors.ResourceExhaustedError(None, None, "injected: out of memory")
            _throughput(checked, per_replica, steps=2)
        except tf.errors.ResourceExhaustedError:
            return EXIT_OUT_OF_MEMORY
    return 0


if __name__ == "__main__":
    raise SystemExit(try_one_step(Path(sys.argv[1])))
