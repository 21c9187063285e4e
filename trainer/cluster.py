"""The cluster of a multi-worker run, from `TF_CONFIG` or `cluster.workers`; no TensorFlow.

Cluster managers (Kubernetes TFJob, SLURM wrappers, `python -m trainer.launch`) describe the
cluster in the `TF_CONFIG` environment variable, as TensorFlow defines it:

    {"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}

`cluster.workers=[host1:port,host2:port] cluster.task_index=I` says the same on the command
line and wins over `TF_CONFIG`. Task 0 of the `chief` job, or worker 0 where there is no chief
job, is the chief: the one worker that writes the run directory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from trainer.errors import ConfigError

JOBS = ("chief", "worker")  # MultiWorkerMirroredStrategy's jobs, in their order of ids
COMMUNICATIONS = ("auto", "ring", "nccl")


@dataclass(frozen=True)
class Cluster:
    """Every task of a multi-worker cluster, and which one this process is.

    Attributes:
        jobs: job name -> task addresses (`host:port`), for `chief` and `worker`.
        task_type: this process's job, `chief` or `worker`.
        task_index: this process's index within its job.
        source: where it came from: `TF_CONFIG` or `cluster.workers`.
    """

    jobs: dict[str, tuple[str, ...]]
    task_type: str
    task_index: int
    source: str

    @property
    def tasks(self) -> list[tuple[str, int, str]]:
        """`(job, index, address)` of every task, the chief first (TensorFlow's id order)."""
        return [(job, i, address) for job in JOBS for i, address in
                enumerate(self.jobs.get(job, ()))]

    @property
    def num_workers(self) -> int:
        return len(self.tasks)

    @property
    def task_id(self) -> int:
        """This task's id in the cluster: 0 is the chief."""
        return [(job, i) for job, i, _ in self.tasks].index((self.task_type, self.task_index))

    @property
    def is_chief(self) -> bool:
        return self.task_id == 0

    @property
    def addresses(self) -> list[str]:
        return [address for _, _, address in self.tasks]

    def name(self, job: str, index: int) -> str:
        """A task as the user knows it, e.g. `worker 1 (10.0.0.2:2222)`."""
        address = self.jobs.get(job, ())[index] if index < len(self.jobs.get(job, ())) else "?"
        label = "chief" if job == "chief" and len(self.jobs["chief"]) == 1 else f"{job} {index}"
        return f"{label} ({address})"

    def tf_config(self) -> dict[str, Any]:
        """This task's `TF_CONFIG`."""
        return {"cluster": {job: list(tasks) for job, tasks in self.jobs.items()},
                "task": {"type": self.task_type, "index": self.task_index}}


def _check_address(address: Any, where: str) -> str:
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where} must hold host:port addresses like 10.0.0.1:2222; "
                          f"received: {address!r}")
    return str(address)


def from_workers(workers: list[str], task_index: int) -> Cluster:
    """The cluster `cluster.workers=[...] cluster.task_index=I` describe (worker 0 is chief)."""
    addresses = tuple(_check_address(w, "cluster.workers") for w in workers)
    if len(set(addresses)) != len(addresses):
        raise ConfigError(f"cluster.workers lists an address twice; received: {list(addresses)}")
    if not 0 <= task_index < len(addresses):
        raise ConfigError(f"cluster.task_index must be in 0..{len(addresses) - 1} for "
                          f"{len(addresses)} workers; received: {task_index}")
    return Cluster({"worker": addresses}, "worker", task_index, "cluster.workers")


def from_tf_config(text: str) -> Cluster | None:
    """Parses `TF_CONFIG`; None when it describes no cluster."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({error}); received: {text!r}") from None
    if not isinstance(config, dict) or not config.get("cluster"):
        return None
    cluster, task = config["cluster"], config.get("task") or {}
    unknown = sorted(set(cluster) - set(JOBS))
    task_type, task_index = task.get("type"), task.get("index", 0)
    if task_type not in JOBS:
        raise ConfigError(f"TF_CONFIG task type {task_type!r} cannot run training; "
                          f"MultiWorkerMirroredStrategy runs these: {', '.join(JOBS)}")
    if unknown and set(unknown) - {"evaluator"}:
        raise ConfigError(f"TF_CONFIG has jobs {unknown} that MultiWorkerMirroredStrategy does "
                          f"not use (parameter servers are another strategy); valid: "
                          f"{', '.join(JOBS)} (and evaluator)")
    jobs = {job: tuple(_check_address(a, f"TF_CONFIG cluster.{job}") for a in cluster[job])
            for job in JOBS if job in cluster}
    if len(jobs.get("chief", ())) > 1:
        raise ConfigError(f"TF_CONFIG may have one chief; received: {list(jobs['chief'])}")
    if not isinstance(task_index, int) or not 0 <= task_index < len(jobs.get(task_type, ())):
        raise ConfigError(f"TF_CONFIG task index {task_index!r} is not a task of job "
                          f"{task_type!r}, which has {len(jobs.get(task_type, ()))}")
    return Cluster(jobs, task_type, task_index, "TF_CONFIG")


def resolve_cluster(workers: list[str], task_index: int, tf_config: str | None) -> Cluster | None:
    """The cluster of this run: `cluster.workers` if given, else `TF_CONFIG`, else None."""
    if workers:
        return from_workers(list(workers), task_index)
    if tf_config:
        return from_tf_config(tf_config)
    return None


def choose_communication(name: str, kind: str) -> str:
    """Checks `strategy.communication` (auto | ring | nccl) against the device kind."""
    if name not in COMMUNICATIONS:
        raise ConfigError(f"strategy.communication must be one of {', '.join(COMMUNICATIONS)}; "
                          f"received: {name!r}")
    if name == "nccl" and kind != "gpu":
        raise ConfigError(f"strategy.communication=nccl needs GPUs; this worker runs on {kind}; "
                          "valid here: auto, ring")
    return name


_TASK = re.compile(r"/job:(chief|worker)/(?:replica:\d+/)?task:(\d+)")


def lost_tasks(message: str, cluster: Cluster) -> list[str]:
    """The other tasks a TensorFlow collective error names, as `Cluster.name` gives them.

    A peer that crashed shows up as "The following tasks are unhealthy (stopped sending
    heartbeats): /job:worker/replica:0/task:1", one that is gone as "remote target
    /job:worker/replica:0/task:0"; this task's own device names are left out.
    """
    found: list[str] = []
    # A relayed report names the relaying task first; the unhealthy ones follow this phrase.
    _, unhealthy, rest = message.partition("unhealthy")
    for job, index in _TASK.findall(rest if unhealthy else message):
        if (job, int(index)) == (cluster.task_type, cluster.task_index):
            continue
        name = cluster.name(job, int(index))
        if name not in found:
            found.append(name)
    return found
