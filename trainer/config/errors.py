"""Errors that end a run, each with its exit code; importable without TensorFlow."""

from __future__ import annotations

EXIT_CONFIG = 2
EXIT_DIVERGED = 3
EXIT_WORKER_LOST = 4  # a peer worker crashed or timed out; rerun every worker to resume
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: stopped cleanly; rerun the same command to resume


class ConfigError(ValueError):
    """A configuration the run cannot start with; reported as one line with exit code 2."""

    exit_code = EXIT_CONFIG


class NothingToDo(Exception):  # noqa: N818 - an outcome, not a failure
    """A resume of a finished run that asks for nothing more: one line, exit 0, nothing
    written."""

    exit_code = 0


class Interrupted(Exception):
    """Training stopped on SIGTERM or SIGINT after writing a backup; rerun to resume."""

    exit_code = EXIT_INTERRUPTED


class Diverged(RuntimeError):
    """The loss became NaN or infinite; the last good backup and checkpoints are kept."""

    exit_code = EXIT_DIVERGED


class WorkerLost(RuntimeError):
    """A peer of a multi-worker run crashed, vanished or timed out; the chief's backup is kept."""

    exit_code = EXIT_WORKER_LOST
