"""Whether a failed cluster is started again, and after what pause: the launcher's decisions
(`python -m trainer.launch --max-restarts N`), pure, as torchrun's `--max-restarts` and Ray
Train's `FailureConfig(max_failures)` make them.

A restart stops every worker and starts the cluster again from the last complete backup
(the same run directory, new ports). Retried: a worker that died (SIGKILL, a crash; the others
then end with exit 4), a preempted or stopped run (75), a lost store (75). Never retried: a
configuration or data error (2: the same command fails the same way), the user's Ctrl-C or
SIGTERM to the launcher (130), a preemption notice the launcher itself received (its machine
is going away: the scheduler starts it again), and a run that fails again from the same
backup it failed from before (the same step failing twice: no restart will get past it).

Passed to every worker under `--max-restarts`, for the chief's summary (`trainer.run.end.summary`
reads them by these names): `RESTARTS` (how many
restarts so far) and `STEPS_AGAIN` (the training steps done twice: between each failure's
last backup and the step the chief had reached, where it said so). A chief that fails under
the launcher writes the step it reached to the file `PROGRESS` names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from trainer.config.errors import EXIT_CONFIG
from trainer.rundir.atomic import write_json
from trainer.rundir.layout import PROGRESS, noted_backup

__all__ = ["PROGRESS", "noted_backup"]  # with the decisions below, for the launcher

RESTARTS = "TRAINER_RESTARTS"
STEPS_AGAIN = "TRAINER_STEPS_AGAIN"
# The cluster's worker count at the first start, where a restart went on with fewer
# (`--min-workers`): the chief's summary says so.
WORKERS_AT_START = "TRAINER_WORKERS_AT_START"
# A worker ended by SIGKILL (its machine lost, the kernel's out-of-memory killer): gone for
# good where `--min-workers` lets the cluster go on without it.
GONE = (-9, 128 + 9)

EXIT_SIGINT = 130
NEVER_RETRIED = {EXIT_CONFIG: "a configuration or data error, which a restart repeats",
                 EXIT_SIGINT: "the launcher was asked to stop"}
# The first pause before a restart, doubling with each one up to the cap: a cluster whose
# store or peers are briefly gone gets time to come back, without waiting long at the first.
FIRST_PAUSE_S, MAX_PAUSE_S = 2.0, 60.0

_BACKUP = re.compile(r"ckpt-(\d+)-(\d+)$")


@dataclass(frozen=True)
class Failure:
    """One failed attempt: its exit code, and the newest complete backup it left (its
    directory name, `ckpt-<epoch>-<step>`; None for none, or one the launcher cannot see)."""

    code: int
    backup: str | None


def restart_refusal(failure: Failure, previous: Failure | None, done: int, limit: int,
                    noticed: bool = False) -> str | None:
    """Why a failed attempt is not started again; None where it is.

    Args:
        failure: the attempt that just failed.
        previous: the attempt that failed before it (None: this is the first failure).
        done: restarts already made.
        limit: `--max-restarts`.
        noticed: the launcher itself received a preemption notice (SIGUSR1).

    Returns:
        A phrase for the launcher's line, or None to restart.
    """
    if failure.code in NEVER_RETRIED:
        return NEVER_RETRIED[failure.code]
    if noticed:
        return "the launcher's machine is being preempted; start it again there"
    if done >= limit:
        return f"{limit} restart{'s' * (limit != 1)} used (--max-restarts {limit})"
    if previous is not None and failure.backup == previous.backup:
        where = failure.backup or "the start, no backup written"
        return f"it failed twice from the same backup ({where}); a restart cannot fix it"
    return None


def restart_pause(restart: int, first: float = FIRST_PAUSE_S, cap: float = MAX_PAUSE_S
                  ) -> float:
    """Seconds to wait before restart number `restart` (1, 2, ...): `first`, doubling, up to
    `cap`."""
    return min(first * 2 ** (max(restart, 1) - 1), cap)


def newest_backup(run_dir: Path) -> str | None:
    """The name of the newest complete backup in a local run directory; None for none."""
    found = [p.name for p in (run_dir / "backup").glob("ckpt-*") if _BACKUP.match(p.name)]
    return max(found) if found else None


def steps_again(backup: str | None, progress: Path) -> int:
    """The steps trained past `backup` that a restart from it trains again, from the chief's
    `progress` file (`{"epoch", "step", "steps_per_epoch"}`); 0 where either is unknown."""
    try:
        reached = json.loads(progress.read_text())
    except (OSError, ValueError):
        return 0
    found = _BACKUP.match(backup or "ckpt-0-0")
    per_epoch = int(reached["steps_per_epoch"])
    since = (int(reached["epoch"]) * per_epoch + int(reached["step"])
             - int(found.group(1)) * per_epoch - int(found.group(2)))
    return max(since, 0)


def write_progress(path: str, epoch: int, step: int, steps_per_epoch: int) -> None:
    """Writes where a failing chief got to (`steps_again` reads it), for its launcher."""
    write_json(Path(path), {"epoch": epoch, "step": step, "steps_per_epoch": steps_per_epoch})


def requeue_left(max_restarts: int, environ: dict[str, str]) -> bool:
    """Whether a cluster a scheduler launched (SLURM, Kubernetes) may be started again:
    `cluster.max_restarts` above the restarts made (SLURM's `SLURM_RESTART_COUNT`; 0 where
    nothing counts them, as in a Kubernetes Job, whose `backoffLimit` is the bound)."""
    try:
        made = int(environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        made = 0
    return max_restarts > made


def workers_left(codes: list[int | None], workers: int, min_workers: int) -> int:
    """How many workers the next start has: without the ones `GONE` (`codes`, each worker's
    exit code, the evaluator's left out), where at least `min_workers` remain; else all
    `workers` (none is left out below the floor)."""
    left = workers - sum(1 for code in codes[:workers] if code in GONE)
    return left if min_workers <= left < workers else workers
