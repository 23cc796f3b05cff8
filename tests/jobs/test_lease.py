"""One writer per output, without Ray: a lease refused while held, renewed through any store error, taken
over from a dead run by exactly one of the runs racing for it, and let go by a run that finds it taken."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from pipeline.io.lease import LEASE, OutputLease, OutputLeaseError
from pipeline.io.storage import open_filesystem


def _wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.02)
    return condition()


def _s3(s3_server):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server, skip_instance_cache=True, use_listings_cache=False)
    bucket = f"lease-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    return fs, f"{bucket}/out"


def test_a_second_lease_is_refused_naming_the_holder_and_released_at_the_end(tmp_path):
    fs, path = open_filesystem(str(tmp_path / "out"))
    with OutputLease(fs, path) as first:
        with pytest.raises(OutputLeaseError, match=f"pid {os.getpid()}.*one writer per output"):
            OutputLease(fs, path).__enter__()
        assert json.loads((tmp_path / "out" / LEASE).read_text())["run_id"] == first.holder["run_id"]
    assert not (tmp_path / "out" / LEASE).exists()


def test_the_lease_is_an_exclusive_create_on_s3_too(s3_server):
    """On S3 the create is a conditional PUT (If-None-Match): of two runs, exactly one holds the lease."""
    fs, path = _s3(s3_server)
    with OutputLease(fs, path, url=f"s3://{path}") as first:
        with pytest.raises(OutputLeaseError, match=f"s3://{path}.*run {first.holder['run_id']}"):
            OutputLease(fs, path, url=f"s3://{path}").__enter__()
    assert not fs.exists(f"{path}/{LEASE}")


def test_a_held_lease_is_renewed(tmp_path):
    fs, path = open_filesystem(str(tmp_path / "out"))
    with OutputLease(fs, path, ttl=0.4):
        written = json.loads((tmp_path / "out" / LEASE).read_text())["renewed_at"]
        time.sleep(0.5)
        assert json.loads((tmp_path / "out" / LEASE).read_text())["renewed_at"] > written


class EndpointConnectionError(Exception):
    """What botocore raises for a dropped connection, through s3fs: not an OSError."""


class FlakyStore:
    """A filesystem whose opens fail while `down` is set, with an error that is not an OSError."""

    def __init__(self, fs):
        self.fs, self.down = fs, False

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def open(self, *args, **kwargs):
        if self.down:
            raise EndpointConnectionError('Could not connect to the endpoint URL: "http://s3"')
        return self.fs.open(*args, **kwargs)


def test_renewal_survives_any_store_error_and_keeps_trying(tmp_path, caplog):
    fs, path = open_filesystem(str(tmp_path / "out"))
    store = FlakyStore(fs)
    renewed = lambda: json.loads((tmp_path / "out" / LEASE).read_text())["renewed_at"]  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="pipeline.io.lease"):
        with OutputLease(store, path, ttl=0.2, on_lost=lambda: None) as lease:
            store.down = True
            assert _wait_for(lambda: "EndpointConnectionError" in caplog.text)
            before = renewed()
            time.sleep(0.3)  # several failed renewals
            store.down = False
            assert _wait_for(lambda: renewed() > before), "the lease is no longer renewed after a store error"
            assert lease.lost is None
    assert "could not renew the lease" in caplog.text


def test_a_run_that_finds_its_lease_taken_stops_and_leaves_the_new_holders_lease(tmp_path):
    fs, path = open_filesystem(str(tmp_path / "out"))
    stopped = threading.Event()
    other = {"run_id": "newer", "host": "elsewhere", "pid": 7, "renewed_at": time.time()}
    with OutputLease(fs, path, ttl=0.2, on_lost=stopped.set) as lease:
        (tmp_path / "out" / LEASE).write_text(json.dumps(other))
        assert stopped.wait(5), "the run was not told that its lease was taken"
        assert lease.lost["run_id"] == "newer"
        assert "run newer on host elsewhere" in str(lease.lost_error())
    assert json.loads((tmp_path / "out" / LEASE).read_text()) == other  # not removed, not rewritten


@pytest.mark.parametrize("stops", [True, False])
def test_by_default_a_lost_lease_interrupts_the_run_and_ends_it_if_it_goes_on(tmp_path, monkeypatch, stops):
    """The interrupt goes to the main thread (run_job makes it OutputLeaseLost, exit 3); a run still inside the
    lease's block a renewal period later (the interrupt swallowed somewhere) has its process ended with 3."""
    from pipeline.io import lease as lease_module

    interrupted, ended = threading.Event(), []
    monkeypatch.setattr(lease_module._thread, "interrupt_main", interrupted.set)
    monkeypatch.setattr(lease_module.os, "_exit", ended.append)
    fs, path = open_filesystem(str(tmp_path / "out"))
    with OutputLease(fs, path, ttl=2) as lease:  # renewed, and fenced, every 0.5 s
        (tmp_path / "out" / LEASE).write_text(json.dumps({"run_id": "newer", "renewed_at": time.time()}))
        assert interrupted.wait(5), "the main thread was not interrupted"
        if not stops:
            assert _wait_for(lambda: ended, seconds=5)
    assert lease.lost["run_id"] == "newer"
    assert ended == ([] if stops else [lease_module.EXIT_LEASE_LOST])


def test_the_lease_of_a_dead_run_is_taken_over_with_a_warning(tmp_path, caplog):
    fs, path = open_filesystem(str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holders = [{"run_id": "stale", "host": "elsewhere", "pid": 1, "renewed_at": time.time() - 1000},
               {"run_id": "dead", "host": os.uname().nodename, "pid": int(gone.stdout), "renewed_at": time.time()}]
    for holder in holders:
        (tmp_path / "out" / LEASE).write_text(json.dumps(holder))
        with caplog.at_level(logging.WARNING, logger="pipeline.io.lease"):
            with OutputLease(fs, path, ttl=60) as lease:
                assert json.loads((tmp_path / "out" / LEASE).read_text())["run_id"] == lease.holder["run_id"]
        assert f"from run {holder['run_id']}" in caplog.text
        assert sorted(os.listdir(tmp_path / "out")) == []  # the lease and the takeover's claim released
    (tmp_path / "out" / LEASE).write_text(json.dumps({**holders[0], "renewed_at": time.time()}))
    with pytest.raises(OutputLeaseError, match="run stale on host elsewhere"):  # alive elsewhere: refused
        OutputLease(fs, path, ttl=60).__enter__()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_of_two_runs_racing_for_one_stale_lease_exactly_one_wins(store, tmp_path, request):
    """Both read the stale lease before either writes (a barrier holds each after its first read)."""
    if store == "s3":
        fs, path = _s3(request.getfixturevalue("s3_server"))
    else:
        fs, path = open_filesystem(str(tmp_path / "out"))
    fs.makedirs(path, exist_ok=True)
    with fs.open(f"{path}/{LEASE}", "wb") as handle:
        handle.write(json.dumps({"run_id": "stale", "host": "elsewhere", "renewed_at": time.time() - 1000}).encode())
    both_read = threading.Barrier(2, timeout=10)
    outcomes: dict[int, object] = {}

    def race(index: int) -> None:
        lease = OutputLease(fs, path, ttl=60, on_lost=lambda: None)
        first_read = lease._read_bytes

        def read_then_wait():
            lease._read_bytes = first_read  # only the first read waits
            raw = first_read()
            both_read.wait()
            return raw

        lease._read_bytes = read_then_wait
        try:
            lease.__enter__()
            outcomes[index] = lease
        except OutputLeaseError as exc:
            outcomes[index] = exc

    racers = [threading.Thread(target=race, args=(index,)) for index in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(30)
    winners = [o for o in outcomes.values() if isinstance(o, OutputLease)]
    losers = [o for o in outcomes.values() if isinstance(o, OutputLeaseError)]
    try:
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert "took over the stale lease of run stale" in str(losers[0])
        with fs.open(f"{path}/{LEASE}", "rb") as handle:
            assert json.loads(handle.read())["run_id"] == winners[0].holder["run_id"]
    finally:
        for winner in winners:
            winner.__exit__(None, None, None)


def test_a_run_checks_its_lease_before_its_last_writes(tmp_path):
    """A run that finished its rows between two renewals after another run took the output over learns it before
    writing its manifest (run.py): check_held raises, naming the other run, and leaves the other's lease alone."""
    from pipeline.io.lease import OutputLeaseLost

    fs, path = open_filesystem(str(tmp_path / "out"))
    with OutputLease(fs, path, ttl=60, on_lost=lambda: None) as lease:
        lease.check_held()  # its own: nothing happens
        other = {"run_id": "intruder", "host": "elsewhere", "pid": 7, "renewed_at": time.time()}
        (tmp_path / "out" / LEASE).write_text(json.dumps(other))
        with pytest.raises(OutputLeaseLost, match="run intruder on host elsewhere"):
            lease.check_held()
    assert json.loads((tmp_path / "out" / LEASE).read_text()) == other
