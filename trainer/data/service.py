"""`dataset.service`: the training split's preprocessing on TensorFlow's tf.data service.

`local:K` starts K tf.data services in this process, each a `DispatchServer` and one
`WorkerServer` of TensorFlow's own on free ports (addressed at 127.0.0.1): they live as long
as the process (a crash, Ctrl-C or a kill ends them with it) and the run's session stops them
when the run ends. `grpc://HOST:PORT` sends the work to a dispatcher already running.

Why K services of one worker and not one dispatcher of K workers: in `parallel_epochs` mode
(`ShardingPolicy.OFF`) every worker of a dispatcher produces the whole dataset (K copies per
epoch), and in `distributed_epoch` mode (`DYNAMIC`) or a static sharding policy the client
takes elements from the workers in the order they arrive: either is no longer the
one-machine order of an epoch. A service of one worker hands its elements over in order
(`parallel_epochs`, one copy), so the pipeline gives service `k` of K the positions `k`,
`k + K`, ... of this worker's share of each epoch (`trainer.data.pipeline`) and takes them
back round-robin: the same batches as without a service, each example read once per epoch.
A dispatcher named by `grpc://` must run one worker for that: the client checks the position
of every element it receives, and a second worker's copy stops the run in one line.

A build module: TensorFlow is imported at the top.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from trainer.config.errors import ConfigError
from trainer.config.schema import DataService
from trainer.data.pipeline import out_of_order_found

_SERVICE = tf.data.experimental.service
# Seconds a running dispatcher has to accept a connection before it counts as unreachable.
CONNECT_TIMEOUT_S = 5.0


@dataclass
class _Local:
    """The servers `local:K` started in this process: (dispatcher, its worker's port,
    worker) triples."""

    servers: list[tuple[Any, int, Any]] = field(default_factory=list)


_RUNNING = _Local()
# Attempts at a worker's port, where another process took the free port chosen for it.
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class Service:
    """Where the training split's streams go: one dispatcher target per stream, the
    config's value, and whether this process started them."""

    value: str
    targets: tuple[str, ...]
    local: bool

    @classmethod
    def of(cls, served: DataService | None) -> Service | None:
        """The service `dataset.service` names (as the run read it: `Spec.pipeline.served`),
        its servers started (`local:K`) or its dispatcher checked reachable (`grpc://`);
        None without one."""
        if served is None:
            return None
        kind, where, value = served.kind, served.where, served.value
        if kind == "local":
            targets = start_local(where)
            print(f"dataset.service={value}: tf.data dispatchers at "
                  f"{', '.join(t.partition('://')[2] for t in targets)}, one worker each "
                  f"(ports {', '.join(map(str, local_ports()))}), in this process until the "
                  "run ends", flush=True)
            return cls(str(value), targets, local=True)
        check_reachable(where, str(value))
        return cls(str(value), (f"grpc://{where}",), local=False)

    def distributed(self, dataset: tf.data.Dataset, stream: int) -> tf.data.Dataset:
        """`dataset` produced by the service of stream `stream`, one copy in order."""
        return dataset.apply(_SERVICE.distribute(
            _SERVICE.ShardingPolicy.OFF, self.targets[stream],
            compression=None if self.local else "AUTO"))


def service_report(served: DataService | None) -> dict[str, Any] | None:
    """What the summary says about `dataset.service` (None without one): where the training
    split's preprocessing ran, TensorFlow's mode and whether the batches are exact."""
    if served is None:
        return None
    kind, where, value = served.kind, served.where, served.value
    streams = where if kind == "local" else 1
    place = (f"{streams} tf.data service{'s' if streams > 1 else ''} of one worker each, "
             "started in this process" if kind == "local"
             else f"the tf.data dispatcher at grpc://{where} (one worker)")
    split = (f", service k producing the examples k, k + {streams}, ... of this worker's share"
             if streams > 1 else "")
    return {"value": str(value), "mode": "parallel_epochs", "streams": streams, "exact": True,
            "says": f"{place}; parallel_epochs{split}: each example once per epoch, in the "
                    "one-machine order (the same batches as without the service)"}


def out_of_order_message(error: BaseException, value: str) -> str | None:
    """The one line for a served element found out of place (`_in_order`'s failure), or
    None for another error."""
    found = out_of_order_found(error)
    if found is None:
        return None
    position, expected = found
    return (f"dataset.service={value}: the tf.data service sent the example at position "
            f"{position} where {expected} was due: its dispatcher runs several workers, each "
            "producing the whole split (parallel_epochs); run one worker per dispatcher, or use "
            "dataset.service=local:K (K services beside the run)")


def start_local(count: int) -> tuple[str, ...]:
    """The targets of `count` one-worker tf.data services in this process, started now on
    free ports (those already running reused where there are as many)."""
    if len(_RUNNING.servers) != count:
        stop_local()
    while len(_RUNNING.servers) < count:
        dispatcher = _SERVICE.DispatchServer(_SERVICE.DispatcherConfig(port=0))
        port = int(dispatcher.target.rpartition(":")[2])
        try:
            worker_port, worker = _worker(port)
        except Exception:
            dispatcher.stop()
            raise
        _RUNNING.servers.append((dispatcher, worker_port, worker))
    return tuple(f"grpc://127.0.0.1:{d.target.rpartition(':')[2]}"
                 for d, _, _ in _RUNNING.servers)


def _worker(dispatcher_port: int) -> tuple[int, Any]:
    """A tf.data worker of the dispatcher at this port, on a free port chosen here (its
    config is the only public place that names the port)."""
    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        try:
            return port, _SERVICE.WorkerServer(_SERVICE.WorkerConfig(
                dispatcher_address=f"127.0.0.1:{dispatcher_port}",
                worker_address=f"127.0.0.1:{port}", port=port))
        except (tf.errors.UnavailableError, tf.errors.InternalError, RuntimeError):
            if attempt == PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def free_port() -> int:
    """A port no process listens on at this moment."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_ports() -> list[int]:
    """The ports the local services of this process listen on (none once stopped)."""
    return [port for dispatcher, worker_port, _ in _RUNNING.servers
            for port in (int(dispatcher.target.rpartition(":")[2]), worker_port)]


def stop_local() -> None:
    """Stops every tf.data server this process started (the run's end; idempotent)."""
    servers, _RUNNING.servers = _RUNNING.servers, []
    for dispatcher, _, worker in servers:
        worker.stop()
        dispatcher.stop()


def check_reachable(address: str, value: str) -> None:
    """Refuses a dispatcher that does not accept a connection, in one line.

    Raises:
        ConfigError: naming the address and what would be valid.
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S):
            return
    except OSError as error:
        reason = error.strerror or type(error).__name__
    raise ConfigError(f"dataset.service={value}: no tf.data dispatcher answers at {address} "
                      f"({reason}, {CONNECT_TIMEOUT_S:g} s); start one there "
                      "(tf.data.experimental.service.DispatchServer) or use "
                      "dataset.service=local:K (K services started beside the run)")
