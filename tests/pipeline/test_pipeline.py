"""The batch pipeline end to end on a real local Ray: formats, S3 (moto), bad input, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.io.storage import InputError, open_filesystem, output_files, read_output_table
from pipeline.jobs import JobConfig, load_job
from pipeline.jobs.run import OutputExistsError, run_job
from support import REPO

pytestmark = pytest.mark.slow
SENTENCES = ["Ein Hund läuft.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.",
             "Kinder bauen eine Sandburg.", "Ein Mann fährt Rad.", "Musiker spielen auf der Bühne."]


def make_job(pair, input_path, output_path, fmt="parquet", **sections) -> JobConfig:
    small, large = pair
    data = {
        "name": "test",
        "input": {"path": str(input_path), "format": fmt, "id_column": "id", "text_column": "text",
                  "reference_column": "ref"},
        "models": {"small": small, "large": large, "device": "cpu"},
        "decoding": {"method": "bild", "max_new_tokens": 8},
        "compute": {"actors": 1, "batch_size": 4},
        "output": {"path": str(output_path), "mode": "overwrite"},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return JobConfig.model_validate(data)


def write_shards(fs_path: str, n_records: int, n_shards: int, storage_options=None):
    fs, base = open_filesystem(fs_path, storage_options)
    fs.makedirs(base, exist_ok=True)
    per = n_records // n_shards
    for shard in range(n_shards):
        ids = [f"doc-{i}" for i in range(shard * per, (shard + 1) * per)]
        table = pa.table({"id": ids, "text": [SENTENCES[int(i.split('-')[1]) % len(SENTENCES)] for i in ids],
                          "ref": [f"reference {i}" for i in ids]})
        with fs.open(f"{base}/shard-{shard:03d}.parquet", "wb") as handle:
            pq.write_table(table, handle)
    return [f"doc-{i}" for i in range(n_shards * per)]


def output_rows(job: JobConfig) -> pa.Table:
    return read_output_table(job.output.path, job.output.storage_options)


def assert_one_row_per_id(table: pa.Table, ids: list[str]):
    got = table.column("id").to_pylist()
    assert sorted(got) == sorted(ids), "every input id exactly once"


def test_parquet_shards_from_and_to_s3(ray_local, saved_tiny_pair, s3_server, capsys):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server)
    fs.mkdir("bild-test")
    ids = write_shards("s3://bild-test/input/", 12, 3, s3_server)
    job = make_job(saved_tiny_pair, "s3://bild-test/input/", "s3://bild-test/runs/t1",
                   input={"storage_options": s3_server}, output={"storage_options": s3_server})
    summary = run_job(job)
    table = output_rows(job)
    assert_one_row_per_id(table, ids)
    assert table.column("error").null_count == table.num_rows
    assert summary.decoded_now == 12 and summary.records_in_output == 12
    assert table.column("reference").to_pylist()[0].startswith("reference doc-")
    assert set(table.column("job_name").to_pylist()) == {"test"}
    assert set(table.column("engine").to_pylist()) == {"native"} and summary.engines == ["native"]  # T5: native
    manifest = json.loads(fs.cat("bild-test/runs/t1/run.json"))
    assert manifest["attempts"][-1]["summary"]["engines"] == ["native"]
    assert manifest["status"] == "succeeded" and manifest["config_hash"] == job.config_hash()
    assert manifest["versions"]["ray"] and manifest["cluster"]["cpus"] >= 1
    # Secrets never reach the manifest, the summary or the log.
    everything = json.dumps(manifest) + summary.to_text() + "".join(capsys.readouterr())
    assert s3_server["secret"] not in everything and s3_server["key"] not in everything


def test_jsonl_and_csv_inputs(ray_local, saved_tiny_pair, tmp_path):
    rows = [{"id": i, "text": SENTENCES[i], "ref": f"r{i}"} for i in range(5)]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for shard in (0, 1):
        lines = ["id,text,ref"] + [f"00{r['id']},\"{r['text']}\",{r['ref']}" for r in rows if r["id"] % 2 == shard]
        (csv_dir / f"part-{shard}.csv").write_text("\n".join(lines) + "\n")

    jsonl = make_job(saved_tiny_pair, tmp_path / "in.jsonl", tmp_path / "out-jsonl", fmt="jsonl")
    run_job(jsonl)
    assert_one_row_per_id(output_rows(jsonl), [str(i) for i in range(5)])

    csv = make_job(saved_tiny_pair, csv_dir, tmp_path / "out-csv", fmt="csv", models={"engine": "hf"})
    assert run_job(csv).engines == ["hf"]
    table = output_rows(csv)
    assert set(table.column("engine").to_pylist()) == {"hf"}
    assert_one_row_per_id(table, [f"00{i}" for i in range(5)])  # ids read as text: leading zeros kept
    assert table.column("error").null_count == 5


def test_bad_input_file_completes_with_errors_only_on_bad_rows(ray_local, saved_tiny_pair, tmp_path):
    lines = [
        json.dumps({"id": "good-1", "text": "Ein Hund läuft."}),
        json.dumps({"id": "empty", "text": ""}),
        json.dumps({"id": "blank", "text": "   "}),
        json.dumps({"id": "null", "text": None}),
        json.dumps({"id": "number", "text": 42}),
        json.dumps({"id": "missing-text"}),
        json.dumps({"id": "huge", "text": "Wort " * 10_000}),  # 50k characters: truncated, not an error
        json.dumps({"id": "good-2", "text": "Zwei Männer spielen."}),
    ]
    data = "\n".join(lines).encode() + b'\n{"id": "bad-utf8", "text": "caf\xe9 \xff"}\n'
    data += b'{"id": "broken-json", "text": \n'
    (tmp_path / "bad.jsonl").write_bytes(data)
    job = make_job(saved_tiny_pair, tmp_path / "bad.jsonl", tmp_path / "out", fmt="jsonl",
                   decoding={"max_input_tokens": 64})
    summary = run_job(job)
    table = output_rows(job)
    rows = {row["id"]: row for row in table.to_pylist()}
    assert len(rows) == table.num_rows == 10
    errors = {key: row["error"] for key, row in rows.items() if row["error"]}
    assert set(errors) == {"empty", "blank", "null", "number", "missing-text", "bad-utf8", "bad.jsonl:10"}
    assert "empty" in errors["empty"] and "string" in errors["number"] and "UTF-8" in errors["bad-utf8"]
    assert "JSON" in errors["bad.jsonl:10"]
    assert rows["huge"]["truncated"] and rows["huge"]["input_tokens"] == 64 and rows["huge"]["error"] is None
    assert rows["good-1"]["prediction"] is not None and rows["good-1"]["output_tokens"] > 0
    assert summary.errors_now == 7


def test_duplicate_ids_stop_the_job_before_decoding(ray_local, saved_tiny_pair, tmp_path):
    pq.write_table(pa.table({"id": ["a", "b", "a"], "text": ["x", "y", "z"], "ref": ["", "", ""]}),
                   tmp_path / "dup.parquet")
    job = make_job(saved_tiny_pair, tmp_path / "dup.parquet", tmp_path / "out")
    with pytest.raises(InputError, match=r"more than once.*'a' x2"):
        run_job(job)
    fs, path = open_filesystem(str(tmp_path / "out"))
    assert output_files(fs, path) == []


def test_missing_column_and_existing_output_are_refused(ray_local, saved_tiny_pair, tmp_path):
    write_shards(str(tmp_path / "in"), 4, 1)
    with pytest.raises(InputError, match="input.text_column 'body'"):
        run_job(make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", input={"text_column": "body"}))
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out")
    run_job(job)
    with pytest.raises(OutputExistsError):
        run_job(make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", output={"mode": "error"}))


def test_resume_decodes_only_missing_ids_after_a_limit(ray_local, saved_tiny_pair, tmp_path):
    ids = write_shards(str(tmp_path / "in"), 12, 4)
    first = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", input={"limit": 5})
    assert run_job(first).decoded_now == 5
    done_first = set(output_rows(first).column("id").to_pylist())
    rest = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", output={"mode": "resume"})
    summary = run_job(rest)
    assert summary.decoded_now == 7 and summary.skipped_existing == 5
    # The summary's BiLD rates are over this run's records only.
    now = [row for row in output_rows(rest).to_pylist() if row["id"] not in done_first]
    tokens = sum(row["output_tokens"] for row in now)
    assert summary.output_tokens_now == tokens > 0
    assert summary.small_share == pytest.approx(sum(row["small_tokens"] for row in now) / tokens)
    assert summary.fallbacks_per_100_tokens == pytest.approx(100 * sum(row["fallbacks"] for row in now) / tokens)
    assert summary.rollbacks_per_100_tokens == pytest.approx(100 * sum(row["rollbacks"] for row in now) / tokens)
    assert_one_row_per_id(output_rows(rest), ids)
    manifest = json.loads((tmp_path / "out" / "run.json").read_text())
    assert [a["to_decode"] for a in manifest["attempts"]] == [5, 7]


def _readable_rows(data_dir: Path) -> int:
    rows = 0
    for file in data_dir.glob("*.parquet"):
        try:
            rows += pq.read_metadata(file).num_rows
        except Exception:  # noqa: BLE001 - torn by the kill: the rerun removes it
            pass
    return rows


def test_resume_after_the_job_is_killed_part_way(saved_tiny_pair, tmp_path):
    """Kill a running `bild-pipeline run` once some output exists, add a torn file, rerun."""
    ids = write_shards(str(tmp_path / "in"), 64, 16)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", decoding={"max_new_tokens": 24},
                   compute={"batch_size": 1}, output={"mode": "resume", "rows_per_file": 2})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job.model_dump()))
    command = [sys.executable, "-m", "pipeline.cli", "run", str(job_file)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    data_dir = tmp_path / "out" / "data"
    deadline = time.time() + 300  # Ray start-up and model loading are slow on a loaded 2-core machine
    while time.time() < deadline and not (data_dir.exists() and any(data_dir.glob("*.parquet"))):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # the whole job: driver, its embedded Ray, the workers
    process.wait()
    written = _readable_rows(data_dir)  # a write cut off by the kill may have left a torn file
    assert 0 < written < len(ids), f"the job should have been interrupted part-way ({written} rows)"
    (data_dir / "torn-write.parquet").write_bytes(b"PAR1 cut off")  # a file whose write was cut off

    result = subprocess.run(command + ["--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["skipped_existing"] == written and summary["decoded_now"] == len(ids) - written
    assert_one_row_per_id(read_output_table(str(tmp_path / "out")), ids)
    assert not (data_dir / "torn-write.parquet").exists()


def test_job_files_validate_and_name_the_bad_key(tmp_path):
    from click.testing import CliRunner

    from pipeline.cli import main

    good = {"name": "ok", "input": {"path": "in/"}, "models": {"small": "s", "large": "l"},
            "output": {"path": "out/"}}
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**good, "decodng": {"method": "bild"}}))
    (tmp_path / "range.yaml").write_text(yaml.safe_dump({**good, "decoding": {"temperature": -1}}))
    runner = CliRunner()
    assert runner.invoke(main, ["validate", str(tmp_path / "good.yaml")]).exit_code == 0
    typo = runner.invoke(main, ["validate", str(tmp_path / "typo.yaml")])
    assert typo.exit_code == 2 and "decodng: unknown key" in typo.output
    bad_range = runner.invoke(main, ["validate", str(tmp_path / "range.yaml")])
    assert bad_range.exit_code == 2 and "decoding.temperature" in bad_range.output
    override = runner.invoke(main, ["validate", str(tmp_path / "good.yaml"), "--set", "decoding.method=beam"])
    assert override.exit_code == 2 and "decoding.method" in override.output
    engine = runner.invoke(main, ["validate", str(tmp_path / "good.yaml"), "--set", "models.engine=fast"])
    assert engine.exit_code == 2 and "models.engine" in engine.output
    assert load_job(tmp_path / "good.yaml", ["models.engine=hf"]).models.engine == "hf"
    job = load_job(tmp_path / "good.yaml", ["decoding.method=large", "input.limit=100"])
    assert job.decoding.method == "large" and job.input.limit == 100
    run_bad = runner.invoke(main, ["run", str(tmp_path / "typo.yaml")])
    assert run_bad.exit_code == 2


def _decode_actor_pids() -> list[int]:
    """Processes of live decode actors (Ray titles them after the stage)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"MapBatches(DecodeStage)" in cmdline:
                pids.append(int(entry.name))
    return pids


def test_an_actor_that_dies_is_replaced_and_its_work_redone(ray_local, saved_tiny_pair, tmp_path):
    import threading

    ids = write_shards(str(tmp_path / "in"), 48, 8)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", decoding={"max_new_tokens": 24},
                   compute={"batch_size": 1}, output={"rows_per_file": 2})
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(summary=run_job(job)))
    worker.start()
    data_dir, killed = tmp_path / "out" / "data", []
    deadline = time.time() + 120
    while not killed and time.time() < deadline and worker.is_alive():
        if data_dir.exists() and any(data_dir.glob("*.parquet")):  # the actor is mid-job
            for pid in _decode_actor_pids():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)
    worker.join(timeout=300)
    assert killed, "the test must kill a decode actor while the job runs"
    assert outcome["summary"].records_in_output == len(ids)
    table = output_rows(job)
    assert_one_row_per_id(table, ids)
    assert table.column("error").null_count == table.num_rows
    assert len(set(table.column("worker").to_pylist())) >= 2  # the replacement actor finished the job


def test_a_job_prints_progress_lines_and_keeps_ray_quiet(ray_local, saved_tiny_pair, tmp_path):
    """Unless --verbose, a job's console is its progress lines and summary: Ray Data's operator
    tables stay in Ray's log files."""
    import io
    import logging

    from pipeline.jobs.console import Progress, quiet_ray

    ids = write_shards(str(tmp_path / "in"), 8, 2)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", compute={"actors": 1, "batch_size": 2},
                   output={"rows_per_file": 2})
    run_job(job, progress=True)
    assert logging.getLogger("ray.data").getEffectiveLevel() >= logging.WARNING  # quiet_ray ran
    fs, path = open_filesystem(str(tmp_path / "out"))
    stream = io.StringIO()
    progress = Progress(fs, path, total=len(ids), stream=stream)
    progress.seen.clear()  # count the finished run's files as if they had just been written
    assert progress._count() and progress.records == len(ids)
    progress._show()
    assert stream.getvalue().startswith(f"decoding: {len(ids)}/{len(ids)} records (100%)")
    quiet_ray(verbose=True)
    assert logging.getLogger("ray.data").getEffectiveLevel() == logging.INFO
    quiet_ray(verbose=False)
