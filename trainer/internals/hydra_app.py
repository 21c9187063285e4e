"""Hydra 1.3's internals that trainer composes with: the command line's argument parser,
the config search path of an app, and the config loader (what `@hydra.main` runs before a
job, without running one). No TensorFlow; Hydra is imported on first use, as composing
needs it."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import open_dict, read_write

from trainer.internals import check_version


def _checked() -> None:
    import hydra

    check_version("hydra-core", hydra.__version__)


def args_parser() -> argparse.ArgumentParser:
    """Hydra's own parser of a Hydra app's command line (`-m`, `--config-dir`, overrides)."""
    from hydra._internal.utils import get_args_parser

    _checked()
    return get_args_parser()


def search_path(primary: str) -> Any:
    """An app's config search path with `primary` (a `file://` URL) first, as Hydra builds
    it for `@hydra.main(config_path=...)` (plugins' search path entries included)."""
    from hydra._internal.utils import create_config_search_path

    _checked()
    return create_config_search_path(primary)


def load_configuration(search: Any, config_name: str, overrides: list[str], run_mode: Any,
                       from_shell: bool) -> Any:
    """The config Hydra composes for a job (its `hydra` node included), by Hydra's config
    loader alone."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    _checked()
    return ConfigLoaderImpl(config_search_path=search).load_configuration(
        config_name=config_name, overrides=overrides, run_mode=run_mode, from_shell=from_shell)


# `HydraConfig` is one per process: runs in threads (`trainer.fit` from several) each set it
# for their block, and what was there before the first of them comes back after the last.
_jobs = threading.Lock()
_held = {"blocks": 0, "before": None}


@contextmanager
def job_config(job: Any) -> Iterator[None]:
    """`HydraConfig` set to a composed config's `hydra` node for the block (`${hydra:...}`
    reads it), as Hydra's job sets it; what was set before the first such block (a user's
    own app's, or none) comes back once the last one ends. Concurrent blocks (runs in
    threads) each set their own as they start, when their `${hydra:...}` is read."""
    from hydra.core.hydra_config import HydraConfig

    with _jobs:
        if not _held["blocks"]:
            _held["before"] = HydraConfig.instance().cfg
        _held["blocks"] += 1
        HydraConfig.instance().set_config(job)
    try:
        yield
    finally:
        with _jobs:
            _held["blocks"] -= 1
            if not _held["blocks"]:
                HydraConfig.instance().cfg = _held["before"]
                _held["before"] = None


def run_job(job: Any, task: Callable[[], Any], configure_logging: bool) -> Any:
    """Hydra's own job runner (`hydra.core.utils.run_job`) on a config composed already:
    the run directory made, `hydra.job.chdir` and `hydra.job.env_set` honoured, the job's
    logging configured (`configure_logging`; else left as the process has it), the
    `hydra.callbacks` told of the job; never a second composition. `.hydra/` is not written
    here (the run records it once checked). Returns what `task` returned; raises what it
    raised."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.utils import JobStatus
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext

    _checked()
    job = job.copy()
    with read_write(job.hydra), open_dict(job.hydra):
        job.hydra.output_subdir = None
    # run_job reads no config (it is composed): the loader is there for its signature
    context = HydraContext(config_loader=ConfigLoaderImpl(ConfigSearchPathImpl()),
                           callbacks=Callbacks(job))
    found = hydra_run_job(lambda _cfg: task(), job, "hydra.run.dir", None, context,
                          configure_logging=configure_logging)
    if found.status == JobStatus.FAILED:
        # as the task raised it: `return_value` would first print Hydra's own "Error
        # executing job" line
        raise found._return_value
    return found._return_value
