"""The command line's run directory at a URL: `hydra.run.dir=URL` or `resume=URL`; and the
run at a URL that `trainer.evaluate` and `trainer.predict` read (`readable`).

`at_url` runs around the whole command: where an argument names a URL, it takes the URL's
lease (`trainer.rundir.lease`), makes the local mirror a copy of what the URL holds
(`trainer.rundir.remote.Mirror.pull`), and passes the mirror's path to Hydra and the run in
the URL's place; every backup then reaches the URL (`committed`), and so does the rest at
the command's end, before the lease is released. Only the chief writes: another worker of a
cluster (`cluster.task_index` above 0, a `TF_CONFIG` task that is not the chief, a SLURM
task other than 0) trains in a mirror of its own and never touches the URL, as it writes no
run directory on disk. (Told from the command line and the environment: the config is not
composed yet when the URL is replaced; a URL set in a config file is found when the
config is composed, `ConfiguredUrl`, and the command runs again with it: `run_at_url`.)
When the command ends, the local mirror is removed (`TRAINER_KEEP_SCRATCH=1` keeps it), and
an error naming the mirror names the URL instead.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from trainer.config.errors import ConfigError
from trainer.distribute.cluster import has_evaluator_job
from trainer.rundir.atomic import written  # the one writer, for predict's output too
from trainer.rundir.lease import Lease
from trainer.rundir.remote import (
    Mirror,
    check_scratch,
    check_url,
    explain,
    fetch,
    filesystem,
    is_url,
    keep_scratch,
    register,
    scratch,
    shown,
    unregister,
    upload,
)

KEYS = ("hydra.run.dir", "resume", "+resume")
__all__ = ["ConfiguredUrl", "at_url", "deliver", "is_url", "readable", "reading", "run_at_url",
           "shown", "written"]
T = TypeVar("T")


class ConfiguredUrl(Exception):  # noqa: N818 - a control-flow signal, caught by run_at_url
    """The composed config puts the run directory at a URL that the command line did not
    name (a config file's `hydra.run.dir`): the command runs again with it named."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


def check_configured(run_dir: str | Path | None) -> None:
    """Raises `ConfiguredUrl` where the composed run directory is a URL (the command line's
    own URL would have been replaced by its mirror before the config was composed)."""
    if run_dir is not None and (is_url(run_dir) or "://" in str(run_dir)):
        check_url(str(run_dir))
        raise ConfiguredUrl(str(run_dir))


def run_at_url(argv: list[str], work: Callable[[Mirror | None], T]) -> T:
    """`work(mirror)` inside `at_url(argv)`; where the composed config names a URL of its own
    (`ConfiguredUrl`), once more with `hydra.run.dir=URL` added to `argv`."""
    try:
        with at_url(argv) as mirror:
            return work(mirror)
    except ConfiguredUrl as found:
        argv.append(f"hydra.run.dir={found.url}")
        try:
            with at_url(argv) as mirror:
                return work(mirror)
        finally:
            argv.remove(f"hydra.run.dir={found.url}")


def urls_in(argv: list[str]) -> list[tuple[int, str]]:
    """The positions and URLs of `hydra.run.dir=URL` and `resume=URL` in `argv`."""
    found = []
    for i, arg in enumerate(argv):
        key, _, value = arg.partition("=")
        if key in KEYS:
            check_url(value.strip("'\""), key.lstrip("+"))
            if is_url(value.strip("'\"")):
                found.append((i, value.strip("'\"")))
    return found


def with_evaluator(argv: list[str], environ: dict[str, str] | None = None) -> bool:
    """Whether the command is one task of a cluster with an evaluator: `cluster.evaluator`
    given, or an `evaluator` job in `TF_CONFIG` (what `trainer.launch --evaluator` sets)."""
    environ = os.environ if environ is None else environ
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "cluster.evaluator" and value.strip("'\" ") not in ("", "null"):
            return True
    return has_evaluator_job(environ.get("TF_CONFIG"))


def is_chief(argv: list[str], environ: dict[str, str] | None = None) -> bool:
    """Whether this process writes the run directory: not another worker of a cluster."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_PROCID", "0").strip() not in ("", "0"):
        return False  # a SLURM step's task other than 0 (the chief)
    for arg in argv:
        key, _, value = arg.partition("=")
        if key == "cluster.task_index" and value.strip().isdigit() and int(value) > 0:
            return False
    try:
        described = json.loads(environ.get("TF_CONFIG") or "{}")
        task, cluster = described.get("task") or {}, described.get("cluster") or {}
    except (ValueError, AttributeError):
        return True
    kind, index = task.get("type"), task.get("index", 0)
    if kind is None or kind == "chief":
        return True
    return kind == "worker" and index == 0 and "chief" not in cluster


def _the_url(found: list[tuple[int, str]]) -> str:
    urls = {url.rstrip("/") for _, url in found}
    if len(urls) > 1:
        raise ConfigError(f"one run directory at a URL per command; received {sorted(urls)}")
    url = urls.pop()
    if "${" in url:  # replaced before Hydra composes: its resolvers never see it
        raise ConfigError(f"a run directory at a URL is taken as written, without Hydra's "
                          f"interpolations; spell it out (e.g. with the shell's $(date)); "
                          f"received {url}")
    return url


@contextmanager
def at_url(argv: list[str]) -> Iterator[Mirror | None]:
    """Runs the block with `argv`'s URL (if any) replaced by its local mirror, in place.

    Yields:
        The mirror (None: no URL in `argv`).

    Raises:
        ConfigError: another run holds the URL, or its storage cannot be used (one line).
        Interrupted: the URL could not be written at the end (its last backup is kept).
    """
    swept = [arg for arg in argv if arg.startswith("hydra.sweep.dir=")
             and is_url(arg.partition("=")[2].strip("'\""))]
    if swept:
        raise ConfigError(f"a sweep's directory cannot be a URL yet ({swept[0]}); sweep into "
                          "a local directory, or run each job with hydra.run.dir=URL")
    found = urls_in(argv)
    if not found:
        yield None
        return
    url = _the_url(found)
    if with_evaluator(argv):
        raise evaluator_refused(url)
    chief = is_chief(argv)
    mirror = _opened(url, chief)
    saved = list(argv)
    try:
        if chief:
            mirror.pull()
        for i, _ in found:
            key = argv[i].partition("=")[0]
            # `resume=` is compared between the workers at their rendezvous (the chief
            # alone reads it): every worker names the chief's mirror
            place = mirror.root if chief or key == "hydra.run.dir" else scratch(url, "run")
            argv[i] = f"{key}={place}"
        register(mirror)
        yield mirror
        if chief:
            mirror.push()
    except BaseException as error:
        if chief:
            _push_after_failure(mirror)
        _named_by_url(error, mirror)
        raise
    finally:
        unregister(mirror)
        argv[:] = saved
        if mirror.lease is not None:
            mirror.lease.release(quiet=mirror.broken)
        if not chief or not keep_scratch():  # the URL holds the run: nothing local is left
            shutil.rmtree(mirror.root, ignore_errors=True)


def evaluator_refused(url: str) -> ConfigError:
    """The one line refusing an evaluator beside the workers with a run directory at a URL
    (the command line's tasks, and `TF_CONFIG`'s evaluator task alike)."""
    return ConfigError(f"an evaluator beside the workers reads the run directory as files the "
                       f"chief writes (a shared file system), not at a URL ({url}); use a "
                       "shared directory, or no evaluator")


def _opened(url: str, chief: bool) -> Mirror:
    """The mirror of `url` for this process; the chief's holds the URL's lease, taken once
    the store is found readable, and keeps it only where the store also lets it delete."""
    fs, path = filesystem(url)
    check_scratch()
    mirror = Mirror(url, scratch(url, "run" if chief else f"worker-{os.getpid()}"), fs, path)
    if chief:
        mirror.lease = Lease(fs, path, url)
        mirror.listing()  # a missing bucket or no credentials: said before any lease
        mirror.lease.take()
        try:
            mirror.check_deletes()
        except ConfigError:
            mirror.lease.release(quiet=True)
            raise
    return mirror


def _named_by_url(error: BaseException, mirror: Mirror) -> None:
    """An error's message names the URL where it names the mirror (removed at the end)."""
    if error.args and isinstance(error.args[0], str) and str(mirror.root) in error.args[0]:
        error.args = (error.args[0].replace(str(mirror.root), mirror.url), *error.args[1:])


def _push_after_failure(mirror: Mirror) -> None:
    """What a failed run wrote (its log, a backup a signal's stop wrote) reaches the URL
    where it can; a URL that cannot be written is said in one line, and the run's own error
    stays the one it ends with."""
    try:
        mirror.push()  # nothing where a push failed already (the run's own error)
    except Exception as error:  # noqa: BLE001 - the run's own error is what it reports
        print(f"warning: {error}", file=sys.stderr, flush=True)


def readable(run_dir: str | Path) -> Path:
    """The run directory to read: `run_dir` itself, or for a URL a local copy of its whole
    files (`trainer.rundir.remote.fetch`; no lease: reading never changes the URL)."""
    return fetch(str(run_dir)) if is_url(run_dir) else Path(run_dir)


@contextmanager
def reading(run_dir: str | Path) -> Iterator[Path]:
    """`readable(run_dir)` for the block; a URL's local copy is removed after it
    (`TRAINER_KEEP_SCRATCH=1` keeps it)."""
    local = readable(run_dir)
    try:
        yield local
    finally:
        if is_url(run_dir) and not keep_scratch():
            shutil.rmtree(local, ignore_errors=True)


def checkpoints_at(url: str, names: tuple[str, ...]) -> dict[str, str]:
    """The URLs of the checkpoints (`best`, `last`, ...) a run at `url` holds, by name."""
    fs, path = filesystem(url)
    try:
        return {name: f"{url.rstrip('/')}/checkpoints/{name}.keras" for name in names
                if fs.exists(f"{path}/checkpoints/{name}.keras")}
    except Exception as error:  # noqa: BLE001 - every storage failure is one line
        raise ConfigError(explain(error, url)) from None


@contextmanager
def output_at(output: str | Path, overwrite: bool) -> Iterator[Path]:
    """The local file to write an output to: `output` itself, or for a URL a file in a
    temporary folder, put at the URL (whole, one PUT) once the block ends.

    Raises:
        ConfigError: the URL exists and `overwrite` is false, or its store cannot be used.
    """
    if not is_url(output):
        yield Path(output)
        return
    url = str(output)
    check_url(url, "output")
    fs, path = filesystem(url)
    try:
        there = fs.exists(path)
    except Exception as error:  # noqa: BLE001 - every storage failure is one line
        raise ConfigError(explain(error, url)) from None
    if there and not overwrite:
        raise ConfigError(f"output={url} exists; pass overwrite=true to replace it, or name "
                          "another output=")
    with tempfile.TemporaryDirectory(prefix="trainer-output-") as folder:
        local = Path(folder) / Path(path).name
        yield local
        if local.is_file():
            upload(url.rsplit("/", 1)[0], local, Path(path).name)


def deliver(run_dir: str | Path, local: Path, name: str) -> str:
    """A file written into the local copy of a run at a URL (`predictions.csv`) put at
    `URL/name`; returns where it is (the local path for a local run)."""
    return upload(str(run_dir), local, name) if is_url(run_dir) else str(local)
