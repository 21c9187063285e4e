"""SLURM job steps as clusters: the node-list parser, the tasks-per-node list, the environment
`srun` gives each task, and the devices of tasks that share a node. Pure functions."""

from __future__ import annotations

import pytest

from trainer.config.errors import ConfigError
from trainer.distribute.cluster import (
    expand_nodelist,
    expand_tasks_per_node,
    resolve_cluster,
    slurm_cluster,
    slurm_devices,
)

# Node lists as SLURM writes them (squeue, SLURM_JOB_NODELIST) on real clusters.
NODELISTS = {
    "node01": ["node01"],
    "node[01-04,07]": ["node01", "node02", "node03", "node04", "node07"],
    "gpu[1-3]": ["gpu1", "gpu2", "gpu3"],
    "node[9-11]": ["node9", "node10", "node11"],
    "nid[00098-00100]": ["nid00098", "nid00099", "nid00100"],
    "cn[1-2],gpu[5,7]": ["cn1", "cn2", "gpu5", "gpu7"],
    "a01,b02,c03": ["a01", "b02", "c03"],
    "node[001-002]-ib": ["node001-ib", "node002-ib"],
    "rack[1-2]-node[01-02]": ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"],
    "jwb[0001,0003-0004]": ["jwb0001", "jwb0003", "jwb0004"],
    "r1i0n[0-1],r1i1n3": ["r1i0n0", "r1i0n1", "r1i1n3"],
    "127.0.0.1": ["127.0.0.1"],
    "compute-0-[1-2].local": ["compute-0-1.local", "compute-0-2.local"],
}


@pytest.mark.parametrize("text", sorted(NODELISTS))
def test_node_lists_in_slurms_compressed_form(text):
    assert expand_nodelist(text) == NODELISTS[text]


@pytest.mark.parametrize("text", ["node01", "node[01-04,07]", "gpu[1-3]", "cn[1-2],gpu[5,7]",
                                  "a01,b02,c03", "nid[00098-00100]"])
def test_node_lists_agree_with_tensorflows_resolver(text):
    # TensorFlow's SlurmClusterResolver has its own parser (it needs TensorFlow imported,
    # which the early checks must not, and refuses text after a bracket: node[1-2]-ib, or
    # two bracket groups); on the forms it reads, both agree.
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_hostlist,
    )

    assert expand_nodelist(text) == expand_hostlist(text)


@pytest.mark.parametrize("text", ["node[01-", "node]01[", "node[a-b]", "node[5-2]", ""])
def test_a_bad_node_list_is_one_error_naming_it(text):
    with pytest.raises(ConfigError, match="SLURM node list"):
        expand_nodelist(text)


def test_tasks_per_node():
    assert expand_tasks_per_node("4") == [4]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4(x2)") == [4, 4]
    with pytest.raises(ConfigError, match="tasks per node"):
        expand_tasks_per_node("4x2")


def step(procid: int, localid: int, node: str, **extra: str) -> dict[str, str]:
    """What `srun -N2 --ntasks-per-node=4` gives one task (2 nodes x 4 GPUs)."""
    return {"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_NODELIST": "gpu[07-08]",
            "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8",
            "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(localid), "SLURMD_NODENAME": node, **extra}


def test_a_job_step_of_eight_tasks_on_two_nodes():
    cluster = slurm_cluster(step(5, 1, "gpu08"), port_base=9000)
    assert cluster.source == "SLURM" and cluster.num_workers == 8
    assert cluster.addresses == [f"gpu07:{9000 + i}" for i in range(4)] + \
        [f"gpu08:{9000 + i}" for i in range(4)]
    assert cluster.task_id == 5 and not cluster.is_chief
    assert (cluster.local_index, cluster.local_tasks) == (1, 4)
    assert slurm_cluster(step(0, 0, "gpu07")).is_chief
    # one task per node: SLURM_STEP_TASKS_PER_NODE "1(x2)"
    one = slurm_cluster(step(1, 0, "gpu08", SLURM_STEP_NUM_TASKS="2",
                             SLURM_STEP_TASKS_PER_NODE="1(x2)"))
    assert one.addresses == ["gpu07:8888", "gpu08:8888"] and one.task_id == 1


def test_what_is_not_a_multi_task_step_is_no_cluster():
    assert slurm_cluster({}) is None
    # a batch script's own shell: job variables, no step
    batch = {"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"}
    assert slurm_cluster(batch) is None
    # srun -n1: a plain single-machine run
    assert slurm_cluster({"SLURM_STEP_NODELIST": "gpu07", "SLURM_STEP_NUM_TASKS": "1",
                          "SLURM_PROCID": "0"}) is None


def test_cluster_workers_and_tf_config_win_over_slurm():
    env = step(5, 1, "gpu08")
    assert resolve_cluster(["a:1", "b:2"], 1, None, env).source == "cluster.workers"
    tf_config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}'
    assert resolve_cluster([], 0, tf_config, env).source == "TF_CONFIG"
    assert resolve_cluster([], 0, None, env).source == "SLURM"
    assert resolve_cluster([], 0, None, {}) is None


def test_steps_that_do_not_add_up_are_refused():
    with pytest.raises(ConfigError, match="distribution=block"):  # cyclic: task 1 on node 2
        slurm_cluster(step(1, 0, "gpu08"))
    with pytest.raises(ConfigError, match="does not add up"):
        slurm_cluster(step(0, 0, "gpu07", SLURM_STEP_TASKS_PER_NODE="3(x2)"))
    with pytest.raises(ConfigError, match="port_base"):
        slurm_cluster(step(0, 0, "gpu07"), port_base=65534)


def test_tasks_sharing_a_node_take_their_own_gpus():
    cluster = slurm_cluster(step(6, 2, "gpu08"))
    assert slurm_devices("auto", cluster, visible_gpus=4) == [2]
    assert slurm_devices("auto", cluster, visible_gpus=8) == [4, 5]
    assert slurm_devices("auto", cluster, visible_gpus=1) == "auto"  # --gpus-per-task=1
    assert slurm_devices("auto", cluster, visible_gpus=0) == "auto"  # CPU nodes
    assert slurm_devices([0, 1], cluster, visible_gpus=4) == [0, 1]  # the user's choice
    assert slurm_devices("auto", cluster, visible_gpus=4, accelerator="cpu") == "auto"
    one_per_node = slurm_cluster(step(1, 0, "gpu08", SLURM_STEP_NUM_TASKS="2",
                                      SLURM_STEP_TASKS_PER_NODE="1(x2)"))
    assert slurm_devices("auto", one_per_node, visible_gpus=4) == "auto"  # all four
    with pytest.raises(ConfigError, match="give each task a GPU"):
        slurm_devices("auto", cluster, visible_gpus=2)
