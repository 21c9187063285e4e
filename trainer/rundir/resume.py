"""What a resumed run may change: the new config against the one its backup was made with.

Every backup's `state.json` holds the composed config it was trained with and the batch it
used. A rerun in the same run directory (or `resume=DIR`) is compared with it before
anything is written: keys that change what is trained (model, dataset, optimizer, loss,
seed, precision, loop, the global batch) are refused with one line naming each key, its old
and its new value; keys that only change how the run is watched or how long it goes
(epochs, logging, checkpoints, callbacks, speed options) are accepted and reported in the
summary. A path spelled another way (relative or absolute, through a symlink, with `~`) is
no change where both spellings name one existing file or folder. Devices, accelerator,
cluster, strategy and the micro-batch split may change when the global batch is fixed
(`batch.global_size`): the run continues on another device count with the same global
batch, learning rate, schedule position and data order. `dataset.cache` may move between
`memory` and `disk` (the same elements; `true` and `false`, its older spelling, read as
`memory` and `none`), and `dataset.memory_limit_mb` and `dataset.service` (where the
preprocessing runs: the same batches) may change.

Nothing here imports TensorFlow: the command line checks before Hydra writes `.hydra/`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError
from trainer.config.given import NODES, is_marker, lookup
from trainer.config.schema import LrPlan
from trainer.config.validate import cache_mode
from trainer.rundir.atomic import json_read
from trainer.rundir.layout import STATE, RunDir
from trainer.rundir.lock import holder

# Keys (and key prefixes) that may change on any resume.
FREE = ("epochs", "verbose", "tensorboard", "export", "resume", "checkpoint", "callbacks",
        "metrics", "strategy.timeout_s", "strategy.start_timeout_s", "log_device_placement",
        "soft_placement", "gpu",
        "steps_per_execution", "jit_compile", "deterministic", "cluster.task_index",
        "cluster.port_base", "cluster.max_restarts", "logger",
        "optimized_metric", "profile", "tune", "tuner", "dataset.memory_limit_mb",
        # where the preprocessing runs: the same batches with or without a tf.data service
        "dataset.service",
        # what dataset.image_size grows to; the size trained at is dataset.image_size's own
        "model.min_image_size")
# Keys that only decide how the global batch is split over devices: free when the global
# batch is fixed by batch.global_size.
ELASTIC = ("devices", "accelerator", "cluster", "strategy", "batch.accumulate",
           "batch.max_per_replica")
BATCH = ("batch.per_replica", "batch.global_size")


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists stay values."""
    if not isinstance(node, dict) or (prefix and not node):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


# Keys a backup may predate, with the value that means what the run did before them: a
# digits or image_folder run had no test share, a TFDS run no test split, no run fine-tuned.
LEGACY = {"dataset.test_fraction": 0, "dataset.test_split": None,
          "finetune.freeze_backbone": False, "finetune.unfreeze_at_epoch": None,
          "finetune.unfreeze_layers": None, "finetune.backbone_lr_scale": 1.0,
          "augment": [], "sync_batchnorm": False, "dataset.lanes": 1,
          # weight averaging came later: no run before it kept an EMA
          "optimizer.ema": False, "optimizer.ema_momentum": 0.99,
          "dataset.shuffle": True, "validation_split": None,
          # one pass over each split, before Keras's steps came
          "steps_per_epoch": None, "validation_steps": None}
# Cache modes that keep the same (byte-rounded) elements: a resume may move between them.
SAME_ELEMENTS = {"memory", "disk"}


def _cache_modes(flat: dict[str, Any]) -> dict[str, Any]:
    """`dataset.cache` by its mode: `true` and `false` (the older spelling) are `memory`
    and `none`."""
    if "dataset.cache" not in flat:
        return flat
    try:
        return {**flat, "dataset.cache": cache_mode(flat["dataset.cache"])}
    except ConfigError:
        return flat


def _predates(key: str, old: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether a key missing from an older backup's config leaves the run as it was."""
    if key in old:
        return False
    if key.startswith("logger.") and key.endswith("._target_"):
        return True  # loggers named their builders later; the same built-in tracker
    if key in LEGACY:
        return now.get(key) == LEGACY[key]
    # only read when validation_split is auto, which such a run could not have had
    return key == "dataset.validation_fraction" and "dataset.validation_split" in now \
        and now.get("dataset.validation_split") != "auto"


def same_reference(key: str, old: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether `optimizer.reference_batch: auto` (the optimizers' default since it became
    one) stands for the number an older run was saved with: the same learning rate."""
    if key != "optimizer.reference_batch" or now.get(key) != "auto":
        return False
    auto = LrPlan().reference_for(now.get("batch.per_replica"), now.get("batch.global_size"))
    return auto == old.get(key)


def same_place(before: Any, after: Any) -> bool:
    """Whether two config values are two spellings of one existing file or folder (relative
    and absolute, through a symlink, `~`): the same data, not a change. Values that are not
    both existing paths are compared as they are."""
    if not isinstance(before, str) or not isinstance(after, str) or not before or not after:
        return False
    try:
        return os.path.samefile(os.path.expanduser(before), os.path.expanduser(after))
    except (OSError, ValueError):  # either is not there (or not a path at all)
        return False


def _matches(key: str, names: tuple[str, ...]) -> bool:
    return any(key == name or key.startswith(name + ".") for name in names)


def latest_state(run_dir: Path) -> dict[str, Any] | None:
    """The newest backup's `state.json` in a run directory, None when there is none."""
    backup = RunDir(run_dir).backup
    if not backup.is_dir():
        return None
    for path in sorted(backup.glob("ckpt-*"), reverse=True):
        try:
            return json_read((path / STATE).read_text())
        except (OSError, ValueError):
            continue
    return None


def reached_epochs(state: dict[str, Any]) -> int:
    """Epochs a backup's run has started: done ones plus the one it stopped in."""
    return int(state["epoch"]) + (1 if int(state["step"]) else 0)


def check_resume(run_dir: Path, state: dict[str, Any] | None,
                 new: dict[str, Any]) -> dict[str, list]:
    """Refuses a resume that would silently train something else; returns what changed.

    Args:
        run_dir: the run directory being resumed (for the messages).
        state: the newest backup's state (`latest_state`); None: nothing to compare.
        new: the new composed config, as a plain dict.

    Returns:
        The accepted changes, `{key: [old, new]}`.

    Raises:
        ConfigError: naming every refused key with its old and new value.
    """
    if state is None:
        return {}
    if "config" not in state:
        return {}  # a backup from before configs were kept: nothing to compare
    reached = reached_epochs(state)
    if new.get("epochs", reached) < reached:
        raise ConfigError(f"cannot resume {run_dir}: it has reached epoch {reached}, and "
                          f"epochs={new['epochs']} is fewer; pass epochs>={reached} to "
                          "continue it (its checkpoints are kept)")
    old, now = _cache_modes(flatten(state["config"])), _cache_modes(flatten(new))
    _objects_again(old, now)
    changed = {k: [old.get(k), now.get(k)] for k in sorted(set(old) | set(now))
               if old.get(k) != now.get(k) and k != "resume" and not _predates(k, old, now)
               and not same_place(old.get(k), now.get(k)) and not same_reference(k, old, now)}
    fixed = now.get("batch.global_size")
    saved = state.get("global_batch")
    refused, elastic = [], []
    for key, (before, after) in changed.items():
        if _matches(key, FREE) or (key == "dataset.cache"
                                   and {before, after} <= SAME_ELEMENTS):
            continue
        if _matches(key, ELASTIC):
            elastic.append(key)
        elif key in BATCH and fixed is not None and fixed == saved:
            continue  # the same global batch, now fixed
        else:
            refused.append(f"{key} from {before!r} to {after!r}")
    if refused:
        raise ConfigError(f"cannot resume {run_dir} with a changed config (it would train "
                          f"something else): {'; '.join(refused)}; rerun with the old "
                          "values, or start a new run directory")
    if elastic and fixed is None:
        what = "; ".join(f"{k} from {changed[k][0]!r} to {changed[k][1]!r}" for k in elastic)
        raise ConfigError(f"cannot resume {run_dir} with {what} under batch.per_replica: the "
                          f"global batch of {saved} would change with the devices; pass "
                          f"batch.per_replica=null batch.global_size={saved} to resume it on "
                          "any device count")
    return changed


def _objects_again(old: dict[str, Any], now: dict[str, Any]) -> None:
    """A run started from Python objects (`trainer.fit(model=..., data=...)`) resumed without
    them: the one line `trainer.config.given.lookup` says (which object, what to pass),
    rather than a config diff of its markers."""
    for role, node in NODES.items():
        if is_marker(old.get(f"{node}._target_")) and not is_marker(now.get(f"{node}._target_")):
            lookup(role, old.get(f"{node}.given"))


def check_global_batch(run_dir: Path, state: dict[str, Any] | None, global_batch: int,
                       replicas: int, accumulate: int) -> None:
    """Refuses to continue a run at another global batch (devices=auto found other devices).

    Raises:
        ConfigError: naming both global batches and how to keep the old one.
    """
    if state is None or "global_batch" not in state or state["global_batch"] == global_batch:
        return
    before = state["global_batch"]
    raise ConfigError(f"cannot resume {run_dir}: it trained with a global batch of {before} "
                      f"({state.get('replicas')} replicas x {state.get('accumulate', 1)} "
                      f"micro-batches), this run's is {global_batch} ({replicas} x "
                      f"{accumulate}); pass batch.per_replica=null batch.global_size={before} "
                      "to resume it on these devices")


def refuse_finished_run(run_dir: Path, resume: bool) -> None:
    """Refuses to start a new run over a finished one (its summary.json would be lost).
    The directory's name was checked before (`trainer.rundir.names.check_name`)."""
    if not resume and RunDir(run_dir).summary.exists():
        raise ConfigError(f"run directory {run_dir} holds a finished run (summary.json); "
                          f"choose a new hydra.run.dir, or pass resume={run_dir} to continue it")


def check_backups_kept(run_dir: Path) -> None:
    """Refuses a run directory whose checkpoints remain but whose `backup/` was removed: a
    start would silently train from scratch over them.

    Raises:
        ConfigError: naming the directory and the ways on.
    """
    if RunDir(run_dir).lost_backups():
        raise ConfigError(f"{run_dir} holds checkpoints but its backup/ is gone, so the run "
                          "cannot continue where it was; move the directory away (or remove "
                          "its checkpoints/) to start afresh, or choose a new run directory")


def nothing_to_add(run_dir: Path, epochs: int) -> str | None:
    """Why a resume of a finished run has nothing to do (None where it has: no summary
    yet, or more epochs asked than it was run for). The run directory is left as it is."""
    try:
        summary = json.loads(RunDir(run_dir).summary.read_text())
    except (OSError, ValueError):
        return None
    ran, done = summary.get("epochs"), summary.get("epochs_done", 0)
    if not isinstance(ran, int) or epochs > ran or epochs < done:
        return None  # more to train; or fewer than done, which check_resume refuses
    return (f"{run_dir} finished its {ran} epochs (summary.json); nothing to do: pass "
            f"epochs={ran + 1} or more to train it further")


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds a run of trainer's (a backup, checkpoints or a summary)."""
    return RunDir(path).holds_run()


def has_config(path: Path) -> bool:
    """Whether `path` holds a run's recorded config (`.hydra/config.yaml`)."""
    return RunDir(path).config.is_file()


def check_resume_target(resume: str | None, hydra_run_dir: str | None) -> None:
    """Refuses `resume=DIR` where DIR is not a run, or where Hydra would write its `.hydra/`
    and log into another directory that holds a finished run."""
    if resume is None:
        return
    target = Path(resume)
    if not is_run_dir(target):
        busy = holder(target)
        if busy is not None:  # a run that has not written its first backup yet
            raise ConfigError(f"resume={resume} is a run still training (pid {busy}), with "
                              "nothing to resume from yet; wait for it to end, then resume it")
        raise ConfigError(f"resume={resume} is not a run directory (no backup/, checkpoints/ or "
                          "summary.json in it); pass the directory of an earlier run")
    if hydra_run_dir is None:
        return
    logs = Path(hydra_run_dir)
    if logs.resolve() != target.resolve() and RunDir(logs).finished():
        raise ConfigError(f"hydra.run.dir={hydra_run_dir} holds another finished run, whose "
                          f".hydra/ and log this resume would overwrite; pass "
                          f"hydra.run.dir={resume} (or a new directory) with resume={resume}")
