"""Runs you can trust, through `bild-pipeline run` as a user meets them: a resume under another engine,
two runs on one output at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from pipeline.io.lease import LEASE
from pipeline.jobs.run import run_job
from support import REPO
from support.jobs import make_job
from support.shards import write_parquet_shards

pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=timeout)


def test_resuming_under_another_engine_exits_2_naming_the_keys(ray_local, saved_tiny_pair, tmp_path):
    write_parquet_shards(str(tmp_path / "in"), 8, 2)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", models={"engine": "native"},
                   output={"mode": "resume"})
    first = job.model_copy(update={"input": job.input.model_copy(update={"limit": 3})})
    assert run_job(first).decoded_now == 3
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job.model_dump()))  # the whole resolved job, defaults included

    other = cli("run", str(job_file), "--set", "models.engine=onnx", "--set", "models.quantize=int8")
    assert other.returncode == 2, other.stderr[-2000:]
    assert "models.engine: 'native' -> 'onnx'" in other.stderr and "models.quantize: 'none' -> 'int8'" in other.stderr
    assert len(list((tmp_path / "out" / "data").glob("*.parquet"))) >= 1  # nothing was removed or added
    assert run_job(job).decoded_now == 5  # the same settings resume


def test_a_second_run_on_the_same_output_exits_2_naming_the_first(saved_tiny_pair, tmp_path):
    write_parquet_shards(str(tmp_path / "in"), 16, 4)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", decoding={"max_new_tokens": 16},
                   compute={"batch_size": 1}, output={"mode": "resume", "rows_per_file": 2})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job.model_dump()))
    first = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", str(job_file)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "out" / LEASE).exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert (tmp_path / "out" / LEASE).exists(), f"the first run should hold the lease: {first.poll()}"

        second = cli("run", str(job_file))
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"pid {first.pid}" in second.stderr and "one writer per output" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the first run, its embedded Ray and its workers
        first.wait()


def test_a_record_that_kills_its_actor_fails_alone_and_the_job_completes(saved_tiny_pair, tmp_path):
    """The engine SIGKILLs its process on one record (pipeline/stage/in_flight.py's testing hook): Ray restarts the
    actor and retries the call record by record; the record kills it alone twice and gets an `error` row; every
    other id is decoded once and the job exits 0."""
    import pyarrow.compute as pc

    from pipeline.stage.in_flight import FAULT_VARIABLE
    from pipeline.io.storage import read_output_table

    ids = write_parquet_shards(str(tmp_path / "in"), 12, 3)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", compute={"batch_size": 4})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job.model_dump()))
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", str(job_file)], cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(REPO), FAULT_VARIABLE: "doc-5"})
    try:
        _, stderr = run.communicate(timeout=300)  # without the guard Ray retries the record forever
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)  # the driver, its embedded Ray and its workers
    assert run.returncode == 0, stderr[-3000:]
    table = read_output_table(str(tmp_path / "out"), columns=["id", "error", "prediction"])
    assert sorted(table["id"].to_pylist()) == sorted(ids)  # each id once
    failed = table.filter(pc.is_valid(table["error"]))
    assert failed["id"].to_pylist() == ["doc-5"]
    assert "alone killed its actor 2 times" in failed["error"][0].as_py()
    assert pc.all(pc.is_valid(table.filter(pc.is_null(table["error"]))["prediction"])).as_py()


def test_a_run_whose_lease_is_taken_over_stops_writing_and_exits_3_naming_the_other(saved_tiny_pair, tmp_path):
    """Another run takes the lease over while this one writes (as after a store outage longer than the lease's
    ttl): this run stops within a renewal period, writes no file after that, leaves the other's lease and
    manifest alone, and exits 3 naming it."""
    import json

    write_parquet_shards(str(tmp_path / "in"), 48, 4)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", decoding={"max_new_tokens": 24},
                   compute={"batch_size": 1}, output={"mode": "resume", "rows_per_file": 1})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job.model_dump()))
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", str(job_file)], cwd=REPO, text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(REPO), "BILD_LEASE_TTL_SECONDS": "2"})
    data = tmp_path / "out" / "data"
    try:
        deadline = time.time() + 180
        while time.time() < deadline and run.poll() is None and len(list(data.glob("*.parquet"))) < 2:
            time.sleep(0.05)
        other = {"run_id": "intruder", "host": "elsewhere", "pid": 7, "renewed_at": time.time()}
        (tmp_path / "out" / LEASE).write_text(json.dumps(other))
        manifest = (tmp_path / "out" / "run.json").read_text()
        taken = time.time()
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 3, stderr[-3000:]
    assert "taken over by another run (run intruder on host elsewhere" in stderr
    late = [f.name for f in data.glob("*.parquet") if f.stat().st_mtime > taken + 2]  # 2 s: a renewal period, more
    assert not late, f"files written after the run knew its lease was taken: {late}"
    assert json.loads((tmp_path / "out" / LEASE).read_text()) == other
    assert (tmp_path / "out" / "run.json").read_text() == manifest


def test_a_record_is_blamed_only_when_its_own_decoding_killed_its_actor_twice(ray_local):
    """The registry's rule, call by call: one death while a record was alone (perhaps a neighbour's out-of-memory
    kill) earns it another try alone; a second blames it; deaths on a node that is gone blame no one."""
    import ray

    from pipeline.stage.in_flight import InFlightRecords

    registry = InFlightRecords.remote()
    here = ray.get_runtime_context().get_node_id()
    begin = lambda worker, node=here: ray.get(registry.begin.remote(worker, ["a", "b"], node))  # noqa: E731
    alone = lambda worker, node=here: ray.get(registry.mark.remote(worker, "a", True, node))  # noqa: E731

    assert begin("w1") == ({}, False)
    assert begin("w2") == ({}, True)  # w1 died with a batch in flight: nobody was alone, nobody counted
    alone("w2")
    assert begin("w3") == ({}, True)  # w2 died while "a" was alone: once, tried alone again
    alone("w3")
    assert begin("w4") == ({"a": "w3"}, True)  # twice: blamed

    assert ray.get(registry.begin.remote("x1", ["c"], "gone-node")) == ({}, False)
    for worker, next_worker in (("x1", "x2"), ("x2", "x3")):
        ray.get(registry.mark.remote(worker, "c", True, "gone-node"))  # alone, on a node that is lost
        assert ray.get(registry.begin.remote(next_worker, ["c"], here)) == ({}, True)
    ray.kill(registry)
