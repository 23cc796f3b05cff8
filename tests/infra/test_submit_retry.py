"""`submit` retries the answers Ray gives while a head is still starting, and nothing else.

No cluster: a fake JobSubmissionClient stands in for Ray's, and a fake clock for time, so no test waits.
"""

from __future__ import annotations

import re
import secrets
import socket

import pytest
from click.testing import CliRunner

from pipeline.cli.cluster import EXIT_CLUSTER, submit
from pipeline.cluster import jobs_client
from pipeline.cluster.jobs_client import backoff_waits, is_transient

NO_AGENT = "Request failed with status code 500: No available agent to submit job, please try again later.."
TOKEN = secrets.token_hex(32)


class FakeTime:
    """jobs_client's `time`: sleeping moves the clock on at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FakeRay:
    """Plays Ray's job server: each attempt takes the next answer from `connects` (for the client's
    constructor) and `submits` (for submit_job); an answer that is an exception is raised. A submit
    answered "ok", or "ok then 504" (the request reached the server, the reply was lost), creates the job."""

    def __init__(self, connects=(), submits=()) -> None:
        self.connects, self.submits = list(connects), list(submits)
        self.headers: list[dict] = []
        self.submission_ids: list[str] = []
        self.jobs: list[str] = []  # jobs created on the "cluster"

    def client_class(self):
        ray = self

        class Client:
            def __init__(self, address, headers=None):
                ray.headers.append(headers)
                answer = ray.connects.pop(0) if ray.connects else None
                if isinstance(answer, BaseException):
                    raise answer

            def submit_job(self, *, entrypoint, runtime_env, submission_id, metadata, entrypoint_num_cpus):
                ray.submission_ids.append(submission_id)
                answer = ray.submits.pop(0) if ray.submits else "ok"
                if isinstance(answer, BaseException):
                    raise answer
                if submission_id in ray.jobs:
                    raise RuntimeError(f"Request failed with status code 500: Traceback ...\nValueError: Job with "
                                       f"submission_id {submission_id} already exists. Please use a different "
                                       "submission_id..")
                ray.jobs.append(submission_id)
                if answer == "ok then 504":
                    raise RuntimeError("Request failed with status code 504: Gateway Timeout.")
                return submission_id

        return Client


@pytest.fixture
def fake_time(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(jobs_client, "time", clock)
    return clock


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A valid job file, a tiny working directory, and a token in the environment."""
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    path = tmp_path / "job.yaml"
    path.write_text("name: retry-test\ninput: {path: /data/in.parquet}\n"
                    "models: {small: /m/small, large: /m/large, device: cpu}\n"
                    "output: {path: /data/out, mode: overwrite}\n", encoding="utf-8")
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "README.md").write_text("hello")
    return path


def _submit(monkeypatch, ray: FakeRay, job, *args: str):
    pytest.importorskip("ray.job_submission")
    monkeypatch.setattr("ray.job_submission.JobSubmissionClient", ray.client_class())
    return CliRunner().invoke(submit, [str(job), "--address", "http://127.0.0.1:8265",
                                       "--working-dir", str(job.parent / "wd"), *args])


def _refused() -> ConnectionError:
    """What Ray's client raises when nothing listens yet: its own message, the socket's error beneath."""
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError:
            raise ConnectionError("Failed to connect to Ray at address: http://127.0.0.1:8265.")
    except ConnectionError as exc:
        return exc


# --------------------------------------------------------------------------------------------


def test_transient_answers_are_told_from_permanent_ones():
    unknown_host = ConnectionError("Failed to connect to Ray at address: http://nohost:8265.")
    unknown_host.__context__ = socket.gaierror(-2, "Name or service not known")
    assert is_transient(RuntimeError(NO_AGENT))
    assert is_transient(RuntimeError("Request failed with status code 503: Service Unavailable."))
    assert is_transient(OSError("503 Server Error: Service Unavailable for url: http://h:8265/api/version"))
    assert is_transient(_refused())
    assert is_transient(ConnectionResetError(104, "Connection reset by peer"))
    assert not is_transient(unknown_host)
    assert not is_transient(RuntimeError("Authentication failed: Unauthorized\n\nToken authentication is enabled "
                                         "but the authentication token is invalid or incorrect."))
    assert not is_transient(RuntimeError("Request failed with status code 401: Unauthorized."))
    assert not is_transient(RuntimeError("Request failed with status code 400: ValueError: bad entrypoint."))
    assert not is_transient(RuntimeError("Request failed with status code 500: Traceback ... KeyError: 'x'."))


def test_backoff_doubles_up_to_a_cap():
    waits = backoff_waits()
    assert [next(waits) for _ in range(7)] == [1, 2, 4, 8, 10, 10, 10]


def test_no_agent_twice_then_submitted_once_under_one_id(monkeypatch, job, fake_time):
    ray = FakeRay(submits=[RuntimeError(NO_AGENT), RuntimeError(NO_AGENT), "ok"])
    result = _submit(monkeypatch, ray, job)
    assert result.exit_code == 0, result.output
    assert len(ray.submission_ids) == 3 and len(set(ray.submission_ids)) == 1
    assert ray.jobs == ray.submission_ids[:1] and re.fullmatch(r"raysubmit_\w{16}", ray.jobs[0])
    assert f"submitted: {ray.jobs[0]}" in result.stdout
    notes = [line for line in result.stderr.splitlines() if "retrying" in line]
    assert notes == [
        f"Ray's job server is not ready (submitting {job} failed: {NO_AGENT}); retrying in 1.0 s (59 s left)",
        f"Ray's job server is not ready (submitting {job} failed: {NO_AGENT}); retrying in 2.0 s (57 s left)",
    ]
    assert fake_time.slept == [1.0, 2.0]
    assert ray.headers[0] == {"Authorization": f"Bearer {TOKEN}"}  # sent, never shown
    assert TOKEN not in result.output


def test_connection_refused_while_the_head_starts_is_retried(monkeypatch, job, fake_time):
    ray = FakeRay(connects=[_refused(), _refused()])
    result = _submit(monkeypatch, ray, job, "--submission-id", "mine")
    assert result.exit_code == 0, result.output
    assert ray.jobs == ["mine"] and len(ray.headers) == 3
    assert result.stderr.count("Connection refused); retrying in") == 2


def test_a_retry_after_a_request_that_reached_the_server_does_not_submit_twice(monkeypatch, job, fake_time):
    ray = FakeRay(submits=["ok then 504"])
    result = _submit(monkeypatch, ray, job, "--submission-id", "mine")
    assert result.exit_code == 0, result.output
    assert ray.jobs == ["mine"] and ray.submission_ids == ["mine", "mine"]
    assert "status code 504" in result.stderr and "submitted: mine" in result.stdout


def test_an_id_that_already_exists_before_any_retry_still_fails(monkeypatch, job, fake_time):
    ray = FakeRay()
    ray.jobs.append("taken")
    result = _submit(monkeypatch, ray, job, "--submission-id", "taken")
    assert result.exit_code == EXIT_CLUSTER and "already exists" in result.stderr
    assert ray.submission_ids == ["taken"] and fake_time.slept == []


def test_a_refused_token_fails_at_once_without_showing_it(monkeypatch, job, fake_time):
    from ray.exceptions import AuthenticationError

    ray = FakeRay(connects=[AuthenticationError("Authentication failed: Unauthorized\n\nToken authentication is "
                                                "enabled but the authentication token is invalid or incorrect.")])
    result = _submit(monkeypatch, ray, job)
    assert result.exit_code == EXIT_CLUSTER
    assert "refused the request (Authentication failed: Unauthorized); used the token from RAY_AUTH_TOKEN" \
        in result.stderr
    assert len(ray.headers) == 1 and ray.submission_ids == [] and fake_time.slept == []
    assert "retrying" not in result.output and TOKEN not in result.output

    ray = FakeRay(submits=[RuntimeError("Request failed with status code 403: Forbidden.")])
    result = _submit(monkeypatch, ray, job)
    assert result.exit_code == EXIT_CLUSTER and "status code 403" in result.stderr
    assert len(ray.submission_ids) == 1 and fake_time.slept == [] and TOKEN not in result.output


def test_a_server_that_stays_unready_fails_with_its_last_answer_after_the_budget(monkeypatch, job, fake_time):
    answers = [RuntimeError(f"{NO_AGENT} (answer {n})") for n in range(10)]
    ray = FakeRay(submits=answers)
    start = fake_time.now
    result = _submit(monkeypatch, ray, job, "--retry-for", "5")
    assert result.exit_code == EXIT_CLUSTER
    assert fake_time.slept == [1.0, 2.0, 2.0] and fake_time.now - start == 5  # 1 + 2 + (4, cut to what is left)
    assert len(ray.submission_ids) == 4 and ray.jobs == []
    assert result.stderr.rstrip().endswith(f"Error: submitting {job} failed: {NO_AGENT} (answer 3)")
    assert "retrying in 2.0 s (0 s left)" in result.stderr


def test_retry_for_option(monkeypatch, job, fake_time):
    ray = FakeRay(submits=[RuntimeError(NO_AGENT)])
    result = _submit(monkeypatch, ray, job, "--retry-for", "0")
    assert result.exit_code == EXIT_CLUSTER and len(ray.submission_ids) == 1 and fake_time.slept == []
    assert "retrying" not in result.stderr

    result = CliRunner().invoke(submit, [str(job), "--retry-for", "-1"])
    assert result.exit_code == 2 and "--retry-for" in result.output
    help_text = CliRunner().invoke(submit, ["--help"]).output
    assert "--retry-for SECONDS" in help_text and "default: 60.0" in help_text
