"""A record that kills its actor fails alone.

One pathological input can crash the process decoding it (a segfault, the kernel's out-of-memory
killer). Ray Data then restarts the actor and retries its call, which crashes again, until the job
dies or hangs behind that record. So every call registers its ids with one small registry actor
(`InFlightRecords`, no CPU) and removes them when it returns. A call whose ids are still registered
to another worker is the retry of a call whose actor died: it decodes its records one at a time,
each marked "alone" while it runs. A record that was alone in flight when its actor died is the one
that killed it, twice now: it gets an `error` row naming the crash instead of a third attempt, and
the job goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid

import ray

# Testing hook: a decode actor kills its own process (SIGKILL) when it is about to decode this id.
FAULT_VARIABLE = "BILD_FAULT_KILL_ID"


@ray.remote(num_cpus=0)
class InFlightRecords:
    """{record id: (worker, alone)} for the records in calls not yet returned."""

    def __init__(self):
        self.held: dict[str, tuple[str, bool]] = {}

    def begin(self, worker: str, ids: list[str]) -> tuple[dict[str, str], bool]:
        """Register a call's ids; answer ({id: the dead worker} for ids that killed a worker while alone,
        whether this call retries one whose worker died)."""
        killers, retried = {}, False
        for record_id in ids:
            holder = self.held.get(record_id)
            if holder is not None and holder[0] != worker:
                retried = True
                if holder[1]:
                    killers[record_id] = holder[0]
            self.held[record_id] = (worker, False)
        return killers, retried

    def mark(self, worker: str, record_id: str, alone: bool) -> None:
        self.held[record_id] = (worker, alone)

    def end(self, worker: str, ids: list[str]) -> None:
        for record_id in ids:
            if self.held.get(record_id, ("",))[0] == worker:
                del self.held[record_id]


@contextlib.contextmanager
def in_flight_registry():
    """The run's registry while the run lives: yields the name its actors find it by."""
    name = f"bild-in-flight-{uuid.uuid4().hex[:12]}"
    registry = InFlightRecords.options(name=name).remote()
    try:
        yield name
    finally:
        ray.kill(registry)


class CallGuard:
    """A decode actor's side of the registry (a no-op without one: a stage built outside a run)."""

    def __init__(self, registry_name: str | None, worker: str):
        self.registry = ray.get_actor(registry_name) if registry_name else None
        self.worker = worker

    def begin(self, ids: list[str]) -> tuple[dict[str, str], bool]:
        if self.registry is None:
            return {}, False
        return ray.get(self.registry.begin.remote(self.worker, ids))

    def end(self, ids: list[str]) -> None:
        if self.registry is not None:
            ray.get(self.registry.end.remote(self.worker, ids))

    @contextlib.contextmanager
    def alone(self, record_id: str):
        """Around one record decoded by itself in a retried call."""
        if self.registry is not None:
            ray.get(self.registry.mark.remote(self.worker, record_id, True))
        yield
        if self.registry is not None:
            ray.get(self.registry.mark.remote(self.worker, record_id, False))


def crash_error(dead_worker: str) -> str:
    return (f"decoding this record killed its actor twice (last {dead_worker}, decoding it alone: a crash in the "
            "engine such as a segfault or out of memory); it was not decoded again")


def kill_if_chosen(ids) -> None:
    """The testing hook (FAULT_VARIABLE): die as a crashing engine would."""
    chosen = os.environ.get(FAULT_VARIABLE)
    if chosen and chosen in ids:
        os.kill(os.getpid(), signal.SIGKILL)
