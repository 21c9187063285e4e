"""train(cfg): the order of a run. What it builds is `trainer.run.assemble`'s."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from omegaconf import DictConfig

from trainer.config.errors import ConfigError, Interrupted, WorkerLost
from trainer.config.messages import one_line
from trainer.data.fingerprint import check_same_data, of_source
from trainer.data.pipeline import data_failure
from trainer.distribute.cluster import Cluster, resolve_cluster, slurm_devices
from trainer.distribute.devices import DevicePlan, configure_devices, memory_option, plan_devices
from trainer.distribute.multiworker import (
    backup_place,
    lost_message,
    peer_failure,
    share_from_chief,
)
from trainer.distribute.strategy import KINDS
from trainer.models.export import export_model
from trainer.run.assemble import Callbacks, Run, assemble, build_callbacks
from trainer.run.callbacks import RunProgress
from trainer.run.loop import CustomLoop
from trainer.run.preflight import check_config
from trainer.run.resolve import Spec, resolve
from trainer.run.summary import (
    build_summary,
    format_summary,
    process_seconds,
)
from trainer.rundir.atomic import write_json
from trainer.rundir.backup import BackupStore, StopNow, StopRequest, stop_on_signals, tidy
from trainer.rundir.checksum import verify_beside
from trainer.rundir.layout import RunDir
from trainer.rundir.lock import run_lock
from trainer.rundir.resume import (
    check_backups_kept,
    check_global_batch,
    check_resume,
    check_resume_target,
    latest_state,
    nothing_to_add,
    refuse_finished_run,
)
from trainer.rundir.space import check_free_space, disk_full, full_message, needed_bytes
from trainer.task.finetune import (
    apply_phase,
    boundaries,
    phase_at,
    phase_report,
    scale_backbone_gradients,
)
from trainer.track.sweep import check_metric_name
from trainer.track.trackers import finish_trackers, logged_to

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


def train(cfg: DictConfig, run_dir: str | Path | None = None,
          callbacks: Sequence[Any] = (), choices: dict[str, str] | None = None
          ) -> dict[str, Any]:
    """Trains and evaluates as the config says; writes everything into the run directory.

    Args:
        cfg: a composed config (see `conf/config.yaml`).
        run_dir: where checkpoints, logs and `summary.json` go; Hydra's output directory
            when None.
        callbacks: extra Keras callbacks, after the built-in and the configured ones.
        choices: the config groups' choices (`{"model": "cnn", ...}`) where no Hydra job
            runs; the summary names the model and dataset by them.

    Returns:
        The summary dict, also written to `run_dir/summary.json`.
    """
    started = time.perf_counter()
    startup = process_seconds()
    check_config(cfg)
    spec = resolve(cfg, choices)
    cluster = resolve_cluster(list(spec.cluster.workers), spec.cluster.task_index,
                              os.environ.get("TF_CONFIG"), os.environ,
                              spec.cluster.port_base)
    if cluster is None or cluster.is_chief:
        check_config(cfg, reach=True)  # the chief's trackers write to their servers
        place = _run_dir(spec, run_dir)
        why = nothing_to_add(place, spec.epochs) if spec.resume is not None else None
        if why is not None:  # the command line says so before Hydra runs (trainer.__main__)
            print(f"finished: {why}", flush=True)
            return json.loads(RunDir(place).summary.read_text())
        with run_lock(place):
            return _train(spec, place, callbacks, started, cluster, startup)
    # Another worker: it saves what the chief saves (some reads of distributed variables are
    # collectives every worker must join) but into a temporary place, removed at the end.
    scratch = Path(tempfile.mkdtemp(prefix=f"trainer-worker{cluster.task_id}-"))
    try:
        return _train(spec, scratch, callbacks, started, cluster, startup)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _train(spec: Spec, run_dir: Path, extra: Sequence[Any], started: float,
           cluster: Cluster | None, startup: float | None = None) -> dict[str, Any]:
    chief = cluster is None or cluster.is_chief
    if chief:
        refuse_finished_run(run_dir, resume=spec.resume is not None)

    asked = spec.devices
    gpus = visible_gpu_count()
    plan = plan_devices(asked.accelerator,
                        slurm_devices(asked.devices, cluster, gpus, asked.accelerator), gpus,
                        asked.soft_placement)
    configure_devices(plan, memory_option(asked.memory_growth, asked.memory_limit_mb),
                      asked.soft_placement, asked.log_placement)
    _set_determinism(spec.deterministic)
    wired: list[Callbacks] = []
    try:
        return _run(spec, plan, run_dir, extra, started, cluster, wired, startup)
    except Exception as error:
        if cluster is not None and cluster.num_workers > 1 and peer_failure(error):
            epoch = wired[0].backup.epoch if wired else None
            raise WorkerLost(lost_message(error, cluster, epoch,
                                          backup_place(run_dir, chief))) from error
        raise
    finally:
        if wired and wired[0].watchdog is not None:
            wired[0].watchdog.stop()  # a failed fit never reaches on_train_end


def _run(spec: Spec, plan: DevicePlan, run_dir: Path, extra: Sequence[Any],
         started: float, cluster: Cluster | None, wired: list,
         startup: float | None = None) -> dict[str, Any]:
    """Builds, trains, evaluates and reports; `wired` receives the callbacks once built."""
    run = assemble(spec, plan, cluster)
    model = run.model
    with run.strategy.scope():  # the optimizer's slots are distributed variables
        if not model.optimizer.built:  # built now, so the space estimate counts its slots
            model.optimizer.build(model.trainable_variables)
    needed = needed_bytes(model, export=spec.export)
    if run.is_chief:
        check_free_space(run_dir, needed)
    try:
        return _train_and_report(spec, plan, run, run_dir, extra, started, wired, startup)
    except Exception as error:
        if run.is_chief and not isinstance(error, ConfigError) and disk_full(error):
            raise ConfigError(full_message(run_dir, needed)) from error
        bad_data = data_failure(run.data.source, error)  # an image that does not decode
        if bad_data is not None:
            raise bad_data from None
        raise


def _train_and_report(spec: Spec, plan: DevicePlan, run: Run, run_dir: Path,
                      extra: Sequence[Any], started: float, wired: list,
                      startup: float | None = None) -> dict[str, Any]:
    cluster = run.cluster
    check_metric_name(spec.optimized_metric, run.logged, tested=run.data.test is not None)
    start, changes, done, metrics = _resume_point(spec, run, run_dir)

    # after the optimizer is built over every variable (in _run)
    phases = phase_report(run.model, spec.finetune, spec.epochs)
    if phases is not None:
        scale_backbone_gradients(run.model, spec.finetune.backbone_lr_scale)
    request = StopRequest()
    callbacks = build_callbacks(spec, run, run_dir, started, start, request, tuple(extra),
                                history=done)
    callbacks.backup.resumed_metrics = metrics  # the resumed epoch's training metrics
    wired.append(callbacks)
    try:
        # The end of a run (final evaluations, export) listens for signals too: a stop
        # there ends with the final epoch's backup, from which a rerun finishes just that.
        with stop_on_signals(request):
            outcome = _fit(spec, run, callbacks, start, request)
            outcome = replace(outcome, startup_s=startup)
            summary = None
            if not callbacks.backup.interrupted:
                summary = build_summary(spec, run, plan, run_dir, outcome, callbacks, started,
                                        start, changes)
                if spec.export:
                    summary["exports"] = export_model(run.model, run_dir, spec.export,
                                                      run.data.validation)
                    if "saved_model" in summary["exports"]:  # its key before export formats
                        summary["saved_model"] = summary["exports"]["saved_model"]
                _stop_if_asked(request, "the export", run_dir, run.is_chief)
    except BaseException:
        finish_trackers(list(callbacks.trackers), None, "FAILED")
        raise
    if callbacks.backup.interrupted:
        finish_trackers(list(callbacks.trackers), None, "KILLED")
        why = ("another worker was asked to stop" if callbacks.backup.stopped_by_peer
               else f"stopped by signal {request.signal}")
        who = "; every worker stopped" if run.workers > 1 else ""
        raise Interrupted(f"{why}{who} at epoch {callbacks.backup.epoch + 1}; backup in "
                          f"{backup_place(run_dir, run.is_chief)}; rerun the same command to "
                          "resume")
    summary["loggers"] = logged_to(callbacks.trackers, run_dir)
    summary["finetune"] = phases
    if run.is_chief:
        callbacks.curves.draw(summary["history"])  # what epoch ends left undrawn
        _finish(summary, run_dir)
        finish_trackers(list(callbacks.trackers), summary, "FINISHED")
    else:
        print(f"worker {cluster.task_id} of {cluster.num_workers} finished; the chief "
              f"({cluster.addresses[0]}) wrote the checkpoints and summary", flush=True)
    return summary


def _run_dir(spec: Spec, run_dir: str | Path | None) -> Path:
    if spec.resume is not None:
        check_resume_target(spec.resume, None)
        return Path(spec.resume)
    return Path(run_dir) if run_dir is not None else _hydra_run_dir()


def _stop_if_asked(request: StopRequest, during: str, run_dir: Path, chief: bool) -> None:
    """A signal received after training (the final evaluations, the export): stop there,
    before the summary; the final epoch's backup lets a rerun finish exactly what is left."""
    if request.signal is not None:
        raise Interrupted(f"stopped by signal {request.signal} during {during}, after the "
                          f"last epoch; backup in {backup_place(run_dir, chief)}; rerun the "
                          "same command to finish the run")


def _resume_point(spec: Spec, run: Run, run_dir: Path
                  ) -> tuple[tuple[int, int], dict, dict[str, list], tuple | None]:
    """Restores the newest good backup.

    Returns:
        (epoch, step in epoch) to start from, the config changes the resume accepted, the
        per-epoch metrics of the epochs done before it, and the training metrics' state at
        that step (None at an epoch's start, for an older backup, or one shared by the
        chief of a multi-worker run).

    Raises:
        ConfigError: the config or the global batch differs from the backup's in a way
            that would train something else (`trainer.rundir.resume`).
    """
    changes = {}
    if run.is_chief:
        check_backups_kept(run_dir)
        state = latest_state(run_dir)
        changes = check_resume(run_dir, state, spec.record)
        check_same_data(run_dir, (state or {}).get("data"), of_source(run.data.source))
        check_global_batch(run_dir, state, run.batch.global_size, run.batch.replicas,
                           run.batch.accumulate)
        tidy(run_dir)
    model = run.model  # its optimizer built over every trainable variable (in _run)
    # Loaded outside the scope: Keras's loader creates throwaway variables, which under
    # MultiWorkerMirroredStrategy's scope would start collectives on the chief alone.
    point = BackupStore(RunDir(run_dir).backup).restore(model)
    if KINDS[run.strategy_name].resume_from_chief:
        # Only the chief keeps backups: every worker continues from the chief's.
        point = share_from_chief(run.strategy, model, point)
    if point is None:
        return (0, 0), {}, {}, None
    start = (point.epoch + 1, 0) if point.step >= run.steps else (point.epoch, point.step)
    if start[0] >= spec.epochs and not start[1]:
        log.warning("resuming from %s: every epoch is trained; finishing the run",
                    point.path)
    else:
        log.warning("resuming from %s: epoch %d, step %d", point.path, point.epoch + 1,
                    point.step)
    done = {k: list(v)[:start[0]] for k, v in point.state.get("history", {}).items()}
    return start, changes, done, point.metrics if start[1] else None


def _build_compiled_metrics(run: Run, element_spec: Any) -> None:
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


def _segments(spec: Spec, run: Run, start: tuple[int, int]) -> list:
    """(first epoch, end epoch, steps per epoch, dataset) to train, in order.

    A run resumed mid-epoch first finishes that epoch's remaining steps, then trains whole
    epochs; each dataset starts exactly where the interrupted run would have been.
    """
    epoch, step = start
    make = run.data.make_train
    segments = []
    if step:
        segments.append((epoch, epoch + 1, run.steps - step, make(epoch, epoch + 1, step)))
        epoch += 1
    # a fine-tuning phase change starts a new segment (its step is compiled anew)
    ends = sorted({*(b for b in boundaries(spec.finetune, spec.epochs) if b > epoch),
                   spec.epochs})
    for end in ends:
        if epoch < end:
            segments.append((epoch, end, run.steps, make(epoch, end, 0)))
            epoch = end
    return segments


def _fit(spec: Spec, run: Run, callbacks: Callbacks, start: tuple[int, int],
         request: StopRequest | None = None) -> Outcome:
    """Trains with the chosen loop, then evaluates every validation example once.

    The history starts with the epochs done before a resume (kept in the backups), so a run
    resumed after its last epoch reports what the uninterrupted run would have.
    """
    model = run.model
    history = {k: list(v) for k, v in callbacks.backup.history.items()}
    trained = False
    loop, phase = None, None
    build_s = time.perf_counter() - callbacks.throughput.started

    def new_loop():
        made = CustomLoop(model, run.strategy, run.speed.steps_per_execution,
                          jit_compile=run.speed.jit_compile is True, loss=run.loss,
                          metrics=run.metrics, accumulate=run.batch.accumulate)
        callbacks.backup.metric_source = lambda: made.metric_variables  # not the model's
        return made

    if run.loop == "custom":
        loop = new_loop()
    backup, stopped_early = callbacks.backup, False
    progress = []
    if spec.verbose != 0:
        progress = [RunProgress(spec.epochs, run.steps, start)]
    for first, end, steps, dataset in _segments(spec, run, start):
        if loop is None and backup.resumed_metrics is not None:
            _build_compiled_metrics(run, dataset.element_spec)
        if phase_at(first, spec.finetune) != phase:
            if phase is not None:  # the trainable variables change: compile the step anew
                model.train_function = None
                loop = new_loop() if loop is not None else None
            phase = phase_at(first, spec.finetune)
            apply_phase(model, phase, spec.finetune.unfreeze_layers)
        kwargs = dict(initial_epoch=first, epochs=end, steps_per_epoch=steps,
                      validation_data=run.data.validation,
                      callbacks=[*callbacks.all(), *progress], verbose=spec.verbose)
        try:
            if loop is not None:
                part = loop.fit(dataset, **kwargs)
            else:
                kwargs["callbacks"] = [*run.fit_callbacks, *kwargs["callbacks"]]
                part = model.fit(dataset, shuffle=False, **kwargs)  # already shuffled
        except StopNow:
            if spec.verbose in (1, "auto"):
                print(flush=True)  # end the progress bar's line
            break
        trained = trained or bool(part.history)
        for key, values in part.history.items():
            history.setdefault(key, []).extend(values)
        # A callback (early stopping) ended training before the last epoch.
        stopped_early = bool(model.stop_training) and not backup.interrupted
        if backup.interrupted or stopped_early:
            break
    epochs_done = backup.epoch + 1 if trained else start[0]
    if backup.interrupted:  # a stopped run is not evaluated (other workers may be gone)
        return Outcome(history, {}, epochs_done, False, build_s=build_s)
    if not trained and epochs_done:
        # Nothing left to train (stopped after the last epoch's backup): the final state is
        # the backup's; last.keras is written now where the stop came before it.
        ensure_last(callbacks.checkpoints[0], model, epochs_done - 1)
    evaluating = time.perf_counter()
    final = evaluate_split(run, run.data.validation, loop)
    if request is not None:
        _stop_if_asked(request, "the final validation", callbacks.backup.store.directory.parent,
                       run.is_chief)
    test, checkpoint = None, None
    if run.data.test is not None:
        # Once, at the end, with the checkpoint validation chose: nothing before read it.
        # Every worker decides alike (each has its own copy of the checkpoints); a run that
        # ended no epoch tests the weights as they are. The last weights come back after,
        # for the export and anything the caller does with the model.
        checkpoint = test_checkpoint(spec.checkpoint.test_with, callbacks) if history else None
        last = model.get_weights() if checkpoint is not None else None
        if checkpoint is not None:
            checkpoint = load_for_test(model, checkpoint, callbacks)
        test = test_metrics(run, loop)
        if last is not None:
            model.set_weights(last)
        if request is not None:
            _stop_if_asked(request, "the test evaluation",
                           callbacks.backup.store.directory.parent, run.is_chief)
    return Outcome(history, final, epochs_done, stopped_early and epochs_done < spec.epochs,
                   test, None if checkpoint is None else str(checkpoint), build_s=build_s,
                   evaluation_s=time.perf_counter() - evaluating)


def test_metrics(run: Run, loop: Any = None) -> dict[str, float]:
    """Every test example evaluated once, by the run's loop."""
    return evaluate_split(run, run.data.test, loop)


def evaluate_split(run: Run, dataset: Any, loop: Any = None) -> dict[str, float]:
    """Loss and metrics over every example of a split, once: Keras's `evaluate` under
    `fit` (its symbolic build reads no batch once the model is built, see
    `trainer.run.step`), the custom loop's evaluation under `loop=custom`."""
    if run.loop == "fit":
        found = run.model.evaluate(dataset, return_dict=True, verbose=0)
    else:
        if loop is None:
            loop = CustomLoop(run.model, run.strategy, loss=run.loss, metrics=run.metrics)
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
    if _intact(path):
        return
    log.warning("%s is missing or damaged; writing it from the last backup", path)
    last.set_model(model)
    last._ended = (epoch, {})  # noqa: SLF001 - its own at-end write, as at the end of fit
    last.same_as = None
    last.on_train_end()


def _intact(path: Path) -> bool:
    try:
        verify_beside(path)
        return path.is_file()
    except (OSError, ValueError):
        return False


def load_for_test(model: Any, checkpoint: Path, callbacks: Callbacks) -> Path | None:
    """Loads the test checkpoint into `model`; a damaged one (its hash, or a file that does
    not load) is one warning naming it and the fallback: the last weights, which the model
    holds already. Returns the checkpoint whose weights the model then holds (None: the
    final weights, no file)."""
    fallback = Path(callbacks.checkpoints[0].filepath)
    try:
        if not checkpoint.is_file():
            raise ValueError("missing")
        if not _intact(checkpoint):
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
        return fallback if _intact(fallback) else None


def _set_determinism(on: bool) -> None:
    """TensorFlow's op determinism is process-wide: set it either way, so a second run in one
    process (a notebook, a test session) gets what its own config says."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    if on:
        tf.config.experimental.enable_op_determinism()
    elif tf_config.is_op_determinism_enabled():
        tf_config.disable_op_determinism()


def visible_gpu_count() -> int:
    """Physical GPUs TensorFlow sees (after CUDA_VISIBLE_DEVICES)."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _hydra_run_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise ConfigError("train() outside a Hydra run needs run_dir; received: None")
    return Path(HydraConfig.get().runtime.output_dir)


def _finish(summary: dict[str, Any], run_dir: Path) -> None:
    write_json(RunDir(run_dir).summary, summary)
    # A good finish keeps the newest backup only: what `resume=DIR` extends the run from.
    BackupStore(RunDir(run_dir).backup).prune(keep=1)
    tidy(run_dir)
    print(format_summary(summary), flush=True)
