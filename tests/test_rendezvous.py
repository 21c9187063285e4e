"""The workers' meeting before TensorFlow starts (`trainer.distribute.rendezvous`): each worker
of a cluster a thread here, on free 127.0.0.1 ports. What the processes do with it (one line,
the exit code, nothing written) is tested with real workers in tests/test_multiworker.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from trainer.config.errors import ConfigError, WorkerLost
from trainer.distribute.cluster import from_workers
from trainer.distribute.launch import free_ports
from trainer.distribute.rendezvous import IN_USE, difference, facts, meet

VERSIONS = {"trainer": "0.1.0", "tensorflow": "2.21.0", "keras": "3.15.1"}


def config(**changes) -> dict:
    record = {"epochs": 3, "seed": 1, "dataset": {"image_size": 8, "_target_": "digits"},
              "cluster": {"workers": [], "task_index": 0}, "augment": []}
    for key, value in changes.items():
        node, *path = key.split("__")
        if path:
            record[node] = {**record[node], path[0]: value}
        else:
            record[key] = value
    return record


def addresses(count: int) -> list[str]:
    return [f"127.0.0.1:{port}" for port in free_ports(count)]


def run_cluster(found: list[dict], timeout_s: float = 20.0,
                only: list[int] | None = None) -> list[BaseException | None]:
    """Each worker's `meet` in a thread (the ones in `only`); what each raised (None: went
    on)."""
    cluster_addresses = addresses(len(found))
    outcome: list[BaseException | None] = [None] * len(found)

    def worker(index: int) -> None:
        cluster = from_workers(cluster_addresses, index)
        try:
            meet(cluster, facts(found[index], VERSIONS), timeout_s, say=lambda line: None)
        except BaseException as error:  # noqa: BLE001 - reported to the test
            outcome[index] = error

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in (range(len(found)) if only is None else only)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s + 15)
        assert not thread.is_alive()
    return outcome


def test_workers_with_the_same_config_go_on_together():
    assert run_cluster([config(), config(cluster__task_index=1), config(cluster__task_index=2)]
                       ) == [None, None, None]


@pytest.mark.parametrize(("key", "change", "chief", "other"), [
    ("epochs", {"epochs": 2}, "3", "2"),
    ("seed", {"seed": 2}, "1", "2"),
    ("dataset.image_size", {"dataset__image_size": 16}, "8", "16"),
])
def test_a_difference_is_the_same_line_naming_key_and_values_on_every_worker(
        key, change, chief, other):
    outcome = run_cluster([config(), config(**change, cluster__task_index=1)])
    assert all(isinstance(error, ConfigError) for error in outcome), outcome
    assert str(outcome[0]) == str(outcome[1])
    assert str(outcome[0]).startswith(
        f"workers disagree on {key}: the chief has {chief}, worker 1 (127.0.0.1:")
    assert str(outcome[0]).endswith(f" has {other}; start every worker with the same config "
                                    "and the same trainer, TensorFlow and Keras")


def test_the_first_worker_that_differs_is_named_with_every_key_and_versions():
    cluster = from_workers(addresses(3), 0)
    chief = facts(config(), VERSIONS)
    line = difference(cluster, chief, {
        1: facts(config(cluster__task_index=1), VERSIONS),
        2: facts(config(epochs=5, seed=None, augment=["flip"]),
                 {**VERSIONS, "tensorflow": "2.20.0"})})
    assert line.startswith("workers disagree on epochs: the chief has 3, worker 2 (127.0.0.1:")
    assert "; on seed: the chief has 1, worker 2 has null; on augment: the chief has [], " \
           "worker 2 has [\"flip\"] (and 1 more: version.tensorflow); start every" in line
    assert difference(cluster, chief, {1: facts(config(cluster__task_index=1), VERSIONS)}) \
        is None


def test_a_worker_without_a_chief_ends_at_the_timeout_naming_the_chiefs_address():
    started = time.monotonic()
    outcome = run_cluster([config(), config(cluster__task_index=1)], timeout_s=1.0, only=[1])
    assert time.monotonic() - started < 5
    assert isinstance(outcome[1], WorkerLost), outcome
    assert str(outcome[1]).startswith("worker 1 (127.0.0.1:") and (
        " waited 1 s (strategy.start_timeout_s) for the chief at 127.0.0.1:") in str(outcome[1])


def test_a_chief_without_a_worker_ends_at_the_timeout_naming_the_missing_one():
    outcome = run_cluster([config(), config(), config()], timeout_s=1.0, only=[0, 2])
    assert all(isinstance(error, WorkerLost) for error in (outcome[0], outcome[2])), outcome
    # the connected worker prints the chief's line: who is missing
    assert str(outcome[0]) == str(outcome[2])
    assert str(outcome[0]).startswith("the chief waited 1 s (strategy.start_timeout_s) for "
                                      "worker 1 (127.0.0.1:")


def test_a_taken_port_is_one_line_naming_it():
    cluster = from_workers(addresses(2), 0)
    port = int(cluster.addresses[0].rpartition(":")[2])
    with socket.create_server(("127.0.0.1", port)):
        with pytest.raises(ConfigError) as chief:
            meet(cluster, {}, 5.0)
        with pytest.raises(ConfigError) as worker:
            meet(from_workers([cluster.addresses[1], cluster.addresses[0]], 1), {}, 5.0)
    assert str(chief.value).startswith(f"port {port} (the chief's address 127.0.0.1:{port}) "
                                       f"{IN_USE};")
    assert str(worker.value).startswith(f"port {port} (worker 1 (127.0.0.1:{port})'s address")


def test_a_stranger_on_the_chiefs_port_is_ignored():
    cluster_addresses = addresses(2)
    done: list = []
    chief = threading.Thread(target=lambda: done.append(meet(
        from_workers(cluster_addresses, 0), facts(config(), VERSIONS), 20.0)), daemon=True)
    chief.start()
    host, port = cluster_addresses[0].rsplit(":", 1)
    deadline = time.monotonic() + 10
    while True:
        try:
            stranger = socket.create_connection((host, int(port)))
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
    meet(from_workers(cluster_addresses, 1), facts(config(cluster__task_index=1), VERSIONS),
         20.0)
    chief.join(timeout=10)
    stranger.close()
    assert done == [None]


TAKEN_ONCE = """
import os, sys
if not os.path.exists(sys.argv[1]):
    open(sys.argv[1], "w").close()
    print("error: port 1 (the chief's address 127.0.0.1:1) {in_use}; stop that process")
    sys.exit(2)
"""


@pytest.mark.parametrize("taken", [True, False])
def test_the_launcher_chooses_other_ports_where_a_worker_found_one_taken(tmp_path, taken):
    import io
    import re
    import sys

    from trainer.distribute.launch import launch

    marker = tmp_path / "once"
    if not taken:
        marker.touch()  # the first attempt succeeds
    worker = [sys.executable, "-c", TAKEN_ONCE.format(in_use=IN_USE), str(marker)]
    out = io.StringIO()
    launcher, code = launch([worker, [sys.executable, "-c", "pass"]], tmp_path, grace=5,
                            out=out)
    assert code == 0, out.getvalue()
    starts = re.findall(r"\[launch\] 2 workers on (\S+), (\S+);", out.getvalue())
    assert len(starts) == (2 if taken else 1), out.getvalue()
    if taken:
        assert "a port chosen for a worker was taken meanwhile" in out.getvalue()
        assert set(starts[0]) != set(starts[1])


def test_the_launcher_does_not_start_again_after_another_bad_config(tmp_path):
    import io
    import sys

    from trainer.distribute.launch import launch

    bad = [sys.executable, "-c", "print('error: epochs must be positive'); exit(2)"]
    out = io.StringIO()
    _, code = launch([bad, [sys.executable, "-c", "pass"]], tmp_path, grace=5, out=out)
    assert code == 2 and out.getvalue().count("[launch] 2 workers on") == 1


@pytest.mark.parametrize("value, refusal", [
    ("0", "a positive number of seconds, or null .*"), ("-5", "a positive number of seconds, "
                                                      "or null .*"),
    ("inf", "a finite number; ")])
def test_a_start_timeout_that_is_not_a_positive_number_is_refused(tiny_config, value, refusal):
    from trainer.run.prepare.preflight import check_config

    assert tiny_config("strategy=multi_worker").strategy.start_timeout_s == 300
    check_config(tiny_config("strategy=multi_worker", "strategy.start_timeout_s=null"))
    with pytest.raises(ConfigError, match=rf"^strategy.start_timeout_s must be {refusal}"
                                          rf"received: {value}"):
        check_config(tiny_config("strategy=multi_worker", f"strategy.start_timeout_s={value}"))
