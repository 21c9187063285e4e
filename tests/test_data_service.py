"""`dataset.service`: the training split read on TensorFlow's tf.data service gives the batches
of a run without it, and leaves no server behind (`trainer.data.service`)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, error_lines, run_main
from tests.test_multiworker import COMMON, assert_same_weights, launches, reference  # noqa: F401
from trainer.config.errors import ConfigError
from trainer.config.validate import read_pipeline, service_of
from trainer.data import service
from trainer.data.pipeline import Batches, Epochs, Order, Prep, build_training_epochs
from trainer.data.shares import Place
from trainer.run.train import train
from trainer.rundir.resume import check_resume

PORTS_LINE = re.compile(r"dataset\.service=local:\d+: .*\(ports ([\d, ]+)\)")


def listening(port: int) -> bool:
    """Whether a process accepts connections on this port of 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def ports_in(output: str) -> list[int]:
    found = PORTS_LINE.search(output)
    assert found, f"no line naming the services' ports in:\n{output[-2000:]}"
    return [int(p) for p in found[1].split(",")]


@pytest.fixture
def stopped_after():
    """Stops this process's services after the test, whatever it did."""
    yield
    service.stop_local()


def test_service_values_are_checked():
    assert service_of(None) is None and service_of("null") is None
    assert service_of("local:2") == ("local", 2)
    assert service_of("grpc://data.example.com:5050") == ("grpc", "data.example.com:5050")
    for bad in ("local:0", "local:two", "grpc://host", "host:5050", "grpc://h:70000"):
        with pytest.raises(ConfigError, match=r"^dataset\.service must be local:K .*received"):
            service_of(bad)


def test_a_resume_may_add_move_or_drop_the_service(tmp_path):
    """Where the preprocessing runs changes no batch: a free key of a resume, reported."""
    state = {"epoch": 0, "step": 0, "config": {"epochs": 2, "dataset": {"service": "local:4"}}}
    for value in ("local:2", "grpc://10.0.0.1:5050", None):
        assert check_resume(tmp_path, state, {"epochs": 2, "dataset": {"service": value}}) == {
            "dataset.service": ["local:4", value]}
    with pytest.raises(ConfigError, match="dataset.lanes from 1 to 2"):  # not free
        check_resume(tmp_path, {**state, "config": {"epochs": 2, "dataset": {"lanes": 1}}},
                     {"epochs": 2, "dataset": {"lanes": 2}})


def read(value):
    """`dataset.service` as the run reads it (`Spec.pipeline.served`)."""
    return read_pipeline({"_target_": "trainer.data.digits.load", "service": value}).served


def _batches(served, place, lanes, cache, drop=False, examples=103):
    rng = np.random.default_rng(0)
    x = rng.random((examples, 3, 3, 1), dtype=np.float32)
    y = np.eye(3, dtype=np.float32)[np.arange(examples) % 3]
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    epochs = build_training_epochs(
        dataset, Batches(16, 2, examples, drop), Epochs(1, 3, 1),
        prep=Prep(lambda a, b: (a * 2, b), cache=cache), order=Order(7, 40, lanes),
        place=place, augment=["flip", "mixup"], service=served)
    return list(epochs.as_numpy_iterator())


@pytest.mark.parametrize("place, lanes, cache, drop", [
    (None, 1, "memory", False), (Place(2, 1, 1), 4, "none", True), (Place(3, 2, 2), 1, "memory",
                                                                     False)])
def test_served_batches_are_those_without_a_service(place, lanes, cache, drop, stopped_after):
    """Two services, each producing every other example of the worker's share: the same
    batches, example for example, as the pipeline without them (augmentation and a batch
    mixer, a resumed first step skipped, one worker or one of several, with and without a
    cache, lanes the 2 x workers divide or not, a dropped last batch)."""
    served = service.Service.of(read("local:2"))
    ports = service.local_ports()
    assert len(ports) == 4 and all(map(listening, ports))
    expected = _batches(None, place, lanes, cache, drop)
    actual = _batches(served, place, lanes, cache, drop)
    assert len(actual) == len(expected) >= 10
    for got, want in zip(actual, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    service.stop_local()
    assert service.local_ports() == [] and not any(map(listening, ports))


def test_a_dispatcher_of_several_workers_is_one_line(stopped_after):
    """A dispatcher named by grpc:// whose 2 workers each produce the whole split (what
    parallel_epochs does) is caught at the first element out of place."""
    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0))
    address = dispatcher.target.partition("://")[2]
    # A worker starts its task of a new job at its next heartbeat to the dispatcher (every
    # 30 s by default): the second task then often began after the first had delivered the
    # whole split, in place, in every try. Heartbeats every 50 ms and a split of 2000 examples
    # make the two copies overlap.
    workers = [svc.WorkerServer(svc.WorkerConfig(dispatcher_address=address,
                                                 heartbeat_interval_ms=50)) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30  # both registered: a job then has a task on each
        while dispatcher._num_workers() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        served = service.Service.of(read(f"grpc://127.0.0.1:{address.rpartition(':')[2]}"))
        # Which task serves first is the servers' timing: a job whose first task delivers
        # the whole split in order before the other starts is in place (and trains right),
        # so a few jobs are tried; one of them interleaves the two copies.
        caught = None
        for _ in range(5):
            try:
                _batches(served, None, 1, "none", examples=2000)
            except tf.errors.InvalidArgumentError as error:
                caught = error
                break
        assert caught is not None, "two workers' copies were never caught out of place"
        assert service.out_of_order_message(caught, served.value).startswith(
            f"dataset.service={served.value}: the tf.data service sent the example at position")
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_local_service_trains_as_without_and_stops(tmp_path, tiny_config):
    """`dataset.service=local:2`: the run's summary says where and how its preprocessing
    ran, its losses are those of the run without it, and its 4 servers are gone after it."""
    out = run_main("epochs=2", "verbose=0", "dataset.image_size=8", "logger=[]", "model=small",
                   "dataset.service=local:2", f"hydra.run.dir={tmp_path / 'served'}",
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ports = ports_in(out.stdout)
    assert len(ports) == 4 and not any(map(listening, ports))
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["input"]["service"]["mode"] == "parallel_epochs"
    assert summary["input"]["service"]["exact"] is True
    assert "2 tf.data services of one worker each" in out.stdout
    again = train(tiny_config("epochs=2"), run_dir=tmp_path / "again")
    np.testing.assert_allclose(summary["history"]["loss"], again["history"]["loss"], atol=1e-6)


def test_an_unreachable_dispatcher_is_one_line(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = run_main("epochs=1", "verbose=0", "logger=[]", f"dataset.service=grpc://127.0.0.1:{port}",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    lines = error_lines(out.stderr)
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: dataset.service=grpc://127.0.0.1:{port}: no tf.data "
                               f"dispatcher answers at 127.0.0.1:{port}")


def test_a_killed_run_leaves_no_server(tmp_path):
    """SIGKILL, which no handler sees: the servers lived in the process, and went with it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "epochs=200", "verbose=0", "logger=[]",
         "dataset.service=local:2", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, deadline = "", time.monotonic() + 120
        while not PORTS_LINE.search(output) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            output += line
        ports = ports_in(output)
        assert all(map(listening, ports))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
    assert not any(map(listening, ports))


@pytest.mark.multiworker
def test_two_workers_each_with_local_services_train_like_one(tmp_path, launches,  # noqa: F811
                                                            tiny_config):
    """2 workers (`python -m trainer.launch`), each preprocessing its share on 2 services of
    its own: 1 worker's weights, and no process or port left."""
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01"]
    run_dir = tmp_path / "run"
    launch = launches(2, *COMMON, *batch, "dataset.service=local:2", f"hydra.run.dir={run_dir}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    ports = [int(p) for found in PORTS_LINE.finditer(launch.output)
             for p in found[1].split(",")]
    assert len(ports) == 8 and not any(map(listening, ports))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["input"]["service"]["streams"] == 2
    assert_same_weights(run_dir, reference(tmp_path, tiny_config, "one", *batch), atol=1e-5)
