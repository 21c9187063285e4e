"""One writer at a time at a URL: a lease object, `URL/lease.json`, as `.lock` is on disk.

The lease is created only where it is absent (fsspec's `mode="create"`: S3's conditional PUT
`If-None-Match: *`, GCS's `ifGenerationMatch=0`), and holds its holder (host, pid, a token
of its own), when it started, and a heartbeat (seconds since the epoch) that a daemon thread
writes again every `TRAINER_LEASE_SECONDS` (30 by default). A second start finds it and is
refused in one line naming the holder. A lease is stale, and taken over, when its holder's
heartbeat is older than `STALE` intervals (a machine gone: clocks are taken to agree within
an interval), or at once when its holder is a process of this host that is no longer
alive (the rule the local lock follows for a dead pid).

Some servers ignore the condition (gcp-storage-emulator overwrites): the lease is read
before it is created and read back after, and every heartbeat and every push (`check`)
reads it again. A run whose lease another start took over stops at its next backup without
writing to the URL (`Interrupted`), so two writers do not interleave their backups (what is
left is the instant between a push's read of the lease and its uploads).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from trainer.config.errors import ConfigError, Interrupted
from trainer.rundir.layout import LEASE
from trainer.rundir.remote import explain

log = logging.getLogger(__name__)

INTERVAL = "TRAINER_LEASE_SECONDS"
STALE = 4  # heartbeats missed before a lease is taken over


def interval() -> float:
    """Seconds between heartbeats (`TRAINER_LEASE_SECONDS`, 30 by default)."""
    try:
        return max(float(os.environ.get(INTERVAL, "30")), 0.1)
    except ValueError:
        raise ConfigError(f"{INTERVAL} must be a number of seconds; received "
                          f"{os.environ[INTERVAL]!r}") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


class Lease:
    """The lease on the run directory at `url` (`fs`, `path`: its fsspec file system and
    the path in it)."""

    def __init__(self, fs: Any, path: str, url: str) -> None:
        self.fs, self.url, self.key = fs, url, f"{path}/{LEASE}"
        self.every = interval()
        self.token = uuid.uuid4().hex
        self.started = time.time()
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "token": self.token, "started": self.started,
                           "heartbeat": time.time(), "interval": self.every}).encode()

    def _read(self) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(self.key))
        except FileNotFoundError:
            return None
        except ValueError:
            return {}  # not a lease of ours: never fresh

    def _stale(self, held: dict) -> bool:
        if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int):
            if not _alive(held["pid"]):
                return True
        beat = held.get("heartbeat")
        every = held.get("interval", self.every)
        return not isinstance(beat, (int, float)) or time.time() - beat > STALE * every

    def _refuse(self, held: dict) -> ConfigError:
        age = time.time() - float(held.get("heartbeat", 0))
        return ConfigError(f"run directory {self.url} is in use by another run (host "
                           f"{held.get('host')}, pid {held.get('pid')}, heartbeat {age:.0f} s "
                           "ago); wait for it to end, or choose another hydra.run.dir")

    def _create(self) -> bool:
        """Writes the lease where none is; False where one is."""
        try:
            self.fs.pipe_file(self.key, self._body(), mode="create")
        except FileExistsError:
            return False
        except TypeError:  # a file system without exclusive create: read back below
            if self.fs.exists(self.key):
                return False
            self.fs.pipe_file(self.key, self._body())
        return True

    def take(self) -> None:
        """Takes the lease (a stale one taken over) and starts its heartbeat.

        Raises:
            ConfigError: another run holds it (naming its host and pid), or the storage
                cannot be reached (one line).
        """
        try:
            self._take()
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - every storage failure is one line
            raise ConfigError(explain(error, self.url)) from None
        self._thread = threading.Thread(target=self._beat, name="trainer-lease", daemon=True)
        self._thread.start()

    def _take(self) -> None:
        # Read first: a server that ignores the condition would let a create overwrite a
        # live lease; the condition still decides between two starts at the same instant.
        held = self._read()
        if held is not None:
            if not self._stale(held):
                raise self._refuse(held)
            log.warning("taking over the stale lease of %s (host %s, pid %s)", self.url,
                        held.get("host"), held.get("pid"))
            self.fs.rm_file(self.key)
        if not self._create():
            raise self._refuse(self._read() or {})
        held = self._read() or {}
        if held.get("token") != self.token:  # a server that ignored the condition
            raise self._refuse(held)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                held = self._read()
                if held is not None and held.get("token") not in (None, self.token):
                    self.lost = f"host {held.get('host')}, pid {held.get('pid')}"
                    return
                self.fs.pipe_file(self.key, self._body())
            except Exception as error:  # noqa: BLE001 - the next push reports the storage
                log.warning("the lease of %s was not renewed: %s", self.url,
                            explain(error, self.url))

    def check(self) -> None:
        """Raises `Interrupted` where another start took the lease over: read again before
        every push, so a run whose heartbeat was missed writes no backup over the new
        holder's (a heartbeat's interval would leave that window open)."""
        if self.lost is None:
            try:
                held = self._read()
            except Exception:  # noqa: BLE001 - the push that follows reports the storage
                held = None
            if held is not None and held.get("token") not in (None, self.token):
                self.lost = f"host {held.get('host')}, pid {held.get('pid')}"
        if self.lost is not None:
            raise Interrupted(f"another run ({self.lost}) took over the lease of {self.url} "
                              "(this run's heartbeat was missed); this run stopped without "
                              "writing there again")

    def release(self, quiet: bool = False) -> None:
        """Stops the heartbeat and removes the lease where it is still this run's; `quiet`:
        a storage that failed already (and was reported) is not reported again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every + 5)
        try:
            held = self._read()
            if held is not None and held.get("token") == self.token:
                self.fs.rm_file(self.key)
        except Exception as error:  # noqa: BLE001 - a lease left goes stale on its own
            log.warning("the lease of %s was not removed (%s); it goes stale in %.0f s",
                        self.url, explain(error, self.url), STALE * self.every)
