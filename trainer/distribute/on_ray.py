"""`python -m trainer.ray --workers N [--address ADDR] [overrides... | script.py [args...]]`:
one multi-worker run on a Ray cluster, with Ray Train as the engine.

Ray Train's `TensorflowTrainer` does what a cluster manager does, and trainer leaves it to it:
- it places the N workers on the cluster's machines (`ScalingConfig`: `--cpus-per-worker`
  each, packed onto few machines, or `--spread` over as many as it can);
- it gives each worker its place: Ray's TensorFlow backend sets `TF_CONFIG` (every worker's
  address, this one's index) before the worker's function runs;
- it restarts the whole worker group after a failure (a worker's process or its machine
  lost), up to `--max-failures` times (`FailureConfig(max_failures)`), on whatever machines
  are left; with `--min-workers M` (`ScalingConfig(num_workers=(M, N))`, Ray's elastic
  training) a restart may go on with fewer workers where the cluster has no room for N.

Each Ray worker runs one trainer worker as a fresh process (`python -m trainer` with the
overrides, or `python script.py`, whose `trainer.fit` joins from `TF_CONFIG`), exactly as
`python -m trainer.launch` runs it, and relays its lines prefixed `[worker I]`; the process
dies with its Ray worker. Worker 0 is the chief and writes the run directory: on several
machines that is a bucket (`hydra.run.dir=s3://...`, docs/resume.md), on one machine any
path. A restart resumes from the chief's last complete backup there, as a relaunch by hand
does, at the same global batch (accumulation makes up for fewer replicas), so the run ends
with the weights of a run that was never stopped; the summary counts the restarts, the steps
trained twice, and the workers the run started with where it went on with fewer.

What trainer keeps between Ray's attempts (how many there were, where the chief got to) is a
small file in Ray's own storage for the run (`--storage`, `RunConfig(storage_path)`: Ray's
default, `~/ray_results`, on one machine; shared storage on several, as Ray Train requires),
never in the run directory.

Ray Train sets `TF_USE_LEGACY_KERAS=1` for its workers (for `tf_keras`); trainer's workers
are Keras 3 and drop it. `pip install 'trainer[ray]'` installs Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainer.config.compose import KNOWN_ERRORS, composed
from trainer.config.errors import EXIT_CONFIG
from trainer.config.messages import one_line
from trainer.config.overrides import under
from trainer.distribute.launch import run_dir_of, script_commands, split_script, worker_commands
from trainer.distribute.restarts import (
    PROGRESS,
    RESTARTS,
    STEPS_AGAIN,
    WORKERS_AT_START,
    noted_backup,
    steps_again,
)
from trainer.internals.tf_start import SWITCH, PeerLossLines
from trainer.processes import describe_exit, environment, spawn
from trainer.rundir.atomic import write_json

LEDGER = "trainer-attempts.json"  # in Ray's storage for the run: what a restart must know
PROGRESS_COPY = "trainer-progress.json"  # where the chief got to when an attempt failed
BACKUP_COPY = "trainer-backup.json"  # the chief's newest complete backup then
# A worker ended with exit code 2 (a configuration or data error it said in its line): a
# restart would fail the same way, so the next attempt ends at once and the command exits 2.
REFUSED = "trainer-refused.json"
LEGACY_KERAS = "TF_USE_LEGACY_KERAS"


class WorkerStopped(RuntimeError):
    """A trainer worker's process ended with a failure (Ray restarts the group for it)."""


def ledger_after(previous: dict[str, Any] | None, world_size: int,
                 backup: str | None, progress: Path | None) -> dict[str, Any]:
    """What an attempt tells its chief, from the ledger the attempts before it left (None: the
    first attempt): `restarts` so far, `steps_again` (the steps trained past the backup each
    failure resumed from, where the chief said how far it got), and `workers_at_start`.

    Args:
        previous: the ledger as the last attempt left it.
        world_size: the workers of this attempt.
        backup: the newest complete backup the last attempt's chief noted (None: none).
        progress: the last attempt's chief's progress file, where it wrote one.
    """
    if previous is None:
        return {"restarts": 0, "steps_again": 0, "workers_at_start": world_size}
    again = steps_again(backup, progress) if progress is not None else 0
    return {"restarts": int(previous["restarts"]) + 1,
            "steps_again": int(previous["steps_again"]) + again,
            "workers_at_start": int(previous["workers_at_start"])}


def ledger_environment(ledger: dict[str, Any], world_size: int) -> dict[str, str]:
    """The chief's variables for its summary's `restarts` row (`trainer.run.end.summary`)."""
    env = {RESTARTS: str(ledger["restarts"]), STEPS_AGAIN: str(ledger["steps_again"])}
    if world_size < int(ledger["workers_at_start"]):
        env[WORKERS_AT_START] = str(ledger["workers_at_start"])
    return env


class _Storage:
    """Small JSON files in Ray's storage for this run (a local folder or a bucket, through
    the pyarrow file system Ray Train itself writes there with)."""

    def __init__(self, context: Any) -> None:
        storage = context.get_storage()
        self.fs, self.root = storage.storage_filesystem, storage.experiment_fs_path

    def read(self, name: str) -> Any:
        try:
            with self.fs.open_input_stream(f"{self.root}/{name}") as f:
                return json.loads(f.read().decode())
        except (OSError, ValueError):
            return None

    def write(self, name: str, value: Any) -> None:
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(f"{self.root}/{name}") as f:
            f.write(json.dumps(value).encode())


def _relay(proc: subprocess.Popen, label: str, lines: Any) -> None:
    """Sends a worker's lines, prefixed, to the command's process (`lines`, a Ray queue),
    but for TensorFlow's records of a lost peer."""
    assert proc.stdout is not None
    peer_loss = PeerLossLines()
    everything = os.environ.get(SWITCH) == "1"
    for raw in iter(proc.stdout.readline, b""):
        for part in raw.decode("utf-8", errors="replace").rstrip("\n").split("\r"):
            if part.strip() and (everything or not peer_loss.is_noise(part)):
                _say(lines, f"[{label}] {part}")


def _say(lines: Any, line: str) -> None:
    try:
        lines.put(line)
    except Exception:  # the command's process is gone (Ray's error says so): the run goes on
        pass


def worker_loop(config: dict[str, Any]) -> None:
    """What each of Ray Train's workers runs: one trainer worker, in a fresh process, with
    the `TF_CONFIG` Ray's TensorFlow backend set here; raises where it fails, for Ray's
    failure handling to restart the group."""
    from ray import train

    context = train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    storage = _Storage(context)
    if storage.read(REFUSED):  # a worker refused its input: the same command fails again
        return  # every worker ends at once; Ray then ends the run, the command says why
    extra: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix=f"trainer-ray-{rank}-") as scratch:
        progress = Path(scratch) / "progress.json"
        if rank == 0:
            ledger = _chief_ledger(storage, size, Path(scratch))
            extra = {PROGRESS: str(progress)}
            if config["restarting"]:  # the summary's restarts row, as the launcher's
                extra.update(ledger_environment(ledger, size))
            if ledger["restarts"]:
                _say(config["lines"], f"[ray] restart {ledger['restarts']} on {size} workers: "
                     "every worker starts again from the last complete backup")
        script = config["script"]
        command = (script_commands(size, script)[rank] if script else
                   worker_commands(size, config["overrides"], config["run_dir"],
                                   Path(scratch))[rank])
        env = environment({**extra, "TMPDIR": scratch}, drop=(LEGACY_KERAS,))
        proc = spawn(command, env, die_with_parent=True, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _relay(proc, f"worker {rank}", config["lines"])
        code = proc.wait()
        if code != 0 and rank == 0:  # where the chief got to, for the next attempt
            storage.write(PROGRESS_COPY, _json(progress))
            storage.write(BACKUP_COPY, {"backup": noted_backup(progress)})
        if code == EXIT_CONFIG:  # never retried, as the launcher never retries it
            storage.write(REFUSED, {"worker": rank})
    if code != 0:
        raise WorkerStopped(f"worker {rank} stopped with {describe_exit(code)}")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _chief_ledger(storage: _Storage, size: int, scratch: Path) -> dict[str, Any]:
    """Reads the ledger the attempts before this one left, counts this one, writes it back."""
    previous = storage.read(LEDGER)
    progress = None
    if previous is not None:
        reached = storage.read(PROGRESS_COPY)
        if reached is not None:
            progress = scratch / "previous-progress.json"
            write_json(progress, reached)
    backup = (storage.read(BACKUP_COPY) or {}).get("backup")
    ledger = ledger_after(previous, size, backup, progress)
    storage.write(LEDGER, ledger)
    storage.write(PROGRESS_COPY, None)  # counted once: a chief killed outright writes none
    return ledger


def _refusal(args: argparse.Namespace, overrides: list[str],
             script: list[str] | None) -> str | None:
    """What is wrong with the command line, as one line; None where nothing is."""
    if args.workers < 1:
        return f"--workers must be a positive number; received: {args.workers}"
    if args.max_failures < -1:
        return (f"--max-failures must be 0 or more (-1: without limit); received: "
                f"{args.max_failures}")
    if args.min_workers is not None and not 1 <= args.min_workers <= args.workers:
        return (f"--min-workers must be 1 to --workers ({args.workers}); received: "
                f"{args.min_workers}")
    if args.cpus_per_worker <= 0:
        return f"--cpus-per-worker must be above 0; received: {args.cpus_per_worker}"
    clashing = under(overrides, "cluster")
    if clashing:
        return f"Ray sets the cluster itself; remove {' '.join(clashing)}"
    if script is not None:
        if overrides:
            return (f"a script takes its own arguments after its path ({script[0]} ...); the "
                    f"overrides before it are python -m trainer's: received {' '.join(overrides)}")
        if not Path(script[0]).is_file():
            return f"the script {script[0]} does not exist (the path to a Python file to run)"
    return None


def quiet_ray() -> None:
    """Before `import ray`: Ray's own records stay in its log files, not on this screen."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_DISABLE_WORKER_LOG_PREFIX", "1")


def connect(address: str | None) -> str | None:
    """Connects this process to the Ray cluster at `address` (None: starts a Ray of this
    machine alone); a line saying why not, else None. The actors' own output stays in Ray's
    log files (`log_to_driver=False`): the workers' lines come through `relay_lines`."""
    import logging

    import ray

    everything = os.environ.get(SWITCH) == "1"  # TRAINER_TF_LOGS=1: Ray's records too
    unreachable = _unreachable(address) if address is not None else None
    if unreachable is None:
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=everything,
                     configure_logging=True,
                     runtime_env={"env_vars": {} if everything else {"TF_CPP_MIN_LOG_LEVEL": "2"}},
                     **({"include_dashboard": False} if address is None else {}))
        except (ConnectionError, RuntimeError, ValueError) as error:
            unreachable = one_line(error)
    if unreachable is not None:
        where = f"at {address}" if address else "started here"
        return (f"no Ray cluster {where} ({unreachable}); give --address HOST:PORT of a "
                "running cluster's head (`ray start --head` prints it), or leave --address "
                "out for a Ray of this machine alone")
    if not everything:
        # the raylets' and nodes' notices Ray prints here (a node lost: its raylet's last
        # records): the workers' own lines and the restart line say what happened
        import ray._private.worker as ray_worker

        ray_worker._worker_logs_enabled = False
    return None


def _unreachable(address: str) -> str | None:
    """Why nothing answers at a Ray head's `HOST:PORT` (ray.init itself retries for a minute
    before it says so); None where something listens, or the address is not `HOST:PORT`
    (`ray://...`, `auto`: Ray reads those itself)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        return f"nothing answers at {host}:{port}: {error.strerror or error}"
    return None


class _Lines:
    """The workers' lines, through a Ray queue on this machine, printed here in order."""

    def __init__(self) -> None:
        import ray
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                              soft=False)
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._print, daemon=True)
        self._thread.start()

    def _print(self) -> None:
        from ray.util.queue import Empty

        while True:
            try:
                print(self.queue.get(timeout=0.2), flush=True)
            except Empty:
                if self._stop.is_set():
                    return
            except Exception:  # Ray itself is going away
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def room(workers: int, cpus: float, resources: dict[str, float]) -> str | None:
    """Why a cluster with `resources` (`ray.cluster_resources()`) cannot place `workers`
    workers of `cpus` CPUs each; None where it can."""
    have = resources.get("CPU", 0.0)
    if have < workers * cpus:
        return (f"the Ray cluster has {have:g} CPUs; {workers} workers of {cpus:g} CPU "
                f"each need {workers * cpus:g}: lower --workers (or --min-workers) or "
                "--cpus-per-worker, or add machines")
    return None


def checked_run_dir(overrides: list[str], check: Callable[[Any], Any] | None) -> str:
    """The chief's run directory (`trainer.distribute.launch.run_dir_of`), once every value
    of the config is checked here as a worker would check it (`check`, the pre-flight's
    `check_config`): a bad value is one line before Ray starts anything, never a failure
    Ray's failure handling retries on every worker."""
    run_dir = run_dir_of(overrides)
    run = composed(list(overrides))
    if run is not None and check is not None:
        check(run.cfg)
    return run_dir


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog="python -m trainer.ray",
        usage="%(prog)s --workers N [--address HOST:PORT] [--max-failures K] "
              "[--min-workers M] [--cpus-per-worker C] [--spread] [--storage PATH] "
              "[overrides ... | script.py [args ...]]",
        description="Runs one multi-worker training (strategy=multi_worker) on a Ray "
                    "cluster through Ray Train: python -m trainer with the overrides, or a "
                    "script of yours whose trainer.fit joins the cluster.",
        epilog="Any other argument is a trainer override, e.g. model=mobilenet epochs=5.")
    found.add_argument("--workers", type=int, required=True, help="how many workers (>= 1)")
    found.add_argument("--address", default=None,
                       help="the Ray cluster's head, HOST:PORT (default: $RAY_ADDRESS, "
                            "else a Ray of this machine alone)")
    found.add_argument("--max-failures", type=int, default=0,
                       help="restart the worker group after a failure up to K times "
                            "(Ray Train's FailureConfig; -1: without limit; default 0)")
    found.add_argument("--min-workers", type=int, default=None,
                       help="at a restart, go on with as few as M workers where the "
                            "cluster has no room for --workers (Ray's elastic training), "
                            "at the same global batch")
    found.add_argument("--cpus-per-worker", type=float, default=1.0,
                       help="CPUs Ray reserves for each worker (default 1)")
    found.add_argument("--spread", action="store_true",
                       help="place the workers on as many machines as possible (default: "
                            "packed onto few)")
    found.add_argument("--storage", default=None,
                       help="Ray Train's storage for the run (RunConfig's storage_path; "
                            "default ~/ray_results; shared on several machines)")
    return found


def main(argv: Sequence[str] | None = None,
         check: Callable[[Any], Any] | None = None) -> int:
    """The command (`trainer.ray` passes the pre-flight's `check_config` as `check`)."""
    own, script = split_script(list(sys.argv[1:] if argv is None else argv))
    args, overrides = parser().parse_known_args(own)
    refusal = _refusal(args, overrides, script)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        run_dir = None if script else checked_run_dir(overrides, check)
    except KNOWN_ERRORS as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return EXIT_CONFIG
    quiet_ray()
    try:
        import ray
    except ImportError:
        print("error: Ray is not installed here: pip install 'trainer[ray]'", file=sys.stderr)
        return EXIT_CONFIG
    refusal = connect(args.address or os.environ.get("RAY_ADDRESS"))
    if refusal is None:
        refusal = room(args.min_workers or args.workers, args.cpus_per_worker,
                       ray.cluster_resources())
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        ray.shutdown()
        return EXIT_CONFIG
    print(f"[ray] {args.workers} workers on the Ray cluster; the chief (worker 0) writes "
          f"{run_dir or 'the run directory its trainer.fit names'}", flush=True)
    code, ending = _train(args, overrides, run_dir, script)
    if ending is not None:
        print(ending, flush=True)
    return code


def _train(args: argparse.Namespace, overrides: list[str], run_dir: str | None,
           script: list[str] | None) -> tuple[int, str | None]:
    """Ray Train's run of the workers, connected; its exit code and last line."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    lines = _Lines()
    count: int | tuple[int, int] = args.workers
    if args.min_workers is not None and args.min_workers < args.workers:
        count = (args.min_workers, args.workers)
    trainer = TensorflowTrainer(
        worker_loop,
        train_loop_config={"overrides": overrides, "run_dir": run_dir, "script": script,
                           "lines": lines.queue,
                           "restarting": args.max_failures != 0 or count != args.workers},
        scaling_config=ScalingConfig(
            num_workers=count, resources_per_worker={"CPU": args.cpus_per_worker},
            placement_strategy="SPREAD" if args.spread else "PACK"),
        run_config=RunConfig(
            name=f"trainer-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
            storage_path=args.storage,
            failure_config=FailureConfig(max_failures=args.max_failures)))
    again = f" with hydra.run.dir={run_dir}" if run_dir else ""
    code, ending = 0, None
    try:
        if _refused(trainer.fit()):
            code, ending = EXIT_CONFIG, ("[ray] failed: a worker refused its input (its line "
                                         "above); fix it and run the command again")
    except KeyboardInterrupt:
        code, ending = 130, f"[ray] interrupted; to resume, run the same command again{again}"
    except Exception as error:  # Ray Train's TrainingFailedError, after its last attempt
        cause = one_line(_cause(error))
        stopped = re.search(r"stopped with exit code (\d+)", cause)
        code = int(stopped.group(1)) if stopped else 1
        ending = (f"[ray] failed: {cause}; " + ("fix it and run the command again"
                  if code == EXIT_CONFIG else f"to resume, run the same command again{again}"))
    finally:
        lines.close()  # every worker's line before the last one
        ray.shutdown()
    return code, ending


def _refused(result: Any) -> bool:
    """Whether Ray's run ended because a worker refused its input (`REFUSED`)."""
    try:
        with result.filesystem.open_input_stream(f"{result.path}/{REFUSED}"):
            return True
    except (OSError, AttributeError, TypeError):
        return False


def _cause(error: BaseException) -> BaseException:
    """The worker's own failure inside Ray Train's error, where there is one."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        found = stack.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, WorkerStopped) or "stopped with" in str(found).split("\n")[0]:
            return found
        for attr in ("worker_failures", ):
            stack.extend(getattr(found, attr, {}).values() if hasattr(found, attr) else [])
        stack.extend(e for e in (found.__cause__, found.__context__) if e is not None)
    return error


if __name__ == "__main__":
    raise SystemExit(main())
