"""Cluster commands: ``submit``, ``status``, ``logs``, ``stop``, through the Ray Jobs API (pipeline/cluster).

``submit`` validates the job file here, stages a small working directory and asks the cluster's job server
to run ``python -m pipeline.cli run _bild_job/<file> [--set ...]`` in it. The cluster's auth token is
found as Ray finds it (pipeline/cluster/auth.py) and never printed.

Exit codes: 0 success (for ``--wait``/``--follow``: the job SUCCEEDED); 1 the job FAILED or was STOPPED;
2 bad usage or an invalid job file; 3 the cluster could not be reached, refused the credentials, or does
not know the job id.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import click

from pipeline.cli.options import options, renamed
from pipeline.cluster.auth import TokenFileError, resolve_token
from pipeline.cluster.entrypoint import redact_entrypoint
from pipeline.cluster.jobs_client import (DEFAULT_ADDRESS, ClusterError, JobsClient, connect, new_submission_id,
                                          submit_retrying)
from pipeline.cluster.package import PackageError, relative_path_warnings, stage_package

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_CLUSTER = 0, 1, 2, 3


class ClusterFailure(click.ClickException):
    """A ClusterError as the command line reports it."""

    exit_code = EXIT_CLUSTER


def _exit_codes(command):
    """Report the cluster layer's errors as click does: bad local input exits 2, the cluster's refusal 3."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (TokenFileError, PackageError) as exc:
            raise click.UsageError(str(exc)) from None
        except ClusterError as exc:
            raise ClusterFailure(str(exc)) from None
    return run


cluster_options = options(
    renamed("--dashboard", "--address", dest="address", envvar="RAY_ADDRESS", default=DEFAULT_ADDRESS,
            show_default=True, help="The Ray dashboard / job server, e.g. http://HEAD:8265 (env RAY_ADDRESS)."),
    click.option("--auth-token-file", type=click.Path(dir_okay=False), default=None,
                 help="File holding the cluster's auth token. Default: RAY_AUTH_TOKEN, "
                      "RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token. The token is never printed."),
)


def _connect(address: str, auth_token_file: str | None) -> JobsClient:
    try:
        return connect(address, resolve_token(auth_token_file))
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise click.ClickException(f"the Ray Jobs client is not installed ({exc}); pip install 'ray[default]'")


@click.command("submit")
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job key (repeatable).")
@cluster_options
@click.option("--wait", is_flag=True, help="Follow the logs and exit with the job's status (0 SUCCEEDED, 1 otherwise).")
@click.option("--submission-id", default=None, help="Job id to use (default: a new raysubmit_... id).")
@click.option("--env", "env", multiple=True, metavar="KEY[=VALUE]",
              help="Environment variable for the job (repeatable); KEY alone passes this shell's value on.")
@click.option("--working-dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Directory to upload (default: this project's checkout). pipeline/ is added if missing.")
@click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
              help="Leave files out of the upload (gitignore syntax, repeatable).")
@click.option("--entrypoint-num-cpus", type=float, default=None, help="CPUs reserved for the job's driver.")
@click.option("--retry-for", type=click.FloatRange(min=0), default=60.0, show_default=True, metavar="SECONDS",
              help="Keep retrying while Ray's job server is not ready (a head still starting) for up to this "
                   "long; 0: no retry.")
@_exit_codes
def submit(job_file, overrides, address, auth_token_file, wait, submission_id, env, working_dir, excludes,
           entrypoint_num_cpus, retry_for):
    """Submit JOB_FILE to a Ray cluster through the Ray Jobs API and print its job id."""
    from pipeline.jobs import JobFileError, load_job

    try:
        job = load_job(job_file, overrides)
    except JobFileError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_USAGE)
    for warning in relative_path_warnings(job):
        click.echo(warning, err=True)
    env_vars = parse_env(env)

    submission_id = submission_id or new_submission_id()  # one id for every attempt: never two jobs
    with tempfile.TemporaryDirectory(prefix="bild-submit-") as staging:
        package = stage_package(job_file, Path(staging) / "wd", working_dir, excludes)
        click.echo(f"uploading {package.size_bytes / 1024:.0f} KiB from {package.source}", err=True)
        client, job_id = submit_retrying(
            lambda: _connect(address, auth_token_file),
            lambda client: client.submit(job_file, package, overrides, env_vars, submission_id,
                                         metadata={"bild_job": job.name, "config_hash": job.config_hash()},
                                         entrypoint_num_cpus=entrypoint_num_cpus),
            submission_id, retry_for, _note)
    click.echo(f"submitted: {job_id}")
    if not wait:
        click.echo(f"follow it with: bild-pipeline logs --follow {job_id}", err=True)
        return
    follow_and_exit(client, job_id)


def parse_env(assignments: tuple[str, ...] | list[str], environ: dict | None = None) -> dict[str, str]:
    """``--env KEY=VALUE`` sets a value; ``--env KEY`` passes this shell's value of KEY through."""
    environ = os.environ if environ is None else environ
    env: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise click.UsageError(f"--env {key!r}: expected KEY=VALUE or KEY with a valid variable name")
        if not sep:
            if key not in environ:
                raise click.UsageError(f"--env {key}: not set in this shell (give KEY=VALUE)")
            value = environ[key]
        env[key] = value
    return env


@click.command("status")
@click.argument("job_id", required=False)
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_exit_codes
def status(job_id, address, auth_token_file, as_json):
    """Show a job's status (without JOB_ID: list the cluster's jobs)."""
    client = _connect(address, auth_token_file)
    if job_id is None:
        jobs = sorted(client.list_jobs(), key=lambda j: j.start_time or 0)
        for info in jobs:
            record = _job_record(info)
            if as_json:
                click.echo(json.dumps(record))
            else:
                click.echo(f"{record['submission_id'] or record['job_id']}\t{record['status']}\t"
                           f"{record['job'] or '-'}\t{record['start_time'] or '-'}")
        return
    record = _job_record(client.info(job_id))
    if as_json:
        click.echo(json.dumps(record))
        return
    click.echo(f"status: {record['status']}")
    for key in ("submission_id", "job", "message", "start_time", "end_time", "entrypoint"):
        if record.get(key):
            value = record[key].splitlines()[0] if key == "message" else record[key]  # logs follow in a message
            click.echo(f"{key}: {value}")


def _job_record(info) -> dict:
    metadata = info.metadata or {}
    return {
        "submission_id": info.submission_id,
        "job_id": info.job_id,
        "status": str(info.status),
        "job": metadata.get("bild_job"),
        "message": info.message,
        "start_time": _time(info.start_time),
        "end_time": _time(info.end_time),
        "entrypoint": redact_entrypoint(info.entrypoint or ""),
    }


def _time(ms: int | None) -> str | None:
    if not ms:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ms / 1000))


@click.command("logs")
@click.argument("job_id")
@cluster_options
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends; exit with its status.")
@_exit_codes
def logs(job_id, address, auth_token_file, follow):
    """Print a job's logs."""
    client = _connect(address, auth_token_file)
    if follow:
        client.status(job_id)  # an unknown id exits 3 before following
        follow_and_exit(client, job_id)
    _write(client.logs(job_id))


@click.command("stop")
@click.argument("job_id")
@cluster_options
@click.option("--wait", is_flag=True, help="Wait until the job has ended.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait with --wait.")
@_exit_codes
def stop(job_id, address, auth_token_file, wait, timeout):
    """Stop a running job."""
    client = _connect(address, auth_token_file)
    if not client.stop(job_id):
        click.echo(f"not running: {job_id} ({client.status(job_id)})")
        return
    click.echo(f"stop requested: {job_id}")
    if wait:
        deadline = time.monotonic() + timeout
        while True:
            current = client.status(job_id)
            if current.is_terminal():
                click.echo(f"status: {current}")
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"job {job_id} still {current} after {timeout:.0f} s")
            time.sleep(0.5)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _note(text: str) -> None:
    click.echo(text, err=True)


def follow_and_exit(client: JobsClient, job_id: str, poll_s: float = 1.0) -> None:
    """Print the job's logs until it ends, then exit with its status (Ctrl-C leaves it running)."""
    try:
        status = client.follow(job_id, _write, _note, poll_s)
    except KeyboardInterrupt:
        click.echo(f"\nstopped following; job {job_id} keeps running "
                   f"(bild-pipeline stop {job_id} ends it)", err=True)
        sys.exit(130)
    _exit_with_status(client, job_id, status)


def _exit_with_status(client: JobsClient, job_id: str, status) -> None:
    """Print the job's final status (and its message's first line if it failed); exit 0 or 1."""
    info = client.info(job_id)
    click.echo(f"status: {status}")
    if str(status) != "SUCCEEDED" and info.message:
        # Ray appends the last logs to a failed job's message; they were just printed.
        click.echo(f"message: {info.message.splitlines()[0]}", err=True)
    sys.exit(EXIT_OK if str(status) == "SUCCEEDED" else EXIT_JOB_FAILED)

