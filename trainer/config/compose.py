"""Composing a config as the command line would, without running or writing anything.

Used by the command line's pre-flight (before Hydra writes `.hydra/` into a run directory)
and by the Python API (`trainer.fit`), so both see the same config from the same arguments:
the same schema, the same search path, a `--config-dir` of the user's in front of it.
"""

from __future__ import annotations

import os

from hydra.errors import (
    ConfigCompositionException,
    OverrideParseException,
    SearchPathException,
)
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from trainer.config.errors import ConfigError
from trainer.config.schema import config_dir

# Errors of a config that cannot be composed or checked: one line each, exit code 2.
KNOWN_ERRORS = (ConfigError, ConfigCompositionException, OverrideParseException,
                SearchPathException, OmegaConfBaseException)


def compose_from_args(args: list[str]) -> DictConfig | None:
    """The config (with its `hydra` node) these arguments would run, composed as Hydra
    composes it but without running anything or writing anything; None for commands that
    run no single job (`-m`, `--cfg`, `--help`, ...)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path, get_args_parser
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    parsed = get_args_parser().parse_args(args)
    if (parsed.cfg or parsed.help or parsed.hydra_help or parsed.info
            or parsed.shell_completion or parsed.experimental_rerun):
        return None
    if parsed.multirun:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        # What every job shares: the sweep's own values are each job's to check.
        shared = OverridesParser.create().parse_overrides(parsed.overrides)
        parsed.overrides = [o.input_line for o in shared if not o.is_sweep_override()]
    search = create_config_search_path(f"file://{config_dir()}")
    if parsed.config_dir is not None:
        search.prepend(provider="command-line",
                       path=f"file://{os.path.abspath(parsed.config_dir)}",
                       anchor=SearchPathQuery(provider="schema"))
    try:
        hydra_app = Hydra.create_main_hydra2(task_name="trainer", config_search_path=search)
        return hydra_app.compose_config(parsed.config_name or "config", parsed.overrides,
                                        run_mode=RunMode.MULTIRUN if parsed.multirun
                                        else RunMode.RUN)
    except ValueError as error:  # Hydra's own for some malformed overrides, e.g. `=5`
        if isinstance(error, KNOWN_ERRORS):
            raise
        raise ConfigError(f"cannot use the overrides {' '.join(parsed.overrides)}: "
                          f"{str(error).strip().splitlines()[0]} (overrides are key=value, "
                          "e.g. epochs=3)") from None
    finally:
        GlobalHydra.instance().clear()
