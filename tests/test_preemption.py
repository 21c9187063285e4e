"""Preemption notices: SIGUSR1 (SLURM's `--signal=B:USR1@120`) starts the same agreed stop
as SIGTERM, in training, at start-up, and through the local launcher."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import keras
import pytest

from trainer.config.errors import EXIT_INTERRUPTED, Interrupted
from trainer.distribute.launch import launch_once
from trainer.run import process
from trainer.run.train import train


class NoticeAt(keras.callbacks.Callback):
    """Sends this process SIGUSR1 after step `step` of the first epoch, as SLURM would
    ahead of a preemption."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


def test_a_preemption_notice_stops_with_a_backup_and_the_rerun_resumes(tiny_config, tmp_path):
    args = ["epochs=1", "deterministic=true"]
    with pytest.raises(Interrupted, match=f"stopped by signal {int(signal.SIGUSR1)} at "
                                          "epoch 1") as stopped:
        train(tiny_config(*args), run_dir=tmp_path, callbacks=[NoticeAt(3)])
    assert stopped.value.exit_code == EXIT_INTERRUPTED == 75
    assert [p.name for p in (tmp_path / "backup").iterdir()] == ["ckpt-000000-000000004"]
    summary = train(tiny_config(*args), run_dir=tmp_path)
    assert summary["resumed_from"]["step"] == 4 and summary["epochs"] == 1


def test_a_preemption_notice_at_start_up_is_the_one_line_of_sigterm():
    with pytest.raises(process.Terminated) as caught, process.signals_raise():
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)  # the handler raises first
    line, code = process.exit_code(caught.value)
    assert code == EXIT_INTERRUPTED and line.startswith("interrupted: SIGUSR1 outside"), line


def test_a_signal_caught_at_one_start_up_is_not_raised_again_in_a_later_run():
    """The block's signals are checked again once TensorFlow started, inside the block; a
    later `trainer.fit` in the same process (no block of its own) stopped on a notice an
    earlier block had already turned into its one line."""
    with pytest.raises(process.Terminated), process.signals_raise():
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
    process.raise_if_signalled()  # nothing left over


WAITS_FOR_NOTICE = ("import signal, sys, time\n"
                    "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))\n"
                    "print('ready', flush=True)\n"
                    "time.sleep(60)\n")


def test_the_launcher_passes_a_preemption_notice_on_to_every_worker(tmp_path):
    """SIGUSR1 to the launcher (the batch shell's process under `--signal=B:USR1@...`)
    reaches every worker, each of which ends as the agreed stop does (75)."""
    commands = [[sys.executable, "-c", WAITS_FOR_NOTICE] for _ in range(2)]
    out = (tmp_path / "out.log").open("w+")

    def notice() -> None:
        deadline = time.monotonic() + 30
        while Path(out.name).read_text().count("] ready") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=notice, daemon=True).start()
    started = time.monotonic()
    _, code = launch_once(commands, tmp_path, grace=5.0, out=out)
    text = Path(out.name).read_text()
    assert code == EXIT_INTERRUPTED, text
    assert "[launch] SIGUSR1: passed on to every worker" in text
    assert time.monotonic() - started < 20
