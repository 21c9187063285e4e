"""Hydra 1.3's internals that trainer composes with: the command line's argument parser,
the config search path of an app, and the config loader (what `@hydra.main` runs before a
job, without running one). No TensorFlow; Hydra is imported on first use, as composing
needs it."""

from __future__ import annotations

import argparse
from typing import Any

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
