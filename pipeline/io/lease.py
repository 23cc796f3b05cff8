"""One writer per output: a lease file in the output folder, created atomically and renewed while the run lives.

Two runs resuming one output (a nightly job overlapping the last one, two people) would each take the
other's half-written files for torn ones and delete them, and both would write rows for the same ids.
So a run first creates OUTPUT/run.lease with an exclusive create (O_EXCL on a local disk; a conditional
PUT, If-None-Match, on S3) and holds it: a thread rewrites it every ttl/4 seconds. A second run finds it
and stops (OutputLeaseError names the holder). A lease not renewed for ttl seconds, or held by a process
on this host that no longer exists, belonged to a run that died: it is taken over, with a warning.
"""

from __future__ import annotations

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


class OutputLeaseError(RuntimeError):
    """Another live run holds the output's lease."""


class OutputStoreError(OSError):
    """The output's store does not answer or refuses (down, bad credentials): nothing was started."""


def lease_ttl() -> float:
    return float(os.environ.get(TTL_VARIABLE, DEFAULT_TTL_SECONDS))


class OutputLease:
    """A context manager: holds OUTPUT/run.lease from entry to exit (or raises OutputLeaseError)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, output_path: str, ttl: float | None = None,
                 url: str | None = None):
        self.fs, self.path = fs, posixpath.join(output_path, LEASE)
        self.output_path = output_path
        self.url = url or output_path  # as the job names it (s3://...), for messages
        self.ttl = ttl if ttl is not None else lease_ttl()
        self.holder = {"run_id": uuid.uuid4().hex[:12], "host": platform.node(), "pid": os.getpid()}
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> "OutputLease":
        try:
            self.fs.makedirs(self.output_path, exist_ok=True)
            if not self._create():
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
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._still_mine():
            self.fs.rm(self.path)

    def _content(self) -> bytes:
        return json.dumps({**self.holder, "renewed_at": time.time()}).encode()

    def _create(self) -> bool:
        """Create the lease file if there is none; False when one exists (it is then someone's)."""
        try:
            with self.fs.open(self.path, "xb") as handle:
                handle.write(self._content())
            return True
        except FileExistsError:
            return False

    def _read(self) -> dict | None:
        try:
            with self.fs.open(self.path, "rb") as handle:
                return json.loads(handle.read())
        except FileNotFoundError:
            return None
        except ValueError:  # cut off mid-write by a crash: nobody's
            return {}

    def _take_over_or_refuse(self) -> None:
        other = self._read()
        if other is None and self._create():  # released between our create and our read
            return
        other = other or {}
        age = time.time() - float(other.get("renewed_at", 0.0))
        dead = other.get("host") == platform.node() and not _process_exists(other.get("pid"))
        if age <= self.ttl and not dead:
            raise OutputLeaseError(
                f"output.path {self.url!r} is being written by another run (run {other.get('run_id')} on "
                f"host {other.get('host')}, pid {other.get('pid')}, lease renewed {age:.0f} s ago): one writer per "
                f"output. Wait for it to finish, or write to another output.path. A lease not renewed for "
                f"{self.ttl:.0f} s ({TTL_VARIABLE}) is taken over.")
        why = "its process is gone" if dead else f"not renewed for {age:.0f} s"
        log.warning("taking over the lease of %s from run %s on %s (%s): that run died", self.url,
                    other.get("run_id"), other.get("host"), why)
        self._write()

    def _write(self) -> None:
        with self.fs.open(self.path, "wb") as handle:
            handle.write(self._content())

    def _still_mine(self) -> bool:
        return (self._read() or {}).get("run_id") == self.holder["run_id"]

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if not self._still_mine():
                    log.error("the lease of %s was taken by another run; this run keeps writing, but its output "
                              "may hold rows of both", self.url)
                    return
                self._write()
            except OSError as exc:  # a store that does not answer for a moment: try again next time
                log.warning("could not renew the lease of %s: %s", self.url, exc)


def _process_exists(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
