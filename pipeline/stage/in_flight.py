"""A record that kills its actor fails alone.

One pathological input can crash the process decoding it (a segfault, the kernel's out-of-memory
killer). Ray Data then restarts the actor and retries its call, which crashes again, until the job
dies or hangs behind that record. So every call registers its ids with one small registry actor
(`InFlightRecords`, no CPU) and removes them when it returns. A call whose ids are still registered
to another worker is the retry of a call whose actor died: it decodes its records one at a time,
each marked "alone" while it runs. A record that was alone in flight when its actor died may be the one
that killed it, or may have been unlucky (a neighbour's out-of-memory kill): it is decoded alone once more.
A record whose own decoding, alone, killed its actor twice gets an `error` row naming the crash instead of
another attempt, and the job goes on. A death on a node that is gone (a lost machine) blames no one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid

import ray

# Testing hook: a decode actor kills its own process (SIGKILL) when it is about to decode this id.
FAULT_VARIABLE = "BILD_FAULT_KILL_ID"


KILLS_TO_BLAME = 2  # deaths of its actor while a record was decoded alone, on a node that lives on


@ray.remote(num_cpus=0)
class InFlightRecords:
    """{record id: (worker, alone, node)} for the records in calls not yet returned, and how many times each
    record's own decoding killed its actor."""

    def __init__(self):
        self.held: dict[str, tuple[str, bool, str]] = {}
        self.kills: dict[str, int] = {}

    def begin(self, worker: str, ids: list[str], node: str = "") -> tuple[dict[str, str], bool]:
        """Register a call's ids; answer ({id: the dead worker} for ids whose decoding alone killed a worker
        KILLS_TO_BLAME times, whether this call retries one whose worker died)."""
        killers, retried = {}, False
        for record_id in ids:
            holder = self.held.get(record_id)
            if holder is not None and holder[0] != worker:
                retried = True
                if holder[1] and _node_alive(holder[2]):
                    self.kills[record_id] = self.kills.get(record_id, 0) + 1
                    if self.kills[record_id] >= KILLS_TO_BLAME:
                        killers[record_id] = holder[0]
            self.held[record_id] = (worker, False, node)
        return killers, retried

    def mark(self, worker: str, record_id: str, alone: bool, node: str = "") -> None:
        self.held[record_id] = (worker, alone, node)

    def end(self, worker: str, ids: list[str]) -> None:
        for record_id in ids:
            if self.held.get(record_id, ("",))[0] == worker:
                del self.held[record_id]


def _node_alive(node: str) -> bool:
    """Whether the Ray node `node` is alive ("" unknown: taken as alive). A node whose raylet is gone is
    marked dead before its actors' calls are retried elsewhere."""
    if not node:
        return True
    return any(found["NodeID"] == node and found["Alive"] for found in ray.nodes())


@contextlib.contextmanager
def in_flight_registry():
    """The run's registry while the run lives: yields the name its actors find it by."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"bild-in-flight-{uuid.uuid4().hex[:12]}"
    # On the driver's node: a lost worker node would take the registry with it and fail every actor's next
    # call, where the job should lose nothing (the driver's node lost ends the job anyway).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    registry = InFlightRecords.options(name=name, scheduling_strategy=here).remote()
    try:
        yield name
    finally:
        ray.kill(registry)


class CallGuard:
    """A decode actor's side of the registry (a no-op without one: a stage built outside a run)."""

    def __init__(self, registry_name: str | None, worker: str):
        self.registry = ray.get_actor(registry_name) if registry_name else None
        self.worker = worker
        self.node = ray.get_runtime_context().get_node_id() if self.registry is not None else ""

    def begin(self, ids: list[str]) -> tuple[dict[str, str], bool]:
        if self.registry is None:
            return {}, False
        return ray.get(self.registry.begin.remote(self.worker, ids, self.node))

    def end(self, ids: list[str]) -> None:
        if self.registry is not None:
            ray.get(self.registry.end.remote(self.worker, ids))

    @contextlib.contextmanager
    def alone(self, record_id: str):
        """Around one record decoded by itself in a retried call."""
        if self.registry is not None:
            ray.get(self.registry.mark.remote(self.worker, record_id, True, self.node))
        yield
        if self.registry is not None:
            ray.get(self.registry.mark.remote(self.worker, record_id, False, self.node))


def crash_error(dead_worker: str) -> str:
    return (f"decoding this record alone killed its actor {KILLS_TO_BLAME} times (last {dead_worker}: a crash in "
            "the engine such as a segfault or out of memory); it was not decoded again")


def kill_if_chosen(ids) -> None:
    """The testing hook (FAULT_VARIABLE): die as a crashing engine would."""
    chosen = os.environ.get(FAULT_VARIABLE)
    if chosen and chosen in ids:
        os.kill(os.getpid(), signal.SIGKILL)
