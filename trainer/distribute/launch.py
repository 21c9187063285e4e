"""`python -m trainer.launch --workers N [overrides... | script.py [args...]]`: one
multi-worker run on this machine.

Starts N `python -m trainer` workers (or N copies of a user's script, whose `trainer.fit`
joins the cluster from its `TF_CONFIG`), each with the `TF_CONFIG` of a cluster on free
127.0.0.1 ports, so MultiWorkerMirroredStrategy trains across them exactly as it would across
machines. Each line a worker prints comes out prefixed with `[worker I]`. When one worker
fails, the others get `--grace` seconds to stop by themselves (they notice the lost peer
within seconds and say so), then SIGTERM, then SIGKILL; Ctrl-C stops them all the same way.
No worker outlives the launcher: each runs in its own process group, which is killed, and
dies with the launcher on Linux even when the launcher itself is killed.

A worker that finds its port taken (by another process since the launcher chose it) makes
the launcher start every worker again on other free ports, up to three times.

Worker 0 is the chief and writes the run directory (`hydra.run.dir`, chosen here when not
given); the others run in a temporary directory removed at the end. Launching again with the
same `hydra.run.dir` resumes from the chief's backup.

`--evaluator` starts one more process, `TF_CONFIG`'s `evaluator` task (outside the workers'
collective), which validates each epoch beside them (`trainer.run.end.evaluator`); its lines come
prefixed with `[evaluator]`. The workers never wait for it while they train, and it failing
does not stop them (the summary says validation was incomplete); once the workers have
ended it gets `--grace` seconds to end by itself, and it is stopped with them on a failure
or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from trainer.config.compose import KNOWN_ERRORS, composed
from trainer.config.errors import EXIT_CONFIG, EXIT_WORKER_LOST
from trainer.config.messages import one_line
from trainer.config.overrides import under, value, without
from trainer.config.schema import register_configs
from trainer.distribute.rendezvous import IN_USE
from trainer.distribute.restarts import (
    PROGRESS,
    RESTARTS,
    STEPS_AGAIN,
    WORKERS_AT_START,
    Failure,
    newest_backup,
    noted_backup,
    restart_pause,
    restart_refusal,
    steps_again,
    workers_left,
)
from trainer.internals.tf_start import SWITCH, PeerLossLines
from trainer.processes import describe_exit, environment, python, spawn

EXIT_SIGINT = 130
SETTLE = 3.0  # seconds a lost peer's own end may take to show (see Launcher._cause)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports nobody listens on now (all bound at once, then released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_configs(addresses: Sequence[str], evaluator: str | None = None) -> list[str]:
    """The `TF_CONFIG` of each worker of a cluster of `addresses` (worker 0 is the chief),
    then, with an `evaluator` address, the evaluator's."""
    cluster: dict[str, list[str]] = {"worker": list(addresses)}
    if evaluator is not None:
        cluster["evaluator"] = [evaluator]
    tasks = [("worker", i) for i in range(len(addresses))]
    tasks += [("evaluator", 0)] if evaluator is not None else []
    return [json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}})
            for kind, i in tasks]


def worker_commands(workers: int, overrides: Sequence[str], run_dir: str,
                    scratch: Path, evaluator: bool = False) -> list[list[str]]:
    """The command line of each worker, then the evaluator's (with `evaluator`: it reads the
    chief's run directory).

    Args:
        workers: how many workers.
        overrides: the user's Hydra overrides (`hydra.run.dir` is replaced per worker).
        run_dir: the chief's run directory.
        scratch: a temporary directory for the other workers' Hydra directories.
        evaluator: one more command, for the evaluator.
    """
    common = without(overrides, "hydra.run.dir")
    if value(overrides, "strategy") is None and value(overrides, "strategy.name") is None:
        common.append("strategy=multi_worker")
    if value(overrides, "verbose") is None:
        common.append("verbose=2")  # a line per epoch: progress bars do not survive prefixing
    return [python(*common, f"hydra.run.dir="
                   f"{run_dir if i == 0 or i == workers else scratch / f'worker-{i}'}",
                   module="trainer")
            for i in range(workers + bool(evaluator))]


def _mkdir(path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def run_dir_of(overrides: Sequence[str]) -> str:
    """The chief's run directory: the one the workers' config names (the command line's
    `hydra.run.dir`, an experiment file's, a `--config-dir`'s, or the default
    `outputs/DATE/TIME`), composed as the workers compose it and resolved once here, so
    every worker and every restart writes and resumes the same one (a `${now:...}` in it
    is read once). A URL stays a URL: the chief keeps it in step with its mirror."""
    register_configs()
    run = composed(list(overrides))
    if run is None:  # --cfg, --help: the workers print it; the directory is not used
        return time.strftime("outputs/%Y-%m-%d/%H-%M-%S")
    return run.logs


def first_cause(failed: list[tuple[int, int]]) -> tuple[int, int]:
    """Of the workers that failed, `(index, code)` of the one that stopped the cluster: one
    that did not merely lose a peer (exit code 4), else the first."""
    return next(((i, c) for i, c in failed if c != EXIT_WORKER_LOST), failed[0])


class Launcher:
    """Runs the workers, relays their output, and stops them all together.

    Args:
        commands: one command line per worker.
        envs: one environment per worker.
        grace: seconds the others get to stop by themselves after one fails, and again after
            SIGTERM before SIGKILL.
        out: where the prefixed output goes.
    """

    def __init__(self, commands: list[list[str]], envs: list[dict[str, str]],
                 grace: float = 30.0, out: IO[str] = sys.stdout, evaluator: bool = False
                 ) -> None:
        self.commands, self.envs, self.grace, self.out = commands, envs, grace, out
        self.workers = len(commands) - bool(evaluator)  # the evaluator comes last
        self.procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.port_taken = False  # a worker said one of its ports is in use
        self.noticed = False  # this launcher received a preemption notice (SIGUSR1)
        # `(index, exit code)` of the worker that stopped the cluster, once `wait` returns
        self.first: tuple[int, int] | None = None

    def say(self, line: str) -> None:
        with self._lock:
            try:
                print(line, file=self.out, flush=True)
            except (OSError, ValueError):
                pass  # output closed (`| head`): keep draining the workers' pipes

    def start(self) -> None:
        for i, (command, env) in enumerate(zip(self.commands, self.envs, strict=True)):
            proc = spawn(command, env, die_with_parent=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.procs.append(proc)
            self.say(f"[launch] {self.label(i)}: pid {proc.pid}")
            thread = threading.Thread(target=self._relay, args=(i, proc), daemon=True)
            thread.start()
            self._threads.append(thread)

    def label(self, index: int) -> str:
        """`worker I`, or `evaluator`."""
        return f"worker {index}" if index < self.workers else "evaluator"

    def _relay(self, index: int, proc: subprocess.Popen) -> None:
        """Prefixes and passes on a worker's lines, but for TensorFlow's records of a lost
        peer (the worker's own line says which, and how to resume; `TRAINER_TF_LOGS=1`
        keeps them)."""
        assert proc.stdout is not None
        peer_loss = PeerLossLines()
        everything = os.environ.get(SWITCH) == "1"
        for raw in iter(proc.stdout.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            for part in text.split("\r"):
                if peer_loss.is_noise(part) and not everything:
                    continue
                if part.strip():
                    self.port_taken = self.port_taken or IN_USE in part
                    self.say(f"[{self.label(index)}] {part}")

    def wait(self) -> int:
        """Waits for all workers; returns 0, or the exit status of the first that failed.
        The evaluator's end is said, never a failure: the workers go on without it."""
        first: tuple[int, int] | None = None
        told = False
        while True:
            codes = [p.poll() for p in self.procs]
            told = told or self._evaluator_ended(codes)
            failed = [(i, c) for i, c in enumerate(codes[:self.workers])
                      if c not in (None, 0)]
            if first is None and failed:
                first = self._cause(failed)
                self.say(f"[launch] worker {first[0]} stopped with {describe_exit(first[1])}; "
                         "stopping the others")
                patience = 0.0 if first[1] == EXIT_CONFIG else self.grace
                self.stop(patience)
            elif first is None and all(c is not None for c in codes[:self.workers]):
                self._let_evaluator_end()
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.1)
        self.join()
        self.first = first
        if first is None:
            return 0
        return first[1] if first[1] > 0 else 128 - first[1]

    def _cause(self, failed: list[tuple[int, int]]) -> tuple[int, int]:
        """The worker whose end stopped the cluster. A worker that lost a peer (exit code 4)
        may be seen before the peer it lost (a killed process takes a moment to be reaped):
        the others get up to `SETTLE` seconds to show how they ended."""
        deadline = time.monotonic() + SETTLE
        while all(code == EXIT_WORKER_LOST for _, code in failed) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
            codes = [p.poll() for p in self.procs[:self.workers]]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        return first_cause(failed)

    def _evaluator_ended(self, codes: list[int | None]) -> bool:
        """Says once that the evaluator ended with a failure (the workers go on)."""
        code = codes[self.workers] if len(codes) > self.workers else None
        if code not in (None, 0):
            self.say(f"[launch] the evaluator stopped with {describe_exit(code)}; the workers "
                     "train on (the summary says validation was incomplete)")
            return True
        return False

    def _let_evaluator_end(self) -> None:
        """The workers have ended: the evaluator gets `grace` seconds to end by itself, then
        is stopped."""
        for proc in self.procs[self.workers:]:
            try:
                proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                self.say("[launch] the evaluator did not end with the run; stopping it")
                self.stop(0.0)

    def stop(self, patience: float) -> None:
        """Gives the workers `patience` seconds to end, then SIGTERM, then SIGKILL."""
        self._wait_all(patience)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            running = [p for p in self.procs if p.poll() is None]
            if not running:
                return
            for proc in running:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            self._wait_all(self.grace if sig == signal.SIGTERM else 10.0)

    def _wait_all(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.1)

    def forward(self, signum: int, frame: object = None) -> None:
        """Passes a preemption notice (SIGUSR1) on to every running worker, each of which
        starts the agreed stop, as it would had the scheduler signalled it itself."""
        self.noticed = True
        self.say(f"[launch] {signal.Signals(signum).name}: passed on to every worker")
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def kill_all(self) -> None:
        """SIGKILL to every worker's process group (also whatever they started)."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.procs:
            proc.wait()

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=5)


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the launcher's options; everything else goes to every worker as overrides, or,
    from a script's path on (`script.py [args]`), is the command each worker runs."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.launch",
        usage="%(prog)s --workers N [--evaluator] [--grace S] [--max-restarts N] "
              "[--min-workers M] [overrides ... | script.py [args ...]]",
        description="Runs N local workers of one multi-worker training (strategy=multi_worker): "
                    "python -m trainer with the overrides, or a script of yours whose "
                    "trainer.fit joins the cluster.",
        epilog="Any other argument is a trainer override, e.g. model=mobilenet epochs=5.")
    parser.add_argument("--workers", type=int, required=True, help="how many workers (>= 1)")
    parser.add_argument("--evaluator", action="store_true",
                        help="one more process validating each epoch beside the workers")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds the workers get to stop by themselves (default 30)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="start every worker again from the last backup after a "
                             "failure, up to N times (default 0)")
    parser.add_argument("--min-workers", type=int, default=None,
                        help="at a restart, go on without a worker that was killed "
                             "(SIGKILL: gone for good), down to M workers, at the same "
                             "global batch (batch.global_size; default: --workers, every "
                             "worker restarts)")
    own, script = split_script(list(sys.argv[1:] if argv is None else argv))
    args, overrides = parser.parse_known_args(own)
    refusal = _refusal(args, overrides, script)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        run_dir = None if script else run_dir_of(overrides)
    except KNOWN_ERRORS as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return EXIT_CONFIG
    with tempfile.TemporaryDirectory(prefix="trainer-launch-") as scratch:
        def commands(workers: int) -> list[list[str]]:
            return (script_commands(workers, script) if script else
                    worker_commands(workers, overrides, run_dir, Path(scratch),
                                    args.evaluator))

        launcher, code = launch_restarting(commands, Path(scratch), args.grace,
                                           args.max_restarts, run_dir,
                                           evaluator=args.evaluator,
                                           workers=(args.workers,
                                                    args.min_workers or args.workers))
    if code:
        launcher.say(ending(code, run_dir))
    return code


def split_script(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """The launcher's own arguments, and a script's command (`script.py [args]`, every
    argument from the first `.py` path on, which the script parses itself), or None.

    Args:
        argv: the launcher's command line, without the program.
    """
    takes_value = {"--workers", "--grace", "--max-restarts"}
    for i, arg in enumerate(argv):
        if (arg.endswith(".py") and "=" not in arg and not arg.startswith("-")
                and (i == 0 or argv[i - 1] not in takes_value)):
            return argv[:i], argv[i:]
    return argv, None


def _refusal(args: argparse.Namespace, overrides: list[str],
             script: list[str] | None) -> str | None:
    """What is wrong with the launcher's command line, as one line; None where nothing is."""
    if args.workers < 1:
        return f"--workers must be a positive number; received: {args.workers}"
    if args.max_restarts < 0:
        return f"--max-restarts must be 0 or more; received: {args.max_restarts}"
    if args.min_workers is not None and not 1 <= args.min_workers <= args.workers:
        return (f"--min-workers must be 1 to --workers ({args.workers}); received: "
                f"{args.min_workers}")
    if args.min_workers is not None and args.min_workers < args.workers and not (
            args.max_restarts):
        return (f"--min-workers {args.min_workers} goes on with fewer workers at a restart; "
                "give --max-restarts N too")
    clashing = under(overrides, "cluster")
    if clashing:
        return f"the launcher sets the cluster itself; remove {' '.join(clashing)}"
    if script is None:
        return None
    if overrides:
        return (f"a script takes its own arguments after its path ({script[0]} ...); the "
                f"overrides before it are python -m trainer's: received {' '.join(overrides)}")
    if args.evaluator:
        return (f"--evaluator validates a run of python -m trainer, not a script's fit; "
                f"received: --evaluator {script[0]}")
    if not Path(script[0]).is_file():
        return f"the script {script[0]} does not exist (the path to a Python file to run)"
    return None


def script_commands(workers: int, script: list[str]) -> list[list[str]]:
    """Each worker's command for a user's script: the script itself, with its arguments.
    The launcher gives each its `TF_CONFIG`, from which its `trainer.fit` joins the cluster
    (worker 0, the chief, writes the run directory the script names)."""
    return [python(*script) for _ in range(workers)]


PORT_ATTEMPTS = 3


def launch(commands: list[list[str]], scratch: Path, grace: float,
           out: IO[str] = sys.stdout, evaluator: bool = False,
           env: dict[str, str] | None = None) -> tuple[Launcher, int]:
    """Runs the workers, on other free ports again (up to `PORT_ATTEMPTS` times) where a
    worker found a port taken: free when chosen, a port may be taken before its worker
    listens on it. Returns the last launcher and its exit code."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        launcher, code = launch_once(commands, scratch, grace, out, evaluator, env)
        if code != EXIT_CONFIG or not launcher.port_taken or attempt == PORT_ATTEMPTS:
            break
        launcher.say("[launch] a port chosen for a worker was taken meanwhile; starting "
                     "every worker again on other ports")
    return launcher, code


def launch_restarting(commands: Any, scratch: Path, grace: float,
                      max_restarts: int, run_dir: str | None, out: IO[str] = sys.stdout,
                      evaluator: bool = False,
                      workers: tuple[int, int] | None = None) -> tuple[Launcher, int]:
    """Runs the cluster, and where it fails in a way a restart may fix
    (`trainer.distribute.restarts.restart_refusal`), starts it again from the last complete
    backup after a growing pause, up to `max_restarts` times; each restart is one line.

    Args:
        commands: the workers' commands (the same for every attempt: `hydra.run.dir` fixed),
            or a function giving them for a number of workers.
        scratch: the launcher's temporary directory.
        grace: the workers' time to stop by themselves.
        max_restarts: how many restarts at most (0: none).
        run_dir: the chief's local run directory, where the backups are looked for (None
            where the launcher cannot see them: a script's, or one at a URL).
        out: where the lines go.
        evaluator: the last command is the evaluator's.
        workers: `(--workers, --min-workers)`: a restart goes on without the workers
            SIGKILLed (`trainer.distribute.restarts.workers_left`), with `commands(n)`.

    Returns:
        The last launcher and its exit code.
    """
    if not callable(commands):
        fixed = commands
        commands, workers = (lambda n: fixed), None
    # SIGTERM as Ctrl-C for the whole launch: between two attempts (no worker running) it
    # ended the launcher without a line (exit 143)
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _restarting(commands, scratch, grace, (max_restarts, workers), run_dir, out,
                           evaluator)
    finally:
        signal.signal(signal.SIGTERM, before)


def _restarting(commands: Any, scratch: Path, grace: float, limits: tuple,
                run_dir: str | None, out: IO[str], evaluator: bool) -> tuple[Launcher, int]:
    """`launch_restarting`'s loop, SIGTERM raising `KeyboardInterrupt`; `limits` is
    `(max_restarts, (workers, min_workers) or None)`."""
    max_restarts, workers = limits
    progress = scratch / "progress.json"
    local = Path(run_dir) if run_dir is not None and "://" not in run_dir else None
    env = {PROGRESS: str(progress)} if max_restarts else {}
    done, again, previous = 0, 0, None
    count = workers[0] if workers else None
    while True:
        if max_restarts:
            env.update({RESTARTS: str(done), STEPS_AGAIN: str(again)})
        progress.unlink(missing_ok=True)
        launcher, code = launch(commands(count), scratch, grace, out, evaluator, env)
        if code == 0 or not max_restarts:
            return launcher, code
        if workers is not None:
            # the worker that stopped the cluster (the others were stopped by the launcher)
            first = launcher.first
            left = workers_left([first[1] if first and i == first[0] else 0
                                 for i in range(count)], count, workers[1])
            if left < count:
                launcher.say(f"[launch] going on without the {count - left} worker(s) killed "
                             f"(gone for good): {left} of {workers[0]} from now on, at the "
                             "same global batch")
                count = left
                env[WORKERS_AT_START] = str(workers[0])
        try:
            plan = _next_attempt(launcher, code, local, previous, done, max_restarts,
                                 progress)
        except KeyboardInterrupt:
            launcher.say("[launch] interrupted in the pause before a restart; no worker was "
                         "running")
            return launcher, EXIT_SIGINT
        if plan is None:
            return launcher, code
        done, previous, extra = plan
        again += extra


def _next_attempt(launcher: Launcher, code: int, local: Path | None, previous: Any,
                  done: int, max_restarts: int, progress: Path) -> tuple | None:
    """After a failed attempt: None where it is not restarted (the line said why), else
    `(restarts made, the failure, steps trained again)` once the pause has run out."""
    # the run directory's own listing where the launcher sees it, else what the chief noted
    # (a URL's, a script's run directory)
    failure = Failure(code, newest_backup(local) if local is not None
                      else noted_backup(progress))
    refusal = restart_refusal(failure, previous, done, max_restarts, launcher.noticed)
    if refusal is not None:
        if done:
            launcher.say(f"[launch] not restarted: {refusal}")
        return None
    done += 1
    again = steps_again(failure.backup, progress)
    pause = restart_pause(done)
    launcher.say(f"[launch] restart {done} of {max_restarts} in {pause:.0f} s: the "
                 f"cluster stopped with {describe_exit(128 - code if code > 128 else code)}; "
                 f"every worker starts again from {failure.backup or 'the last complete backup'}")
    time.sleep(pause)
    return done, failure, again


def launch_once(commands: list[list[str]], scratch: Path, grace: float,
                out: IO[str] = sys.stdout, evaluator: bool = False,
                env: dict[str, str] | None = None) -> tuple[Launcher, int]:
    """Runs the workers (and the evaluator, last of `commands`) once on newly chosen free
    ports, each with `env` added to this process's environment; the launcher and its exit
    code."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(len(commands))]
    workers = len(commands) - bool(evaluator)
    base = environment(env, drop=("TF_CONFIG",))
    # Temporary files of a worker killed before it could clean up go with `scratch`.
    envs = [{**base, "TF_CONFIG": config, "TMPDIR": _mkdir(scratch / f"tmp-{i}")}
            for i, config in enumerate(tf_configs(addresses[:workers],
                                                  addresses[workers] if evaluator else None))]
    for other in envs[1:]:  # the chief alone tells where it got to, and its backups
        other.pop(PROGRESS, None)
    launcher = Launcher(commands, envs, grace=grace, out=out, evaluator=evaluator)
    run_dir = value(commands[0], "hydra.run.dir") or "the run directory its trainer.fit names"
    launcher.say(f"[launch] {workers} workers on {', '.join(addresses[:workers])}; "
                 f"the chief (worker 0) writes {run_dir}"
                 + ("; an evaluator validates beside them" if evaluator else ""))
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    notice = signal.signal(signal.SIGUSR1, launcher.forward)
    try:
        launcher.start()
        code = launcher.wait()
    except KeyboardInterrupt:
        launcher.say("[launch] interrupted: stopping every worker (the chief backs up)")
        launcher.stop(0.0)
        code = EXIT_SIGINT
    finally:
        launcher.kill_all()
        launcher.join()  # the workers' last lines (their "interrupted: ..." included)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGUSR1, notice)
    return launcher, code


def ending(code: int, run_dir: str | None) -> str:
    """The launcher's last line for a run that did not finish (`run_dir` None: a script's,
    whose `trainer.fit` names its run directory)."""
    again = (f"launch again with hydra.run.dir={run_dir}" if run_dir is not None else
             "launch the same command again (its trainer.fit resumes from its run directory)")
    if code == EXIT_CONFIG:
        return "[launch] failed (a configuration error, above); fix it and launch again"
    if code == EXIT_SIGINT:
        return f"[launch] interrupted; to resume, {again}"
    return f"[launch] failed ({describe_exit(code) if code < 128 else code}); to resume, {again}"


if __name__ == "__main__":
    raise SystemExit(main())
