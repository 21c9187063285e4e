"""`trainer.fit` in a fresh child process, where this process can no longer run it.

TensorFlow fixes its devices (the logical CPU split, the visible GPUs), its oneDNN CPU
kernels and its collective ops as its runtime starts, and a layer, a tensor or a dataset
made before `trainer.fit` starts it: in a script that builds one at module level, and in
every notebook. Where a run needs what this process can no longer have (`devices=2` on the
CPU of a process that started with one, `deterministic=true` with oneDNN's kernels on, a
cluster's worker, whose strategy must come first), `trainer.fit` runs the same call in a
child process (`needed`, `fit_in_child`) and returns the same `Result`:

- spawned: a new interpreter (`python -m trainer.child`), never a fork of a process whose
  TensorFlow runs threads, with this process's environment, working directory and
  `sys.path` (so the user's own modules import there too);
- the call sent by value with cloudpickle, as Accelerate's notebook launcher and
  Lightning's notebook strategies send theirs: functions and classes defined in `__main__`
  (a script, a notebook) travel whole, an importable one by its name; an object that
  cannot be sent is one line naming it (a `tf.data.Dataset`: pass the function making it);
- the child's devices set from this process's plan before the call is unpacked, so an
  object that starts TensorFlow as it is unpacked (a Keras layer) finds them;
- its output streamed to this process's stdout and stderr as it comes (a notebook's cell
  shows it), and its `Result`, or its error (a `TrainerError`: the same line and exit
  code), returned or raised here;
- Ctrl-C here is Ctrl-C there (a run in its training steps stops with a backup, as in this
  process), and the child stops itself (as on SIGTERM) when this process ends: its stdin,
  which only this process holds, closes.

An entry point: the run's modules are imported inside its functions, after TensorFlow was
found started (here) or started quietly (in the child).
"""

from __future__ import annotations

import ast
import codecs
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainer.config.compose import Composed
from trainer.config.errors import ConfigError
from trainer.config.outcome import TrainerError
from trainer.config.validate import parse_devices
from trainer.distribute.cluster import Cluster, cluster_of_config, slurm_devices
from trainer.distribute.device_plan import DevicePlan, memory_option, plan_devices
from trainer.processes import describe_exit, environment, python, spawn
from trainer.run.prepare.preflight import ONEDNN, exact_kernels

# Set in the child's environment: it runs the call itself, never in another child.
CHILD = "TRAINER_FIT_CHILD"
# How long a child asked to stop (Ctrl-C here) gets to write its backup and end.
STOP_GRACE_S = 60.0


@dataclass(frozen=True)
class Fresh:
    """Why a run needs a fresh process, and the devices to give it.

    Attributes:
        reason: what this process can no longer have, for the line saying so.
        plan: the run's devices, set in the child before the call is unpacked.
        memory: the GPU memory option (`memory_option`) set with them.
        environ: what the child's environment adds to this one's, read as its TensorFlow
            starts (`TF_ENABLE_ONEDNN_OPTS=0` for `deterministic=true`).
    """

    reason: str
    plan: DevicePlan
    memory: tuple[str, int | None]
    environ: tuple[tuple[str, str], ...] = ()


def fresh_reason(missing: list[str], kind: str, have: int, onednn_fixed: bool,
                 cluster: bool) -> str | None:
    """What a process whose TensorFlow started cannot give a run; None where it can.

    Args:
        missing: the devices of the run's plan the started runtime lacks.
        kind: `cpu` or `gpu`, the plan's.
        have: how many logical devices of that kind the runtime has.
        onednn_fixed: `deterministic=true` while oneDNN's CPU kernels are on, and the user
            did not ask for them (`TF_ENABLE_ONEDNN_OPTS=1`).
        cluster: the run is a worker of a cluster.

    Returns:
        One clause, or None.
    """
    if cluster:
        return ("a worker's multi-worker strategy must be created before TensorFlow starts, "
                "and it has started in this process")
    if missing:
        return (f"TensorFlow already started in this process with {have} logical "
                f"{kind.upper()} device(s), so {', '.join(missing)} cannot be created")
    if onednn_fixed:
        return ("deterministic=true takes TensorFlow's own CPU kernels, but it started in "
                "this process with oneDNN's on, which stay on until it ends")
    return None


def needed(run: Composed) -> Fresh | None:
    """Whether the run `trainer.fit` composed (`run`) needs a fresh process: only where
    TensorFlow's runtime started already, and the run needs what it fixed.

    Returns:
        Why and with which devices, or None to run here.
    """
    if os.environ.get(CHILD) or "tensorflow" not in sys.modules:
        return None  # not imported: not started (importing it starts nothing)
    from trainer.internals.tf_runtime import runtime_started

    return _needs(run.cfg) if runtime_started() else None


def _needs(cfg: Any) -> Fresh | None:
    """`needed` for a composed config, in a process whose TensorFlow runs."""
    import tensorflow as tf

    from trainer.distribute.devices import missing_devices
    from trainer.internals.tf_runtime import onednn_enabled

    cluster = _cluster(cfg)
    gpus = len(tf.config.list_physical_devices("GPU"))
    devices = slurm_devices(parse_devices(cfg.devices), cluster, gpus, cfg.accelerator)
    plan = plan_devices(cfg.accelerator, devices, gpus, cfg.soft_placement)
    have = len(tf.config.list_logical_devices(plan.kind.upper()))
    onednn_fixed = (bool(cfg.deterministic) and onednn_enabled()
                    and os.environ.get(ONEDNN) != "1")
    reason = fresh_reason(missing_devices(plan), plan.kind, have, onednn_fixed,
                          cluster is not None and cluster.num_workers > 1)
    if reason is None:
        return None
    environ = dict(os.environ)
    exact_kernels(bool(cfg.deterministic), environ)  # as the pre-flight would, before it
    return Fresh(reason, plan, memory_option(cfg.gpu.memory_growth, cfg.gpu.memory_limit_mb),
                 tuple((k, v) for k, v in environ.items() if os.environ.get(k) != v))


def _cluster(cfg: Any) -> Cluster | None:
    """The run's cluster; None where there is none, or where it is wrong (the run in this
    process then says how, as it would have)."""
    try:
        return cluster_of_config(cfg.cluster, os.environ)
    except ConfigError:
        return None


def fit_in_child(fresh: Fresh, fit: Callable[..., Any], call: Mapping[str, Any],
                 callbacks: tuple = ()) -> Any:
    """Runs `fit(**call)` in a fresh child process and returns what it returned.

    Args:
        fresh: why, and the devices (`needed`).
        fit: `trainer.fit`'s runner (sent by its name).
        call: its arguments, sent by value; its `extra` are the Keras callbacks.
        callbacks: the caller's own callback objects (`call["extra"]`), given the state
            their copies reached in the child, as if they had run here.

    Raises:
        ConfigError: an argument cannot be sent, naming it; whatever the child's `fit`
            raised (a `TrainerError` with its line and exit code).
    """
    payload = _pickled(fresh, fit, call)
    print(f"trainer.fit runs in a fresh process: {fresh.reason}", flush=True)
    with tempfile.TemporaryDirectory(prefix="trainer-fit-") as folder:
        sent, outcome = Path(folder) / "call.pkl", Path(folder) / "outcome.pkl"
        sent.write_bytes(payload)
        code = _run_child(sent, outcome, dict(fresh.environ))
        if not outcome.is_file():
            raise TrainerError(f"the fresh process running trainer.fit ended with "
                               f"{describe_exit(code)} before returning (its output is above)",
                               code if code > 0 else 1)
        kind, value, states = pickle.loads(outcome.read_bytes())
    for callback, state in zip(callbacks, states, strict=False):
        vars(callback).update(state)
    if kind == "error":
        raise value
    return value


def by_value(obj: Any) -> bytes:
    """`obj` pickled for the child: cloudpickle (functions and classes of `__main__` whole),
    their code keeping the file it was written in (cloudpickle drops it, and AutoGraph in
    the child then cannot read a function's source to convert its Python `if`), and every
    `tf.data.Dataset` in it, at any depth (a split of `data=`, a dataset a model builder
    reads at module level), as its pipeline's graph, rebuilt there on its first use (after
    a worker's strategy: `trainer.internals.tf_data.LaterDataset`), as the tf.data service
    sends a pipeline."""
    import io
    import types

    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, found: Any) -> Any:
            if isinstance(found, types.CodeType):
                rebuild, args = self.dispatch_table[types.CodeType](found)
                return rebuild, tuple(found.co_filename if a == "<dynamic-code>" else a
                                      for a in args)
            tf = sys.modules.get("tensorflow")
            if tf is not None and isinstance(found, tf.data.Dataset):
                from trainer.internals.tf_data import LaterDataset, dataset_graph

                if isinstance(found, LaterDataset):
                    return found.__reduce__()
                return LaterDataset, (dataset_graph(found), found.element_spec)
            return super().reducer_override(found)

    buffer = io.BytesIO()
    Pickler(buffer).dump(obj)
    return buffer.getvalue()


def _pickled(fresh: Fresh, fit: Callable[..., Any], call: Mapping[str, Any]) -> bytes:
    """The child's payload: the devices (plain pickle), then the call (`by_value`)."""
    try:
        user = by_value((fit, dict(call)))
    except Exception:  # noqa: BLE001 - any pickling failure is named below
        raise ConfigError(_unsendable(fresh, call)) from None
    return pickle.dumps((fresh.plan, fresh.memory, sys.path, user))


def _unsendable(fresh: Fresh, call: Mapping[str, Any]) -> str:
    """The line for a call one of whose arguments cannot be sent: the first such part."""
    for name, value in call.items():
        found = _first_unsendable(value, name)
        if found is not None:
            where, error = found
            shown = where if "[" in where else f"{where}="
            text = str(error).strip().splitlines()
            return (f"trainer.fit must run in a fresh process ({fresh.reason}), and {shown} "
                    f"({type(_part(call, where)).__name__}) cannot be sent to it: "
                    f"{type(error).__name__}: {text[0] if text else ''}; pass a function "
                    f"that makes it ({name}=make_it, defined in the script), or run the "
                    "script in a new process before TensorFlow starts")
    return (f"trainer.fit must run in a fresh process ({fresh.reason}), and its call cannot "
            "be sent to it; run the script in a new process before TensorFlow starts")


def _first_unsendable(value: Any, where: str) -> tuple[str, BaseException] | None:
    """The first part of `value` (itself, or an item of its dict, list or tuple) that
    cloudpickle cannot send, and its error; None where all of it can be sent.

    Args:
        value: an argument of the call, or a part of one.
        where: its name: `data`, `data['train']`, `data['train'][0]`.
    """
    try:
        by_value(value)
        return None
    except Exception as error:  # noqa: BLE001 - named to the user
        items = (value.items() if isinstance(value, dict)
                 else enumerate(value) if isinstance(value, (list, tuple)) else ())
        for key, item in items:
            found = _first_unsendable(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return where, error


def _part(call: Mapping[str, Any], where: str) -> Any:
    """The part of the call `where` names (`data['train'][0]`)."""
    name, _, rest = where.partition("[")
    found = call[name]
    for key in (rest[:-1].split("][") if rest else ()):
        found = found[ast.literal_eval(key)]
    return found


def _run_child(sent: Path, outcome: Path, environ: dict[str, str]) -> int:
    """Starts the child (`environ` added to this environment), streams its output here,
    and waits; Ctrl-C is passed on."""
    # its own session: a terminal's Ctrl-C reaches it once, from here
    proc = spawn(python(str(sent), str(outcome), module="trainer.child"),
                 environment({**environ, CHILD: "1"}), stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    relays = [threading.Thread(target=_relay, args=(pipe, out), daemon=True)
              for pipe, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
    for relay in relays:
        relay.start()
    try:
        code = _wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for relay in relays:
            relay.join(timeout=10)
        proc.stdin.close()
    return code


def _wait(proc: subprocess.Popen) -> int:
    """Waits for the child; a Ctrl-C here asks it to stop, then waits for it to end."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def _relay(pipe: IO[bytes], out: Any) -> None:
    """Copies the child's output to `out` as it comes (progress bars' `\\r` included)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: os.read(pipe.fileno(), 65536), b""):
        try:
            out.write(decoder.decode(chunk))
            out.flush()
        except (OSError, ValueError):
            pass  # our output closed: keep draining the child's


def _watch_parent() -> None:
    """In the child: the parent's end closes our stdin; stop as on SIGTERM then."""
    while os.read(0, 4096):  # the raw descriptor: no buffer's lock held at our own exit
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """The child: `python -m trainer.child CALL OUTCOME` runs the pickled call in CALL and
    pickles what it returned or raised into OUTCOME."""
    sent, outcome = map(Path, argv if argv is not None else sys.argv[1:])
    threading.Thread(target=_watch_parent, daemon=True).start()
    plan, memory, path, user = pickle.loads(sent.read_bytes())
    sys.path[:] = path
    from trainer.run import process

    process.own_the_objects()  # a fresh process of trainer's: the user's call alone in it
    process.quiet_logs()
    process.start_tensorflow()
    from trainer.distribute.devices import configure_devices

    configure_devices(plan, memory)
    try:
        import cloudpickle

        fit, call = cloudpickle.loads(user)
        found = ("result", fit(**call))
    except BaseException as error:  # noqa: BLE001 - sent back, raised in the parent
        found = ("error", error)
        call = locals().get("call") or {}
    _write_outcome(outcome, (*found, [state_of(c) for c in call.get("extra", ())]))
    return 0


# A callback's attributes that point back into the run (its model, the run's params): never
# sent back; the caller's callback keeps its own.
NOT_STATE = ("model", "_model", "params")


def state_of(callback: Any) -> dict[str, Any]:
    """What a callback's copy in the child holds after the run (its attributes but the
    model's), each attribute that can be sent: `fit_in_child` sets them on the caller's."""
    import cloudpickle

    state = {}
    for name, value in vars(callback).items():
        if name in NOT_STATE:
            continue
        try:
            cloudpickle.dumps(value)
        except Exception:  # noqa: BLE001 - a handle, a lock: left as the caller's
            continue
        state[name] = value
    return state


def _write_outcome(outcome: Path, found: tuple[str, Any]) -> None:
    """Pickles the outcome (atomically: the parent reads a whole one or none); an error
    that cannot be pickled goes as its line."""
    import cloudpickle

    try:
        data = cloudpickle.dumps(found)
    except Exception:  # noqa: BLE001 - the error's own type cannot travel: its text does
        kind, value, states = found
        data = cloudpickle.dumps(("error", RuntimeError(f"{type(value).__name__}: {value}"),
                                  states))
    partial = outcome.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(outcome)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    finally:
        from trainer.run.process import settled

        settled(ending=True)  # the exit's collections skip TensorFlow's objects and the run's
