"""Kubernetes, without TFJob: the pods of an Indexed Job (or a JobSet) form the cluster from
what Kubernetes gives each pod (`JOB_COMPLETION_INDEX`, its hostname, the fully qualified name
its headless Service's subdomain gives it) and `cluster.size=N`
(`trainer.distribute.pods`); the manifests docs/several-machines.md shows are valid
Kubernetes objects (kubernetes-validate's strict schemas, from the API's OpenAPI).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import yaml
from conftest import REPO, error_lines, run_main

from tests.test_multiworker import (  # noqa: F401
    COMMON,
    assert_same_weights,
    consecutive_free_ports,
    launches,
    run_tasks,
)
from trainer.config.errors import ConfigError
from trainer.distribute.cluster import cluster_of_config, kubernetes_cluster

DOMAIN = ".default.svc.cluster.local"


def fqdn(subdomain: str):
    """`socket.getfqdn` in a pod whose template names `subdomain` (its `/etc/hosts` line)."""
    return lambda hostname: f"{hostname}.{subdomain}{DOMAIN}"


def test_each_pod_of_a_two_pod_indexed_job_finds_the_same_cluster_and_its_place():
    # what Kubernetes sets in pod i of Job `cifar` (completionMode: Indexed, completions: 2)
    # whose template's subdomain is the headless Service `cifar`
    clusters = [kubernetes_cluster({"JOB_COMPLETION_INDEX": str(i), "HOSTNAME": f"cifar-{i}",
                                    "KUBERNETES_SERVICE_HOST": "10.96.0.1"}, 2, 8888,
                                   fqdn("cifar")) for i in range(2)]
    workers = (f"cifar-0.cifar{DOMAIN}:8888", f"cifar-1.cifar{DOMAIN}:8889")
    for index, cluster in enumerate(clusters):
        assert cluster.jobs == {"worker": workers} and cluster.source == "Kubernetes"
        assert (cluster.task_type, cluster.task_index) == ("worker", index)
        assert cluster.is_chief == (index == 0)
        assert cluster.tf_config() == {"cluster": {"worker": list(workers)},
                                       "task": {"type": "worker", "index": index}}


def test_each_pod_of_a_two_pod_jobset_finds_the_same_cluster_and_its_place():
    # JobSet `cifar`, replicated job `workers` of 1 Job of 2 pods: the pods' hostnames are
    # <jobset>-<replicated job>-<job index>-<pod index>, the subdomain the JobSet's own
    # headless Service (named after the JobSet)
    clusters = [kubernetes_cluster({"JOB_COMPLETION_INDEX": str(i),
                                    "HOSTNAME": f"cifar-workers-0-{i}"}, 2, 2222, fqdn("cifar"))
                for i in range(2)]
    workers = (f"cifar-workers-0-0.cifar{DOMAIN}:2222", f"cifar-workers-0-1.cifar{DOMAIN}:2223")
    assert [c.jobs["worker"] for c in clusters] == [workers, workers]
    assert [c.task_index for c in clusters] == [0, 1]


def test_the_cluster_of_pods_is_chosen_by_the_config_and_only_with_cluster_size():
    pod = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "cifar-1"}
    # an Indexed Job of independent runs (one trial a pod): no cluster without cluster.size
    node = yaml.safe_load("{workers: [], task_index: 0, port_base: 8888, evaluator: null, "
                          "max_restarts: 0, size: 0}")
    from omegaconf import OmegaConf

    assert cluster_of_config(OmegaConf.create(node), pod) is None
    assert cluster_of_config(OmegaConf.create({**node, "size": 1}), pod) is None
    # TF_CONFIG, where given, wins (a Job whose command sets it keeps working)
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                            "task": {"type": "worker", "index": 0}})
    found = cluster_of_config(OmegaConf.create({**node, "size": 2}),
                              {**pod, "TF_CONFIG": tf_config})
    assert found.source == "TF_CONFIG"


@pytest.mark.parametrize(("environ", "size", "subdomain", "message"), [
    ({"HOSTNAME": "cifar-1"}, 2, "cifar",
     "cluster.size=2 forms a cluster of the pods of a Kubernetes Indexed Job (or JobSet), "
     "but JOB_COMPLETION_INDEX is not set"),
    ({"JOB_COMPLETION_INDEX": "2", "HOSTNAME": "cifar-2"}, 2, "cifar",
     "JOB_COMPLETION_INDEX=2 is not a pod of a Job of cluster.size=2 pods (0 to 1)"),
    ({"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "my-pod"}, 2, "cifar",
     "HOSTNAME='my-pod' is not an Indexed Job pod's <job name>-1"),
    ({"JOB_COMPLETION_INDEX": "1"}, 2, "cifar", "HOSTNAME='' is not an Indexed Job pod's"),
    ({"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "cifar-1"}, 2, None,
     "pod cifar-1 has no subdomain (cifar-1 is known as 'cifar-1')"),
])
def test_a_pods_incomplete_variables_are_one_line(environ, size, subdomain, message):
    qualified = fqdn(subdomain) if subdomain else (lambda hostname: hostname)
    with pytest.raises(ConfigError, match=re.escape(message)):
        kubernetes_cluster(environ, size, 8888, qualified)


def test_cluster_size_outside_a_pod_is_one_line_exit_2_and_nothing_written(tmp_path,
                                                                          monkeypatch):
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    result = run_main("cluster.size=2", "epochs=1", cwd=tmp_path)
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "JOB_COMPLETION_INDEX is not set" in lines[0], lines
    assert not (tmp_path / "outputs").exists()
    bad = run_main("cluster.size=-1", cwd=tmp_path)
    assert bad.returncode == 2 and "cluster.size" in error_lines(bad.stderr)[0]


def manifests() -> list[dict]:
    """Every Kubernetes object in docs/several-machines.md's YAML blocks."""
    text = (REPO / "docs" / "several-machines.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def test_the_documented_manifests_are_valid_kubernetes_objects_and_no_tfjob_is_left():
    import kubernetes_validate

    docs = manifests()
    kinds = sorted({(d["apiVersion"], d["kind"]) for d in docs})
    assert kinds == [("batch/v1", "Job"), ("v1", "Service")], kinds
    for doc in docs:
        # strict: an unknown or misplaced field is an error, as `kubectl apply` would say
        kubernetes_validate.validate(doc, "1.33", strict=True)
    text = (REPO / "docs" / "several-machines.md").read_text()
    assert "TFJob" not in text and "kubeflow.org" not in text
    for job in (d for d in docs if d["kind"] == "Job"):
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert spec["completionMode"] == "Indexed"
        command = pod["containers"][0]["command"]
        assert f"cluster.size={spec['completions']}" in command, command
        services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        service = services[pod["subdomain"]]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}


@pytest.mark.multiworker
def test_two_pods_commands_started_here_with_a_pods_variables_train_like_two_launched_workers(
        tmp_path, launches):  # noqa: F811
    """The documented Job's command, run as its 2 pods would run it: each process with the
    variables Kubernetes sets (`JOB_COMPLETION_INDEX`, `HOSTNAME`) and a pod's `/etc/hosts`
    (its own fully qualified name first, the other pod's after, as the headless Service's
    DNS would answer), mounted in a mount namespace of its own (`unshare`); every name is
    127.0.0.1, pod i listens on port_base + i. They train as 2 launched workers do."""
    if shutil.which("unshare") is None:
        pytest.fail("the pods' /etc/hosts is mounted with util-linux's unshare: install it")
    batch = ["batch.per_replica=null", "batch.global_size=64", "epochs=2", "optimizer.lr=0.01",
             "verbose=0"]
    base = consecutive_free_ports(2)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYDRA_FULL_ERROR", "TF_CONFIG") and not k.startswith("SLURM")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")

    def in_a_pod(index: int) -> list[str]:
        hosts = tmp_path / f"hosts{index}"
        names = [f"127.0.0.1 cifar-{i}.cifar{DOMAIN} cifar-{i}" for i in (index, 1 - index)]
        hosts.write_text("\n".join([*names, "127.0.0.1 localhost", ""]))
        return ["unshare", "--mount", "--map-root-user", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]

    run_tasks(tmp_path, [([*COMMON, *batch, "cluster.size=2", f"cluster.port_base={base}",
                           f"hydra.run.dir={tmp_path / f'pod{index}'}"],
                          {**env, "JOB_COMPLETION_INDEX": str(index),
                           "HOSTNAME": f"cifar-{index}"}) for index in range(2)],
              "pod", wrap=in_a_pod)
    summary = json.loads((tmp_path / "pod0" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["cluster"]["source"] == "Kubernetes"
    assert summary["cluster"]["tasks"] == [f"cifar-0.cifar{DOMAIN}:{base}",
                                           f"cifar-1.cifar{DOMAIN}:{base + 1}"]
    assert not (tmp_path / "pod1" / "summary.json").exists()  # the chief alone writes

    launched = tmp_path / "launched"
    launch = launches(2, *COMMON, *batch, f"hydra.run.dir={launched}")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    assert_same_weights(tmp_path / "pod0", launched, atol=1e-5)
