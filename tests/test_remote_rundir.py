"""A run directory at a URL, against real servers on 127.0.0.1: moto's S3-compatible server
and gcp-storage-emulator, both from PyPI, each on a free loopback port, stopped after its
test. Credentials are dummies; the endpoints are the libraries' own variables
(`AWS_ENDPOINT_URL`, `STORAGE_EMULATOR_HOST`)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import TINY, error_lines, run_cli, run_main
from tests.test_fault_tolerance import RESUMABLE, start_cli, weights
from trainer.config.errors import EXIT_CONFIG, EXIT_INTERRUPTED
from trainer.rundir.lease import Lease

BIN = Path(sys.executable).parent
# RESUMABLE at 16 examples a step: one epoch of 90 steps, a backup every 10.
LEAN = [*RESUMABLE, "batch.per_replica=16", "checkpoint.backup_every=10", "epochs=1"]
BUCKET = "runs"
# The runs that train at a URL: the small network (tests/small_model.py); the place is tested.
SMALL = [*TINY, "model=small"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, process: subprocess.Popen | None = None,
                   timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            pytest.fail(f"the server ended at start (exit {process.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"no server on 127.0.0.1:{port} after {timeout} s")


def stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(timeout=10)


@dataclass
class Store:
    """A running server: its file system (as the test's client), the environment a run
    needs to reach it, and how to stop it."""

    fs: Any
    env: dict[str, str]
    stop: Any


def _s3_env(port: int, scratch: Path, key: str = "testing", secret: str = "testing"):
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "TRAINER_SCRATCH": str(scratch), "TRAINER_LEASE_SECONDS": "1"}


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """moto's server in this process (a thread), with the bucket `runs`."""
    import s3fs
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    wait_listening(port)
    # moto keeps its buckets in the process, not in the server: each test starts empty
    urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{port}/moto-api/reset", method="POST"), timeout=10).close()
    env = _s3_env(port, tmp_path / "scratch")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    fs.mkdir(BUCKET)
    try:
        yield Store(fs, env, server.stop)
    finally:
        server.stop()


# gcp-storage-emulator serves one connection at a time (http.server's HTTPServer), so a
# client stopped with a connection open (a chief SIGSTOPped mid-upload, as a test does to
# hold its lease) wedged it for every other client; a real store serves them all at once.
THREADED_EMULATOR = ("import http.server as h, runpy, sys; h.HTTPServer = h.ThreadingHTTPServer; "
                     "sys.argv[0] = 'gcp_storage_emulator'; "
                     "runpy.run_module('gcp_storage_emulator', run_name='__main__')")


@pytest.fixture
def gcs(tmp_path, monkeypatch):
    """gcp-storage-emulator in a process of its own, in memory, with the bucket `runs`."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", THREADED_EMULATOR, "start", "--host", "127.0.0.1",
         "--port", str(port), "--in-memory", "--default-bucket", BUCKET],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, process)
        env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}",
               "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
               "TRAINER_SCRATCH": str(tmp_path / "scratch"), "TRAINER_LEASE_SECONDS": "1"}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        import gcsfs

        fs = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True,
                                 use_listings_cache=False)
        yield Store(fs, env, lambda: stop(process))
    finally:
        stop(process)


@pytest.fixture
def memory():
    """fsspec's in-memory store (`memory://`) under a root of its own: the mirror's push
    order and the lease's rules behind the same fsspec calls a bucket's store answers, in
    milliseconds (the servers above keep one end-to-end test each)."""
    import uuid

    import fsspec

    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    root = f"/{BUCKET}-{uuid.uuid4().hex}"
    fs.mkdir(root)
    try:
        yield Store(fs, {}, lambda: None), root
    finally:
        fs.rm(root, recursive=True)


def _stored(fs: Any, prefix: str) -> list[str]:
    return sorted(key[len(prefix) + 1:] for key in fs.find(prefix))


def _mid_epoch_at_url(fs: Any, prefix: str, epoch: int):
    """Whether a whole mid-epoch backup of `epoch` (its state.json) reached the URL."""
    def found() -> bool:
        return any(rel.startswith(f"backup/ckpt-{epoch:06d}-") and rel.endswith("/state.json")
                   and "-000000000/" not in rel for rel in _stored(fs, prefix))
    return found


def _wait(predicate, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _, err = process.communicate()
            pytest.fail(f"gave up waiting (exit {process.returncode}): {err[-2000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The uninterrupted local run both stores' killed-and-resumed runs end equal to, made
    once: a fresh process, as theirs."""
    root = tmp_path_factory.mktemp("uninterrupted")
    done = run_cli(*LEAN, f"hydra.run.dir={root / 'clean'}", cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "clean"


@pytest.mark.parametrize("scheme", ["s3", pytest.param("gs", marks=pytest.mark.long)])
def test_killed_mid_epoch_at_a_url_resumes_to_the_weights_of_an_uninterrupted_run(
        scheme, request, tmp_path, capsys, monkeypatch, uninterrupted):
    """The issue's measure: a chief killed mid-epoch, a second start refused while it
    trained, the rerun from the URL alone (a new machine: the local mirror wiped) ending
    with an uninterrupted local run's weights; on moto's S3 server, and on the GCS
    emulator (long: the same code behind another fsspec store). Every side trains in a
    fresh process, where `deterministic=true` turns oneDNN's kernels off before TensorFlow
    starts: in this process TensorFlow has started already, with them on where the CPU
    has AVX-512, and the sides would run other kernels (0.004 apart on such a host)."""
    s3 = request.getfixturevalue({"s3": "s3", "gs": "gcs"}[scheme])
    url = f"{scheme}://{BUCKET}/runs/a"
    chief = start_cli(*LEAN, f"hydra.run.dir={url}", cwd=tmp_path)
    try:
        _wait(_mid_epoch_at_url(s3.fs, f"{BUCKET}/runs/a", epoch=0), chief)
        chief.send_signal(signal.SIGSTOP)  # mid-epoch, whatever this machine's speed
        second = run_main(*LEAN, f"hydra.run.dir={url}", cwd=tmp_path)  # its lease is fresh
        chief.send_signal(signal.SIGKILL)
        chief.wait(timeout=30)
    finally:
        chief.kill()
    assert second.returncode == EXIT_CONFIG
    lines = error_lines(second.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: run directory {url} is in use "
                                                   f"by another run (host "), lines
    assert f"pid {chief.pid}," in lines[0]
    assert "summary.json" not in _stored(s3.fs, f"{BUCKET}/runs/a")
    for path in (tmp_path / "scratch").rglob("*"):  # another machine: nothing local is left
        if path.is_file():
            path.unlink()
    rerun = run_cli(*LEAN, f"hydra.run.dir={url}", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    held = _stored(s3.fs, f"{BUCKET}/runs/a")
    assert "lease.json" not in held and "checkpoints/last.keras" in held
    from trainer.evaluate import main as evaluate

    assert evaluate([url]) == 0  # `python -m trainer.evaluate URL`
    assert json.loads(capsys.readouterr().out)["checkpoint"] == f"{url}/checkpoints/best.keras"
    summary = json.loads(s3.fs.cat_file(f"{BUCKET}/runs/a/summary.json"))
    assert summary["resumed_from"]["epoch"] == 1 and summary["resumed_from"]["step"] > 0
    copy = tmp_path / "copy"
    (copy / "checkpoints").mkdir(parents=True)
    for name in ("last.keras", "last.keras.sha256"):
        s3.fs.get_file(f"{BUCKET}/runs/a/checkpoints/{name}", str(copy / "checkpoints" / name))
    for a, b in zip(weights(uninterrupted), weights(copy), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_a_second_start_at_a_held_url_is_refused_in_one_line(s3, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    holder = Lease(fs, f"{BUCKET}/runs/b", f"s3://{BUCKET}/runs/b")
    holder.take()
    try:
        done = run_main(*TINY, f"hydra.run.dir=s3://{BUCKET}/runs/b", cwd=tmp_path)
    finally:
        holder.release()
    assert done.returncode == EXIT_CONFIG
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and re.fullmatch(
        rf"error: run directory s3://{BUCKET}/runs/b is in use by another run \(host "
        rf"{re.escape(socket.gethostname())}, pid {os.getpid()}, heartbeat [0-2] s ago\); "
        "wait for it to end, or choose another hydra.run.dir", lines[0]), lines
    assert _stored(s3.fs, f"{BUCKET}/runs/b") == []  # the refused start wrote nothing


def test_a_stale_lease_is_taken_over(memory):
    store, root = memory
    fs, key = store.fs, f"{root}/runs/c/lease.json"
    fs.pipe_file(key, json.dumps({"host": "gone-pod", "pid": 1, "token": "old",
                                  "heartbeat": time.time() - 60, "interval": 1}).encode())
    lease = Lease(fs, f"{root}/runs/c", f"memory:/{root}/runs/c")
    lease.take()
    try:
        assert json.loads(fs.cat_file(key))["token"] == lease.token
    finally:
        lease.release()
    assert not fs.exists(key)


def test_two_starts_at_one_instant_create_one_lease_on_s3(s3):
    """Both read no lease; S3's conditional PUT (If-None-Match: *) lets one create it."""
    first, second = (Lease(s3.fs, f"{BUCKET}/runs/i", f"s3://{BUCKET}/runs/i")
                     for _ in range(2))
    assert first._create() and not second._create()
    assert json.loads(s3.fs.cat_file(f"{BUCKET}/runs/i/lease.json"))["token"] == first.token


def test_a_run_whose_lease_was_taken_over_writes_nothing_more(memory, tmp_path):
    from trainer.config.errors import Interrupted

    store, root = memory
    mirror = _mirror(store.fs, tmp_path, f"{root}/taken")
    mirror.lease = Lease(store.fs, mirror.path, mirror.url)
    mirror.lease.take()
    try:
        mirror.root.mkdir(parents=True)
        (mirror.root / "summary.json").write_text("{}")
        store.fs.pipe_file(f"{root}/taken/lease.json", json.dumps(
            {"host": "other-pod", "pid": 7, "token": "theirs", "heartbeat": time.time()}
        ).encode())  # its heartbeat missed, another start took it over
        with pytest.raises(Interrupted, match="another run \\(host other-pod, pid 7\\) took"):
            mirror.push()
    finally:
        mirror.lease.release()
    assert _stored(store.fs, f"{root}/taken") == ["lease.json"]  # theirs, kept


def test_a_held_lease_at_gcs_refuses_a_second_though_the_emulator_ignores_the_condition(gcs):
    from trainer.config.errors import ConfigError

    leases = [Lease(gcs.fs, f"{BUCKET}/runs/l", f"gs://{BUCKET}/runs/l") for _ in range(2)]
    leases[0].take()
    try:
        with pytest.raises(ConfigError, match=rf"gs://{BUCKET}/runs/l is in use by another "
                                              rf"run \(host .*, pid {os.getpid()},"):
            leases[1].take()
        held = json.loads(gcs.fs.cat_file(f"{BUCKET}/runs/l/lease.json"))
        assert held["token"] == leases[0].token
    finally:
        leases[0].release()
    assert not gcs.fs.exists(f"{BUCKET}/runs/l/lease.json")


def test_a_missing_bucket_is_one_line(s3, tmp_path):
    done = run_main(*TINY, "hydra.run.dir=s3://no-such-bucket/runs/a", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "error: the bucket of s3://no-such-bucket/runs/a does not exist"), lines


def test_no_credentials_is_one_line(s3, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask
    done = run_main(*TINY, f"hydra.run.dir=s3://{BUCKET}/runs/n", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert error_lines(done.stderr) == [
        f"error: no credentials for s3://{BUCKET}/runs/n (Unable to locate credentials); set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for s3://, "
        "GOOGLE_APPLICATION_CREDENTIALS for gs://"]


def test_a_missing_package_or_scheme_is_one_line_and_an_interpolation_resolved(tmp_path,
                                                                               monkeypatch):
    import fsspec  # noqa: F401 - its registry module, whose name the package shadows

    monkeypatch.setitem(sys.modules, "s3fs", None)  # as where it is not installed
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)
    done = run_main(*TINY, "hydra.run.dir=s3://bucket/a", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert error_lines(done.stderr) == [
        "error: a run directory at s3://bucket/a needs s3fs: pip install 'trainer[remote]' "
        "(or s3fs)"]
    # an interpolation is resolved once, as the config is composed: the URL is its value
    done = run_main(*TINY, "hydra.run.dir=s3://bucket/${now:%Y}", cwd=tmp_path)
    assert re.fullmatch(r"error: a run directory at s3://bucket/20\d\d needs s3fs: .*",
                        error_lines(done.stderr)[0]), done.stderr[-2000:]
    done = run_main(*TINY, "hydra.run.dir=nosuchscheme://bucket/a", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert error_lines(done.stderr) == [
        "error: a run directory at nosuchscheme://bucket/a: fsspec knows no scheme "
        "nosuchscheme://; use s3://, gs:// or another fsspec URL"]


def test_a_sweeps_directory_at_a_url_is_one_line_before_any_job(tmp_path):
    """A sweep's directory at a URL (the command line's, or a config file's) is refused in
    one line, from the composed config, before a job runs or a local `s3:` folder is made."""
    done = run_main("-m", *TINY, "hydra.sweep.dir=s3://runs/sweep", "epochs=1,2", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert error_lines(done.stderr) == [
        "error: a sweep's directory cannot be a URL yet (hydra.sweep.dir=s3://runs/sweep); "
        "sweep into a local directory, or run each job with hydra.run.dir=URL"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.fixture
def read_only_s3(tmp_path, monkeypatch):
    """moto's server with its access checks on: a bucket this user may only read."""
    yield from _limited_s3(tmp_path, monkeypatch, "readonly", ["s3:GetObject", "s3:ListBucket"])


@pytest.fixture
def no_delete_s3(tmp_path, monkeypatch):
    """moto's server with its access checks on: a bucket this user may read and write, but
    not delete in."""
    yield from _limited_s3(tmp_path, monkeypatch, "nodelete",
                           ["s3:GetObject", "s3:ListBucket", "s3:PutObject"])


def _limited_s3(tmp_path, monkeypatch, bucket: str, actions: list[str]):
    """moto's server in a process of its own, its access checks on: `bucket`, where the
    user the environment names may do `actions` only."""
    import boto3

    port = free_port()
    # the four set-up calls below go unchecked; every later one is checked
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}
    process = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, process)
        given = {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1",
                 "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        boto3.client("s3", **given).create_bucket(Bucket=bucket)
        iam = boto3.client("iam", **given)
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Resource": "*",
                                                     "Action": actions}]}))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        for name, value in _s3_env(port, tmp_path / "scratch", key["AccessKeyId"],
                                   key["SecretAccessKey"]).items():
            monkeypatch.setenv(name, value)
        yield
    finally:
        stop(process)


def test_a_read_only_bucket_is_refused_in_one_line(read_only_s3, tmp_path):
    done = run_main(*TINY, "hydra.run.dir=s3://readonly/runs/a", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "error: access to s3://readonly/runs/a is denied"), lines


def test_a_store_that_refuses_deletes_is_found_at_the_start_in_one_line(no_delete_s3,
                                                                         tmp_path):
    done = run_main(*TINY, "hydra.run.dir=s3://nodelete/runs/a", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "error: access to s3://nodelete/runs/a is denied for deletes ("), lines
    assert not (tmp_path / "scratch" / "trainer-scratch").is_dir() or not any(
        (tmp_path / "scratch" / "trainer-scratch").iterdir())
    # nothing left in the bucket: no lease, no probe (the user could not delete them)
    import boto3

    held = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).list_objects_v2(
        Bucket="nodelete")
    assert held.get("KeyCount", 0) == 0, held.get("Contents")


def test_malformed_and_non_persistent_urls_and_an_unwritable_scratch_are_one_line(
        tmp_path, monkeypatch):
    cases = {"hydra.run.dir=s3:/one-slash/a": "error: hydra.run.dir=s3:/one-slash/a is not a "
             "URL (a URL has two slashes after its scheme: s3://one-slash/a)",
             "hydra.run.dir=S3://runs/a": "error: hydra.run.dir=S3://runs/a: a URL's scheme is "
             "lower case; write s3://runs/a",
             "hydra.run.dir=memory://runs/a": "error: hydra.run.dir=memory://runs/a: memory:// "
             "keeps nothing once this process ends",
             "resume=gs:/runs/a": "error: resume=gs:/runs/a is not a URL"}
    for arg, expected in cases.items():
        done = run_main(*TINY, arg, cwd=tmp_path)
        assert done.returncode == EXIT_CONFIG, (arg, done.stderr)
        lines = error_lines(done.stderr)
        assert len(lines) == 1 and lines[0].startswith(expected), (arg, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no `s3:` folder, no outputs/
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("TRAINER_SCRATCH", str(blocked))
    done = run_main(*TINY, "hydra.run.dir=s3://runs/a", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert error_lines(done.stderr) == [
        f"error: TRAINER_SCRATCH={blocked} cannot be written (Not a directory); a run at a URL "
        "keeps its local copy there: set TRAINER_SCRATCH to a writable directory"]


@pytest.mark.long
def test_a_server_gone_mid_run_stops_it_in_one_line_with_the_last_backup_kept(s3, tmp_path):
    url = f"s3://{BUCKET}/runs/gone"
    chief = start_cli(*LEAN, f"hydra.run.dir={url}", cwd=tmp_path)
    try:
        _wait(_mid_epoch_at_url(s3.fs, f"{BUCKET}/runs/gone", epoch=0), chief)
        s3.stop()
        _, err = chief.communicate(timeout=240)
    finally:
        chief.kill()
    assert chief.returncode == EXIT_INTERRUPTED, err[-3000:]
    lines = [line for line in error_lines(err) if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted: {url} cannot be reached"), lines
    assert "the last backup that reached" in lines[0]


@pytest.mark.long
def test_a_run_at_gcs_finishes_there_and_evaluates_and_resumes_from_the_url(gcs, tmp_path):
    from trainer.evaluate import evaluate_run
    from trainer.predict import predict_run

    url = f"gs://{BUCKET}/runs/g"
    done = run_main(*SMALL, "epochs=1", "logger=[tensorboard]", f"hydra.run.dir={url}",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    held = _stored(gcs.fs, f"{BUCKET}/runs/g")
    assert {"summary.json", ".hydra/config.yaml", "checkpoints/best.keras", "curves.png",
            "trainer.log", "model_inputs.json"} <= set(held)
    assert any(rel.startswith("tensorboard/") and ".tfevents." in rel for rel in held)
    assert "lease.json" not in held and not any(".tmp" in rel for rel in held)
    assert len([rel for rel in held if rel.endswith("/state.json")]) == 1
    again = run_main(*SMALL, "epochs=1", f"hydra.run.dir={url}", cwd=tmp_path)
    assert again.returncode == EXIT_CONFIG and error_lines(again.stderr) == [
        f"error: run directory {url} holds a finished run (summary.json); choose a new "
        f"hydra.run.dir, or pass resume={url} to continue it"]
    found = evaluate_run(url)
    assert found["examples"] > 0 and found["checkpoint"].startswith(url)
    spec = json.loads(gcs.fs.cat_file(f"{BUCKET}/runs/g/model_inputs.json"))["examples"]
    np.save(tmp_path / "x.npy", np.zeros((3, *spec["shape"]), dtype=spec["dtype"]))
    predicted = predict_run(url, str(tmp_path / "x.npy"))
    assert predicted["rows"] == 3 and predicted["output"] == f"{url}/predictions.csv"
    assert gcs.fs.cat_file(f"{BUCKET}/runs/g/predictions.csv").count(b"\n") == 4
    more = run_main(*SMALL, "epochs=2", f"resume={url}", cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    summary = json.loads(gcs.fs.cat_file(f"{BUCKET}/runs/g/summary.json"))
    assert summary["epochs_done"] == 2
    assert summary["resumed_from"]["epoch"] == 2 and summary["resumed_from"]["step"] == 0


def _mirror(fs: Any, tmp_path: Path, path: str, root: str = "mirror"):
    """A run directory at `memory://PATH` (`fs`: the memory store) and its local mirror."""
    from trainer.rundir.remote import Mirror

    return Mirror(f"memory:/{path}", tmp_path / root, fs, path)


def test_a_backup_cut_short_at_the_url_is_never_restored_and_goes_at_the_next_push(
        memory, tmp_path):
    store, root = memory
    prefix = f"{root}/cut"
    whole, cut = "backup/ckpt-000001-000000000", "backup/ckpt-000001-000000010"
    for rel in (f"{whole}/model.weights.h5", f"{whole}/state.json", f"{cut}/model.weights.h5",
                ".hydra/config.yaml"):
        store.fs.pipe_file(f"{prefix}/{rel}", b"x")
    mirror = _mirror(store.fs, tmp_path, prefix)
    assert mirror.pull()
    local = sorted(p.relative_to(mirror.root).as_posix()
                   for p in mirror.root.rglob("*") if p.is_file())
    assert local == [".hydra/config.yaml", f"{whole}/model.weights.h5", f"{whole}/state.json"]
    mirror.push()
    assert _stored(store.fs, prefix) == local


def _two_backups_and_a_summary(mirror) -> tuple[Path, Path]:
    """Fills the mirror as a finished run: two whole backups, the summary, a local cache."""
    old, new = (mirror.root / f"backup/ckpt-00000{i}-000000000" for i in (1, 2))
    for folder in (old, new):
        folder.mkdir(parents=True)
        (folder / "model.weights.h5").write_bytes(b"w")
        (folder / "state.json").write_text("{}")
    (mirror.root / "summary.json").write_text("{}")
    (mirror.root / "input_cache" / "worker-0").mkdir(parents=True)
    (mirror.root / "input_cache" / "worker-0" / "train.data").write_bytes(b"c")
    return old, new


def _recording(fs: Any, prefix: str, calls: list, fail_at: int | None = None) -> None:
    """Records the store's uploads and removals (relative to `prefix`) in `calls`; with
    `fail_at`, that call fails, as a store gone mid-push."""
    real_put, real_rm = fs.put_file, fs.rm_file

    def record(kind, key, real, *args):
        if len(calls) == fail_at:
            raise ConnectionError("Could not connect to the endpoint URL")
        calls.append((kind, key[len(prefix) + 1:]))
        return real(*args)

    fs.put_file = lambda local, key: record("put", key, real_put, local, key)
    fs.rm_file = lambda key: record("rm", key, real_rm, key)


def test_a_push_puts_each_backups_state_last_and_removes_an_old_backup_marker_first(
        memory, tmp_path):
    store, root = memory
    mirror = _mirror(store.fs, tmp_path, f"{root}/order")
    assert not mirror.pull()  # an empty URL: no mirror yet
    old, _ = _two_backups_and_a_summary(mirror)
    calls = []
    _recording(store.fs, mirror.path, calls)
    mirror.push()
    assert calls[-3:] == [("put", "backup/ckpt-000001-000000000/state.json"),
                          ("put", "backup/ckpt-000002-000000000/state.json"),
                          ("put", "summary.json")]
    assert not any("input_cache" in key for _, key in calls)  # a machine's own cache
    calls.clear()
    for path in old.iterdir():
        path.unlink()
    old.rmdir()
    mirror.push()
    assert calls == [("rm", "backup/ckpt-000001-000000000/state.json"),
                     ("rm", "backup/ckpt-000001-000000000/model.weights.h5")]


def test_a_push_cut_short_anywhere_leaves_a_whole_backup_at_the_url(memory, tmp_path):
    """A backup rotation (the next backup written, the old one removed) pushed to a store
    that fails at each of the push's four calls in turn: every time, a new machine's pull
    restores a whole backup (its weights and its state) and no part of one, and its push
    leaves the URL as that mirror."""
    import fsspec

    from trainer.config.errors import Interrupted

    store, root = memory
    old, new = "backup/ckpt-000001-000000000", "backup/ckpt-000002-000000000"
    for cut in range(5):  # the fifth is not cut: the push makes exactly four calls
        fs = fsspec.filesystem("memory", skip_instance_cache=True)  # methods of its own
        mirror = _mirror(fs, tmp_path, f"{root}/at-{cut}", root=f"mirror-{cut}")
        _write(mirror.root, old, b"1")
        mirror.push()
        _write(mirror.root, new, b"2")
        for path in (mirror.root / old).iterdir():
            path.unlink()
        (mirror.root / old).rmdir()
        calls = []
        _recording(fs, mirror.path, calls, fail_at=cut)
        if cut < 4:
            with pytest.raises(Interrupted, match="cannot be reached"):
                mirror.push()
        else:
            mirror.push()
            assert [kind for kind, _ in calls] == ["put", "put", "rm", "rm"]
        elsewhere = _mirror(store.fs, tmp_path, mirror.path, root=f"elsewhere-{cut}")
        assert elsewhere.pull()
        restored = sorted(p.relative_to(elsewhere.root).as_posix()
                          for p in elsewhere.root.rglob("*") if p.is_file())
        backups = {rel.rsplit("/", 1)[0] for rel in restored}
        assert backups and restored == sorted(f"{b}/{name}" for b in backups
                                              for name in ("model.weights.h5", "state.json"))
        elsewhere.push()  # a rerun's first push: the parts cut short go
        assert _stored(store.fs, mirror.path) == restored


def test_a_backup_uploads_beside_training_and_is_the_newest_only_once_uploaded(
        memory, tmp_path):
    """The second backup's upload is held mid-way, then fails (the store gone): meanwhile
    the URL's newest whole backup is the first (what a restart after a crash there would
    find), and the failure is the one line of a push that fails, at the next backup."""
    import threading

    import keras

    from trainer.config.errors import Interrupted
    from trainer.rundir.backup import BackupStore
    from trainer.rundir.remote import RunPlace

    store, root = memory
    mirror = _mirror(store.fs, tmp_path, f"{root}/beside", root="run")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    backups = BackupStore(mirror.root / "backup", place=RunPlace(mirror.root, mirror))
    try:
        backups.save(model, 0, 5)
        backups.wait()
        held, entered, real_put = threading.Event(), threading.Event(), store.fs.put_file

        def put(local, key):
            if "ckpt-000000-000000010" in key and key.endswith("rng.npz"):
                entered.set()
                held.wait(10)
                raise ConnectionError("Could not connect to the endpoint URL")
            return real_put(local, key)

        store.fs.put_file = put
        backups.save(model, 0, 10)  # back at once, its upload held
        assert entered.wait(10)
        elsewhere = _mirror(store.fs, tmp_path, mirror.path, root="elsewhere")
        assert elsewhere.pull()
        assert [p.name for p in BackupStore(elsewhere.root / "backup").backups()] == [
            "ckpt-000000-000000005"]
        held.set()
        with pytest.raises(Interrupted, match=r"cannot be reached .*the last backup that "
                                              r"reached memory:/.* is kept"):
            backups.save(model, 0, 15)
    finally:
        backups.close(failed=True)


def _write(root: Path, backup: str, content: bytes) -> None:
    for name in ("model.weights.h5", "state.json"):
        (root / backup).mkdir(parents=True, exist_ok=True)
        (root / backup / name).write_bytes(content)


def _composed_run(*args: str):
    from trainer.config.compose import composed
    from trainer.config.schema import register_configs

    register_configs()
    return composed(list(args))


def test_only_the_chief_of_a_cluster_takes_the_url():
    """The chief is the cluster's one rule (`Cluster.is_chief`, read from the composed
    config's `cluster` node as the pre-flight reads it): a lone `cluster.task_index`, or a
    lone `SLURM_PROCID` outside a step of several tasks, describes no cluster, so the
    process writes the URL."""
    from omegaconf import OmegaConf

    from trainer.run.prepare.place import writes_url

    cfg = _composed_run().cfg

    def chief(environ: dict[str, str], **cluster: Any) -> bool:
        node = OmegaConf.merge(cfg, {"cluster": cluster})
        return writes_url(node, "s3://runs/r", environ)

    def tf_config(kind: str, index: int, chief: bool = False) -> dict[str, str]:
        cluster = {"worker": ["a:1", "b:1"], **({"chief": ["c:1"]} if chief else {})}
        return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                         "task": {"type": kind, "index": index}})}

    def slurm(procid: int) -> dict[str, str]:
        return {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": str(procid),
                "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}

    workers = ["127.0.0.1:1", "127.0.0.1:2"]
    assert chief({}) and chief({}, workers=workers, task_index=0)
    assert not chief({}, workers=workers, task_index=1)
    assert chief({}, task_index=1)  # no cluster: a run of its own
    assert chief(tf_config("worker", 0)) and chief(tf_config("chief", 0, True))
    assert not chief(tf_config("worker", 1))
    assert not chief(tf_config("worker", 0, chief=True))
    assert chief(tf_config("worker", 1), workers=workers, task_index=0)  # the config wins
    assert not chief(slurm(1)) and chief(slurm(0))
    assert chief({"SLURM_PROCID": "2"})  # a batch script's shell: no step


@pytest.mark.long
@pytest.mark.multiworker
def test_two_workers_at_one_url_train_once_and_only_the_chief_writes_there(s3, tmp_path):
    from tests.test_multiworker import COMMON, run_tasks
    from trainer.distribute.launch import free_ports

    addresses = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(Path(__file__).parent.parent))
    url = f"s3://{BUCKET}/runs/mw"
    run_tasks(tmp_path, [([*COMMON, "epochs=1", "verbose=0", "strategy=multi_worker",
                           f"cluster.workers=[{addresses}]", f"cluster.task_index={index}",
                           f"hydra.run.dir={url}"], env) for index in (0, 1)], "worker")
    summary = json.loads(s3.fs.cat_file(f"{BUCKET}/runs/mw/summary.json"))
    assert summary["workers"] == 2 and summary["cluster"]["task_id"] == 0
    held = _stored(s3.fs, f"{BUCKET}/runs/mw")
    assert "lease.json" not in held and [r for r in held if r.endswith(".log")] == [
        "trainer.log"]
    assert b"task_index: 0" in s3.fs.cat_file(f"{BUCKET}/runs/mw/.hydra/config.yaml")
    assert sorted(p.name for p in (tmp_path / "scratch" / "trainer-scratch").iterdir()) == [
        f"{p.name}" for p in (tmp_path / "scratch" / "trainer-scratch").glob("*-run")]


def _digits_npy(path: Path) -> Path:
    from sklearn.datasets import load_digits

    np.save(path, load_digits().images[:5].astype(np.uint8)[..., None])
    return path


def _no_scratch(tmp_path: Path) -> list[str]:
    """The local copies left under the scratch place (none: a run's, and the copy evaluate
    and predict read, are removed at their end)."""
    place = tmp_path / "scratch" / "trainer-scratch"
    return sorted(p.name for p in place.iterdir()) if place.is_dir() else []


def test_fit_at_a_url_names_the_url_and_predict_writes_into_the_bucket(s3, tmp_path,
                                                                       monkeypatch):
    """`trainer.fit(run_dir=URL)`: the Result, its summary, a second fit's advice and the
    checkpoints name the URL, and a run at another URL in the same process names its own;
    `trainer.predict(..., output=URL)` (the API and the command line) puts the file in the
    bucket, no local `s3:` folder; no local copy is left (of the runs, or of what evaluate
    and predict read)."""
    import trainer
    from trainer.predict import main as predict_main

    monkeypatch.chdir(tmp_path)
    url, other = f"s3://{BUCKET}/runs/api", f"s3://{BUCKET}/runs/other"
    result = trainer.fit(SMALL, run_dir=url)
    assert result.run_dir == url and result.summary["run_dir"] == url
    assert "lease.json" not in _stored(s3.fs, f"{BUCKET}/runs/api")
    assert result.checkpoints["best"] == f"{url}/checkpoints/best.keras"
    assert result.summary == json.loads(s3.fs.cat_file(f"{BUCKET}/runs/api/summary.json"))
    second = trainer.fit(SMALL, run_dir=other)  # a place of its own, in this process
    assert second.run_dir == other and second.summary["run_dir"] == other
    assert json.loads(s3.fs.cat_file(f"{BUCKET}/runs/other/summary.json"))["run_dir"] == other
    assert _no_scratch(tmp_path) == []
    with pytest.raises(trainer.TrainerError) as refused:
        trainer.fit(SMALL, run_dir=url)
    assert url in str(refused.value) and "trainer-scratch" not in str(refused.value)
    assert trainer.evaluate(url)["checkpoint"] == f"{url}/checkpoints/best.keras"
    x = _digits_npy(tmp_path / "x.npy")
    found = trainer.predict(url, input=str(x), output=f"s3://{BUCKET}/out/p.csv")
    assert found["output"] == f"s3://{BUCKET}/out/p.csv"
    assert s3.fs.cat_file(f"{BUCKET}/out/p.csv").count(b"\n") == 6  # a header, 5 rows
    assert predict_main([url, f"input={x}", f"output=s3://{BUCKET}/out/q.csv"]) == 0
    assert s3.fs.exists(f"{BUCKET}/out/q.csv")
    assert predict_main([url, f"input={x}", f"output=s3://{BUCKET}/out/q.csv"]) == 2  # exists
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch", "x.npy"]
    assert _no_scratch(tmp_path) == []


def test_a_url_set_in_an_experiment_file_trains_there(s3, tmp_path, monkeypatch):
    """A config file's URL is the run's place, as the command line's is, its interpolations
    resolved once; its local copy is kept, as asked (`TRAINER_KEEP_SCRATCH=1`)."""
    monkeypatch.setenv("TRAINER_KEEP_SCRATCH", "1")
    monkeypatch.setenv("EXP_NAME", "exp")
    own = tmp_path / "conf" / "experiment"
    own.mkdir(parents=True)
    (own / "at_url.yaml").write_text("# @package _global_\nhydra:\n  run:\n"
                                     f"    dir: s3://{BUCKET}/runs/${{oc.env:EXP_NAME}}\n")
    done = run_main("--config-dir", str(tmp_path / "conf"), *SMALL, "experiment=at_url",
                    cwd=tmp_path)
    assert done.returncode == 0, error_lines(done.stderr)[-3:]
    held = _stored(s3.fs, f"{BUCKET}/runs/exp")
    assert "summary.json" in held and "lease.json" not in held
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf", "scratch"]
    kept = [name for name in _no_scratch(tmp_path) if name.endswith("-run")]
    assert len(kept) == 1, _no_scratch(tmp_path)
    assert (tmp_path / "scratch" / "trainer-scratch" / kept[0] / "summary.json").is_file()


def test_a_store_gone_is_not_read_as_denied_from_the_digits_of_its_port():
    from trainer.rundir.remote import explain

    gone = ConnectionError('Could not connect to the endpoint URL: "http://127.0.0.1:40312/r"')
    assert explain(gone, "s3://r/a").startswith("s3://r/a cannot be reached")
    assert explain(OSError("HttpError 403 Forbidden"), "gs://r/a").startswith(
        "access to gs://r/a is denied")
    assert explain(OSError("(401) Anonymous caller does not have storage.objects.list access"),
                   "gs://r/a").startswith("no credentials for gs://r/a")


def test_an_evaluator_beside_workers_at_a_url_is_one_line():
    """The evaluator reads the chief's files on a shared file system: a run directory at a
    URL with one is refused before any lease or download (`cluster.evaluator`, an
    `evaluator` job in `TF_CONFIG` as `trainer.launch --evaluator` sets it, or the
    evaluator's own task)."""
    from trainer.config.errors import ConfigError
    from trainer.run.prepare.place import opened

    refused = r"not at a URL \(s3://runs/r\)"
    described = {"cluster": {"worker": ["127.0.0.1:1"], "evaluator": ["127.0.0.1:2"]},
                 "task": {"type": "worker", "index": 0}}
    evaluator = {**described, "task": {"type": "evaluator", "index": 0}}
    run = _composed_run("hydra.run.dir=s3://runs/r")
    for environ in (described, evaluator):
        with pytest.raises(ConfigError, match=refused):
            with opened(run, {"TF_CONFIG": json.dumps(environ)}):
                pass
    beside = _composed_run("hydra.run.dir=s3://runs/r", "cluster.evaluator=127.0.0.1:5",
                           "cluster.workers=[127.0.0.1:3,127.0.0.1:4]")
    with pytest.raises(ConfigError, match=refused):
        with opened(beside, {}):
            pass
    two = _composed_run("hydra.run.dir=s3://runs/a", "resume=s3://runs/b")
    with pytest.raises(ConfigError, match=r"one run directory at a URL per command; "
                                          r"received \['s3://runs/a', 's3://runs/b'\]"):
        with opened(two, {}):
            pass


def test_the_evaluator_task_at_a_url_is_refused_by_the_one_rule(tmp_path, monkeypatch):
    """`TF_CONFIG`'s evaluator task with the run directory at a URL (named on the command
    line, or by a config file) meets the refusal `place.opened` writes, before any store is
    reached: one line, exit 2."""
    described = {"cluster": {"worker": ["127.0.0.1:1"], "evaluator": ["127.0.0.1:2"]},
                 "task": {"type": "evaluator", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(described))
    own = tmp_path / "conf" / "experiment"
    own.mkdir(parents=True)
    (own / "at_url.yaml").write_text("# @package _global_\nhydra:\n  run:\n"
                                     "    dir: s3://runs/exp\n")
    for args, url in ((["hydra.run.dir=s3://runs/r"], "s3://runs/r"),
                      (["--config-dir", str(tmp_path / "conf"), "experiment=at_url"],
                       "s3://runs/exp")):
        done = run_main(*args, *TINY, cwd=tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert error_lines(done.stderr) == [
            f"error: an evaluator beside the workers reads the run directory as files the "
            f"chief writes (a shared file system), not at a URL ({url}); use a shared "
            "directory, or no evaluator"]


def test_a_file_named_by_hydras_run_time_output_dir_lands_at_the_url(s3, tmp_path):
    """`${hydra:runtime.output_dir}` is the URL's local mirror, uploaded with the run."""
    done = run_main(*TINY, "model=small", "+callbacks.csv._target_=keras.callbacks.CSVLogger",
                    "+callbacks.csv.filename=${hydra:runtime.output_dir}/epochs.csv",
                    f"hydra.run.dir=s3://{BUCKET}/runs/csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert s3.fs.cat_file(f"{BUCKET}/runs/csv/epochs.csv").startswith(b"epoch,")


@pytest.mark.parametrize("url, name", [("gs://runs/a", "GOOGLE_APPLICATION_CREDENTIALS"),
                                       ("gcs://runs/a", "GOOGLE_APPLICATION_CREDENTIALS")])
def test_a_credentials_file_that_is_not_there_is_one_line_before_any_request(
        tmp_path, monkeypatch, url, name):
    """gcsfs printed its fallbacks and a logged traceback (52 lines), then blamed the
    network: the variable and its path are named, nothing is asked of any store."""
    monkeypatch.setenv(name, str(tmp_path / "nowhere.json"))
    done = run_main(*TINY, f"hydra.run.dir={url}", cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert error_lines(done.stderr) == [
        f"error: {name}={tmp_path / 'nowhere.json'} names no file, so {url} cannot be reached "
        f"with its credentials; point {name} at the key file, or unset it"]
