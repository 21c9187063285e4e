"""The run's place, opened once from the composed config, and the places of what a
finished run is read from and an output written to.

`opened` is the pre-flight's first step, for the command line and `trainer.fit` alike: from
the composed config (`hydra.run.dir`, `resume`: given on the command line, by a config file,
or by `fit(run_dir=)`), it opens the run's place (`trainer.rundir.remote.RunPlace`) and
hands on the run as it is to run there. A local directory is its own place, opened by the
pre-flight with its lock. A URL is checked (one line for a malformed one or a store that
keeps nothing), its lease taken (`trainer.rundir.lease`), its store probed for deletes, and
its local mirror made a copy of what it holds (`trainer.rundir.remote.Mirror.pull`); the run
is handed on with the mirror in the URL's place, so the rules of a local run directory run
on it unchanged. The run's owner holds the place: its backups reach the URL through it
(`RunPlace.committed`), its messages name the URL (`RunPlace.shown`). When the block ends the
place closes (`RunPlace.close`): the rest uploaded, the lease released, the local mirror
removed (`TRAINER_KEEP_SCRATCH=1` keeps it), and an error naming the mirror names the URL.

Only the chief writes: another worker of a cluster trains in a mirror of its own and never
touches the URL. Which task is the chief is the cluster's one rule, read from the composed
config's `cluster` node and the environment (`trainer.distribute.cluster.cluster_of_config`,
`Cluster.is_chief`), as the pre-flight reads it. An evaluator beside the workers reads the
chief's files, so a run at a URL with one is refused here, once (`evaluator_refused`).

A decide module: no TensorFlow.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, open_dict
from omegaconf.errors import InterpolationResolutionError

from trainer.config.compose import Composed
from trainer.config.errors import ConfigError
from trainer.distribute.cluster import cluster_of_config, evaluator_task
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

__all__ = ["RunPlace", "deliver", "is_url", "opened", "reading", "written"]
# The config's keys that name a run directory: `hydra.run.dir` (Composed.logs) and `resume`.
KEYS = ("hydra.run.dir", "resume")


def urls_of(run: Composed) -> dict[str, str]:
    """The run directories at a URL the composed config names, by key, each checked
    (`check_url`: a malformed URL, or a store that keeps nothing, is one line)."""
    try:
        resume = run.cfg.get("resume")
    except InterpolationResolutionError:
        resume = None  # it reads the running job (`${hydra:...}`): no URL of its own
    found = {}
    for key, value in zip(KEYS, (run.logs, resume), strict=True):
        if value is None:
            continue
        check_url(str(value), key)
        if is_url(value):
            found[key] = str(value).rstrip("/")
    if len(set(found.values())) > 1:
        raise ConfigError(f"one run directory at a URL per command; received "
                          f"{sorted(set(found.values()))}")
    return found


@contextmanager
def opened(run: Composed, environ: Mapping[str, str] | None = None
           ) -> Iterator[tuple[Composed, RunPlace | None]]:
    """Opens the place of the run `run` describes, for the block.

    Args:
        run: the composed config (`trainer.config.compose.composed`).
        environ: the environment that describes a cluster (`TF_CONFIG`, SLURM's).

    Yields:
        `(run, place)`: the run as it is to run (a URL's mirror in the URL's place), and
        the place at a URL (None: the run directory is local, and the pre-flight opens it
        with its lock).

    Raises:
        ConfigError: a malformed URL, an evaluator beside the workers, another run holding
            the URL, or storage that cannot be used (one line).
        Interrupted: the URL could not be written at the end (its last backup is kept).
    """
    environ = os.environ if environ is None else environ
    found = urls_of(run)
    if not found:
        yield run, None
        return
    url = next(iter(found.values()))
    place = _opened(url, writes_url(run.cfg, url, environ))
    error = None
    try:
        if place.role == "run":
            place.mirror.pull()
        yield _there(run, found, place), place
    except BaseException as raised:
        error = raised
        raise
    finally:
        _close(place, error)


def writes_url(cfg: DictConfig, url: str, environ: Mapping[str, str]) -> bool:
    """Whether this process writes the run directory at `url`: the chief of the cluster the
    composed config's `cluster` node and the environment describe (the cluster's one rule,
    `cluster_of_config`, as the pre-flight resolves it: `Cluster.is_chief`), or a process of
    no cluster.

    Raises:
        ConfigError: an evaluator validates beside the workers (`cluster.evaluator`,
            `TF_CONFIG`'s evaluator job), or this process is that evaluator: it reads the
            chief's files, which a URL does not give it (`evaluator_refused`).
    """
    if evaluator_task(environ.get("TF_CONFIG")):
        raise evaluator_refused(url)
    cluster = cluster_of_config(cfg.cluster, environ)
    if cluster is not None and cluster.evaluator is not None:
        raise evaluator_refused(url)
    return cluster is None or cluster.is_chief


def _there(run: Composed, found: dict[str, str], place: RunPlace) -> Composed:
    """`run` with its URLs replaced by the local directories it runs in: the place's mirror;
    for another worker's `resume=`, the chief's mirror, which the workers compare at their
    rendezvous (the chief alone reads it)."""
    there = run.at(str(place.root)) if "hydra.run.dir" in found else run
    if "resume" not in found:
        return there
    cfg = run.cfg.copy()
    with open_dict(cfg):
        cfg.resume = str(place.root if place.role == "run" else scratch(found["resume"], "run"))
    return replace(there, cfg=cfg)


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
        mirror.check_deletes()  # before the lease: a store refusing deletes would keep it
        mirror.lease.take()
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
