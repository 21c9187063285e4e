"""The checks of a config that run before TensorFlow starts, gathered in one place.

The config's own checks (`trainer.config.validate`) and those owned by one part of a run (a
tracker's package and server, an augmentation preset, fine-tuning options, an export
format's converter) are run here together. The command line checks before Hydra writes
anything and `train()` checks again for API users; a config already checked in this
process is not checked twice, and a tracker's server is probed once.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from trainer.config.errors import NothingToDo
from trainer.config.validate import export_formats, validate
from trainer.data.augment import check as check_augment
from trainer.distribute.cluster import resolve_cluster
from trainer.models.export import check_converters
from trainer.rundir.lock import check_writable, hold
from trainer.rundir.names import check_name
from trainer.rundir.resume import (
    check_backups_kept,
    check_resume,
    check_resume_target,
    latest_state,
    nothing_to_add,
    refuse_finished_run,
)
from trainer.task.finetune import check as check_finetune
from trainer.track.loggers import check_loggers

# The configs (as YAML, interpolations unresolved) that passed, and that passed with their
# servers reached, in this process.
_passed: set[str] = set()
_reached: set[str] = set()


def check_config(cfg: DictConfig, reach: bool = False) -> None:
    """Checks every value of a composed config before anything is built or written.

    Args:
        cfg: the composed config (without Hydra's own `hydra` node).
        reach: also connect to the servers the config names (an MLflow tracking server).

    Raises:
        ConfigError: naming the bad value and what would be valid.
    """
    key = OmegaConf.to_yaml(cfg, resolve=False)
    if key not in _passed:
        validate(cfg)
        check_loggers(cfg.logger)
        check_augment(cfg.augment)
        check_finetune(cfg.finetune, str(cfg.optimizer.get("_target_", "")))
        check_converters(export_formats(cfg.export))
        _passed.add(key)
    if reach and key not in _reached:
        check_loggers(cfg.logger, reach=True)
        _reached.add(key)


def check_run_dir(cfg: DictConfig, logs: str | None, fresh: list) -> Path | None:
    """The pre-flight of a run's directory, before anything is written into it: the config
    checked, the directory's name, a `resume=` target, a finished run with nothing to add,
    then, holding the directory's lock for the rest of the process, a finished or busy
    directory, trackers' servers, removed backups and a changed config.

    Args:
        cfg: the composed config (without Hydra's `hydra` node).
        logs: Hydra's run directory (`hydra.run.dir`), where `.hydra/` and the log go.
        fresh: receives `(directory, topmost directory created)` for each directory this
            call created (or that Hydra will create), for removal if the run fails on its
            config.

    Returns:
        The run directory checked; None where a running job must check it (another
        worker's, or a config that reads Hydra's job).

    Raises:
        ConfigError: naming what is wrong; NothingToDo: a finished run asked for nothing more.
    """
    if logs is not None:
        check_name(Path(logs))
        check_writable(Path(logs))
    try:
        check_config(cfg)
    except InterpolationResolutionError:
        return None  # it needs a running job (`${hydra:...}`): the job validates it
    cluster = resolve_cluster(list(cfg.cluster.workers), cfg.cluster.task_index,
                              os.environ.get("TF_CONFIG"), os.environ,
                              cfg.cluster.port_base)
    if cluster is not None and not cluster.is_chief:
        return None  # the chief checks and writes the run directory
    check_resume_target(cfg.get("resume"), logs)
    run_dir = Path(cfg.resume if cfg.get("resume") else logs)
    if cfg.get("resume"):
        why = nothing_to_add(run_dir, cfg.epochs)
        if why is not None:
            raise NothingToDo(why)
    # The lock before anything that reads or writes the directory (two starts at once:
    # one holds it, the other is refused having created and changed nothing).
    if logs is not None and Path(logs) != run_dir and not Path(logs).exists():
        fresh.append((Path(logs), None))  # Hydra's .hydra/ and log: created by it
    created = hold(run_dir)
    if created is not None:
        fresh.append((run_dir, created))
    refuse_finished_run(run_dir, resume=bool(cfg.get("resume")))
    check_config(cfg, reach=True)
    check_backups_kept(run_dir)
    state = latest_state(run_dir)
    if state is None:
        return run_dir
    try:
        new = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:  # an interpolation only a running job resolves
        new = OmegaConf.to_container(cfg, resolve=False)
    check_resume(run_dir, state, new)
    return run_dir
