"""Errors from composing or checking a config, rendered as the one line a user sees."""

from __future__ import annotations

import re

from hydra.errors import MissingConfigException, OverrideParseException

from trainer.config.overrides import split
from trainer.config.schema import config_dir


def one_line(error: BaseException) -> str:
    """Renders a config error as one line naming the bad value and what is valid."""
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, name = error.missing_cfg_file.rpartition("/")
        if group and error.options is not None:
            return f"unknown {group} {name!r}; available: {', '.join(error.options)}"
    # an item of a list of options (logger=[csv,mlfow]): Hydra names it but not the options
    missing = re.search(r"Could not load '([\w/]+)/(\w+)'", str(error))
    if missing and (config_dir() / missing.group(1)).is_dir():
        options = sorted(p.stem for p in (config_dir() / missing.group(1)).glob("*.yaml"))
        return (f"unknown {missing.group(1)} {missing.group(2)!r}; available: "
                f"{', '.join(options)}")
    if isinstance(error, OverrideParseException):
        hint = quoting_hint(error.override or "")
        if hint:
            return hint
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        text = "; ".join(lines[:2]) or "cannot parse"
        if error.override and error.override not in text:
            text = f"cannot parse the override {error.override!r}: {text}"
        return f"{text} (overrides are key=value, e.g. epochs=3 devices=[0,1])"
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    if text.endswith("while composing config:") and len(lines) > 1:
        # Hydra's first line says where; the next says what (Key 'x' not in 'Config')
        text = f"{text[:-1]} {lines[1]}"
    cause = error.__cause__
    if cause is not None and str(cause).strip():
        text = f"{text.rstrip('.')}: {str(cause).strip().splitlines()[0]}"
    return text


# What Hydra's override grammar takes in a value outside quotes (ASCII letters, digits, a few
# signs, spaces), and its own list, dict and sweep signs.
UNQUOTED = re.compile(r"[A-Za-z0-9_\-/\\+.$%*@?|: \t\[\]{},=]")


def quoting_hint(override: str) -> str | None:
    """The one line for an override whose unquoted value holds characters Hydra's grammar
    takes only inside quotes (a path with `é`, `(`, `#`), with the override quoted; None
    where quoting is not the cure."""
    key, value = split(override)
    if not value or value[0] in "'\"":
        return None
    odd = sorted({c for c in value if not UNQUOTED.fullmatch(c)}, key=value.index)
    if not odd or "'" in value and '"' in value:
        return None
    quote = "'" if "'" not in value else '"'
    quoted = f"{key}={quote}{value}{quote}"
    shell = f" (on a shell, quote it again: \"{quoted}\")" if quote == "'" else ""
    return (f"cannot parse the override {override!r}: {' '.join(odd)} may appear in a value "
            f"only inside quotes; quote the value: {quoted}{shell}")
