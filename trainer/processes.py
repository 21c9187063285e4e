"""The one way trainer starts a fresh Python process: `trainer.fit`'s child, a sweep's job,
a `tune=batch` try, and the launcher's workers (`python -m trainer.launch`).

TensorFlow fixes its devices, its oneDNN kernels and its collective ops once per process, so
each of these runs in a new interpreter (never a fork of a process whose TensorFlow runs
threads), as Lightning starts its processes through one `_Launcher`. What they share is
decided here once:

- the command: this interpreter, `-m MODULE` or a script, with its arguments;
- the environment: this process's, less what the new process must not inherit (a
  cluster's `TF_CONFIG`, `HYDRA_FULL_ERROR` where the user did not ask for it), plus what
  it is given; TensorFlow's C++ notices off (`TF_CPP_MIN_LOG_LEVEL=2`) unless the user set
  the level or asked for them (`TRAINER_TF_LOGS=1`);
- the process group: its own session (a terminal's Ctrl-C reaches it once, from the
  parent, which passes it on) or the parent's (a sweep's job gets the same Ctrl-C);
- on Linux, SIGKILL when the parent dies (`die_with_parent`), so no worker outlives its
  launcher;
- how an exit code reads (`describe_exit`).

No TensorFlow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# `TRAINER_TF_LOGS=1`: TensorFlow's notices as TensorFlow prints them, in every process.
TF_LOGS = "TRAINER_TF_LOGS"
TF_LEVEL = "TF_CPP_MIN_LOG_LEVEL"


def python(*args: str, module: str | None = None) -> list[str]:
    """This interpreter's command line: `python -m MODULE ARGS`, or `python ARGS` (a
    script and its arguments)."""
    return [sys.executable, *(["-m", module] if module else []), *args]


def environment(extra: Mapping[str, str] | None = None, drop: Sequence[str] = (),
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A new process's environment: `base` (this process's) less `drop`, TensorFlow's
    notices off unless asked for, then `extra`."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in drop}
    if env.get(TF_LOGS) != "1":
        env.setdefault(TF_LEVEL, "2")
    env.update(extra or {})
    return env


def spawn(command: Sequence[str], env: Mapping[str, str], *, own_session: bool = True,
          die_with_parent: bool = False, **streams: Any) -> subprocess.Popen:
    """Starts a fresh process.

    Args:
        command: its command line (`python(...)`).
        env: its whole environment (`environment(...)`).
        own_session: a session and process group of its own (else the parent's).
        die_with_parent: on Linux, SIGKILL when this process ends (the launcher's workers).
        streams: `subprocess.Popen`'s `stdin`, `stdout`, `stderr`, `text`, `errors`, `cwd`.

    Returns:
        The started process.
    """
    setup = _die_with_parent() if die_with_parent else None
    return subprocess.Popen(list(command), env=dict(env), preexec_fn=setup,
                            start_new_session=own_session and setup is None, **streams)


def run(command: Sequence[str], env: Mapping[str, str], timeout: float
        ) -> subprocess.CompletedProcess:
    """Runs a fresh process to its end (its output captured as text), killed with its
    group past `timeout` seconds."""
    proc = spawn(command, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_group(proc)
        raise
    return subprocess.CompletedProcess(list(command), proc.returncode, out, err)


def stop_group(proc: subprocess.Popen) -> None:
    """Kills a process started in a session of its own, with whatever it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _die_with_parent() -> Callable[[], None]:
    """What a child runs before exec: its own session, and on Linux SIGKILL when the parent
    dies (looked up here, in the parent: the child only makes two system calls)."""
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def setup() -> None:
        os.setsid()
        if prctl is not None:
            prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)

    return setup


def describe_exit(code: int) -> str:
    """`exit code 4`, or `SIGKILL` for a process killed by a signal."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def process_seconds() -> float | None:
    """Seconds since this process started (Linux's /proc), None where that is unknown: the
    interpreter's start, imports and the config's composition before a run's own clock."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
