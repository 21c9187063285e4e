"""Composing a config as the command line would, without running or writing anything.

Used by the command line's pre-flight (before Hydra writes `.hydra/` into a run directory)
and by the Python API (`trainer.fit`), so both see the same config from the same arguments:
the same schema, the same search path, a `--config-dir` of the user's in front of it.

Hydra's own compose API keeps its state in a process-wide `GlobalHydra`, which allows one
initialization at a time: two `trainer.fit` calls in two threads, or one inside a user's own
`@hydra.main` app, were told "GlobalHydra is already initialized" (or cleared the user's).
Here a config is composed by Hydra's config loader directly, never touching `GlobalHydra`,
and one composition at a time (the loader reads process-wide registries: the ConfigStore,
the plugins, OmegaConf's resolvers).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, replace

import yaml
from hydra.errors import (
    ConfigCompositionException,
    OverrideParseException,
    SearchPathException,
)
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from trainer.config.errors import ConfigError
from trainer.config.overrides import sets
from trainer.config.schema import config_dir
from trainer.internals.hydra_app import args_parser, load_configuration, search_path

# The version_base of the command line's @hydra.main (trainer.__main__).
VERSION_BASE = "1.3"
# One composition at a time in this process.
_composing = threading.RLock()

# Errors of a config that cannot be composed or checked: one line each, exit code 2.
KNOWN_ERRORS = (ConfigError, ConfigCompositionException, OverrideParseException,
                SearchPathException, OmegaConfBaseException)


def compose_from_args(args: list[str]) -> DictConfig | None:
    """The config (with its `hydra` node) these arguments would run, composed as Hydra
    composes it but without running anything or writing anything; None for commands that
    run no single job (`-m`, `--cfg`, `--help`, ...)."""
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.types import RunMode

    parsed = args_parser().parse_args(args)
    if (parsed.cfg or parsed.help or parsed.hydra_help or parsed.info
            or parsed.shell_completion or parsed.experimental_rerun):
        return None
    if parsed.multirun:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        # What every job shares: the sweep's own values are each job's to check.
        shared = OverridesParser.create().parse_overrides(parsed.overrides)
        parsed.overrides = [o.input_line for o in shared if not o.is_sweep_override()]
    search = search_path(f"file://{config_dir()}")
    if parsed.config_dir is not None:
        check_config_dir(parsed.config_dir)
        search.prepend(provider="command-line",
                       path=f"file://{os.path.abspath(parsed.config_dir)}",
                       anchor=SearchPathQuery(provider="schema"))
    try:
        return _load(search, parsed.config_name or "config", parsed.overrides,
                     RunMode.MULTIRUN if parsed.multirun else RunMode.RUN)
    except ValueError as error:  # Hydra's own for some malformed overrides, e.g. `=5`
        if isinstance(error, KNOWN_ERRORS):
            raise
        raise ConfigError(f"cannot use the overrides {' '.join(parsed.overrides)}: "
                          f"{str(error).strip().splitlines()[0]} (overrides are key=value, "
                          "e.g. epochs=3)") from None


@dataclass(frozen=True)
class Composed:
    """A config as the command line would run it, composed once, with what Hydra's node
    said of it.

    Attributes:
        cfg: the config, without its `hydra` node (what the pre-flight checks).
        logs: `hydra.run.dir`: where the run's `.hydra/` and log go, resolved once (a
            `${now:...}` in it is read at composition, never again).
        overrides: the task's overrides, as `.hydra/overrides.yaml` keeps them.
        choices: the config groups' choices (`{"model": "cnn", ...}`).
        job: the same composition with its `hydra` node, the run directory pinned to `logs`
            (`hydra.run.dir`, `hydra.runtime.output_dir`): what Hydra's job runs with,
            `${hydra:...}` reads and `.hydra/hydra.yaml` keeps; None where none was composed.
    """

    cfg: DictConfig
    logs: str
    overrides: list[str]
    choices: dict[str, str]
    job: DictConfig | None = None

    def at(self, logs: str) -> Composed:
        """The same run with its `.hydra/` and log in `logs` (a URL's mirror, another
        worker's own directory)."""
        return replace(self, logs=logs, job=_pinned(self.job, logs))


def composed(args: list[str]) -> Composed | None:
    """The one run these arguments describe (`compose_from_args`), its run directory
    resolved once; None for commands that run no single job. The command line,
    `trainer.fit` and the launcher read a config this way alike."""
    job = compose_from_args(args)
    if job is None:
        return None
    # The overrides as typed: `+x=${hydra:runtime.output_dir}/f` is text here, resolved by
    # the job that reads it (resolving it now needs a running Hydra job).
    task = OmegaConf.select(job, "hydra.overrides.task")
    logs = _resumed(job) or OmegaConf.select(job, "hydra.run.dir")
    logs = None if logs is None else local_path(str(logs))
    cfg = job.copy()
    with open_dict(cfg):
        del cfg["hydra"]
    return Composed(cfg, logs, OmegaConf.to_container(task, resolve=False) if task else [],
                    dict(OmegaConf.select(job, "hydra.runtime.choices") or {}),
                    _pinned(job, logs))


def _resumed(job: DictConfig) -> str | None:
    """The local run `resume=DIR` continues, where no `hydra.run.dir` is given beside it:
    its `.hydra/` and log go there, with the rest of it (never into a new folder of Hydra's
    default `outputs/DATE/TIME`, which would hold only those); None otherwise."""
    try:
        resume = job.get("resume")
    except OmegaConfBaseException:
        return None  # it reads the running job (`${hydra:...}`): no directory of its own
    given = OmegaConf.select(job, "hydra.overrides.hydra") or []
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", str(resume or ""))
    if not resume or (scheme and not str(resume).lower().startswith("file://")) or sets(
            [str(o) for o in given], "hydra.run.dir"):
        return None
    return local_path(str(resume))


def local_path(run_dir: str) -> str:
    """A run directory as the path it names: `file:///tmp/x` is `/tmp/x` (a `file://` URL
    names a local folder; kept as text it made a folder named `file:`)."""
    if run_dir.lower().startswith("file://"):
        path = run_dir[len("file://"):]
        if not path.startswith("/"):
            raise ConfigError(f"a file:// run directory names an absolute local path "
                              f"(file:///tmp/run); received: {run_dir}")
        return path
    return run_dir


def _pinned(job: DictConfig | None, logs: str | None) -> DictConfig | None:
    """A composition with its run directory fixed to `logs`: `${now:...}` read once."""
    if job is None or logs is None:
        return job
    job = job.copy()
    with read_write(job.hydra), open_dict(job.hydra):
        job.hydra.run.dir = logs
        job.hydra.runtime.output_dir = os.path.abspath(logs)
    return job


def check_config_dir(folder: str) -> None:
    """Refuses a `--config-dir` (`trainer.fit(config_dir=...)`) that is not a folder, before
    anything is written (Hydra's own refusal came after the run directory's lock)."""
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise ConfigError(f"the config directory {folder} (--config-dir) {what}; pass the "
                          "folder that holds your own YAML files")


def yaml_error(error: Exception) -> ConfigError:
    """A config file's YAML syntax error as one line naming the file, line and column."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or getattr(error, "context", None)
    where = ("a config file" if mark is None else
             f"{mark.name} (line {mark.line + 1}, column {mark.column + 1})")
    what = problem or (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ConfigError(f"{where} is not valid YAML: {what}; fix the file's syntax")


def compose_in(folder: str, config_name: str, overrides: list[str]) -> DictConfig:
    """`hydra.compose(config_name, overrides)` over the configs in `folder` (as under
    `hydra.initialize_config_dir(folder)`), without its `hydra` node, and without touching
    `GlobalHydra` (a user's Hydra app around the call keeps its own)."""
    from hydra.types import RunMode

    search = search_path(f"file://{os.path.abspath(folder)}")
    cfg = _load(search, config_name, list(overrides), RunMode.RUN, from_shell=False,
                job_name="app")
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def _load(search, config_name: str, overrides: list[str], run_mode,
          from_shell: bool = True, job_name: str = "trainer") -> DictConfig:
    """What `Hydra.compose_config` returns, by its config loader alone, one at a time."""
    from hydra.core.utils import JobRuntime, setup_globals
    from hydra.version import VersionBase, setbase

    with _composing:
        setup_globals()  # the resolvers Hydra registers (`now`, `hydra`): as a Hydra app has
        # The command line's version_base (its @hydra.main's) and job name, for this
        # composition only: a user's app around it keeps its own.
        versions, runtime = VersionBase.instance(), JobRuntime.instance()
        before, name = versions.getbase(), runtime.get("name")
        setbase(VERSION_BASE)
        runtime.set("name", job_name)
        try:
            return load_configuration(search, config_name, overrides, run_mode, from_shell)
        except yaml.YAMLError as error:  # a file of the user's config dir, as Hydra read it
            raise yaml_error(error) from None
        finally:
            versions.version_base = before
            runtime.set("name", name)
