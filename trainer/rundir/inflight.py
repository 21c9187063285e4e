"""The slow part of a backup beside training: at most one in flight, in one thread.

A backup's state is taken in the step loop (the next step changes the weights); what only
reads the files written then (their checksums, `state.json`, the rename into place, the old
backups pruned, the upload to a run directory's URL) runs in one background thread while
training goes on. A new backup waits for the one in flight, and so do a stop, a recovery's
restore and the run's end: a backup is complete, and named as the newest, only once all of
it is done (`trainer.rundir.backup.BackupStore`).

A failure in the background (the store gone, a full disk) is kept and raised, as it was
raised there, by the next `wait`: the next backup's, or the run's end. It is never lost:
where the run already fails with another error, `close` logs it in one line.

The thread is the run's: its `BackupStore` creates it at the first backup, and the run's
owner closes it (`trainer.run.session.Session.close`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class InFlight:
    """One background thread running at most one piece of work at a time."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None

    @property
    def busy(self) -> bool:
        """Whether work was handed over and not yet waited for."""
        return self._future is not None

    def submit(self, work: Callable[[], Any]) -> None:
        """Runs `work` in the background once the work before it is done.

        Raises:
            What the work before it raised (it is waited for first).
        """
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-backup")
        self._future = self._pool.submit(work)

    def wait(self) -> None:
        """Blocks until the work in flight is done (nothing where none is).

        Raises:
            What the work raised, as it raised it (once: the next `wait` returns).
        """
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def close(self, failed: bool = False) -> None:
        """Waits for the work in flight and ends the thread.

        Args:
            failed: the run fails already: a failure of the work is logged in one line
                (the run's own error is the one it ends with) instead of raised.
        """
        try:
            self.wait()
        except Exception as error:  # noqa: BLE001 - said, never lost; the run's error wins
            if not failed:
                raise
            why = (str(error).splitlines() or [type(error).__name__])[0]
            log.warning("the last backup did not complete: %s", why)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
