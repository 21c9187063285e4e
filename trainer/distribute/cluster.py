"""The cluster of a multi-worker run, from `cluster.workers`, `TF_CONFIG`, SLURM or a
Kubernetes Indexed Job's pods; no TensorFlow.

Cluster managers (`python -m trainer.launch`, Kubeflow's former TFJob) describe the cluster
in the `TF_CONFIG` environment variable, as TensorFlow defines it:

    {"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}

`cluster.workers=[host1:port,host2:port] cluster.task_index=I` says the same on the command
line and wins over `TF_CONFIG`. Without either, a SLURM job step (`srun`) is read from the
environment SLURM gives each task (`slurm_cluster`): no `scontrol`, no hand-made TF_CONFIG;
with `cluster.size=N`, the N pods of a Kubernetes Indexed Job or JobSet from the index and
names Kubernetes gives each pod (`kubernetes_cluster`, `trainer.distribute.pods`).
Task 0 of the `chief` job, or worker 0 where there is no chief job, is the chief: the one
worker that writes the run directory.

An `evaluator` job (`TF_CONFIG`'s, or `cluster.evaluator=host:port`) is outside the
MultiWorkerMirroredStrategy cluster, as TensorFlow's SidecarEvaluator was: the workers only
learn that one validates beside them (`Cluster.evaluator`); the evaluator's own process is
told by `TF_CONFIG`'s task type (`evaluator_task`) and never joins the collective.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from trainer.config.errors import ConfigError
from trainer.distribute import pods

# TensorFlow's SlurmClusterResolver's default: worker ports on a node are base, base+1, ...
DEFAULT_PORT_BASE = 8888
JOBS = ("chief", "worker")  # MultiWorkerMirroredStrategy's jobs, in their order of ids
COMMUNICATIONS = ("auto", "ring", "nccl")


@dataclass(frozen=True)
class Cluster:
    """Every task of a multi-worker cluster, and which one this process is.

    Attributes:
        jobs: job name -> task addresses (`host:port`), for `chief` and `worker`.
        task_type: this process's job, `chief` or `worker`.
        task_index: this process's index within its job.
        source: where it came from: `TF_CONFIG`, `cluster.workers`, `SLURM` or
            `Kubernetes`.
        local_index: SLURM only: this task's index on its node (`SLURM_LOCALID`).
        local_tasks: SLURM only: how many tasks of the step run on this node.
        evaluator: the evaluator's address where one validates beside the workers, else None.
    """

    jobs: dict[str, tuple[str, ...]]
    task_type: str
    task_index: int
    source: str
    # SLURM only: this task's index among the tasks on its node, and how many run there
    local_index: int | None = None
    local_tasks: int | None = None
    evaluator: str | None = None
    # `cluster.max_restarts`: restarts a scheduler may make (a lost peer then exits 75)
    max_restarts: int = 0

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


def from_workers(workers: list[str], task_index: int, evaluator: str | None = None) -> Cluster:
    """The cluster `cluster.workers=[...] cluster.task_index=I` describe (worker 0 is chief),
    with `cluster.evaluator` where one validates beside them."""
    addresses = tuple(_check_address(w, "cluster.workers") for w in workers)
    if len(set(addresses)) != len(addresses):
        raise ConfigError(f"cluster.workers lists an address twice; received: {list(addresses)}")
    if not 0 <= task_index < len(addresses):
        raise ConfigError(f"cluster.task_index must be in 0..{len(addresses) - 1} for "
                          f"{len(addresses)} workers; received: {task_index}")
    return Cluster({"worker": addresses}, "worker", task_index, "cluster.workers",
                   evaluator=_evaluator(evaluator))


def _evaluator(address: str | None) -> str | None:
    return None if address is None else _check_address(address, "cluster.evaluator")


def evaluator_task(tf_config: str | None) -> bool:
    """Whether `TF_CONFIG` makes this process the evaluator (`task.type` `evaluator`)."""
    if not tf_config:
        return False
    try:
        config = json.loads(tf_config)
    except json.JSONDecodeError:
        return False  # the pre-flight says why, in one line
    task = config.get("task") if isinstance(config, dict) else None
    return isinstance(task, dict) and task.get("type") == "evaluator"


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
    evaluators = list(cluster.get("evaluator") or [])
    if len(evaluators) > 1:
        raise ConfigError(f"TF_CONFIG may have one evaluator; received: {evaluators}")
    if not isinstance(task_index, int) or not 0 <= task_index < len(jobs.get(task_type, ())):
        raise ConfigError(f"TF_CONFIG task index {task_index!r} is not a task of job "
                          f"{task_type!r}, which has {len(jobs.get(task_type, ()))}")
    return Cluster(jobs, task_type, task_index, "TF_CONFIG",
                   evaluator=_check_address(evaluators[0], "TF_CONFIG cluster.evaluator")
                   if evaluators else None)


def resolve_cluster(workers: list[str], task_index: int, tf_config: str | None,
                    environ: Any = None, port_base: int = DEFAULT_PORT_BASE,
                    evaluator: str | None = None, size: int = 0) -> Cluster | None:
    """The cluster of this run: `cluster.workers` if given, else `TF_CONFIG`, else a SLURM
    job step of several tasks (from `environ`), else the `size` pods of a Kubernetes Indexed
    Job (`kubernetes_cluster`), else None. `evaluator` (`cluster.evaluator`) adds an
    evaluator to a cluster that names none.

    Raises:
        ConfigError: `cluster.evaluator` without a cluster of workers to validate for.
    """
    found = None
    if workers:
        return from_workers(list(workers), task_index, evaluator)
    if tf_config:
        found = from_tf_config(tf_config)
    elif environ is not None:
        found = slurm_cluster(environ, port_base) or kubernetes_cluster(environ, size,
                                                                         port_base)
    if evaluator is not None and found is None:
        raise ConfigError("cluster.evaluator validates beside the workers of a multi-worker "
                          "run; this run has no cluster (cluster.workers, TF_CONFIG, SLURM or "
                          f"an Indexed Job's pods); received: cluster.evaluator={evaluator}")
    if evaluator is not None and found.evaluator is None:
        return replace(found, evaluator=_evaluator(evaluator))
    return found


def cluster_of_config(node: Any, environ: Any) -> Cluster | None:
    """The cluster a composed config's `cluster` node and the environment describe
    (`resolve_cluster` of `cluster.workers`, `TF_CONFIG`, SLURM), before any run starts.

    Args:
        node: the config's `cluster` node (`workers`, `task_index`, `port_base`,
            `evaluator`, `max_restarts`).
        environ: the environment (`TF_CONFIG`, SLURM's variables).
    """
    found = resolve_cluster(list(node.workers), node.task_index, environ.get("TF_CONFIG"),
                            environ, node.port_base, node.evaluator, node.get("size", 0) or 0)
    restarts = int(node.get("max_restarts", 0) or 0)
    return replace(found, max_restarts=restarts) if found is not None and restarts else found


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Splits at the commas outside brackets: `a[1-2],b` -> `a[1-2]`, `b`."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError("unbalanced brackets")
    return [*parts, current]


def _expand_one(name: str) -> list[str]:
    """`rack[1-2]-n[01,03]` -> rack1-n01, rack1-n03, rack2-n01, rack2-n03."""
    start = name.find("[")
    if start < 0:
        if "]" in name:
            raise ValueError("unbalanced brackets")
        return [name]
    end = name.index("]", start)
    choices = []
    for item in name[start + 1:end].split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ValueError(f"bad range {item!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {item!r} runs backwards")
        width = len(low) if low.startswith("0") else 0  # node[01-10]: zero-padded
        choices += [str(i).zfill(width) for i in range(int(low), int(high) + 1)]
    return [f"{name[:start]}{choice}{rest}" for choice in choices
            for rest in _expand_one(name[end + 1:])]


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list in full, in SLURM's order.

    `node[01-04,07]` -> node01..node04, node07; `a[1-2],b3` -> a1, a2, b3; several bracket
    groups in one name give every combination (`r[1-2]-n[1-2]`). No `scontrol` needed.

    Raises:
        ConfigError: the text is not a host list.
    """
    try:
        hosts = [host for part in _split_top(text.strip()) if part
                 for host in _expand_one(part.strip())]
    except ValueError as error:
        raise ConfigError(f"SLURM node list {text!r} cannot be read ({error}); expected e.g. "
                          "node[01-04,07]") from None
    if not hosts:
        raise ConfigError(f"SLURM node list is empty; received: {text!r}")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks-per-node list in full: `2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ConfigError(f"SLURM tasks per node {text!r} cannot be read; expected e.g. "
                              "4(x2),3")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_cluster(environ: Any, port_base: int = DEFAULT_PORT_BASE) -> Cluster | None:
    """The cluster of a SLURM job step of several tasks, from the variables `srun` sets.

    Read: `SLURM_PROCID` (this task), `SLURM_STEP_NUM_TASKS` (or `SLURM_NTASKS`),
    `SLURM_STEP_NODELIST` (or `SLURM_JOB_NODELIST`), `SLURM_STEP_TASKS_PER_NODE` (or
    `SLURM_TASKS_PER_NODE`), `SLURM_LOCALID`, `SLURMD_NODENAME`. Each task is a worker at
    `host:port_base + its index on the node`, worker i being task i (SLURM's default block
    distribution); task 0 is the chief.

    Returns:
        None outside a job step, or for a step of one task (a plain single-machine run; a
        batch script's own shell is not a step: it has no `SLURM_STEP_NODELIST`).

    Raises:
        ConfigError: the variables disagree (a cyclic task distribution, a task count that
            does not match the node list).
    """
    nodelist = environ.get("SLURM_STEP_NODELIST")
    procid = environ.get("SLURM_PROCID")
    if not nodelist or procid is None:
        return None
    ntasks = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
    if ntasks < 2:
        return None
    hosts = expand_nodelist(nodelist)
    per_node_text = (environ.get("SLURM_STEP_TASKS_PER_NODE")
                     or environ.get("SLURM_TASKS_PER_NODE") or "")
    per_node = expand_tasks_per_node(per_node_text) if per_node_text else []
    if len(per_node) == 1 and len(hosts) > 1:
        per_node *= len(hosts)
    if not per_node:
        per_node = [ntasks // len(hosts)] * len(hosts)
    if len(per_node) != len(hosts) or sum(per_node) != ntasks:
        raise ConfigError(f"SLURM step of {ntasks} tasks on nodes {hosts} with tasks per node "
                          f"{per_node_text!r} does not add up; check the srun options")
    if not 0 < port_base < 65536 - max(per_node):
        raise ConfigError(f"cluster.port_base must leave room for {max(per_node)} ports below "
                          f"65536; received: {port_base}")
    places = [(host, local) for host, count in zip(hosts, per_node, strict=True)
              for local in range(count)]
    task = int(procid)
    if not 0 <= task < ntasks:
        raise ConfigError(f"SLURM_PROCID {task} is not a task of a {ntasks}-task step")
    host, local = places[task]
    node, local_id = environ.get("SLURMD_NODENAME"), environ.get("SLURM_LOCALID")
    if (node and node != host) or (local_id is not None and int(local_id) != local):
        raise ConfigError(f"SLURM task {task} runs on {node} as local task {local_id}, but a "
                          f"block distribution puts it on {host} as local task {local}; run "
                          "with srun --distribution=block (SLURM's default)")
    workers = tuple(f"{h}:{port_base + i}" for h, i in places)
    return Cluster({"worker": workers}, "worker", task, "SLURM", local_index=local,
                   local_tasks=per_node[hosts.index(host)])


def slurm_devices(devices: Any, cluster: Cluster | None, visible_gpus: int,
                  accelerator: str = "auto") -> Any:
    """The devices of one SLURM task where several share a node's GPUs.

    With `devices=auto`, `k` tasks on a node with `n` visible GPUs each take their own
    `n // k` of them, by `SLURM_LOCALID`: task 1 of 4 on a 4-GPU node gets [1]. Anything
    else is left as it is: an explicit `devices`, one task per node (all its GPUs), a task
    that SLURM already gave its own GPU (`--gpus-per-task`: it sees one), or no GPUs.
    """
    if (devices != "auto" or accelerator == "cpu" or cluster is None
            or cluster.source != "SLURM"
            or not cluster.local_tasks or cluster.local_tasks < 2
            or visible_gpus <= 1):
        return devices
    share = visible_gpus // cluster.local_tasks
    if share == 0:
        raise ConfigError(f"{cluster.local_tasks} SLURM tasks on a node with {visible_gpus} "
                          "GPUs: give each task a GPU (fewer --ntasks-per-node) or set devices")
    first = cluster.local_index * share
    return list(range(first, first + share))


def kubernetes_cluster(environ: Any, size: int, port_base: int = DEFAULT_PORT_BASE,
                       qualified: Callable[[str], str] = socket.getfqdn) -> Cluster | None:
    """The cluster of the `size` pods of a Kubernetes Indexed Job or JobSet
    (`cluster.size`), from the variables and names Kubernetes gives each pod
    (`trainer.distribute.pods`); None where `size` < 2."""
    found = pods.kubernetes_cluster(environ, size, port_base, qualified)
    if found is None:
        return None
    workers, index = found
    return Cluster({"worker": tuple(workers)}, "worker", index, "Kubernetes")


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
