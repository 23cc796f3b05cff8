"""Jobs whose input and output live on S3, through `bild-pipeline run` and `sweep` against a local S3
server (moto speaks the S3 protocol, so s3fs runs its real code, listing cache included).

Ray Data's writers add output files while the driver lists the output folder (progress line, resume
state, summary): a listing cached by the driver's s3fs would hide the new files. Each test ends by
reading every output row back, so a stale listing anywhere fails it.
"""

from __future__ import annotations

import io
import json
import uuid

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.io.storage import read_output_table
from pipeline.jobs.console import Progress
from support.shards import write_parquet_shards

pytestmark = pytest.mark.slow


@pytest.fixture
def buckets(s3_server):
    """Fresh input and output buckets for one test: (s3fs filesystem, input bucket, output bucket)."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server, skip_instance_cache=True)
    suffix = uuid.uuid4().hex[:8]
    names = (f"in-{suffix}", f"out-{suffix}")
    for name in names:
        fs.mkdir(name)
    return fs, *names


@pytest.fixture
def frequent_progress(monkeypatch):
    """The progress line looks at the output every 0.2 s (5 s in a real job), so that it lists the
    output folder while Ray Data is still writing it."""
    monkeypatch.setattr(Progress, "interval_seconds", 0.2)


def job_file(tmp_path, pair, s3_server, input_url: str, output_url: str, **sections) -> str:
    small, large = pair
    data = {
        "name": "s3",
        "input": {"path": input_url, "format": "parquet", "reference_column": "ref", "text_column": "text",
                  "storage_options": s3_server},
        "models": {"small": small, "large": large, "device": "cpu"},
        "decoding": {"method": "bild", "max_new_tokens": 6},
        "compute": {"actors": 2, "cpus_per_actor": 0.5, "batch_size": 4},  # the shared local Ray has 2 CPUs
        "output": {"path": output_url, "mode": "overwrite", "rows_per_file": 4, "storage_options": s3_server},
    }
    for section, values in sections.items():
        data[section] = {**data[section], **values}
    path = tmp_path / f"job-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def ids_in_output(url: str, s3_server: dict, columns=("id",)) -> list:
    return read_output_table(url, s3_server, columns=list(columns)).to_pylist()


def test_a_fresh_run_to_s3_with_the_progress_line_exits_0_with_every_id_once(
        ray_local, saved_tiny_pair, s3_server, buckets, frequent_progress, tmp_path):
    fs, source, target = buckets
    ids = write_parquet_shards(f"s3://{source}/shards", 64, 3, s3_server)
    output = f"s3://{target}/run1"
    printed = run_cli("run", job_file(tmp_path, saved_tiny_pair, s3_server, f"s3://{source}/shards", output))
    assert "job s3: 64/64 records" in printed
    assert sorted(row["id"] for row in ids_in_output(output, s3_server)) == sorted(ids)
    assert json.loads(fs.cat(f"{target}/run1/run.json"))["status"] == "succeeded"
    assert s3_server["secret"] not in printed and s3_server["key"] not in printed


def test_an_interrupted_run_on_s3_resumes_to_every_id_once(
        ray_local, saved_tiny_pair, s3_server, buckets, frequent_progress, tmp_path):
    """What an interrupted nightly run leaves behind: the files written so far, records not yet
    decoded, and a torn file (a write cut off before its footer). The resume keeps the written rows,
    removes the torn file and decodes the rest, listing the output before and while Ray Data writes."""
    fs, source, target = buckets
    ids = write_parquet_shards(f"s3://{source}/shards", 32, 2, s3_server)
    output = f"s3://{target}/nightly"
    run_cli("run", job_file(tmp_path, saved_tiny_pair, s3_server, f"s3://{source}/shards", output,
                            input={"limit": 12}))
    written = sorted(fs.find(f"{target}/nightly/data"))
    kept_rows = sum(pq.read_metadata(io.BytesIO(fs.cat(file))).num_rows for file in written)
    assert kept_rows == 12
    whole = fs.cat(written[0])
    fs.pipe(f"{target}/nightly/data/torn-write.parquet", whole[: len(whole) // 2])  # no footer

    resume = job_file(tmp_path, saved_tiny_pair, s3_server, f"s3://{source}/shards", output,
                      output={"mode": "resume"})
    printed = run_cli("run", resume)
    assert f"{len(ids) - kept_rows} decoded (0 errors), {kept_rows} already done and skipped" in printed
    assert sorted(row["id"] for row in ids_in_output(output, s3_server)) == sorted(ids)
    assert not fs.exists(f"{target}/nightly/data/torn-write.parquet")
    manifest = json.loads(fs.cat(f"{target}/nightly/run.json"))
    assert manifest["status"] == "succeeded" and [a["to_decode"] for a in manifest["attempts"]] == [
        12, len(ids) - kept_rows]


def test_a_sweep_on_s3_writes_every_record_under_every_point_once(
        ray_local, saved_tiny_pair, s3_server, buckets, frequent_progress, tmp_path):
    fs, source, target = buckets
    ids = write_parquet_shards(f"s3://{source}/shards", 12, 2, s3_server)
    output = f"s3://{target}/sweep"
    job = job_file(tmp_path, saved_tiny_pair, s3_server, f"s3://{source}/shards", output,
                   output={"mode": "resume"})
    printed = run_cli("sweep", job, "--fallback", "0.4", "--rollback", "0,5", "--out", str(tmp_path / "sweep"))
    rows = ids_in_output(output, s3_server, columns=("id", "point"))
    points = {"large", "small", "bild_fb0.4_rb0", "bild_fb0.4_rb5"}
    assert sorted((row["id"], row["point"]) for row in rows) == sorted((i, p) for i in ids for p in points)
    assert {point["point"] for point in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["points"]} \
        == points
    assert "12/12 records" in printed
