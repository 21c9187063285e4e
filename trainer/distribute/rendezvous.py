"""The workers of a cluster meet before TensorFlow's start-up: each reaches the chief, the
chief checks that every worker runs the same config with the same versions, and all go on
together, or all stop with the same line. No TensorFlow.

Why before TensorFlow: MultiWorkerMirroredStrategy's creation waits for every task inside
TensorFlow's C++ code, which holds the interpreter: a missing chief there was a wait of about
ten minutes that neither SIGTERM nor Ctrl-C could end, and workers started with different
configs failed later in a collective, each with its own traceback. Here the wait is Python's
(a signal ends it at once), bounded by `strategy.start_timeout_s`, and names what it waits
for; a taken port is named before TensorFlow's server would fail on it.

The chief listens on its own cluster port (TensorFlow's server takes it over afterwards);
each other worker connects and sends one JSON line, `{"meet": 1, "task": ID, "facts":
{...}}`. Once every worker has, the chief compares each one's facts with its own and answers
each with `{"go": true}` or `{"stop": LINE, "code": 2}` (a difference: every worker prints
that line), or, at its timeout, `{"stop": LINE, "code": 4}` naming the workers that never came.
"""

from __future__ import annotations

import errno
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from trainer.config.errors import EXIT_CONFIG, EXIT_WORKER_LOST, ConfigError, WorkerLost
from trainer.distribute.cluster import Cluster
from trainer.rundir.resume import flatten

PROTOCOL = 1
POLL_S = 0.2  # how long any wait lasts before Python's signal handlers may run again
SAY_AFTER_S = 5.0  # a worker says it waits for the chief once it has for this long
# Config keys that differ between the workers of one cluster by design.
PER_TASK = ("cluster.task_index",)
IN_USE = "is in use by another process"  # the launcher picks other ports on this phrase
SAME_CONFIG = ("start every worker with the same config and the same trainer, TensorFlow "
               "and Keras")


def facts(record: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    """What must be equal on every worker, as flat `key: value`: the resolved config less
    its per-task keys, and the versions of the packages that run it (`version.NAME`)."""
    found = {k: v for k, v in flatten(record).items() if k not in PER_TASK}
    found.update({f"version.{name}": value for name, value in versions.items()})
    return found


def difference(cluster: Cluster, chief: dict[str, Any], others: dict[int, dict[str, Any]],
               fix: str = SAME_CONFIG) -> str | None:
    """The line every worker prints where a worker's facts differ from the chief's (the
    first such worker, each key that differs with both values, then `fix`); None where
    all agree."""
    for task_id in sorted(others):
        theirs = others[task_id]
        keys = [k for k in [*chief, *(k for k in theirs if k not in chief)]
                if chief.get(k, _MISSING) != theirs.get(k, _MISSING)]
        if not keys:
            continue
        job, index, _ = cluster.tasks[task_id]
        who = [cluster.name(job, index), cluster.name(job, index).split(" (")[0]]
        shown = [f"{k}: the chief has {_show(chief, k)}, {who[min(i, 1)]} has "
                 f"{_show(theirs, k)}" for i, k in enumerate(keys[:3])]
        more = f" (and {len(keys) - 3} more: {', '.join(keys[3:6])})" if len(keys) > 3 else ""
        return f"workers disagree on {'; on '.join(shown)}{more}; {fix}"
    return None


_MISSING = object()


def _show(found: dict[str, Any], key: str) -> str:
    if key not in found:
        return "no such key"
    shown = found[key] if isinstance(found[key], str) else json.dumps(found[key])
    return shown if len(shown) <= 40 else f"{shown[:16]}..."  # a hash: its start tells


def meet(cluster: Cluster, mine: dict[str, Any], timeout_s: float | None,
         say: Callable[[str], None] = print) -> None:
    """Meets every other worker of the cluster before TensorFlow starts (see the module).

    Args:
        cluster: the cluster, with this process's place in it.
        mine: this worker's `facts`.
        timeout_s: `strategy.start_timeout_s`: how long to wait for the others (None: no
            limit).
        say: where a worker says once that it waits for the chief.

    Raises:
        ConfigError: this worker's port is taken, or the workers' facts differ (the same
            line on every worker).
        WorkerLost: a worker did not come within `timeout_s`.
    """
    if cluster.num_workers < 2:
        return
    timeout_s = float("inf") if timeout_s is None else timeout_s
    if cluster.is_chief:
        _Host(cluster, mine, timeout_s).run()
    else:
        _check_port_free(cluster, cluster.task_id)
        _join(cluster, mine, timeout_s, say)


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _listener(cluster: Cluster, task_id: int) -> socket.socket:
    """A socket listening on the task's port on every interface, as TensorFlow's server does
    (its host may name a service address rather than one of this machine's)."""
    job, index, address = cluster.tasks[task_id]
    port = _port(address)
    try:
        try:
            return socket.create_server(("::", port), family=socket.AF_INET6,
                                        dualstack_ipv6=True)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise
            return socket.create_server(("", port))  # no IPv6 here
    except OSError as error:
        what = "the chief's" if task_id == 0 else f"{cluster.name(job, index)}'s"
        problem = IN_USE if error.errno == errno.EADDRINUSE else (
            f"cannot be listened on ({error.strerror})")
        raise ConfigError(f"port {port} ({what} address {address}) {problem}; stop that "
                          "process, or give this worker another port (cluster.workers, "
                          "TF_CONFIG or cluster.port_base)") from None


def _check_port_free(cluster: Cluster, task_id: int) -> None:
    _listener(cluster, task_id).close()


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


class _Lines:
    """Newline-delimited JSON read from a socket in steps of at most `POLL_S`."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer, self.closed = conn, b"", False
        conn.settimeout(POLL_S)

    def next(self) -> dict[str, Any] | None:
        """The next message; None where none came within `POLL_S` or the peer closed."""
        while b"\n" not in self.buffer:
            try:
                chunk = self.conn.recv(65536)
            except TimeoutError:
                return None
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        return message if isinstance(message, dict) else {}


class _Host:
    """The chief's side: waits for every worker's facts, then answers each."""

    def __init__(self, cluster: Cluster, mine: dict[str, Any], timeout_s: float) -> None:
        self.cluster, self.mine, self.timeout_s = cluster, mine, timeout_s
        self.peers: dict[int, tuple[_Lines, dict[str, Any]]] = {}
        self.pending: list[_Lines] = []

    def run(self) -> None:
        server = _listener(self.cluster, 0)
        server.settimeout(POLL_S)
        try:
            deadline = time.monotonic() + self.timeout_s
            while len(self.peers) < self.cluster.num_workers - 1:
                if time.monotonic() > deadline:
                    self._answer({"stop": self._missing(), "code": EXIT_WORKER_LOST})
                    raise WorkerLost(self._missing())
                self._accept(server)
                self._read()
            line = difference(self.cluster, self.mine,
                              {task: found for task, (_, found) in self.peers.items()})
            self._answer({"go": True} if line is None else {"stop": line, "code": EXIT_CONFIG})
            if line is not None:
                raise ConfigError(line)
        finally:
            for lines in [*self.pending, *(lines for lines, _ in self.peers.values())]:
                lines.conn.close()
            server.close()

    def _accept(self, server: socket.socket) -> None:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            return
        self.pending.append(_Lines(conn))

    def _read(self) -> None:
        """Takes the hellos that came; forgets peers that closed (a worker restarted)."""
        for lines in list(self.pending):
            hello = lines.next()
            if lines.closed or (hello is not None and not _valid(hello, self.cluster)):
                self.pending.remove(lines)
                lines.conn.close()
            elif hello is not None:
                self.pending.remove(lines)
                old = self.peers.pop(hello["task"], None)
                if old is not None:
                    old[0].conn.close()
                self.peers[hello["task"]] = (lines, hello["facts"])
        for task, (lines, _) in list(self.peers.items()):
            if _gone(lines.conn):
                del self.peers[task]
                lines.conn.close()

    def _missing(self) -> str:
        missing = [self.cluster.name(job, index)
                   for task, (job, index, _) in enumerate(self.cluster.tasks)
                   if task and task not in self.peers]
        return (f"the chief waited {self.timeout_s:g} s (strategy.start_timeout_s) for "
                f"{', '.join(missing)}, which never connected; start every worker with "
                "the same cluster, or check the address and that the port is reachable")

    def _answer(self, message: dict[str, Any]) -> None:
        """Sends the verdict to every worker, then lets each close first (so the port is
        TensorFlow's at once)."""
        for lines, _ in self.peers.values():
            try:
                _send(lines.conn, message)
            except OSError:
                pass
        end = time.monotonic() + 2.0
        for lines, _ in self.peers.values():
            while not lines.closed and time.monotonic() < end:
                lines.next()


def _valid(hello: dict[str, Any], cluster: Cluster) -> bool:
    task = hello.get("task")
    return (hello.get("meet") == PROTOCOL and isinstance(task, int)
            and 0 < task < cluster.num_workers and isinstance(hello.get("facts"), dict))


def _gone(conn: socket.socket) -> bool:
    """Whether the peer closed its end (a worker that stopped while the chief waited)."""
    try:
        conn.setblocking(False)
        try:
            return conn.recv(1, socket.MSG_PEEK) == b""
        finally:
            conn.settimeout(POLL_S)
    except BlockingIOError:
        return False
    except OSError:
        return True


def _join(cluster: Cluster, mine: dict[str, Any], timeout_s: float,
          say: Callable[[str], None]) -> None:
    """A worker's side: reaches the chief, sends its facts, and waits for the verdict."""
    _, _, chief = cluster.tasks[0]
    host, port = chief.rpartition(":")[0].strip("[]"), _port(chief)
    me = cluster.name(cluster.task_type, cluster.task_index)
    started = time.monotonic()
    deadline = started + timeout_s
    said = False
    while True:
        if time.monotonic() > deadline:
            raise WorkerLost(f"{me} waited {timeout_s:g} s (strategy.start_timeout_s) for "
                             f"the chief at {chief}, which never answered; start it (with "
                             "the same cluster), or check the address and that the port "
                             "is reachable")
        try:
            conn = socket.create_connection((host, port), timeout=POLL_S * 5)
        except OSError:
            if not said and time.monotonic() - started > SAY_AFTER_S:
                say(f"{me}: waiting for the chief at {chief} (up to {timeout_s:g} s, "
                    "strategy.start_timeout_s)")
                said = True
            time.sleep(POLL_S)
            continue
        verdict = _ask(conn, cluster.task_id, mine, deadline + 10.0)
        if verdict is None:
            continue  # the chief went away before answering: it may be restarting
        if "go" in verdict:
            return
        error = ConfigError if verdict.get("code") == EXIT_CONFIG else WorkerLost
        raise error(str(verdict.get("stop")))


def _ask(conn: socket.socket, task_id: int, mine: dict[str, Any],
         deadline: float) -> dict[str, Any] | None:
    """Sends the hello and waits for the chief's verdict (None: the chief closed)."""
    try:
        lines = _Lines(conn)
        _send(conn, {"meet": PROTOCOL, "task": task_id, "facts": mine})
        while time.monotonic() < deadline:
            verdict = lines.next()
            if lines.closed:
                return None
            if verdict:
                return verdict
        return None
    except OSError:
        return None
    finally:
        conn.close()
