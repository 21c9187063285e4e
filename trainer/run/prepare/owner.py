"""The owner of a checked run: the one stack of guards, unwound once when the run ends.

The pre-flight (`trainer.run.prepare.preflight`) takes the run directory's lock and hands
the run over as a `Checked` value with its `Owner`, which holds the run's place too
(`trainer.rundir.remote.RunPlace`: for a run directory at a URL, its mirror and lease,
opened and closed around the whole command by `trainer.run.prepare.place`); the start-up
sequence (`trainer.run.prepare.startup`: the command line, `trainer.fit` and `train(cfg)`
alike) holds the owner around the run, and the run's session (`trainer.run.session.Session`,
once TensorFlow runs) gives it its own guards. When the run ends, well or not, the owner
unwinds them all, once, in this order:

1. the session's: the watchdog stopped, the trackers finished as FAILED, a failure turned
   into the error a user reads (a full disk, an image that does not decode, a lost worker:
   `trainer.run.guards`), another worker's scratch directory removed;
2. on a failure, the directories this start created removed where they hold no run
   (`trainer.rundir.fresh`);
3. the run directory's lock released (this run's alone).

The entry point then prints the error as its one line and exit code
(`trainer.run.process.exit_with`), or raises it as `TrainerError` (`trainer.fit`).

A decide module: no TensorFlow (the session's guards are its own methods).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from trainer.rundir.fresh import Fresh, remove_fresh
from trainer.rundir.lock import RunLock
from trainer.rundir.remote import RunPlace


class Owner:
    """The guards of one checked run, held while it runs and unwound once at its end.

    The command line holds it around Hydra's job as well as inside it (a start that ends
    before the job runs is ended too): the first end unwinds the guards, a later one does
    nothing.

    Attributes:
        lock: the run directory's lock, this run's alone (None: another worker's run).
        fresh: `(directory, topmost directory created)` for each directory this start
            created (`trainer.rundir.fresh.Fresh`).
        place: the run's place, which its backups reach and its messages name
            (`trainer.rundir.remote.RunPlace`: the local folder, or a URL's mirror and
            lease); None: another worker's run, which writes no run directory.
        session: the run's session once it exists (see `adopt`).
        began: when the pre-flight made it (`time.perf_counter()`).
    """

    def __init__(self, lock: RunLock | None = None, fresh: Sequence[Fresh] = (),
                 place: RunPlace | None = None) -> None:
        self.lock, self.fresh, self.place = lock, tuple(fresh), place
        self.began = time.perf_counter()  # the pre-flight's start: the run's own clock
        self.session: Any = None
        self._held = False
        self._ended = False

    def __enter__(self) -> Owner:
        self._held = True
        return self

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        self.end(error)
        return False

    def adopt(self, session: Any) -> None:
        """Takes the run's session, whose `close(error)` is the first guard; a newer session
        of the same run takes its place (`tune=batch`'s tries, each after the last).

        Raises:
            RuntimeError: the owner is not held (`with checked.owned():`), or has ended.
        """
        if not self._held or self._ended:
            raise RuntimeError("a run's session runs inside its owner: "
                               "`with checked.owned(): ...` (trainer.run.prepare.startup.launch)")
        self.session = session

    def end(self, error: BaseException | None = None) -> None:
        """Unwinds the guards (once: a second call does nothing).

        Args:
            error: what ended the run; None for a run that ended well.

        Raises:
            The error a user reads in place of `error`, where the session has one.
        """
        if self._ended:
            return
        self._ended = True
        session, self.session = self.session, None
        failed = error is not None
        try:
            if session is not None:
                session.close(error)
        except BaseException:
            failed = True
            raise
        finally:
            try:
                if failed:
                    remove_fresh(self.fresh)
            finally:
                if self.lock is not None:
                    self.lock.release()
