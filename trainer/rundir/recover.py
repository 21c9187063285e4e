"""Recovery from a loss blow-up (`checkpoint.recover`), as TF Model Garden's
`loss_upper_bound` and `recovery_max_trials`: a training loss that is not finite, or above
the bound, restores the last backup before it and training goes on with the batches after
the one where it was seen, skipping those that led there; up to `max_trials` times, then the
run stops with one line naming the step.

The decisions here are pure; `trainer.rundir.backup.Backup` checks the loss at its step
boundaries and does the restore.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Recovery:
    """The run's recovery settings and what it recovered from.

    Args:
        loss_upper_bound: a training loss above this is a blow-up (None: non-finite only).
        max_trials: how many recoveries a run may make (0: off).
    """

    loss_upper_bound: float | None = None
    max_trials: int = 0
    # one record per recovery: epoch and step (1-based) where the loss was seen, the loss,
    # the backup restored, and the batches skipped ([first, last] positions in that epoch)
    recovered: list[dict] = field(default_factory=list)

    @property
    def on(self) -> bool:
        """Whether the run recovers at all."""
        return self.max_trials > 0

    def blown_up(self, loss: float) -> bool:
        """Whether a training loss calls for a recovery (or, with it off, for the NaN stop)."""
        bound = self.loss_upper_bound if self.on else None
        return not math.isfinite(loss) or (bound is not None and loss > bound)

    def trials_left(self) -> bool:
        """Whether another recovery may be made."""
        return len(self.recovered) < self.max_trials

    def record(self, epoch: int, step: int, loss: float, backup: str, since: int) -> dict:
        """Notes a recovery: the loss `loss` seen at `step` of `epoch` (both 1-based), the
        `backup` restored (its name), which held `since` steps of that epoch.

        Returns:
            The record, whose `skipped` are the batch positions (1-based, in the epoch)
            that training now leaves out: from the backup's next one to `step`.
        """
        found = {"epoch": epoch, "step": step, "loss": float(loss), "restored": backup,
                 "skipped": [since + 1, step]}
        self.recovered.append(found)
        return found

    def why(self, loss: float) -> str:
        """What made `loss` a blow-up: not finite, or above the bound (named)."""
        if math.isfinite(loss) and self.loss_upper_bound is not None:
            return (f"loss became {loss:g}, above checkpoint.recover.loss_upper_bound="
                    f"{self.loss_upper_bound:g},")
        return f"loss became {loss}"

    def remedy(self, loss: float) -> str:
        """What to do: a finite loss above the bound may be the bound's own doing."""
        if math.isfinite(loss) and self.loss_upper_bound is not None:
            return ("raise checkpoint.recover.loss_upper_bound above the loss a normal step "
                    "reaches, or lower optimizer.lr")
        return "lower optimizer.lr, add warm-up, or look at the data of those batches"

    def exhausted(self, epoch: int, step: int, loss: float) -> str:
        """The one line of a blow-up past `max_trials`."""
        where = ", ".join(f"epoch {r['epoch']} step {r['step']}" for r in self.recovered)
        return (f"{self.why(loss)} at epoch {epoch}, step {step}, after "
                f"{len(self.recovered)} recover{'ies' if len(self.recovered) != 1 else 'y'} "
                f"({where}; checkpoint.recover.max_trials={self.max_trials}); "
                f"{self.remedy(loss)}")
