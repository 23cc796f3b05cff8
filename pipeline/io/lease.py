"""One writer per output: a lease file in the output folder, created atomically and renewed while the run lives.

Two runs resuming one output (a nightly job overlapping the last one, two people) would each take the
other's half-written files for torn ones and delete them, and both would write rows for the same ids.
So a run first creates OUTPUT/run.lease with an exclusive create (O_EXCL on a local disk; a conditional
PUT, If-None-Match, on S3) and holds it: a thread rewrites it every ttl/4 seconds. A second run finds it
and stops (OutputLeaseError names the holder). A lease not renewed for ttl seconds, or held by a process
on this host that no longer exists, belonged to a run that died: it is taken over, with a warning.

A takeover is exclusive too: the taker first creates a claim named after the stale lease's exact bytes
(run.lease.taken-HASH), so of two runs racing for one stale lease exactly one wins. The renewal thread
survives any error of the store and keeps trying; if it finds the lease another run's (this run was cut off
from the store for longer than ttl, and was taken for dead), it stops this run (OutputLeaseLost) before it
writes another file beside the new holder: it interrupts the driver's main thread, and where the run has not
stopped within a renewal period (an interrupt swallowed on its way through Ray), ends the process (exit 3).
"""

from __future__ import annotations

import _thread
import contextlib
import hashlib
import json
import logging
import os
import platform
import posixpath
import threading
import time
import uuid

import fsspec

log = logging.getLogger(__name__)

LEASE = "run.lease"
TTL_VARIABLE = "BILD_LEASE_TTL_SECONDS"
DEFAULT_TTL_SECONDS = 120.0
FENCE_SECONDS = 5.0  # at most this long (or ttl/4) between a lost lease's interrupt and the process's end
EXIT_LEASE_LOST = 3


class OutputLeaseError(RuntimeError):
    """Another live run holds the output's lease."""


class OutputLeaseLost(RuntimeError):
    """This run's lease was taken over by another run while it wrote: it stopped writing."""


class OutputStoreError(OSError):
    """The output's store does not answer or refuses (down, bad credentials): nothing was started."""


def lease_ttl() -> float:
    return float(os.environ.get(TTL_VARIABLE, DEFAULT_TTL_SECONDS))


def _describe_holder(holder: dict) -> str:
    return f"run {holder.get('run_id')} on host {holder.get('host')}, pid {holder.get('pid')}"


class OutputLease:
    """A context manager: holds OUTPUT/run.lease from entry to exit (or raises OutputLeaseError).

    `on_lost` is called (from the renewal thread) when the lease turns out to be another run's; by default
    it stops the run (`_stop_the_run`), which run_job turns into OutputLeaseLost (see `lost`)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, output_path: str, ttl: float | None = None,
                 url: str | None = None, on_lost=None):
        self.fs, self.path = fs, posixpath.join(output_path, LEASE)
        self.output_path = output_path
        self.url = url or output_path  # as the job names it (s3://...), for messages
        self.ttl = ttl if ttl is not None else lease_ttl()
        self.holder = {"run_id": uuid.uuid4().hex[:12], "host": platform.node(), "pid": os.getpid()}
        self.lost: dict | None = None  # the run that took the lease over, once this run has seen it
        self._on_lost = on_lost or self._stop_the_run
        self._claim: str | None = None
        self._stop = threading.Event()
        self._ended = threading.Event()  # the run left the lease's block: the fence stands down
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> "OutputLease":
        try:
            self.fs.makedirs(self.output_path, exist_ok=True)
            if not self._create(self.path):
                self._take_over_or_refuse()
        except OutputLeaseError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store's own errors (botocore's are not OSErrors)
            raise OutputStoreError(f"cannot write to output.path {self.url!r} "
                                   f"({type(exc).__name__}: {' '.join(str(exc).split())})") from exc
        self._renewer = threading.Thread(target=self._renew_until_stopped, name="output-lease", daemon=True)
        self._renewer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._ended.set()
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.lost is None and self._still_mine():
            self.fs.rm(self.path)
        if self._claim is not None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self._claim)

    def lost_error(self) -> OutputLeaseLost:
        return OutputLeaseLost(
            f"output.path {self.url!r} was taken over by another run ({_describe_holder(self.lost or {})}) while this "
            f"run wrote: this run could not renew its lease for {self.ttl:.0f} s ({TTL_VARIABLE}) and was taken for "
            f"dead. It stopped writing; the other run holds the output now.")

    def check_held(self) -> None:
        """Raise lost_error() unless the lease is still this run's: read before a run's last writes (its manifest),
        for a run that finished its rows between two renewals after another run took the output over."""
        holder = self._read() or {}
        if self.lost is None and holder.get("run_id") != self.holder["run_id"]:
            self.lost = holder
        if self.lost is not None:
            raise self.lost_error()

    def _stop_the_run(self) -> None:
        """Interrupt the driver's main thread; if the run has not left the lease's block a renewal period later
        (at most FENCE_SECONDS), end the process with EXIT_LEASE_LOST: it must not write beside the new holder."""
        _thread.interrupt_main()
        if not self._ended.wait(min(FENCE_SECONDS, self.ttl / 4)):
            log.error("%s; the run did not stop on its own: ending the process", self.lost_error())
            os._exit(EXIT_LEASE_LOST)

    def _content(self) -> bytes:
        return json.dumps({**self.holder, "renewed_at": time.time()}).encode()

    def _create(self, path: str) -> bool:
        """Create `path` holding this run's lease if there is none; False when one exists (it is then someone's)."""
        try:
            with self.fs.open(path, "xb") as handle:
                handle.write(self._content())
            return True
        except FileExistsError:
            return False

    def _read_bytes(self) -> bytes | None:
        try:
            with self.fs.open(self.path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def _read(self) -> dict | None:
        raw = self._read_bytes()
        return None if raw is None else _parse(raw)

    def _take_over_or_refuse(self) -> None:
        raw = self._read_bytes()
        if raw is None and self._create(self.path):  # released between our create and our read
            return
        other = _parse(raw or b"")
        age = time.time() - float(other.get("renewed_at", 0.0))
        dead = other.get("host") == platform.node() and not _process_exists(other.get("pid"))
        if age <= self.ttl and not dead:
            raise OutputLeaseError(
                f"output.path {self.url!r} is being written by another run ({_describe_holder(other)}, lease "
                f"renewed {age:.0f} s ago): one writer per output. Wait for it to finish, or write to another "
                f"output.path. A lease not renewed for {self.ttl:.0f} s ({TTL_VARIABLE}) is taken over.")
        # The claim is named after the stale lease's bytes: every run that read them races for one name.
        claim = f"{self.path}.taken-{hashlib.sha256(raw or b'').hexdigest()[:16]}"
        if not self._create(claim) or self._read_bytes() != raw:
            raise OutputLeaseError(
                f"output.path {self.url!r}: another run took over the stale lease of {_describe_holder(other)} "
                f"first: one writer per output.")
        self._claim = claim
        why = "its process is gone" if dead else f"not renewed for {age:.0f} s"
        log.warning("taking over the lease of %s from %s (%s): that run died", self.url, _describe_holder(other), why)
        self._write()

    def _write(self) -> None:
        with self.fs.open(self.path, "wb") as handle:
            handle.write(self._content())

    def _still_mine(self) -> bool:
        return (self._read() or {}).get("run_id") == self.holder["run_id"]

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                holder = self._read() or {}
                if holder.get("run_id") != self.holder["run_id"]:
                    self.lost = holder
                    log.error("the lease of %s was taken over by %s: this run stops writing", self.url,
                              _describe_holder(holder))
                    self._on_lost()
                    return
                self._write()
            except Exception as exc:  # noqa: BLE001 - any store error (botocore's are not OSErrors): try again
                log.warning("could not renew the lease of %s (%s: %s); trying again in %.0f s", self.url,
                            type(exc).__name__, " ".join(str(exc).split()), self.ttl / 4)


def _parse(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except ValueError:  # cut off mid-write by a crash: nobody's
        return {}


def _process_exists(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
