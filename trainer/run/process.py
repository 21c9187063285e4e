"""The process's owner: TensorFlow's log policy and quiet start (then an entry point's
checked run: `start_run`), signals at start-up, and
the exit codes (2 bad input, 3 diverged, 4 a worker lost, 75 interrupted, 130 Ctrl-C) with the
one line each prints. The entry points (`python -m trainer`, `.evaluate`, `.predict`, the
Python API) parse, dispatch to this module and to the run, and print one line.

TensorFlow's start-up lines are kept out of a normal run's output.

Importing TensorFlow and looking for GPUs prints C++ log lines straight to file descriptor 2,
before Python's logging exists: "All log messages before absl::InitializeLog() ...", "Could
not find cuda drivers", "failed call to cuInit: ... CUDA error" on every machine without a
GPU, and the CPU feature notice. None is something a user can act on, and the cuInit one
reads as a failure. `tensorflow_started` runs the import and the GPU lookup through
`trainer.internals.tf_start.stderr_filtered`, which writes back every line that is not one
of these known notices, so anything unexpected still shows. `TRAINER_TF_LOGS=1` turns the
filter off.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, NoReturn

from trainer.config.compose import KNOWN_ERRORS
from trainer.config.errors import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    Diverged,
    Interrupted,
    NothingToDo,
    WorkerLost,
)
from trainer.config.messages import one_line
from trainer.internals.tf_start import SWITCH, optional_parts_deferred, stderr_filtered
from trainer.rundir.remote import RunPlace
from trainer.track.sweep import TrialFailed


def tensorflow_started() -> None:
    """Imports TensorFlow and Keras (their optional parts on first use: `optional_parts_deferred`)
    and lists the GPUs (where CUDA's notices come from), quietly, with the garbage collector
    paused (`collector_paused`)."""
    loud = os.environ.get(SWITCH) == "1"
    with collector_paused(), nullcontext() if loud else stderr_filtered(), \
            optional_parts_deferred():
        import keras  # noqa: F401
        import tensorflow as tf

        if not loud:
            tf.config.list_physical_devices("GPU")
        settled()


@contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection while the block runs. Importing TensorFlow and Keras makes
    about a million objects that live as long as the process, and every collection the
    allocations trigger meanwhile walks the ones made before: `import keras` took 4.4-5.5 s
    of CPU with the collector on, 3.2-3.6 s with it frozen after the import, 2.6-3.2 s with
    it paused during the import (2 cores, 3 runs each). In a process of trainer's own,
    `settled` freezes them inside the block, so no collection ever walks them; in a user's
    process (`trainer.fit` where TensorFlow was not imported yet) the collector walks them
    once, after the block, instead of at every threshold during the import."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def settled(ending: bool = False) -> None:
    """In a process of trainer's own (`python -m trainer`, `trainer.fit`'s child), moves
    every object alive now (TensorFlow's and Keras's modules: about a million) out of the
    garbage collector's reach (`gc.freeze`): they live as long as the process, yet each
    full collection walked them all again, during the run and three times more as the
    interpreter shut down (1.2 s of CPU at every exit on 2 cores, for nothing). Called once
    TensorFlow is imported, and again as the process ends (`ending`). Never in a user's
    process (`trainer.fit` in a notebook, a test): there it would also freeze the garbage
    of an earlier run, never to be freed."""
    global _frozen
    if _own_objects and (ending or not _frozen):
        _frozen = True
        gc.freeze()


_frozen = False
_own_objects = False  # this process is trainer's own (`own_the_objects`)


def own_the_objects() -> None:
    """Says no user's objects live in this process beside trainer's (`settled` may freeze)."""
    global _own_objects
    _own_objects = True


def quiet_logs() -> None:
    """TensorFlow's C++ INFO and WARNING lines (tf.distribute's notes on its own datasets, an
    abandoned prefetch) drown the progress and ask nothing of the user; errors still show,
    and `TRAINER_TF_LOGS=1` shows everything. Set before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if os.environ.get(SWITCH) == "1" else "2")


# The shell's convention for a process ended by Ctrl-C.
EXIT_CTRL_C = 130
# HYDRA_FULL_ERROR=1 as the user set it (the command line sets it for Hydra's own use).
USER_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"


class Terminated(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt
    """SIGTERM (or a preemption notice, SIGUSR1) outside the training steps (start-up, the
    summary)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum


# Ask for a stop as SIGTERM does: SIGUSR1 is the notice SLURM sends before a preemption
# (`--signal=B:USR1@120`); its default action would end the process with no line.
TERMINATING = (signal.SIGTERM, signal.SIGUSR1)


# Signals received outside the training steps. A library may catch what a signal raises (an
# import that tries alternatives under `except BaseException`), so they are checked again
# once TensorFlow has started: a Ctrl-C at start-up is never silently lost.
_signalled: list[int] = []


def _on_sigterm(signum: int, frame: Any) -> None:
    _signalled.append(signum)
    raise Terminated(signum)


def _on_sigint(signum: int, frame: Any) -> None:
    _signalled.append(signum)
    raise KeyboardInterrupt


def raise_if_signalled() -> None:
    """Raises again a start-up signal whose exception something swallowed."""
    for signum in TERMINATING:
        if signum in _signalled:
            raise Terminated(signum)
    if signal.SIGINT in _signalled:
        raise KeyboardInterrupt


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM, SIGUSR1 and Ctrl-C raise (`Terminated`, `KeyboardInterrupt`) while the block
    runs, outside the training steps, which route them to a clean stop of their own; the
    previous handlers come back after. Outside the main thread nothing changes."""
    _signalled.clear()
    try:
        previous = {s: signal.signal(s, _on_sigterm) for s in TERMINATING}
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _signalled.clear()  # a signal of this block is this block's: never a later run's


def start_tensorflow() -> None:
    """Starts TensorFlow quietly, then raises a signal that came during its start-up."""
    tensorflow_started()
    raise_if_signalled()


def start_run(checked: Any, callbacks: Sequence[Any] = ()) -> Any:
    """Starts a checked run from an entry point (`trainer.run.prepare.startup`'s `start`):
    TensorFlow first, quietly, then the run (`trainer.run.train.start`).

    Returns:
        The run's summary, or what a tuner found.
    """
    start_tensorflow()
    # an entry point's import: the run imports TensorFlow, started quietly by now
    from trainer.run.train import start

    return start(checked, callbacks)


def exit_code(error: BaseException) -> tuple[str, int] | None:
    """The one line a command prints for an error that ends it, and its exit code; None for
    an error no line describes (a bug: its traceback shows)."""
    if isinstance(error, NothingToDo):
        return f"finished: {error}", error.exit_code
    if isinstance(error, (KeyboardInterrupt, Terminated)):
        what = ("Ctrl-C" if isinstance(error, KeyboardInterrupt)
                else signal.Signals(error.signum).name)
        return (f"interrupted: {what} outside the training steps; rerun the same command to "
                "start again, or to finish from the last backup",
                EXIT_CTRL_C if isinstance(error, KeyboardInterrupt) else EXIT_INTERRUPTED)
    if isinstance(error, (Interrupted, Diverged, WorkerLost)):
        word = "interrupted" if isinstance(error, Interrupted) else "error"
        return f"{word}: {error}", error.exit_code
    if isinstance(error, TrialFailed):
        # A sweeper that stops at a failed job (Hydra's grid sweeper, after its batch;
        # trainer's Optuna sweeper past max_failure_rate, or when every trial failed): the
        # first failure, and where every job's outcome is.
        return (f"error: {error}; every job's outcome is in trials.md in the sweep directory",
                error.code)
    if isinstance(error, KNOWN_ERRORS):
        return f"error: {one_line(error)}", EXIT_CONFIG
    if isinstance(error, ValueError) and raised_by_hydra(error):
        return f"error: {one_line(error)}", EXIT_CONFIG  # "Only one of --run, --multirun..."
    return None


# What may end a command with one line (`exit_with`; a ValueError only where Hydra's own
# checks or the sweeper raised it): failures, and the signals of start-up, which the command
# line handles at its top (as the interpreter's own handling of a Ctrl-C would end it).
FAILURES = (*KNOWN_ERRORS, Interrupted, Diverged, WorkerLost, NothingToDo, TrialFailed,
            ValueError)
STOPS = (*FAILURES, KeyboardInterrupt, Terminated)


def raised_by_hydra(error: BaseException) -> bool:
    """Whether Hydra's own code raised it (its command-line checks), not the training."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}hydra{os.sep}" in frames[-1].filename


# Whether this process is the command itself (`python -m trainer`, the `trainer` script),
# which may end at once, rather than a caller running the command in its own process.
_whole_process = False


def own_the_process() -> None:
    """Says this process is the command's own (its end is the command's exit): its end is
    the command's exit, and a log it cannot write is one line (`one_logging_error`)."""
    global _whole_process
    _whole_process = True
    own_the_objects()
    one_logging_error()


_log_failed: list[str] = []


def _report_once(handler: logging.Handler, record: logging.LogRecord) -> None:
    if _log_failed:
        return
    error = sys.exc_info()[1]
    _log_failed.append(str(error))
    print(f"warning: the log could not be written ({error}); later log records that fail "
          "are dropped unreported", file=sys.stderr, flush=True)


def one_logging_error() -> None:
    """A log record that cannot be written (the run directory's disk full) is one warning
    line for the whole process, where Python prints a `--- Logging error ---` traceback for
    every record (about 95 of them as a disk filled mid-run); the run's own error (a full
    disk at a backup) still ends it in one line."""
    _log_failed.clear()
    logging.Handler.handleError = _report_once


def exit_with(error: BaseException, place: RunPlace | None = None) -> NoReturn:
    """Ends the process with the error's one line (stdout for `finished:`, stderr else) and
    its exit code; re-raises where no line describes it, or where the user asked for the
    whole traceback (`HYDRA_FULL_ERROR=1`; a signal's stop is always one line). A run
    directory at a URL (`place`) is named by its URL, not its local mirror."""
    found = exit_code(error)
    full = USER_FULL_ERROR and not isinstance(error, (Interrupted, NothingToDo))
    if found is None or full:
        raise error
    line, code = found
    if place is not None:
        line = place.shown(line)
    print(line, file=sys.stdout if code == 0 else sys.stderr, flush=True)
    sys.stdout.flush()
    if isinstance(error, (KeyboardInterrupt, Terminated)) and _whole_process:
        # A Ctrl-C that met TensorFlow's start-up (code it runs through pybind11) marks the
        # interpreter as ended by SIGINT, whatever the exit code asked for: end it here.
        logging.shutdown()
        os._exit(code)
    if isinstance(error, WorkerLost):
        # Not sys.exit: TensorFlow's shutdown would wait for the lost peer at its exit barrier.
        os._exit(code)
    sys.exit(code)


def guarded(work: Any, start: bool = True) -> Any:
    """Starts TensorFlow quietly (unless `work` starts it itself, after its own checks) and
    returns what `work()` returns; a bad input's error is its one line on stderr, and the
    exit code (2) is returned instead."""
    from hydra.errors import HydraException

    try:
        if start:
            start_tensorflow()
        return work()
    except (*KNOWN_ERRORS, HydraException) as error:
        print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
