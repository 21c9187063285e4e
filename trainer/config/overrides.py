"""Override text (`key=value`, `+key=value`, `~key`), read in one place.

The command line's and `trainer.fit`'s overrides are composed by Hydra, which alone decides
what they mean; what trainer reads of their text before or beside a composition (which keys
a call sets, the launcher's per-worker run directory, a sweep's swept values in its table)
is read here: the key is the text before the first `=`, without Hydra's `+`, `++` or `~`
prefix, the value the text after it. Nothing else in the package splits an override.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MULTIRUN = ("-m", "--multirun")


def split(override: str) -> tuple[str, str | None]:
    """The text before the first `=` as typed (its `+` or `~` kept), and the value after it
    (None where there is no `=`)."""
    text = str(override)
    key, equals, found = text.partition("=")
    return key, found if equals else None


def key_of(override: str) -> str:
    """`batch.per_replica` of `+batch.per_replica=64` (or of `~batch.per_replica`)."""
    return split(override)[0].lstrip("+~").strip()


def value_of(override: str) -> str | None:
    """`64` of `batch.per_replica=64`; None where the override has no `=` (`~key`)."""
    return split(override)[1]


def pairs(overrides: Iterable[str]) -> dict[str, str]:
    """`{key: value}` of the overrides that have a value, the last of equal keys winning
    (as Hydra takes it)."""
    return {key_of(o): value_of(o) for o in overrides if value_of(o) is not None}


def value(overrides: Sequence[str], key: str) -> str | None:
    """The value the overrides give `key` (the last one), or None."""
    return pairs(overrides).get(key)


def sets(overrides: Iterable[str], *keys: str) -> bool:
    """Whether an override sets one of `keys` or a key below one (`dataset` covers
    `dataset.cache`)."""
    return any(key_of(o) == k or key_of(o).startswith(f"{k}.") for o in overrides for k in keys)


def without(overrides: Iterable[str], *keys: str) -> list[str]:
    """The overrides, less those that set one of `keys` (or a key below one)."""
    return [o for o in overrides if not sets([o], *keys)]


def under(overrides: Iterable[str], prefix: str) -> list[str]:
    """The overrides whose key is below `prefix` (`cluster` gives `cluster.workers=...`)."""
    return [o for o in overrides if key_of(o).startswith(f"{prefix}.")]


def is_multirun(args: Iterable[str]) -> bool:
    """Whether a command line asks for a sweep (`-m`)."""
    return any(a in MULTIRUN for a in args)
