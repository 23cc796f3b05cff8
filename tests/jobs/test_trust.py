"""Runs you can trust, without Ray: one configuration per output, each id counted once, secrets kept out,
keys a method ignores refused, a job larger than its cluster named (one writer per output: test_lease.py)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError

from pipeline.io.schema import OUTPUT_SCHEMA
from pipeline.io.storage import kept_rows, open_filesystem
from pipeline.jobs.cluster_fit import ClusterTooSmallError, check_cluster_fits, shortfall
from pipeline.jobs.fingerprint import (
    ResumeMismatchError,
    check_resume,
    decisive_settings,
    model_fingerprint,
    models_content,
)
from pipeline.jobs.report import build_report, render_markdown
from pipeline.jobs.run_rows import read_run
from pipeline.jobs.fingerprint import REDACTED
from pipeline.jobs.schema import JobConfig

BASE = {
    "name": "t",
    "input": {"path": "in/", "storage_options": {"aws_access_key_id": "AKIAEXAMPLE", "endpoint_url": "http://s3"}},
    "models": {"small": "s", "large": "l"},
    "output": {"path": "out/"},
}


def job(**sections) -> JobConfig:
    data = json.loads(json.dumps(BASE))
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return JobConfig.model_validate(data)


def manifest(config: JobConfig) -> dict:
    return {"decisive_settings": decisive_settings(config), "models_content": models_content(config)}


# A run is one configuration.

def test_the_config_hash_follows_engine_and_quantize_but_not_how_much_or_where():
    base = job()
    assert base.config_hash() != job(models={"engine": "onnx"}).config_hash()
    assert base.config_hash() != job(models={"quantize": "int8"}).config_hash()
    assert base.config_hash() != job(report={"baseline": "large"}).config_hash()
    assert base.config_hash() == job(input={"limit": 5}).config_hash() == job(compute={"actors": 3}).config_hash()
    assert base.config_hash() == job(input={"storage_options": {"aws_access_key_id": "OTHER"}}).config_hash()
    assert base.config_hash() == job(models={"ct2_cache": "/elsewhere"}).config_hash()


def test_a_resume_under_other_settings_is_refused_naming_each_key():
    before = manifest(job())
    check_resume(before, manifest(job(input={"limit": 3}, compute={"batch_size": 2})), "out/")  # same rows
    with pytest.raises(ResumeMismatchError) as refused:
        check_resume(before, manifest(job(models={"engine": "onnx", "quantize": "int8"},
                                          decoding={"fallback_threshold": 0.5})), "out/")
    message = str(refused.value)
    assert "models.engine: 'auto' -> 'onnx'" in message and "models.quantize: 'none' -> 'int8'" in message
    assert "decoding.fallback_threshold: 0.4 -> 0.5" in message and "output.path" in message
    check_resume({"job": {}}, manifest(job(models={"engine": "onnx"})), "out/")  # a run from before: accepted
    check_resume(None, manifest(job()), "out/")  # a fresh output


@pytest.fixture
def digest_cache(tmp_path, monkeypatch):
    from pipeline.jobs import fingerprint

    monkeypatch.setattr(fingerprint, "DIGEST_CACHE", tmp_path / "cache" / "file-digests.json")
    return fingerprint.DIGEST_CACHE


def _model_folder(tmp_path) -> tuple:
    folder = tmp_path / "large"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    weights = bytearray(os.urandom(3 << 20))
    (folder / "model.safetensors").write_bytes(weights)
    return folder, weights


def test_a_byte_changed_anywhere_in_the_weights_is_another_configuration(tmp_path, digest_cache):
    folder, weights = _model_folder(tmp_path)
    first = model_fingerprint(str(folder))
    assert model_fingerprint(str(folder)) == first and first.startswith("sha256:")
    weights[len(weights) // 2] ^= 0xFF  # the middle of a 3 MiB file (a merged LoRA, a partial retrain)
    (folder / "model.safetensors").write_bytes(weights)
    assert model_fingerprint(str(folder)) != first

    config = job(models={"large": str(folder)})
    before = {**manifest(config), "models_content": {**models_content(config), "models.large": first}}
    with pytest.raises(ResumeMismatchError, match=r"models.large: .*\(the model's files changed\)"):
        check_resume(before, manifest(config), "out/", config)


def test_a_file_is_read_once_until_it_changes(tmp_path, digest_cache, monkeypatch):
    import hashlib

    folder, weights = _model_folder(tmp_path)
    reads = []
    real = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda handle, name: reads.append(handle.name) or real(handle, name))
    first = model_fingerprint(str(folder))
    assert len(reads) == 2 and digest_cache.exists()
    assert model_fingerprint(str(folder)) == first and len(reads) == 2  # from the cache: nothing read
    weights[7] ^= 0xFF
    (folder / "model.safetensors").write_bytes(weights)
    os.utime(folder / "model.safetensors", ns=(1, 1))  # another mtime, whatever the clock's resolution
    assert model_fingerprint(str(folder)) != first and reads[2:] == [str(folder / "model.safetensors")]


def test_a_hub_id_is_known_by_the_commit_its_cache_resolves_to(tmp_path, monkeypatch):
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_fingerprint("org/tiny") == f"name:org/tiny@{commit}"
    assert model_fingerprint("google/t5-small") == "name:google/t5-small"  # not cached here: the id alone


def test_an_output_fingerprinted_by_an_older_version_is_compared_as_it_was(tmp_path, digest_cache):
    from pipeline.jobs.fingerprint import legacy_fingerprint

    folder, weights = _model_folder(tmp_path)
    config = job(models={"large": str(folder), "small": "org/tiny"})
    old = {**manifest(config), "models_content": {"models.large": legacy_fingerprint(str(folder)),
                                                  "models.small": "name:org/tiny"}}
    check_resume(old, manifest(config), "out/", config)  # the same files: resumes
    weights[-10] ^= 0xFF
    (folder / "model.safetensors").write_bytes(weights)
    with pytest.raises(ResumeMismatchError, match=r"models.large"):
        check_resume(old, manifest(config), "out/", config)


def test_a_dumped_job_loads_again():
    """What a job writes (run.json, a saved job file) validates as it is: every default included."""
    config = job(decoding={"method": "bild"})
    assert JobConfig.model_validate(yaml.safe_load(yaml.safe_dump(config.model_dump()))) == config


# Keys a method ignores, secrets.

@pytest.mark.parametrize("key,value", [("deferral", "diff"), ("deferral_threshold", 0.3)])
def test_cascade_keys_are_refused_for_other_methods(key, value):
    with pytest.raises(ValidationError, match=f"decoding.{key} is the cascade method's; decoding.method is 'bild'"):
        job(decoding={"method": "bild", key: value})
    assert job(decoding={"method": "cascade", key: value}).decoding.method == "cascade"


def test_every_storage_option_but_where_the_data_lives_is_redacted():
    config = job(output={"storage_options": {"client_kwargs": {"endpoint_url": "http://minio:9000",
                                                                "aws_session_token": "T0KEN"},
                                             "session_name": "nightly-creds", "region_name": "eu-west-1"}})
    shown = config.redacted()
    assert shown["input"]["storage_options"] == {"aws_access_key_id": REDACTED, "endpoint_url": "http://s3"}
    assert shown["output"]["storage_options"] == {
        "client_kwargs": {"endpoint_url": "http://minio:9000", "aws_session_token": REDACTED},
        "session_name": REDACTED, "region_name": "eu-west-1"}
    assert "AKIAEXAMPLE" not in json.dumps(manifest(config)) + json.dumps(shown)


# Each id counted once.

def test_one_row_of_each_id_counts_the_first_without_an_error():
    table = pa.table({"id": ["a", "b", "a", "c", "b"], "point": [None] * 5})
    assert kept_rows(table).to_pylist() == [0, 1, 3]
    errors = pa.array(["crashed", None, None, None, "crashed"])  # a's retried error row decoded again later
    assert kept_rows(table, errors).to_pylist() == [1, 2, 3]
    sweep = pa.table({"id": ["a", "a", "a"], "point": ["p", "q", "p"]})
    assert kept_rows(sweep).to_pylist() == [0, 1]


SENTENCE = "a dog runs across the green field today"


def _rows(*rows: tuple[str, str]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "prediction": prediction, "reference": SENTENCE, "method": "bild", "output_tokens": 3,
          "worker": "host:1", "call_started_at": 1.0, "call_seconds": 0.5, "latency_ms": 10.0}
         for i, prediction in rows], schema=OUTPUT_SCHEMA)


def test_a_report_counts_each_id_once_and_says_how_many_rows_it_skipped(tmp_path):
    data = tmp_path / "run" / "data"
    data.mkdir(parents=True)
    pq.write_table(_rows(("1", SENTENCE), ("2", SENTENCE)), data / "0.parquet")
    pq.write_table(_rows(("2", "x y z"), ("3", SENTENCE)), data / "1.parquet")  # a retried write
    rows = read_run(str(tmp_path / "run"))
    assert rows.duplicate_rows == 1
    table = rows.table(["id", "prediction"])
    assert sorted(zip(table["id"].to_pylist(), table["prediction"].to_pylist())) == [
        ("1", SENTENCE), ("2", SENTENCE), ("3", SENTENCE)]
    (tmp_path / "run" / "run.json").write_text(json.dumps({"attempts": [
        {"started_at": "2026-12-05T07:00:00+00:00"}, {"started_at": "2026-12-05T08:00:00+00:00"}]}))
    summary, _ = build_report(str(tmp_path / "run"))
    assert summary["records"]["total"] == 3 and summary["duplicate_rows_skipped"] == 1
    assert summary["job_started"] == 1_796_454_000.0  # the first attempt's start: the throughput plot's origin
    assert summary["quality"]["bleu"] == pytest.approx(100.0)  # the retried row's "x y z" is not scored
    assert "1 duplicate row(s)" in render_markdown(summary, [])


# A job must fit its cluster.

class _Compute:
    actors, cpus_per_actor, gpus_per_actor = 4, 2.0, 0.0


def test_a_job_larger_than_its_cluster_names_the_keys(monkeypatch):
    import ray

    assert shortfall(_Compute, {"CPU": 8}) is None
    sizes = iter([{"CPU": 4}, {"CPU": 4}, {"CPU": 6}])
    monkeypatch.setattr(ray, "cluster_resources", lambda: next(sizes))
    now = iter(range(100))
    with pytest.raises(ClusterTooSmallError,
                       match=r"compute.actors \(4\) x compute.cpus_per_actor \(2\) = 8 CPUs, but the cluster has 6"):
        check_cluster_fits(_Compute, wait_seconds=2.5, clock=lambda: next(now), sleep=lambda _: None)
    grown = iter([{"CPU": 4}, {"CPU": 16}])
    monkeypatch.setattr(ray, "cluster_resources", lambda: next(grown))
    check_cluster_fits(_Compute, wait_seconds=60, clock=lambda: 0.0, sleep=lambda _: None)  # an autoscaler grew it


# Error paths keep secrets out.

def test_a_bad_storage_option_for_report_is_named_as_such_and_not_echoed(tmp_path):
    from click.testing import CliRunner

    from pipeline.cli import main

    result = CliRunner().invoke(main, ["report", str(tmp_path), "--storage-option", "aws_access_key_id=[AKIAVISIBLE"])
    assert result.exit_code == 2, result.output
    assert "--storage-option 'aws_access_key_id=***'" in result.output and "AKIAVISIBLE" not in result.output
    assert "--set" not in result.output


def test_a_store_that_is_down_fails_with_its_message_and_no_secret(saved_tiny_pair, tmp_path):
    """The output's S3 endpoint refuses connections: the run stops before Ray starts, with one line naming
    output.path and the store's error; neither key appears anywhere."""
    from click.testing import CliRunner

    from pipeline.cli import main

    (tmp_path / "in.jsonl").write_text('{"id": "1", "text": "Hallo"}\n')
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "name": "down", "input": {"path": str(tmp_path / "in.jsonl"), "format": "jsonl"},
        "models": {"small": saved_tiny_pair[0], "large": saved_tiny_pair[1]},
        "output": {"path": "s3://bucket/out", "storage_options": {
            "key": "AKIAVISIBLE", "secret": "SUPERSECRET123", "endpoint_url": "http://127.0.0.1:9",
            "config_kwargs": {"retries": {"max_attempts": 1}}}}}))
    result = CliRunner().invoke(main, ["run", str(job_file)])
    assert result.exit_code == 1, result.output
    assert "cannot write to output.path 's3://bucket/out' (EndpointConnectionError" in result.output
    assert "Traceback" not in result.output
    assert "SUPERSECRET123" not in result.output and "AKIAVISIBLE" not in result.output


def test_progress_counts_only_whole_files(tmp_path):
    """A file still being written (unreadable) is no progress: no line saying 0 records is printed."""
    import io

    from pipeline.jobs.console import Progress

    data = tmp_path / "out" / "data"
    data.mkdir(parents=True)
    fs, path = open_filesystem(str(tmp_path / "out"))
    shown = io.StringIO()
    progress = Progress(fs, path, total=3, stream=shown)
    (data / "0.parquet").write_bytes(b"PAR1 half-written")
    assert not progress._count() and progress.records == 0
    pq.write_table(_rows(("1", SENTENCE), ("2", SENTENCE)), data / "1.parquet")
    assert progress._count() and progress.records == 2
