"""The command line's run directory at a URL: `hydra.run.dir=URL` or `resume=URL`; and the
run at a URL that `trainer.evaluate` and `trainer.predict` read (`reading`).

`at_url` opens the run's place once, around the whole command, and yields it
(`trainer.rundir.remote.RunPlace`; None where no argument names a URL): it takes the URL's
lease (`trainer.rundir.lease`), makes the local mirror a copy of what the URL holds
(`trainer.rundir.remote.Mirror.pull`), and passes the mirror's path to Hydra and the run in
the URL's place. The command hands the place to the run (`trainer.run.prepare.startup.begin`,
then the run's owner), whose backups reach the URL through it (`RunPlace.committed`) and
whose messages name the URL through it (`RunPlace.shown`); at the command's end the place is
closed (`RunPlace.close`): the rest uploaded, the lease released, the local mirror removed
(`TRAINER_KEEP_SCRATCH=1` keeps it), and an error naming the mirror names the URL instead.

Only the chief writes: another worker of a cluster trains in a mirror of its own and never
touches the URL, as it writes no run directory on disk. Which task is the chief is the
cluster's one rule (`trainer.distribute.cluster.resolve_cluster`, `Cluster.is_chief`), from
the command line's `cluster.*` and the environment (`TF_CONFIG`, SLURM): the config is not
composed yet when the URL is replaced. A URL set in a config file is found when the config
is composed (`ConfiguredUrl`), and the command runs again with it named: `run_at_url`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from trainer.config.errors import ConfigError
from trainer.distribute.cluster import (
    DEFAULT_PORT_BASE,
    evaluator_task,
    has_evaluator_job,
    resolve_cluster,
)
from trainer.rundir.atomic import written  # the one writer, for predict's output too
from trainer.rundir.lease import Lease
from trainer.rundir.remote import (
    Mirror,
    RunPlace,
    check_scratch,
    check_url,
    explain,
    fetch,
    filesystem,
    is_url,
    scratch,
    upload,
)

KEYS = ("hydra.run.dir", "resume", "+resume")
__all__ = ["ConfiguredUrl", "RunPlace", "at_url", "deliver", "is_url", "reading",
           "run_at_url", "written"]
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


def run_at_url(argv: list[str], work: Callable[[RunPlace | None], T]) -> T:
    """`work(place)` inside `at_url(argv)`; where the composed config names a URL of its own
    (`ConfiguredUrl`), once more with `hydra.run.dir=URL` added to `argv`."""
    try:
        with at_url(argv) as place:
            return work(place)
    except ConfiguredUrl as found:
        argv.append(f"hydra.run.dir={found.url}")
        try:
            with at_url(argv) as place:
                return work(place)
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


def _cluster_given(argv: list[str]) -> dict[str, Any]:
    """The command line's `cluster.*` values (`workers`, `task_index`, `port_base`,
    `evaluator`), as Hydra's override parser reads them; one it cannot read is left to
    Hydra, which says why when it composes the config."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, found = OverridesParser.create(), {}
    for arg in argv:
        if not arg.lstrip("+").startswith("cluster."):
            continue
        try:
            override = parser.parse_override(arg)
            found[override.key_or_group.removeprefix("cluster.")] = override.value()
        except Exception:  # noqa: BLE001 - Hydra's own line, when it composes the config
            continue
    return found


def with_evaluator(argv: list[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether the command is one task of a cluster with an evaluator, or the evaluator:
    `cluster.evaluator` given, an `evaluator` job in `TF_CONFIG` (what `trainer.launch
    --evaluator` sets), or `TF_CONFIG`'s evaluator task."""
    environ = os.environ if environ is None else environ
    if _cluster_given(argv).get("evaluator") not in (None, ""):
        return True
    tf_config = environ.get("TF_CONFIG")
    return has_evaluator_job(tf_config) or evaluator_task(tf_config)


def is_chief(argv: list[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process writes the run directory: the chief of the cluster the command
    line's `cluster.*` and the environment describe (`resolve_cluster`, as the pre-flight
    resolves it; `Cluster.is_chief`), or a process of no cluster."""
    environ = os.environ if environ is None else environ
    given = _cluster_given(argv)
    # a value of the wrong type is the config check's to refuse, in its own line
    workers = given.get("workers") if isinstance(given.get("workers"), list) else []
    index, base = (given.get(key) if type(given.get(key)) is int else default
                   for key, default in (("task_index", 0), ("port_base", DEFAULT_PORT_BASE)))
    cluster = resolve_cluster(workers, index, environ.get("TF_CONFIG"), environ, base)
    return cluster is None or cluster.is_chief


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
def at_url(argv: list[str]) -> Iterator[RunPlace | None]:
    """Runs the block with `argv`'s URL (if any) replaced by its local mirror, in place.

    Yields:
        The run's place, the URL's mirror and lease (None: no URL in `argv`), closed when
        the block ends (`RunPlace.close`).

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
    place = _opened(url, is_chief(argv))
    saved, error = list(argv), None
    try:
        if place.role == "run":
            place.mirror.pull()
        for i, _ in found:
            key = argv[i].partition("=")[0]
            # `resume=` is compared between the workers at their rendezvous (the chief
            # alone reads it): every worker names the chief's mirror
            where = place.root if place.role == "run" or key == "hydra.run.dir" else scratch(
                url, "run")
            argv[i] = f"{key}={where}"
        yield place
    except BaseException as raised:
        error = raised
        raise
    finally:
        argv[:] = saved
        _close(place, error)


def _close(place: RunPlace, error: BaseException | None) -> None:
    """Closes the place; the error the command ends with names the URL, not the mirror."""
    try:
        place.close(error)
    except BaseException as failed:
        place.named(failed)
        raise
    finally:
        if error is not None:
            place.named(error)


def evaluator_refused(url: str) -> ConfigError:
    """The one line refusing an evaluator beside the workers with a run directory at a URL
    (the command line's tasks, and `TF_CONFIG`'s evaluator task alike)."""
    return ConfigError(f"an evaluator beside the workers reads the run directory as files the "
                       f"chief writes (a shared file system), not at a URL ({url}); use a "
                       "shared directory, or no evaluator")


def _opened(url: str, chief: bool) -> RunPlace:
    """The place of `url` for this process: the chief's mirror holds the URL's lease, taken
    once the store is found readable, and kept only where the store also lets it delete;
    another worker's mirror is its own, and never touches the URL."""
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
    return RunPlace(mirror.root, mirror, "run" if chief else "worker")


@contextmanager
def reading(run_dir: str | Path) -> Iterator[RunPlace]:
    """The place of the run to read, for the block: `run_dir` itself, or for a URL a local
    copy of its whole files (`trainer.rundir.remote.fetch`; no lease: reading never changes
    the URL), removed after it (`TRAINER_KEEP_SCRATCH=1` keeps it)."""
    place = fetch(str(run_dir)) if is_url(run_dir) else RunPlace(Path(run_dir), role="read")
    try:
        yield place
    finally:
        place.close()


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
