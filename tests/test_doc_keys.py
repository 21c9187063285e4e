"""Every config key the docs name exists: a key written as an override or a YAML line
(`optimizer.ema=true`, `checkpoint.test_with: best`) or alone in backticks (`optimizer.ema`)
in README.md and docs/*.md is a key of the composed config, under one of its group's
options (`model.name` is `model=keras_app`'s). The docs once named `optimizer.use_ema`,
which no config has."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, ListConfig

from trainer.config.compose import compose_from_args
from trainer.config.schema import config_dir, register_configs

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
KEY = r"[a-z_][a-z0-9_]*(?:\.[A-Za-z0-9_]+)+"
# `key.sub=` or `key.sub:` (not inside a longer name, a path or a URL), or `key.sub` alone
# in backticks. A leading `+` adds a key of the user's own (`+callbacks.mine._target_=`).
WRITTEN = re.compile(rf"(?<![\w./:+~-])({KEY})[=:]|`[~]?({KEY})(?:[=:][^`]*)?`")
# Alone in backticks these name Python objects as often as config keys (`model.fit`,
# `strategy.run`, `model.tflite`): checked only in the `=` and `:` forms.
OBJECTS = ("model", "strategy")
# Config groups whose options are listed (`logger=[mlflow]`) rather than chosen one at a time.
LISTS = ("callbacks", "logger")


def named_keys() -> dict[str, str]:
    """Each key the docs name -> where first (`file:line`)."""
    found = {}
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for match in WRITTEN.finditer(line):
                key = match.group(1) or match.group(2)
                if match.group(1) or key.split(".")[0] not in OBJECTS:
                    found.setdefault(key, f"{doc.relative_to(REPO)}:{number}")
    return found


def _flat(node, prefix: str) -> set[str]:
    keys = set()
    if isinstance(node, DictConfig):
        for name in node.keys():
            keys.add(f"{prefix}{name}")
            keys |= _flat(node._get_node(name), f"{prefix}{name}.")
    elif isinstance(node, ListConfig):
        for item in node:
            keys |= _flat(item, prefix)
    return keys


@cache
def default_keys() -> frozenset[str]:
    """Every key of the default composed config."""
    register_configs()
    return frozenset(_flat(compose_from_args([]), ""))


@cache
def group_keys(group: str) -> frozenset[str]:
    """Every key of the composed config under each option of `group` (none: not a group)."""
    keys: set[str] = set()
    for option in sorted((config_dir() / group).glob("*.yaml")):
        chosen = f"[{option.stem}]" if group in LISTS else option.stem
        keys |= _flat(compose_from_args([f"{group}={chosen}"]), "")
    return frozenset(keys)


def exists(key: str) -> bool:
    """Whether the config has `key`, by default or under an option of its group."""
    return key in default_keys() or key in group_keys(key.split(".")[0])


def _checked(key: str) -> bool:
    """Whether a name is one of the config's keys to check: its first part is a config key
    (`model.fit` is a method, `keras.io` a site); Hydra's own node is Hydra's, whose
    sweeper's and launcher's keys depend on the plugin chosen."""
    top = key.split(".")[0]
    return top != "hydra" and top in default_keys()


def test_every_config_key_the_docs_name_exists():
    named = named_keys()
    assert len(named) > 40  # the docs' keys were read
    missing = [f"{where}: {key}" for key, where in sorted(named.items(), key=lambda kv: kv[1])
               if _checked(key) and not exists(key)]
    assert missing == []


def test_a_key_no_config_has_is_found():
    assert exists("optimizer.ema") and exists("model.name")  # model=keras_app's
    assert not exists("optimizer.use_ema")
    assert WRITTEN.search("`optimizer.use_ema` (the evaluator keeps").group(2) == \
        "optimizer.use_ema"
    assert WRITTEN.search("pass checkpoint.test_with: best").group(1) == "checkpoint.test_with"
    assert WRITTEN.search("+callbacks.mine._target_=x") is None  # the user's own key
