"""A job must fit the cluster it runs on: otherwise its actors would wait for resources forever."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

# How long a job waits for an autoscaling cluster to grow to what its actors ask for.
WAIT_VARIABLE = "BILD_RESOURCE_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS = 600.0
_POLL_SECONDS = 5.0


class ClusterTooSmallError(ValueError):
    """compute.* asks for more CPUs or GPUs than the cluster has (or grew to within the wait)."""


def shortfall(compute, resources: dict) -> str | None:
    """What the actors ask for beyond `resources` (ray.cluster_resources()), naming the keys; None if it fits."""
    problems = []
    for unit, per_actor, key in (("CPU", compute.cpus_per_actor, "compute.cpus_per_actor"),
                                 ("GPU", compute.gpus_per_actor, "compute.gpus_per_actor")):
        wanted = compute.actors * per_actor
        if wanted > resources.get(unit, 0):
            problems.append(f"compute.actors ({compute.actors}) x {key} ({per_actor:g}) = {wanted:g} {unit}s, "
                            f"but the cluster has {resources.get(unit, 0):g}")
    return "; ".join(problems) or None


def check_cluster_fits(compute, wait_seconds: float | None = None, clock=time.monotonic, sleep=time.sleep) -> None:
    """Return once the connected cluster can hold every actor at once; wait up to `wait_seconds`
    (BILD_RESOURCE_WAIT_SECONDS, default 600) for an autoscaler to add nodes; then raise ClusterTooSmallError."""
    import ray

    wait_seconds = float(os.environ.get(WAIT_VARIABLE, DEFAULT_WAIT_SECONDS)) if wait_seconds is None else wait_seconds
    deadline = clock() + wait_seconds
    missing = shortfall(compute, ray.cluster_resources())
    if missing:
        log.warning("the job does not fit the cluster yet (%s); waiting up to %.0f s for it to grow (%s)",
                    missing, wait_seconds, WAIT_VARIABLE)
    while missing and clock() < deadline:
        sleep(_POLL_SECONDS)
        missing = shortfall(compute, ray.cluster_resources())
    if missing:
        raise ClusterTooSmallError(f"{missing}: lower compute.actors or the per-actor request, or add nodes")
