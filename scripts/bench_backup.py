"""Steady step time with a backup at every epoch's end, against none, on disk and at a URL.

Both sides train the same model through `trainer` on the same synthetic data; the "none" side
replaces `BackupStore.save` with a no-op (nothing written, nothing uploaded), which no run
can ask for: it is the floor the backups are measured against. A side's steady step time is
the wall time from epoch 2's start to the end of training (each epoch's end included: its
validation, best checkpoint and, on one side, its backup's state taken; the rest of a backup
runs beside training) over the steps trained in it. The backup side also reports the share
of that time the step loop spent in `BackupStore` (the state taken, the waits for a backup
in flight) and the background writer's CPU time as a share of the cores' (each CPU second
it takes is one a busy training loses): shares of one run, which the machine's drift
between runs hardly moves, unlike the ratio of two runs. On
disk the run directory is a temporary folder; at a URL it is `s3://runs/...` on moto's S3
server on 127.0.0.1 (in this process), so an upload's cost is the client's and moto's, not a
network's. The sides alternate (none, backup, none, backup ...) in one process, because this
machine's speed drifts within minutes; the result is the median of the per-pair ratios.
Target: backup / none <= 1.05.

    python scripts/bench_backup.py --pairs 3
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
import urllib.request
from contextlib import contextmanager

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args() -> argparse.Namespace:
    from bench_overhead import base_parser

    parser = base_parser(__doc__.splitlines()[0], per_replica=32)
    parser.add_argument("--places", default="disk,url", help="disk, url or both")
    return parser.parse_args()


def make_clock():
    """A callback timing epochs 2..E (their ends included) and counting their steps."""
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.began, self.ended, self.steps, self.epoch = None, None, 0, 0
            self.in_backups = 0.0  # seconds of the timed time spent in BackupStore
            self.writer_cpu = 0.0  # CPU seconds of the background writer in the timed time

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            if epoch == 1:
                self.began = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.steps += self.epoch >= 1

        def on_train_end(self, logs=None):
            self.ended = time.perf_counter()

        def step_s(self) -> float:
            return (self.ended - self.began) / self.steps

    return Clock()


@contextmanager
def backups_off(off: bool, clock):
    """`BackupStore.save` as a no-op while the block runs (with `off`); else `save` and
    `wait` timed while `clock` times (`clock.in_backups`: the step loop's seconds in them,
    the backup's state taken and the waits for the one in flight)."""
    from trainer.rundir.backup import BackupStore

    saved, waited, completed = BackupStore.save, BackupStore.wait, BackupStore._complete

    def timed(method, counter: str = "in_backups", now=time.perf_counter):
        """`method`, adding its time while `clock` times to `clock.<counter>` (the writer's
        CPU: `time.thread_time` in its own thread)."""
        def call(self, *args, **kwargs):
            began = now()
            try:
                return method(self, *args, **kwargs)
            finally:
                if clock.began is not None and clock.ended is None:
                    setattr(clock, counter, getattr(clock, counter) + now() - began)
        return call

    if off:
        BackupStore.save = lambda self, model, epoch, step, *a, **k: self.path(epoch, step)
    else:
        BackupStore.save, BackupStore.wait = timed(saved), timed(waited)
        BackupStore._complete = timed(completed, "writer_cpu", time.thread_time)
    try:
        yield
    finally:
        BackupStore.save, BackupStore.wait, BackupStore._complete = saved, waited, completed


def step_time(args, run_dir: str, off: bool) -> tuple[float, float, float]:
    """Steady seconds per step of one run into `run_dir`, with backups or without; the
    share of the timed time the step loop spent in backups; and the background writer's
    CPU time as a share of what the cores gave in the timed time (`os.cpu_count()` cores):
    where training keeps every core busy, each CPU second the writer takes is one training
    loses, so the two shares add up to what the backups cost, accounted for in one run
    (the machine's drift between runs leaves it be)."""
    import trainer

    overrides = [f"model={args.model}", "dataset=synthetic",
                 f"dataset.train_examples={args.examples}",
                 f"dataset.image_size={args.image_size}", "accelerator=cpu",
                 f"devices={args.devices}", f"epochs={args.epochs}", "verbose=0",
                 f"batch.per_replica={args.per_replica}", "batch.drop_remainder=true",
                 "logger=[]"]
    clock = make_clock()
    with backups_off(off, clock):  # trainer.fit: a URL is a run directory at that URL
        trainer.fit(overrides, run_dir=run_dir, callbacks=[clock])
    timed = clock.ended - clock.began
    return (clock.step_s(), clock.in_backups / timed,
            clock.writer_cpu / (timed * (os.cpu_count() or 1)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server(scratch: str):
    """moto's S3 server on 127.0.0.1 in this process, with the bucket `runs`; the
    environment trainer's run directory at a URL reads."""
    import s3fs
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "TRAINER_SCRATCH": scratch})
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("runs")
    try:
        yield
    finally:
        server.stop()


def measure(args, place: str, scratch: str) -> tuple[list[float], list[float]]:
    """The per-pair ratios backup / none at one place, and the backup side's share of its
    timed time spent in backups in the step loop."""
    ratios, shares = [], []
    for pair in range(args.pairs):
        times = {}
        for side in ("none", "backup"):
            run_dir = (f"s3://runs/{side}-{pair}" if place == "url"
                       else tempfile.mkdtemp(dir=scratch))
            times[side], share, writer = step_time(args, run_dir, off=side == "none")
        ratios.append(times["backup"] / times["none"])
        shares.append((share, writer))
        print(f"{place} pair {pair + 1}: none {times['none'] * 1e3:7.2f} ms/step  backup "
              f"{times['backup'] * 1e3:7.2f} ms/step  (ratio {ratios[-1]:.3f}; the step loop "
              f"in backups {share:.1%} of the time, the writer {writer:.1%} of the cores)",
              flush=True)
    return ratios, shares


def main() -> None:
    args = parse_args()
    from bench_overhead import start

    start(args.devices)
    places = [p for p in args.places.split(",") if p]
    print(f"model={args.model} devices={args.devices} batch {args.per_replica} per replica; "
          f"examples={args.examples} epochs={args.epochs} (epoch 1 not timed); a backup at "
          "every epoch's end vs none")
    with tempfile.TemporaryDirectory() as scratch:
        found = {}
        for place in places:
            if place == "url":
                with s3_server(os.path.join(scratch, "mirror")):
                    found[place] = measure(args, place, scratch)
            else:
                found[place] = measure(args, place, scratch)
    for place, (ratios, shares) in found.items():
        where = "on disk" if place == "disk" else "at an S3 URL (moto, 127.0.0.1)"
        loop = statistics.median(s for s, _ in shares)
        writer = statistics.median(w for _, w in shares)
        print(f"median ratio backup / none {where} over {args.pairs} pairs: "
              f"{statistics.median(ratios):.3f}  (each: "
              f"{', '.join(f'{r:.3f}' for r in ratios)}; target <= 1.05); accounted in the "
              f"backup runs: the step loop in backups {loop:.1%} of the timed time + the "
              f"writer's CPU {writer:.1%} of the cores' = {1 + loop + writer:.3f}")


if __name__ == "__main__":
    main()
