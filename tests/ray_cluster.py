"""A local Ray cluster of simulated nodes for tests/test_ray.py, in a process of its own
(`ray.cluster_utils.Cluster`, Ray's own multi-node test cluster: one raylet per node, all on
127.0.0.1): `python tests/ray_cluster.py NODES CPUS TEMP_DIR` prints the head's address,
then reads commands on stdin: `remove I` removes node I at once (its raylet and every worker
on it killed, as a machine lost), printing `removed`; end of input shuts the cluster down.

The head node has no CPUs: only the nodes added run workers. Ray's addresses are kept on
127.0.0.1 (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: else a driver's `ray.init` turns the head's
127.0.0.1 into this machine's own address, where nothing listens), in every Ray process this
one starts.
"""

import os
import sys
import tempfile

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# A node lost is marked dead after 3 missed health checks half a second apart (Ray's
# defaults: 5 of 3 s each, after 5 s), so a restart sees the room the cluster has left
# within seconds instead of first trying, for Ray Train's 60 s, to start on a dead node.
for name, value in (("period", 500), ("timeout", 500), ("initial_delay", 500)):
    os.environ.setdefault(f"RAY_health_check_{name}_ms", str(value))
os.environ.setdefault("RAY_health_check_failure_threshold", "3")

from ray.cluster_utils import Cluster  # noqa: E402


def main() -> None:
    nodes, cpus, temp_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    # Ray notes the head's address in `$TMPDIR/ray` whatever its own temp_dir is
    os.makedirs(os.path.join(tempfile.gettempdir(), "ray"), exist_ok=True)
    common = {"node_ip_address": "127.0.0.1", "temp_dir": temp_dir}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, **common})
    added = [cluster.add_node(num_cpus=cpus, **common) for _ in range(nodes)]
    cluster.wait_for_nodes()
    print(cluster.address, flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["remove"]:
            cluster.remove_node(added[int(command[1])], allow_graceful=False)
            print("removed", flush=True)
    cluster.shutdown()


if __name__ == "__main__":
    main()
