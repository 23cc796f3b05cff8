"""Running jobs on a Ray cluster through the Ray Jobs API: ``submit``, ``status``, ``logs``, ``stop``.

``submit`` validates the job file here, stages a small working directory (this project's sources
without ``.venv``/``.git``/``runs``/caches, plus a copy of the job file under ``_bild_job/``), and asks
the cluster's job server to run ``python -m pipeline.cli run _bild_job/<file> [--set ...]`` in it.

Authentication: Ray clusters started with token authentication (the default in Ray 2.60 when a token
exists, or with ``RAY_AUTH_MODE=token``) refuse requests without ``Authorization: Bearer <token>``.
The token is looked up the way Ray's own loader does: ``--auth-token-file``, else ``RAY_AUTH_TOKEN``,
else the file named by ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token`` (none of these but the
option when ``RAY_AUTH_MODE=disabled``). It is sent only in that header and is never printed, logged
or written anywhere.

Exit codes: 0 success (for ``--wait``/``--follow``: the job SUCCEEDED); 1 the job FAILED or was
STOPPED; 2 bad usage or an invalid job file; 3 the cluster could not be reached, refused the
credentials, or does not know the job id.

Ray is imported inside the commands only, so importing ``pipeline.cli`` stays fast.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import yaml

from pipeline.jobs.load import job_data
from pipeline.jobs.schema import is_secret_key

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
JOB_DIR = "_bild_job"  # where the job file lands inside the uploaded working directory
MAX_UPLOAD_BYTES = 100 * 1024 * 1024  # keep well under Ray's package limit

# Never uploaded (gitignore syntax). The repo's .gitignore and .rayignore are honoured as well.
DEFAULT_EXCLUDES = [
    ".git/", ".venv/", "venv/", "__pycache__/", "*.pyc", "*.egg-info/", ".pytest_cache/", "build/", "dist/",
    "runs/", "/.gl/", ".ipynb_checkpoints/", "*.safetensors", "*.bin", "*.pt", "*.ckpt",
]

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_CLUSTER = 0, 1, 2, 3



class ClusterError(click.ClickException):
    """The cluster is unreachable, refused the credentials, or does not know the job."""

    exit_code = EXIT_CLUSTER


# --------------------------------------------------------------------------------------------
# Authentication


@dataclass
class Token:
    """A bearer token and where it came from. ``repr`` and ``str`` never show the value."""

    value: str = field(repr=False)
    source: str

    def __str__(self) -> str:
        return f"<token from {self.source}>"

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"}


def _read_token_file(path: Path, what: str) -> Token | None:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise click.UsageError(f"cannot read the auth token file ({what}: {path}): {exc.strerror or exc}") from None
    if not value:
        raise click.UsageError(f"the auth token file is empty ({what}: {path})")
    return Token(value, f"{what} ({path})")


def resolve_token(token_file: str | None, environ: dict | None = None, home: Path | None = None) -> Token | None:
    """Find the cluster's token in Ray's order; None when there is none (the cluster may not need one)."""
    environ = os.environ if environ is None else environ
    if token_file:
        return _read_token_file(Path(token_file).expanduser(), "--auth-token-file")
    if environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None  # as Ray's own clients: an explicit opt-out sends no token (--auth-token-file still does)
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return Token(environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        return _read_token_file(Path(environ["RAY_AUTH_TOKEN_PATH"]).expanduser(), "RAY_AUTH_TOKEN_PATH")
    default = (home if home is not None else Path.home()) / ".ray" / "auth_token"
    if default.is_file():
        return _read_token_file(default, "~/.ray/auth_token")
    return None


def _normalise_address(address: str) -> str:
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


def _connect(address: str, token_file: str | None):
    """A JobSubmissionClient that authenticates with the token (if any) in an explicit header."""
    try:
        from ray.exceptions import AuthenticationError
        from ray.job_submission import JobSubmissionClient
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise click.ClickException(f"the Ray Jobs client is not installed ({exc}); pip install 'ray[default]'")

    import logging

    # Ray's client logs "WebSocket closed ..." at INFO after every followed job: noise here.
    logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)
    token = resolve_token(token_file)
    headers = token.header() if token else {}
    address = _normalise_address(address)
    try:
        return JobSubmissionClient(address, headers=headers)
    except AuthenticationError as exc:
        where = f"used the token from {token.source}" if token else (
            "no token found: give --auth-token-file, or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH, "
            "or put it in ~/.ray/auth_token"
        )
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"the cluster at {address} refused the request ({first}); {where}") from None
    except ConnectionError as exc:
        raise ClusterError(f"cannot reach the Ray job server at {address}: {exc}") from None
    except Exception as exc:  # requests errors, bad addresses, version checks
        raise ClusterError(f"cannot use the Ray job server at {address}: {exc}") from None


def _cluster_call(what: str, job_id: str, call, *args):
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


# --------------------------------------------------------------------------------------------
# Packaging


def project_root() -> Path | None:
    """The source checkout that holds this package, or None when it is installed elsewhere."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    try:
        if 'name = "bild-pipeline"' in pyproject.read_text(encoding="utf-8"):
            return root
    except OSError:
        pass
    return None


def _path_spec(lines: list[str]):
    try:
        from ray._private.thirdparty.pathspec import PathSpec
    except ImportError:  # pragma: no cover - Ray moved its vendored copy
        from pathspec import PathSpec
    return PathSpec.from_lines("gitwildmatch", lines)


def _ignore_lines(root: Path) -> list[str]:
    lines = []
    for name in (".gitignore", ".rayignore"):
        try:
            lines += (root / name).read_text(encoding="utf-8").splitlines()
        except OSError:
            pass
    return lines


def _copy_tree(src: Path, dst: Path, spec, limit: int) -> int:
    """Copy src into dst, skipping what spec matches; return bytes copied (error over limit)."""
    total = 0
    sizes: list[tuple[int, str]] = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = Path(dirpath).relative_to(src)
        kept = []
        for name in sorted(dirnames):
            rel = (rel_dir / name).as_posix()
            if not spec.match_file(rel + "/") and not (Path(dirpath) / name).is_symlink():
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = (rel_dir / name).as_posix()
            if spec.match_file(rel):
                continue
            source = Path(dirpath) / name
            if not source.is_file():
                continue
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            size = target.stat().st_size
            total += size
            sizes.append((size, rel))
            if total > limit:
                biggest = ", ".join(f"{r} ({s / 2**20:.1f} MiB)" for s, r in sorted(sizes, reverse=True)[:5])
                raise click.UsageError(
                    f"the working directory {src} is over {limit / 2**20:.0f} MiB after excludes; "
                    f"biggest files: {biggest}. Leave them out with --exclude PATTERN (or .rayignore), "
                    "and put data and models in shared storage."
                )
    return total


@dataclass
class Package:
    """A staged working directory ready to upload, and the job file's path inside it."""

    directory: Path
    job_file: str  # relative to directory, POSIX
    size_bytes: int
    source: str  # what was staged, for the user


def stage_package(job_path: str | Path, staging: Path, working_dir: str | Path | None = None,
                  excludes: list[str] | tuple = (), limit: int = MAX_UPLOAD_BYTES) -> Package:
    """Fill ``staging`` with the working directory (default: this checkout) minus excludes, the
    ``pipeline`` package (if the directory lacks it) and a copy of the job file under ``_bild_job/``."""
    staging = Path(staging)
    staging.mkdir(parents=True, exist_ok=True)
    root = Path(working_dir).resolve() if working_dir is not None else project_root()
    size = 0
    if root is not None:
        if not root.is_dir():
            raise click.UsageError(f"--working-dir {root} is not a directory")
        # The ignore files are applied here and not copied: Ray must not re-apply them to the job file.
        spec = _path_spec(DEFAULT_EXCLUDES + _ignore_lines(root) + list(excludes)
                          + [f"/{JOB_DIR}/", "/.gitignore", "/.rayignore"])
        size += _copy_tree(root, staging, spec, limit)
        source = str(root)
    else:
        source = "the installed pipeline package"
    if not (staging / "pipeline" / "__init__.py").is_file():
        package_dir = Path(__file__).resolve().parent
        spec = _path_spec(DEFAULT_EXCLUDES + list(excludes))
        size += _copy_tree(package_dir, staging / "pipeline", spec, limit - size)
    target = staging / JOB_DIR / Path(job_path).name
    target.parent.mkdir(parents=True, exist_ok=True)
    # The job with its presets merged in, so it runs wherever configs/ is not uploaded.
    target.write_text(yaml.safe_dump(job_data(job_path), sort_keys=False, allow_unicode=True))
    size += target.stat().st_size
    return Package(staging, target.relative_to(staging).as_posix(), size, source)


def entrypoint_for(job_file: str, overrides: list[str] | tuple = ()) -> str:
    """The command the cluster runs inside the working directory."""
    parts = ["python", "-m", "pipeline.cli", "run", job_file]
    for override in overrides:
        parts += ["--set", override]
    return " ".join(shlex.quote(part) for part in parts)


def runtime_env_for(package: Package, env_vars: dict[str, str] | None = None) -> dict:
    runtime_env: dict = {"working_dir": str(package.directory), "excludes": list(DEFAULT_EXCLUDES)}
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    return runtime_env


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


def redact_entrypoint(entrypoint: str) -> str:
    """The entrypoint with the values of secret-looking ``--set`` keys hidden, for printing."""
    try:
        parts = shlex.split(entrypoint)
    except ValueError:
        return "(entrypoint not shown)"
    out = []
    for index, part in enumerate(parts):
        if index and parts[index - 1] == "--set" and "=" in part:
            key, _, _ = part.partition("=")
            if is_secret_key(key):
                part = f"{key}=***"
        out.append(part)
    return " ".join(shlex.quote(part) for part in out)


def _relative_path_warnings(job) -> list[str]:
    """Local relative paths resolve on the cluster, inside the uploaded working directory."""
    warnings = []
    for key, value in (("input.path", job.input.path), ("output.path", job.output.path),
                       ("models.small", job.models.small), ("models.large", job.models.large),
                       ("models.tokenizer", job.models.tokenizer)):
        if not value or "://" in value or Path(value).is_absolute():
            continue
        if key in ("input.path", "output.path") or Path(value).exists():
            warnings.append(
                f"warning: {key} {value!r} is a relative path; on the cluster it is resolved inside the job's "
                "temporary working directory (use an absolute path or a URL such as s3://...)"
            )
    return warnings


# --------------------------------------------------------------------------------------------
# Following a job


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def follow_logs(client, job_id: str, poll_s: float = 1.0):
    """Print the job's logs as they come until it ends; return its final JobStatus."""
    import asyncio

    printed = 0
    streamed = True

    async def tail() -> None:
        nonlocal printed
        async for chunk in client.tail_job_logs(job_id):
            _write(chunk)
            printed += len(chunk)

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # the stream broke: fall back to polling
        click.echo(f"(log stream interrupted: {type(exc).__name__}; polling instead)", err=True)
        streamed = False

    while True:
        status = _cluster_call("status of job", job_id, client.get_job_status, job_id)
        if not streamed:
            logs = _cluster_call("logs of job", job_id, client.get_job_logs, job_id)
            _write(logs[printed:])
            printed = len(logs)
        if status.is_terminal():
            return status
        time.sleep(poll_s)


def _finish(client, job_id: str, status) -> None:
    info = _cluster_call("status of job", job_id, client.get_job_info, job_id)
    click.echo(f"status: {status}")
    if str(status) != "SUCCEEDED" and info.message:
        # Ray appends the last logs to a failed job's message; they were just printed.
        click.echo(f"message: {info.message.splitlines()[0]}", err=True)
    sys.exit(EXIT_OK if str(status) == "SUCCEEDED" else EXIT_JOB_FAILED)


def _wait_followed(client, job_id: str) -> None:
    try:
        status = follow_logs(client, job_id)
    except KeyboardInterrupt:
        click.echo(f"\nstopped following; job {job_id} keeps running "
                   f"(bild-pipeline stop {job_id} ends it)", err=True)
        sys.exit(130)
    _finish(client, job_id, status)


# --------------------------------------------------------------------------------------------
# Commands


def _cluster_options(func):
    options = [
        click.option("--address", envvar="RAY_ADDRESS", default=DEFAULT_ADDRESS, show_default=True,
                     help="The Ray dashboard / job server, e.g. http://HEAD:8265 (env RAY_ADDRESS)."),
        click.option("--auth-token-file", type=click.Path(dir_okay=False), default=None,
                     help="File holding the cluster's auth token. Default: RAY_AUTH_TOKEN, "
                          "RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token. The token is never printed."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.command("submit")
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job key (repeatable).")
@_cluster_options
@click.option("--wait", is_flag=True, help="Follow the logs and exit with the job's status (0 SUCCEEDED, 1 otherwise).")
@click.option("--submission-id", default=None, help="Job id to use (default: one Ray generates).")
@click.option("--env", "env", multiple=True, metavar="KEY[=VALUE]",
              help="Environment variable for the job (repeatable); KEY alone passes this shell's value on.")
@click.option("--working-dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Directory to upload (default: this project's checkout). pipeline/ is added if missing.")
@click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
              help="Leave files out of the upload (gitignore syntax, repeatable).")
@click.option("--entrypoint-num-cpus", type=float, default=None, help="CPUs reserved for the job's driver.")
def submit(job_file, overrides, address, auth_token_file, wait, submission_id, env, working_dir, excludes,
           entrypoint_num_cpus):
    """Submit JOB_FILE to a Ray cluster through the Ray Jobs API and print its job id."""
    from pipeline.jobs import JobFileError, load_job

    try:
        job = load_job(job_file, overrides)
    except JobFileError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_USAGE)
    for warning in _relative_path_warnings(job):
        click.echo(warning, err=True)
    env_vars = parse_env(env)

    client = _connect(address, auth_token_file)
    with tempfile.TemporaryDirectory(prefix="bild-submit-") as staging:
        package = stage_package(job_file, Path(staging) / "wd", working_dir, excludes)
        entrypoint = entrypoint_for(package.job_file, overrides)
        click.echo(f"uploading {package.size_bytes / 1024:.0f} KiB from {package.source}", err=True)
        try:
            job_id = client.submit_job(
                entrypoint=entrypoint,
                runtime_env=runtime_env_for(package, env_vars),
                submission_id=submission_id,
                metadata={"bild_job": job.name, "config_hash": job.config_hash()},
                entrypoint_num_cpus=entrypoint_num_cpus,
            )
        except Exception as exc:
            raise ClusterError(f"submitting {job_file} failed: {exc}") from None
    click.echo(f"submitted: {job_id}")
    if not wait:
        click.echo(f"follow it with: bild-pipeline logs --follow {job_id}", err=True)
        return
    _wait_followed(client, job_id)


@click.command("status")
@click.argument("job_id", required=False)
@_cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(job_id, address, auth_token_file, as_json):
    """Show a job's status (without JOB_ID: list the cluster's jobs)."""
    client = _connect(address, auth_token_file)
    if job_id is None:
        try:
            jobs = client.list_jobs()
        except Exception as exc:
            raise ClusterError(f"listing jobs failed: {exc}") from None
        jobs = sorted(jobs, key=lambda j: j.start_time or 0)
        for info in jobs:
            record = _job_record(info)
            if as_json:
                click.echo(json.dumps(record))
            else:
                click.echo(f"{record['submission_id'] or record['job_id']}\t{record['status']}\t"
                           f"{record['job'] or '-'}\t{record['start_time'] or '-'}")
        return
    info = _cluster_call("status of job", job_id, client.get_job_info, job_id)
    record = _job_record(info)
    if as_json:
        click.echo(json.dumps(record))
        return
    click.echo(f"status: {record['status']}")
    for key in ("submission_id", "job", "message", "start_time", "end_time", "entrypoint"):
        if record.get(key):
            value = record[key].splitlines()[0] if key == "message" else record[key]  # logs follow in a message
            click.echo(f"{key}: {value}")


def _time(ms: int | None) -> str | None:
    if not ms:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ms / 1000))


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


@click.command("logs")
@click.argument("job_id")
@_cluster_options
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends; exit with its status.")
def logs(job_id, address, auth_token_file, follow):
    """Print a job's logs."""
    client = _connect(address, auth_token_file)
    if follow:
        _cluster_call("status of job", job_id, client.get_job_status, job_id)  # unknown id -> exit 3
        _wait_followed(client, job_id)
    _write(_cluster_call("logs of job", job_id, client.get_job_logs, job_id))


@click.command("stop")
@click.argument("job_id")
@_cluster_options
@click.option("--wait", is_flag=True, help="Wait until the job has ended.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait with --wait.")
def stop(job_id, address, auth_token_file, wait, timeout):
    """Stop a running job."""
    client = _connect(address, auth_token_file)
    stopped = _cluster_call("stopping job", job_id, client.stop_job, job_id)
    if not stopped:
        current = _cluster_call("status of job", job_id, client.get_job_status, job_id)
        click.echo(f"not running: {job_id} ({current})")
        return
    click.echo(f"stop requested: {job_id}")
    if wait:
        deadline = time.monotonic() + timeout
        while True:
            current = _cluster_call("status of job", job_id, client.get_job_status, job_id)
            if current.is_terminal():
                click.echo(f"status: {current}")
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"job {job_id} still {current} after {timeout:.0f} s")
            time.sleep(0.5)


COMMANDS = (submit, status, logs, stop)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def _standalone() -> None:
    """The job commands on their own (``python -m pipeline.submit``); normally reached via bild-pipeline."""


for _command in COMMANDS:
    _standalone.add_command(_command)


if __name__ == "__main__":
    _standalone()
