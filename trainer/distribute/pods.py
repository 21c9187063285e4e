"""The cluster of a Kubernetes Indexed Job's (or a JobSet's) pods, from what Kubernetes sets
in each pod; no TensorFlow, no Kubernetes API.

Kubernetes gives every pod of a Job with `completionMode: Indexed` (a JobSet's jobs are such
Jobs):
- `JOB_COMPLETION_INDEX`: the pod's index, 0 .. completions - 1 (set by the Job controller);
- its hostname, in `HOSTNAME`: `<job name>-<index>` (a JobSet's:
  `<jobset>-<replicated job>-<job index>-<index>`);
- where the pod template names a headless Service as its `subdomain`, a fully qualified name
  in the pod's `/etc/hosts`, `<hostname>.<subdomain>.<namespace>.svc.<cluster domain>`, under
  which every other pod of the Job is found by its own hostname (JobSet makes that Service
  itself, named after the JobSet, with `network.enableDNSHostnames`, its default).

What no pod is told is how many pods the Job runs (its `completions`), and an Indexed Job may
as well be an array of independent runs (a sweep, one trial a pod): the command line says it,
`cluster.size=N`, and only then do the pods form one cluster. Pod `i` is worker `i` at
`<job name>-<i>.<subdomain>...:<cluster.port_base + i>` (its own port, as SLURM tasks on one
node have: the same derivation works for pods started on one machine); pod 0 is the chief.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.config.errors import ConfigError

INDEX = "JOB_COMPLETION_INDEX"


def kubernetes_cluster(environ: Any, size: int, port_base: int,
                       qualified: Callable[[str], str]) -> tuple[list[str], int] | None:
    """The workers' addresses and this pod's index, or None where no cluster is asked for.

    Args:
        environ: the pod's environment (`JOB_COMPLETION_INDEX`, `HOSTNAME`).
        size: `cluster.size`, the Job's completions; 0: not a cluster of pods (an Indexed Job
            of independent runs), 1: one pod, a plain run.
        port_base: `cluster.port_base`: pod `i` listens on `port_base + i`.
        qualified: the fully qualified name of a hostname (`socket.getfqdn`, which reads the
            pod's `/etc/hosts`).

    Raises:
        ConfigError: `cluster.size` given outside an Indexed Job's pod, or the pod's names do
            not make a cluster (no subdomain, a hostname that is not `<job>-<index>`).
    """
    if size < 2:
        return None
    index_text = environ.get(INDEX)
    if index_text is None:
        raise ConfigError(f"cluster.size={size} forms a cluster of the pods of a Kubernetes "
                          f"Indexed Job (or JobSet), but {INDEX} is not set: run it in such a "
                          "pod (completionMode: Indexed), or give cluster.workers, TF_CONFIG "
                          "or a SLURM step instead")
    if not index_text.isdigit() or not int(index_text) < size:
        raise ConfigError(f"{INDEX}={index_text} is not a pod of a Job of cluster.size={size} "
                          f"pods (0 to {size - 1}); set cluster.size to the Job's completions")
    index = int(index_text)
    hostname = environ.get("HOSTNAME") or ""
    prefix, dash, own = hostname.rpartition("-")
    if not dash or not prefix or own != str(index):
        raise ConfigError(f"HOSTNAME={hostname!r} is not an Indexed Job pod's <job name>-"
                          f"{index}, as Kubernetes names the pod of {INDEX}={index}; do not "
                          "set the pod template's hostname")
    full = qualified(hostname)
    if not full.startswith(hostname + ".") or len(full) == len(hostname) + 1:
        raise ConfigError(f"pod {hostname} has no subdomain ({hostname} is known as "
                          f"{full!r}), so the other pods cannot be reached by name: set the pod "
                          "template's subdomain to a headless Service selecting the Job's pods "
                          "(a JobSet makes one: network.enableDNSHostnames)")
    if not 0 < port_base <= 65535 - (size - 1):
        raise ConfigError(f"cluster.port_base must leave room for {size} ports below 65536; "
                          f"received: {port_base}")
    domain = full[len(hostname):]
    return [f"{prefix}-{i}{domain}:{port_base + i}" for i in range(size)], index
