"""Where a training run starts: its newest good backup restored into the model (a new
run: the start), after the data and the global batch are checked against the backup's."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from trainer.data.fingerprint import check_same_data, of_source
from trainer.distribute.multiworker import share_from_chief
from trainer.distribute.strategy import strategy_kind
from trainer.run.assembly.assemble import Run
from trainer.run.prepare.preflight import Checked
from trainer.rundir.backup import BackupStore, tidy
from trainer.rundir.layout import RunDir
from trainer.rundir.resume import check_global_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """Where training starts: (epoch, step in epoch), the per-epoch metrics of the epochs
    done before it, and the training metrics' state at that step (None at an epoch's start,
    for an older backup, or one shared by the chief of a multi-worker run), and the
    recoveries from a loss blow-up made before it (`checkpoint.recover`)."""

    at: tuple[int, int] = (0, 0)
    history: dict[str, list] | None = None
    metrics: tuple | None = None
    recovered: tuple = ()


def restore_backup(checked: Checked, run: Run, run_dir: Path) -> Start:
    """Restores the newest good backup into the run's model (built with its optimizer).

    Raises:
        ConfigError: the data or the global batch differ from the backup's in a way that
            would train something else.
    """
    spec, model = checked.spec, run.model
    if run.is_chief:
        check_same_data(run_dir, (checked.state or {}).get("data"),
                        of_source(run.data.source))
        check_global_batch(run_dir, checked.state, run.batch.global_size,
                           run.batch.replicas, run.batch.accumulate)
        tidy(run_dir)
    # Loaded outside the scope: Keras's loader creates throwaway variables, which under
    # MultiWorkerMirroredStrategy's scope would start collectives on the chief alone.
    point = BackupStore(RunDir(run_dir).backup).restore(model)
    if strategy_kind(run.strategy_name).resume_from_chief:
        # Only the chief keeps backups: every worker continues from the chief's.
        point = share_from_chief(run.strategy, model, point)
    if point is None:
        return Start(history={})
    at = (point.epoch + 1, 0) if point.step >= run.steps else (point.epoch, point.step)
    if at[0] >= spec.epochs and not at[1]:
        log.warning("resuming from %s: every epoch is trained; finishing the run", point.path)
    else:
        log.warning("resuming from %s: epoch %d, step %d", point.path, point.epoch + 1,
                    point.step)
    done = {k: list(v)[:at[0]] for k, v in point.state.get("history", {}).items()}
    return Start(at, done, point.metrics if at[1] else None,
                 tuple(point.state.get("recovered", ())))
