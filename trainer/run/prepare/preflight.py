"""The checks of a run before TensorFlow starts, run once, returned as one `Checked` value.

The config's own checks (`trainer.config.validate`), those owned by one part of a run (a
tracker's package and server, an augmentation preset, fine-tuning options, an export
format's converter) and those of the run directory (its name, its lock, a finished run, a
`resume=` target, removed backups, a changed config) run here in that order, each once.
What they found (the resolved `Spec`, the run directory, the cluster, the newest backup's
state and the config changes a resume accepted) is a `Checked`, whose `Owner` holds the
directory's lock (`trainer.run.prepare.owner`): the run takes one, so a run cannot start unchecked
and nothing after this module checks the config again.

This is a decide module: no TensorFlow or Keras import, so the command line runs it before
Hydra writes anything and before TensorFlow starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from trainer.config.errors import ConfigError, NothingToDo
from trainer.config.validate import Parsed, validate
from trainer.data.augment import check as check_augment
from trainer.distribute.cluster import Cluster, resolve_cluster
from trainer.models.formats import check_converters
from trainer.run.prepare.owner import Owner, RunPlace
from trainer.run.prepare.resolve import Spec, resolve, with_evaluator
from trainer.rundir.lock import acquire, check_writable
from trainer.rundir.names import check_name
from trainer.rundir.resume import (
    check_backups_kept,
    check_resume,
    check_resume_target,
    has_config,
    is_run_dir,
    latest_state,
    nothing_to_add,
    refuse_finished_run,
)
from trainer.task.finetune import check as check_finetune
from trainer.track.loggers import check_loggers


@dataclass(frozen=True)
class Checked:
    """A run that passed every check, with the lock on its directory held by its owner.

    Attributes:
        spec: the config resolved once.
        run_dir: where the run writes; None for another worker of a cluster (the chief
            writes the run directory; the worker saves into a scratch place of its own).
        cluster: the multi-worker cluster, or None on one machine.
        state: the newest backup's `state.json` (None: a new run).
        changes: the config keys a resume changed and the resume accepts, `{key: [old, new]}`.
        owner: the run's one stack of guards (`trainer.run.prepare.owner.Owner`): its lock, the
            directories this start created, and the session's guards once it has one.
        record: writes the run's `.hydra/` (its config, as Hydra would) once the run passed
            the checks that need its data too (a resume's data fingerprint): a rerun that
            is refused leaves the `.hydra/` it found byte for byte; None where it is
            written already (by Hydra, for a new run directory).
    """

    spec: Spec
    run_dir: Path | None
    cluster: Cluster | None = None
    state: dict[str, Any] | None = None
    changes: dict[str, list] = field(default_factory=dict)
    owner: Owner = field(default_factory=Owner)
    record: Callable[[], None] | None = None

    @property
    def chief(self) -> bool:
        """Whether this process writes the run directory."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def recorded(self) -> bool:
        """Whether its run directory holds a run's recorded config (`.hydra/`): a rerun."""
        return self.run_dir is not None and has_config(self.run_dir)

    def owned(self) -> Owner:
        """The run's owner, to hold while it runs (`with checked.owned(): ...`): at its end,
        the one stack of guards unwinds once (`trainer.run.prepare.owner`)."""
        return self.owner


def check_config(cfg: DictConfig, reach: bool = False) -> Parsed | None:
    """Checks every value of a composed config before anything is built or written.

    Args:
        cfg: the composed config (without Hydra's own `hydra` node).
        reach: also connect to the servers the config names (an MLflow tracking server),
            instead of the other checks (the chief's, once the directory is locked).

    Returns:
        The values parsed on the way, for `resolve` (None with `reach`).

    Raises:
        ConfigError: naming the bad value and what would be valid.
    """
    if reach:
        check_loggers(cfg.logger, reach=True)
        return None
    parsed = validate(cfg)
    check_loggers(cfg.logger)
    check_augment(cfg.augment)
    check_finetune(cfg.finetune, str(cfg.optimizer.get("_target_", "")))
    check_converters(parsed.export)
    return parsed


def _cluster_of(spec: Spec, environ: Any) -> tuple[Spec, Cluster | None]:
    """The run's cluster, and its spec for it: with an evaluator, validation is the
    evaluator's (`trainer.run.prepare.sidecar.with_evaluator`)."""
    given = spec.cluster
    cluster = resolve_cluster(list(given.workers), given.task_index, environ.get("TF_CONFIG"),
                              environ, given.port_base, given.evaluator,
                              getattr(given, "size", 0) or 0)
    return with_evaluator(spec, cluster), cluster


def preflight(cfg: DictConfig, logs: str | Path | None = None,
              run_dir: str | Path | None = None, choices: dict[str, str] | None = None,
              environ: dict[str, str] | None = None, at: RunPlace | None = None) -> Checked:
    """Checks a composed config and its run directory, holding the directory's lock after.

    Args:
        cfg: the composed config (without Hydra's `hydra` node).
        logs: Hydra's run directory (`hydra.run.dir`), where `.hydra/` and the log go.
        run_dir: where the run writes when it is not `logs` (`train(cfg, run_dir)`).
        choices: the config groups' choices (`{"model": "cnn"}`); None reads Hydra's job.
        environ: the environment that describes a cluster (`TF_CONFIG`, SLURM's).
        at: the run's place at a URL (`trainer.run.prepare.place`), which its owner holds;
            None: the local run directory is its place.

    Returns:
        The `Checked` run.

    Raises:
        ConfigError: naming what is wrong; NothingToDo: a finished run asked for nothing
            more; InterpolationResolutionError: the config reads a running Hydra job
            (`${hydra:...}`), in which the pre-flight must run instead.
    """
    environ = os.environ if environ is None else environ
    if logs is not None:
        check_name(logs)  # the string: an empty one would be '.' as a Path
        check_writable(Path(logs))
    spec = resolve(cfg, choices, check_config(cfg))
    exact_kernels(spec.deterministic, environ)
    spec, cluster = _cluster_of(spec, environ)
    if cluster is not None and not cluster.is_chief:
        # its Hydra directory (`.hydra/`, the log) goes again if the start fails
        fresh = ((Path(logs), None),) if logs is not None and not Path(logs).exists() else ()
        return Checked(spec, None, cluster, owner=Owner(None, fresh, at))
    place = _place(spec, logs, run_dir)
    if logs is None or Path(logs) != place:
        check_name(place)
    fresh = []
    if logs is not None and Path(logs) != place and not Path(logs).exists():
        fresh.append((Path(logs), None))  # Hydra's .hydra/ and log: created by it
    # The lock before anything that reads or writes the directory (two starts at once:
    # one holds it, the other is refused having created and changed nothing).
    lock = acquire(place)
    if lock.created is not None:
        fresh.append((place, lock.created))
    owner = Owner(lock, fresh, at if at is not None else RunPlace(place))  # a local folder
    try:
        refuse_finished_run(place, resume=spec.resume is not None)
        if spec.tune is not None and is_run_dir(place):
            raise ConfigError(f"tune={spec.tune} writes nothing into a run's directory; "
                              f"{place} holds one: choose a new hydra.run.dir")
        check_config(cfg, reach=True)
        check_backups_kept(place)
        state = latest_state(place)
        changes = check_resume(place, state, spec.record) if state is not None else {}
    except BaseException as error:
        # Refused: the directory the lock created removed again (Hydra's `.hydra/` and log
        # are not there yet), the lock released; the one stack of guards, ended early.
        owner.end(error)
        raise
    return Checked(spec, place, cluster, state, changes or {}, owner)


# TensorFlow reads it once, as it starts. oneDNN's CPU kernels are on by default on CPUs
# with AVX-512 VNNI, BF16 or AMX and compute otherwise than TensorFlow's own (Eigen's): a
# rerun is exact either way, but a run is compared bit for bit only with runs on the same
# kernels, so `deterministic=true` takes TensorFlow's own everywhere.
ONEDNN = "TF_ENABLE_ONEDNN_OPTS"


def exact_kernels(deterministic: bool, environ: MutableMapping[str, str]) -> None:
    """`deterministic=true` switches oneDNN's CPU kernels off in the environment TensorFlow
    starts with (the pre-flight runs before it starts); a value the user set is kept."""
    if deterministic:
        environ.setdefault(ONEDNN, "0")


def _place(spec: Spec, logs: str | Path | None, run_dir: str | Path | None) -> Path:
    """The directory the run writes: `resume=`'s, else `run_dir`, else Hydra's."""
    if spec.resume is not None:
        check_resume_target(spec.resume, None if logs is None else str(logs))
        why = nothing_to_add(Path(spec.resume), spec.epochs)
        if why is not None:
            raise NothingToDo(why)
        return Path(spec.resume)
    if run_dir is None and logs is None:
        raise ConfigError("train() outside a Hydra run needs run_dir; received: None")
    return Path(run_dir if run_dir is not None else logs)
