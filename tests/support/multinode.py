"""A job on a Ray cluster of several nodes on this machine, one of them killed while it decodes.

Run as a program (its own process: a test's shared local Ray cannot be a cluster):

    RAY_AUTH_MODE=token python -m support.multinode JOB_JSON --kill|--no-kill

It starts a head node (the driver's tasks) and two worker nodes of one CPU each (`ray.cluster_utils.Cluster`:
each node a raylet of its own), runs the job there, and with --kill, once a few output files exist, SIGKILLs
the worker node that holds a decode actor (raylet and workers, no grace). It prints one JSON line: where the
actors ran, which node was killed, the job's summary and its wall seconds.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import ray
from ray.cluster_utils import Cluster

from pipeline.io.storage import open_filesystem, output_files
from pipeline.jobs import JobConfig
from pipeline.jobs.run import run_job

FILES_BEFORE_THE_KILL = 2
RESULT = "multinode result: "  # the line the test reads among Ray's own output


def decode_actors() -> dict[str, str]:
    """{actor id: node id} of the live decode actors. From the GCS's actor table: ray.util.state would need
    a dashboard, which would take CPU from the nodes of a 2-core machine."""
    from ray._private.state import actors

    return {actor_id: info["Address"]["NodeID"] for actor_id, info in actors().items()
            if info["State"] == "ALIVE" and "DecodeStage" in info["ActorClassName"]}


def kill_a_decoding_node(cluster: Cluster, job: JobConfig, killed: dict) -> None:
    fs, path = open_filesystem(job.output.path, job.output.storage_options)
    deadline = time.time() + 120
    while time.time() < deadline:
        nodes = set(decode_actors().values())
        victims = [node for node in cluster.worker_nodes if node.node_id in nodes]
        if victims and len(output_files(fs, path)) >= FILES_BEFORE_THE_KILL:
            killed.update(node=victims[0].node_id, at=time.time(), actor_nodes=sorted(nodes))
            cluster.remove_node(victims[0], allow_graceful=False)
            return
        time.sleep(0.1)


def main() -> None:
    job = JobConfig.model_validate(json.loads(sys.argv[1]))
    kill = sys.argv[2] == "--kill"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    nodes = len(cluster.list_all_nodes())
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    killed: dict = {}
    killer = threading.Thread(target=kill_a_decoding_node, args=(cluster, job, killed), daemon=True)
    if kill:
        killer.start()
    started = time.time()
    summary = run_job(job, address=cluster.address)
    seconds = time.time() - started
    print(RESULT + json.dumps({"killed": killed, "nodes": nodes, "seconds": seconds,
                      "summary": summary.to_dict()}), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
