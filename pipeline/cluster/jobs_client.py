"""Submitting, following and stopping jobs through Ray's JobSubmissionClient.

Every failure to reach the cluster, authenticate, or find the job becomes a ClusterError whose message
says which; the token is sent only in the request header. ``submit_retrying`` retries the answers Ray gives
while a head is still starting.
"""

from __future__ import annotations

import re
import secrets
import string
import time
from typing import Callable, Iterator

from pipeline.cluster.auth import Token
from pipeline.cluster.entrypoint import entrypoint_for
from pipeline.cluster.package import Package, runtime_env_for

DEFAULT_ADDRESS = "http://127.0.0.1:8265"


class ClusterError(Exception):
    """The cluster is unreachable, refused the credentials, or does not know the job. ``transient``: Ray's
    answer says to try again (see is_transient)."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


# Ray's "No available agent to submit job, please try again later" (HTTP 500 while the head's job agent
# starts), a gateway in front of the head not ready (502/503/504), a port not listening yet or a
# connection dropped. Not: a refused token (401/403), an unknown host, an invalid job.
_TRANSIENT_TEXT = re.compile(
    r"try again later|no available agent|status code (?:502|503|504)\b|\b(?:502|503|504) Server Error"
    r"|connection refused|connection reset|connection aborted|RemoteDisconnected", re.IGNORECASE)


def is_transient(error: BaseException) -> bool:
    """Whether the error (or one it was raised from) is an answer Ray gives while the head is starting."""
    return any(isinstance(link, (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError))
               or _TRANSIENT_TEXT.search(str(link)) for link in _chain(error))


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error and those it was raised from or while handling (Ray hides the socket error there)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def backoff_waits(first_s: float = 1.0, most_s: float = 10.0) -> Iterator[float]:
    """Seconds to wait before each retry: 1, 2, 4, 8, 10, 10, ..."""
    wait = first_s
    while True:
        yield wait
        wait = min(wait * 2, most_s)


def new_submission_id() -> str:
    """An id like the ones Ray makes up, chosen here so that every attempt of one submit names one job."""
    characters = sorted(set(string.ascii_letters + string.digits) - set("IloO0"))
    return "raysubmit_" + "".join(secrets.choice(characters) for _ in range(16))


def submit_retrying(connect_: Callable[[], JobsClient], submit: Callable[[JobsClient], str], submission_id: str,
                    retry_for_s: float, note: Callable[[str], None],
                    sleep: Callable[[float], None] | None = None,
                    clock: Callable[[], float] | None = None) -> tuple[JobsClient, str]:
    """Connect and submit; while Ray answers that it is not ready, say so to ``note``, wait and try again,
    for up to ``retry_for_s`` seconds in all (0: once). Any other error, or the last one, is raised.

    Every attempt submits under ``submission_id``, so an attempt whose request reached the server cannot
    start the job twice: a retry that hears the id already exists means the job was submitted."""
    sleep, clock = sleep or time.sleep, clock or time.monotonic
    deadline = clock() + retry_for_s
    waits = backoff_waits()
    sent = False  # a submit request went out: the job may exist
    while True:
        client = None
        try:
            client = connect_()
            return client, submit(client)
        except ClusterError as exc:
            if sent and f"submission_id {submission_id} already exists" in str(exc):
                return client, submission_id
            sent = sent or client is not None
            left = deadline - clock()
            if not exc.transient or left <= 0:
                raise
            wait = min(next(waits), left)
            why = str(exc).strip().splitlines()[-1]  # a traceback's last line is its error
            note(f"Ray's job server is not ready ({why}); retrying in {wait:.1f} s ({left - wait:.0f} s left)")
            sleep(wait)


def connect(address: str, token: Token | None) -> JobsClient:
    """A client of the job server at ``address`` that authenticates with the token (if any).
    ImportError when Ray's job client is not installed."""
    import logging

    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    # Ray's client logs "WebSocket closed ..." at INFO after every followed job: noise here.
    logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)
    headers = token.header() if token else {}
    address = _normalise_address(address)
    try:
        return JobsClient(JobSubmissionClient(address, headers=headers))
    except AuthenticationError as exc:
        where = f"used the token from {token.source}" if token else (
            "no token found: give --auth-token-file, or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH, "
            "or put it in ~/.ray/auth_token"
        )
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"the cluster at {address} refused the request ({first}); {where}") from None
    except ConnectionError as exc:  # Ray's message hides why; the socket's error says it
        why = list(_chain(exc))[-1]
        raise ClusterError(f"cannot reach the Ray job server at {address}: {why}", is_transient(exc)) from None
    except Exception as exc:  # requests errors, bad addresses, version checks
        raise ClusterError(f"cannot use the Ray job server at {address}: {exc}", is_transient(exc)) from None


def _normalise_address(address: str) -> str:
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


class JobsClient:
    """The job server's calls, each failure a ClusterError naming the job."""

    def __init__(self, client) -> None:
        self._client = client  # a ray.job_submission.JobSubmissionClient

    def submit(self, job_file: str, package: Package, overrides, env_vars: dict[str, str], submission_id: str | None,
               metadata: dict[str, str], entrypoint_num_cpus: float | None) -> str:
        """Run the package's copy of ``job_file`` on the cluster; return the job id."""
        try:
            return self._client.submit_job(
                entrypoint=entrypoint_for(package.job_file, overrides),
                runtime_env=runtime_env_for(package, env_vars),
                submission_id=submission_id,
                metadata=metadata,
                entrypoint_num_cpus=entrypoint_num_cpus,
            )
        except Exception as exc:
            raise ClusterError(f"submitting {job_file} failed: {exc}", is_transient(exc)) from None

    def list_jobs(self) -> list:
        try:
            return self._client.list_jobs()
        except Exception as exc:
            raise ClusterError(f"listing jobs failed: {exc}") from None

    def status(self, job_id: str):
        return _call("status of job", job_id, self._client.get_job_status, job_id)

    def info(self, job_id: str):
        return _call("status of job", job_id, self._client.get_job_info, job_id)

    def logs(self, job_id: str) -> str:
        return _call("logs of job", job_id, self._client.get_job_logs, job_id)

    def stop(self, job_id: str) -> bool:
        """Ask the job to stop; False when it was not running."""
        return _call("stopping job", job_id, self._client.stop_job, job_id)

    def follow(self, job_id: str, write: Callable[[str], None], note: Callable[[str], None],
               poll_s: float = 1.0):
        """Pass the job's logs to ``write`` as they come until it ends; return its final JobStatus.
        When the log stream breaks, ``note`` hears about it and the logs are polled instead."""
        import asyncio

        printed = 0
        streamed = True

        async def tail() -> None:
            nonlocal printed
            async for chunk in self._client.tail_job_logs(job_id):
                write(chunk)
                printed += len(chunk)

        try:
            asyncio.run(tail())
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            note(f"(log stream interrupted: {type(exc).__name__}; polling instead)")
            streamed = False

        while True:
            status = self.status(job_id)
            if not streamed:
                logs = self.logs(job_id)
                write(logs[printed:])
                printed = len(logs)
            if status.is_terminal():
                return status
            time.sleep(poll_s)


def _call(what: str, job_id: str, call, *args):
    """Run a client call; a missing job or an HTTP failure becomes a ClusterError naming the job."""
    try:
        return call(*args)
    except RuntimeError as exc:
        text = str(exc)
        if "404" in text or "does not exist" in text:
            raise ClusterError(f"no job {job_id!r} on this cluster") from None
        raise ClusterError(f"{what} {job_id!r} failed: {text}") from None
    except Exception as exc:
        raise ClusterError(f"{what} {job_id!r} failed: {exc}") from None
