"""`submit` / `status` / `logs` / `stop`: packaging and token handling here, and one end-to-end
test against a real `ray start --head` on 127.0.0.1 with token authentication on."""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.cli.cluster import follow_and_exit, logs, parse_env, status, stop, submit
from pipeline.cluster.auth import TokenFileError, resolve_token
from pipeline.cluster.entrypoint import entrypoint_for, redact_entrypoint
from pipeline.cluster.jobs_client import JobsClient
from pipeline.cluster.package import PackageError, runtime_env_for, stage_package
from support import REPO


JOB_YAML = """\
name: submit-test
input: {{path: {input}}}
models: {{small: {small}, large: {large}, device: cpu}}
decoding: {{max_new_tokens: 6}}
compute: {{actors: 1, cpus_per_actor: 1, batch_size: 4}}
output: {{path: {output}, mode: overwrite}}
"""

_RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _write_job(path: Path, **fields) -> Path:
    values = {"input": "/data/in.parquet", "small": "/m/small", "large": "/m/large", "output": "/data/out", **fields}
    path.write_text(JOB_YAML.format(**values), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Without a cluster


def test_the_cluster_commands_are_registered_under_their_names():
    for name, command in (("submit", submit), ("status", status), ("logs", logs), ("stop", stop)):
        assert main.commands[name] is command


def test_importing_the_cli_and_the_cluster_modules_does_not_import_ray():
    code = ("import sys, pipeline.cli, pipeline.cluster.auth, pipeline.cluster.jobs_client, "
            "pipeline.cluster.package; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_token_lookup_follows_rays_order(tmp_path):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    path_file = tmp_path / "path_token"
    path_file.write_text("from-path")
    option_file = tmp_path / "option_token"
    option_file.write_text("  from-option \n")
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(path_file)}

    assert resolve_token(str(option_file), env, home).value == "from-option"
    assert resolve_token(None, env, home).value == "from-env"
    assert resolve_token(None, {"RAY_AUTH_TOKEN_PATH": str(path_file)}, home).value == "from-path"
    assert resolve_token(None, {}, home).value == "from-home"
    assert resolve_token(None, {}, tmp_path / "nobody") is None
    assert resolve_token(None, {**env, "RAY_AUTH_MODE": "disabled"}, home) is None
    assert resolve_token(str(option_file), {"RAY_AUTH_MODE": "disabled"}, home).value == "from-option"
    token = resolve_token(None, env, home)
    assert token.header() == {"Authorization": "Bearer from-env"}
    assert "from-env" not in repr(token) and "from-env" not in str(token)


def test_unreadable_or_empty_token_file_is_an_error_naming_the_file_not_its_content(tmp_path):
    with pytest.raises(TokenFileError, match="cannot read"):
        resolve_token(str(tmp_path / "missing"), {}, tmp_path)
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(TokenFileError, match="empty"):
        resolve_token(str(empty), {}, tmp_path)


def _fake_project(root: Path) -> Path:
    (root / "pipeline").mkdir(parents=True)
    (root / "pipeline" / "__init__.py").write_text("")
    (root / "pipeline" / "cli.py").write_text("# cli\n")
    (root / "pipeline" / "__pycache__").mkdir()
    (root / "pipeline" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "big.so").write_bytes(b"\0" * 1000)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "runs" / "demo").mkdir(parents=True)
    (root / "runs" / "demo" / "model.safetensors").write_bytes(b"\0")
    (root / "scratch").mkdir()
    (root / "scratch" / "notes.txt").write_text("ignored by .gitignore")
    (root / "extra.log").write_text("left out with --exclude")
    (root / ".gitignore").write_text("scratch/\n")
    (root / "README.md").write_text("hello")
    return root


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def test_stage_package_leaves_out_the_venv_and_carries_the_job_file(tmp_path):
    project = _fake_project(tmp_path / "project")
    (tmp_path / "elsewhere").mkdir()
    job = _write_job(tmp_path / "elsewhere" / "job.yaml")  # outside the working dir

    package = stage_package(job, tmp_path / "staged", working_dir=project, excludes=["*.log"])

    assert _files(package.directory) == {"pipeline/__init__.py", "pipeline/cli.py", "README.md", "_bild_job/job.yaml"}
    assert package.job_file == "_bild_job/job.yaml"
    # The staged job is the job with its presets merged in (this one has none): the same content.
    assert yaml.safe_load((package.directory / package.job_file).read_text()) == yaml.safe_load(job.read_text())
    runtime_env = runtime_env_for(package, {"HF_HUB_OFFLINE": "1"})
    assert runtime_env["working_dir"] == str(package.directory)
    assert ".venv/" in runtime_env["excludes"] and ".git/" in runtime_env["excludes"]
    assert runtime_env["env_vars"] == {"HF_HUB_OFFLINE": "1"}
    assert "env_vars" not in runtime_env_for(package)


def test_default_working_dir_is_this_checkout_without_its_venv(tmp_path):
    job = _write_job(tmp_path / "job.yaml")
    package = stage_package(job, tmp_path / "staged")
    files = _files(package.directory)
    assert {"pipeline/cli/__init__.py", "pipeline/cluster/jobs_client.py", "pyproject.toml", "_bild_job/job.yaml"} <= files
    assert not any(f.startswith((".venv/", ".git/", "runs/", "docs/", "benchmarks/", "tests/")) or "__pycache__" in f for f in files)
    assert package.size_bytes < 5 * 2**20


def test_a_working_dir_without_the_package_gets_it_added(tmp_path):
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "data.txt").write_text("x")
    job = _write_job(tmp_path / "job.yaml")
    package = stage_package(job, tmp_path / "staged", working_dir=tmp_path / "wd")
    files = _files(package.directory)
    assert {"data.txt", "pipeline/__init__.py", "pipeline/cli/__init__.py", "_bild_job/job.yaml"} <= files
    assert not any("__pycache__" in f for f in files)


def test_an_oversized_upload_is_refused_naming_the_biggest_file(tmp_path):
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "huge.parquet").write_bytes(b"\0" * 4096)
    job = _write_job(tmp_path / "job.yaml")
    with pytest.raises(PackageError, match=r"huge\.parquet.*--exclude"):
        stage_package(job, tmp_path / "staged", working_dir=tmp_path / "wd", limit=1024)


def test_entrypoint_runs_the_job_file_with_the_overrides_quoted():
    entrypoint = entrypoint_for("_bild_job/my job.yaml", ["decoding.method=large", "prompt=summarize: {text}"])
    assert shlex.split(entrypoint) == [
        "python", "-m", "pipeline.cli", "run", "_bild_job/my job.yaml",
        "--set", "decoding.method=large", "--set", "prompt=summarize: {text}",
    ]


def test_secret_overrides_are_hidden_when_an_entrypoint_is_shown():
    entrypoint = entrypoint_for("_bild_job/j.yaml", ["input.storage_options.secret=abc123", "decoding.seed=3"])
    shown = redact_entrypoint(entrypoint)
    assert "abc123" not in shown
    assert "input.storage_options.secret=***" in shown and "decoding.seed=3" in shown


def test_env_options():
    assert parse_env(["A=1", "B=x=y", "HOME_DIR"], {"HOME_DIR": "/h"}) == {"A": "1", "B": "x=y", "HOME_DIR": "/h"}
    with pytest.raises(click.UsageError, match="not set"):
        parse_env(["MISSING"], {})
    with pytest.raises(click.UsageError, match="valid variable name"):
        parse_env(["1BAD=x"], {})


class _FakeClient:
    """Stands in for JobSubmissionClient: a job that prints two chunks and then ends with `final`."""

    def __init__(self, final: str, stream_breaks: bool = False):
        from ray.job_submission import JobStatus

        self.statuses = [JobStatus.RUNNING, JobStatus(final)]
        self.final = JobStatus(final)
        self.stream_breaks = stream_breaks

    async def tail_job_logs(self, job_id):
        yield "first line\n"
        if self.stream_breaks:
            raise RuntimeError("connection lost")
        yield "second line\n"

    def get_job_status(self, job_id):
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def get_job_logs(self, job_id):
        return "first line\nsecond line\n"

    def get_job_info(self, job_id):
        from types import SimpleNamespace

        return SimpleNamespace(message=f"Job ended: {self.final}\nlast logs ...")


@pytest.mark.parametrize("final, code", [("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 1)])
@pytest.mark.parametrize("stream_breaks", [False, True])
def test_following_prints_the_logs_once_and_exits_with_the_jobs_status(final, code, stream_breaks, capsys):
    client = _FakeClient(final, stream_breaks)
    with pytest.raises(SystemExit) as exit_info:
        follow_and_exit(JobsClient(client), "raysubmit_x", poll_s=0)
    assert exit_info.value.code == code
    out, err = capsys.readouterr()
    assert out == f"first line\nsecond line\nstatus: {final}\n"
    assert ("polling instead" in err) == stream_breaks
    assert ("last logs" in err) is False  # only the message's first line, the logs were just printed


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_invalid_job_file_exits_2_naming_the_key_before_any_connection(tmp_path):
    job = _write_job(tmp_path / "job.yaml")
    job.write_text(job.read_text() + "decodng: {method: large}\n")
    result = CliRunner().invoke(submit, [str(job), "--address", f"http://127.0.0.1:{_closed_port()}"])
    assert result.exit_code == 2, result.output
    assert "decodng" in result.output

    good = _write_job(tmp_path / "good.yaml")
    result = CliRunner().invoke(submit, [str(good), "--set", "decoding.method=fast",
                                             "--address", f"http://127.0.0.1:{_closed_port()}"])
    assert result.exit_code == 2 and "decoding.method" in result.output


def test_an_unreadable_token_file_exits_2(tmp_path):
    job = _write_job(tmp_path / "job.yaml")
    result = CliRunner().invoke(submit, [str(job), "--auth-token-file", str(tmp_path / "missing"),
                                         "--address", f"http://127.0.0.1:{_closed_port()}"])
    assert result.exit_code == 2, result.output
    assert "cannot read the auth token file (--auth-token-file" in result.output


def test_relative_local_paths_are_flagged(tmp_path):
    job = _write_job(tmp_path / "job.yaml", input="data/in.parquet", output="out")
    result = CliRunner().invoke(submit, [str(job), "--address", f"http://127.0.0.1:{_closed_port()}", "--retry-for", "0"])
    assert result.exit_code == 3
    assert "input.path 'data/in.parquet' is a relative path" in result.output
    assert "output.path 'out' is a relative path" in result.output


def test_an_unreachable_cluster_exits_3_without_showing_the_token(tmp_path):
    token = secrets.token_hex(32)
    job = _write_job(tmp_path / "job.yaml")
    address = f"http://127.0.0.1:{_closed_port()}"
    env = {**{k: v for k, v in os.environ.items() if k not in _RAY_ENV}, "RAY_AUTH_TOKEN": token}
    for args in (["submit", str(job), "--wait", "--retry-for", "0"], ["stop", "raysubmit_x"]):  # one connect()
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "--address", address],
                             capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
        assert out.returncode == 3, (args, out.stdout, out.stderr)
        assert "cannot reach" in out.stderr
        assert token not in out.stdout + out.stderr


# --------------------------------------------------------------------------------------------
# Against a real cluster with token authentication


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid:  # fields after "(comm)": state ppid pgrp session ...
            pids.append(int(entry.name))
    return pids


def _stop_cluster(process: subprocess.Popen) -> None:
    """End the cluster we started: every process of its session (`ray start` was its leader).
    Not `ray stop`, which would kill every Ray process of this user on the machine."""
    sid = process.pid
    try:
        os.killpg(sid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 2  # Ray drains for up to 30 s on SIGTERM: not worth waiting for
    while time.monotonic() < deadline and _session_pids(sid):
        time.sleep(0.2)
    for pid in _session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _http_status(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


@pytest.fixture(scope="module")
def ray_cluster():
    """`ray start --head` on 127.0.0.1 with RAY_AUTH_MODE=token and a token in a private HOME."""
    if sys.platform != "linux":
        pytest.skip("the cluster fixture tracks its processes through /proc")
    pytest.importorskip("aiohttp_cors", reason="the dashboard needs ray[default]")
    ray_bin = Path(sys.executable).parent / "ray"
    if not ray_bin.exists():
        ray_bin = shutil.which("ray")
        if ray_bin is None:
            pytest.skip("no `ray` executable")
    base = Path(tempfile.mkdtemp(prefix="bildray-", dir="/tmp"))  # short: Ray's unix sockets live below
    home = base / "home"
    (home / ".ray").mkdir(parents=True)
    token = secrets.token_hex(32)
    (home / ".ray" / "auth_token").write_text(token)
    gcs, dashboard, agent_http, agent_grpc, metrics, runtime_env, node_manager, object_manager = _free_ports(8)
    env = {k: v for k, v in os.environ.items() if k not in _RAY_ENV}
    env.update(HOME=str(home), RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    command = [
        str(ray_bin), "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--port={gcs}",
        f"--dashboard-port={dashboard}", "--include-dashboard=true", "--num-cpus=2",
        f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
        f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
        "--object-store-memory=100000000", "--disable-usage-stats", f"--temp-dir={base / 'r'}",
    ]
    log = open(base / "ray-start.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               cwd=base)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 60
        while _http_status(f"{address}/api/jobs/", token) != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("ray start --head did not come up:\n" + (base / "ray-start.log").read_text()[-3000:])
            time.sleep(0.5)
        yield {"address": address, "token": token, "home": home, "base": base}
    finally:
        _stop_cluster(process)
        log.close()
        shutil.rmtree(base, ignore_errors=True)


def _cli(cluster, *args, home=None, extra_env=None, timeout=120) -> subprocess.CompletedProcess:
    """Run a job command as a user would, in a clean environment (HOME decides the token)."""
    env = {k: v for k, v in os.environ.items() if k not in _RAY_ENV}
    env["HOME"] = str(home if home is not None else cluster["home"])
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "--address", cluster["address"]],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


@pytest.mark.slow
def test_submit_a_real_job_to_a_token_authenticated_cluster(ray_cluster, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.pairs.tiny import save_pair

    token = ray_cluster["token"]
    outputs = []

    def run(*args, **kwargs):
        result = _cli(ray_cluster, *args, **kwargs)
        outputs.append(result.stdout + result.stderr)
        return result

    # Auth is really on: no token, or a wrong one, is refused (and the server saw no job).
    nobody = tmp_path / "nobody"
    nobody.mkdir()
    assert _http_status(f"{ray_cluster['address']}/api/jobs/") == 401
    refused = run("status", home=nobody)
    assert refused.returncode == 3 and "refused" in refused.stderr and "no token found" in refused.stderr
    wrong = run("status", home=nobody, extra_env={"RAY_AUTH_TOKEN": "0" * 64})
    assert wrong.returncode == 3 and "refused" in wrong.stderr and "0" * 64 not in wrong.stdout + wrong.stderr

    small, large = save_pair(tmp_path / "pair", "t5")
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["Ein Hund.", "Zwei Katzen.", "Ein Haus."]}),
                   tmp_path / "in.parquet")
    job = _write_job(tmp_path / "job.yaml", input=tmp_path / "in.parquet", small=small, large=large,
                     output=tmp_path / "out")

    # submit --wait: the token comes from ~/.ray/auth_token; --set reaches the cluster-side `run`.
    done = run("submit", str(job), "--wait", "--set", "decoding.method=bild", "--set", "decoding.max_new_tokens=4",
               timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    job_id = next(line.split(": ", 1)[1] for line in lines if line.startswith("submitted: "))
    assert job_id.startswith("raysubmit_")
    assert "run _bild_job/job.yaml --set decoding.method=bild --set decoding.max_new_tokens=4" in done.stdout
    assert "job submit-test: 3/3 records" in done.stdout  # the driver's output, followed live
    assert lines[-1] == "status: SUCCEEDED"
    table = pq.read_table(tmp_path / "out" / "data")
    assert sorted(table.column("id").to_pylist()) == ["a", "b", "c"]
    assert set(table.column("method").to_pylist()) == {"bild"}
    assert max(table.column("output_tokens").to_pylist()) <= 4

    # status / logs with the token given other ways.
    token_file = tmp_path / "token"
    token_file.write_text(token)
    status = run("status", job_id, "--auth-token-file", str(token_file), home=nobody)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0] == "status: SUCCEEDED" and "job: submit-test" in status.stdout
    logs = run("logs", job_id, home=nobody, extra_env={"RAY_AUTH_TOKEN": token})
    assert logs.returncode == 0 and "job submit-test: 3/3 records" in logs.stdout
    listing = run("status")
    assert listing.returncode == 0 and f"{job_id}\tSUCCEEDED\tsubmit-test" in listing.stdout
    assert run("status", "raysubmit_nosuchjob").returncode == 3

    # stop: a second submission under our own id, stopped before it can finish.
    stop_id = f"bild-stop-{secrets.token_hex(4)}"
    started = run("submit", str(job), "--submission-id", stop_id, "--set", f"output.path={tmp_path / 'out2'}")
    assert started.returncode == 0 and f"submitted: {stop_id}" in started.stdout, started.stderr
    stopped = run("stop", stop_id, "--wait")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"stop requested: {stop_id}" in stopped.stdout and "status: STOPPED" in stopped.stdout
    followed = run("logs", stop_id, "--follow")
    assert followed.returncode == 1 and followed.stdout.splitlines()[-1] == "status: STOPPED"
    assert run("stop", stop_id).stdout.startswith(f"not running: {stop_id} (STOPPED)")

    for output in outputs:
        assert token not in output


def test_staged_job_carries_its_presets(tmp_path):
    """The cluster may not have configs/: the staged job file has its presets merged in."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "fast.yaml").write_text("decoding: {fallback_threshold: 0.2, rollback_threshold: 6}\n")
    (tmp_path / "jobs").mkdir()
    job = _write_job(tmp_path / "jobs" / "job.yaml")
    data = yaml.safe_load(job.read_text())
    job.write_text(yaml.safe_dump({"presets": ["../configs/fast.yaml"], **data}))
    package = stage_package(job, tmp_path / "staged", working_dir=tmp_path / "jobs")
    staged = yaml.safe_load((package.directory / package.job_file).read_text())
    assert "presets" not in staged and staged["decoding"]["rollback_threshold"] == 6
