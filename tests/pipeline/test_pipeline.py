"""The batch pipeline end to end on a real local Ray: formats, S3 (moto), bad input, progress lines
(resuming and recovering: test_pipeline_recovery.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.io.fragment_source import read_input
from pipeline.io.fragments import counted, plan_fragments, read_fragment
from pipeline.io.storage import InputError, input_files, open_filesystem, output_files
from pipeline.jobs import load_job
from pipeline.jobs.run import OutputExistsError, run_job
from pipeline.jobs.todo import input_fragments
from support.jobs import ENGINES, assert_one_row_per_id, engine_job, make_job, output_rows
from support.shards import SENTENCES, write_parquet_shards

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("engine", ENGINES)
def test_parquet_shards_from_and_to_s3(ray_local, saved_tiny_pair, s3_server, capsys, engine, ct2_cache):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server)
    fs.mkdir(f"bild-test-{engine}")
    ids = write_parquet_shards(f"s3://bild-test-{engine}/input/", 12, 3, s3_server)
    job = engine_job(engine, ct2_cache, saved_tiny_pair, f"s3://bild-test-{engine}/input/",
                     f"s3://bild-test-{engine}/runs/t1", input={"storage_options": s3_server},
                     output={"storage_options": s3_server})
    summary = run_job(job)
    table = output_rows(job)
    assert_one_row_per_id(table, ids)
    assert table.column("error").null_count == table.num_rows
    assert summary.decoded_now == 12 and summary.records_in_output == 12
    assert table.column("reference").to_pylist()[0].startswith("reference doc-")
    # Each row carries the quality statistics of its own texts, counted by the actor (the report sums them).
    from pipeline.metrics import quality as q

    found = q.stats_matrix("translation", q.row_statistics("translation", table.column("prediction").to_pylist(),
                                                           table.column("reference").to_pylist()))
    assert table.column("quality_stats").to_pylist() == found.tolist()
    assert set(table.column("job_name").to_pylist()) == {"test"}
    assert set(table.column("engine").to_pylist()) == {engine} and summary.engines == [engine]  # T5: native
    manifest = json.loads(fs.cat(f"bild-test-{engine}/runs/t1/run.json"))
    assert manifest["attempts"][-1]["summary"]["engines"] == [engine]
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


def test_every_format_reads_the_same_ids_with_their_positions_and_the_workers_check_them(ray_local, saved_tiny_pair,
                                                                                          tmp_path):
    """Ray Data's read tasks (read_input) and the id check's (read_fragment on the workers) see the same files and
    ids, odd ones included (ints, 7.0, "007", a bad JSONL line), each record with its file and row."""
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    pq.write_table(pa.table({"id": [3, 1], "text": ["a", "b"]}), parquet / "b.parquet")
    pq.write_table(pa.table({"id": [7.0, 2.5], "text": ["c", "d"]}), parquet / "a.parquet")
    for skipped in ("_SUCCESS.parquet", ".hidden.parquet", "notes.txt"):
        (parquet / skipped).write_text("not a shard")  # Ray Data skips these, and so must the ids
    csv = tmp_path / "in.csv"
    csv.write_text("id,text\n007,x\n8,y\n")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_bytes(b'{"id": 5, "text": "x"}\n\n{"id": "broken", \n{"text": "no id"}\n')
    expected = {"parquet": [("7", "a.parquet", 0), ("2.5", "a.parquet", 1), ("3", "b.parquet", 0), ("1", "b.parquet", 1)],
                "csv": [("007", "in.csv", 0), ("8", "in.csv", 1)],
                "jsonl": [("5", "in.jsonl", 0), ("in.jsonl:3", "in.jsonl", 1), (None, "in.jsonl", 2)]}
    for fmt, path in (("parquet", parquet), ("csv", csv), ("jsonl", jsonl)):
        config = make_job(saved_tiny_pair, path, tmp_path / "out", fmt=fmt, input={"reference_column": None}).input
        listing = input_files(config)
        fragments = plan_fragments(config, listing)
        if fmt != "parquet":  # a CSV or JSONL file is counted by the id check, which fails on this JSONL's
            fragments = counted(fragments, [len(expected[fmt])])
        read = read_input(listing[0], config, fragments, block_rows=1).take_all()
        assert [(row["id"], row["input_file"], row["input_row"]) for row in read] == expected[fmt], fmt
        if fmt == "jsonl":
            with pytest.raises(InputError, match="1 input record"):
                input_fragments(config, listing)
        else:
            checked = input_fragments(config, listing)
            ids = [i for fragment in checked for i in read_fragment(listing[0], config, fragment, ids_only=True)["id"]
                   .to_pylist()]
            assert ids == [i for i, _, _ in expected[fmt]], fmt
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no parquet files"):
        input_files(make_job(saved_tiny_pair, empty, tmp_path / "out").input)


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_input_file_completes_with_errors_only_on_bad_rows(ray_local, saved_tiny_pair, tmp_path, engine, ct2_cache):
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
    job = engine_job(engine, ct2_cache, saved_tiny_pair, tmp_path / "bad.jsonl", tmp_path / "out", fmt="jsonl",
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
    assert all(row["quality_stats"] is None for row in rows.values())  # errors and rows without a reference


def test_duplicate_ids_stop_the_job_before_decoding(ray_local, saved_tiny_pair, tmp_path):
    pq.write_table(pa.table({"id": ["a", "b", "a"], "text": ["x", "y", "z"], "ref": ["", "", ""]}),
                   tmp_path / "dup.parquet")
    job = make_job(saved_tiny_pair, tmp_path / "dup.parquet", tmp_path / "out")
    with pytest.raises(InputError, match=r"more than once.*'a' x2"):
        run_job(job)
    fs, path = open_filesystem(str(tmp_path / "out"))
    assert output_files(fs, path) == []


def test_missing_column_and_existing_output_are_refused(ray_local, saved_tiny_pair, tmp_path):
    write_parquet_shards(str(tmp_path / "in"), 4, 1)
    with pytest.raises(InputError, match="input.text_column 'body'"):
        run_job(make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", input={"text_column": "body"}))
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out")
    run_job(job)
    with pytest.raises(OutputExistsError):
        run_job(make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", output={"mode": "error"}))


def test_job_files_validate_and_name_the_bad_key(tmp_path):
    from click.testing import CliRunner

    from pipeline.cli import main

    good = {"name": "ok", "input": {"path": "in/"}, "models": {"small": "s", "large": "l"},
            "output": {"path": "out/"}}
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**good, "decodng": {"method": "bild"}}))
    (tmp_path / "range.yaml").write_text(yaml.safe_dump({**good, "decoding": {"temperature": -1}}))
    runner = CliRunner()
    assert runner.invoke(main, ["validate", "--schema-only", str(tmp_path / "good.yaml")]).exit_code == 0
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


# What Ray Data's operator tables and INFO logs print ("2026-01-01 10:00:00,000\tINFO streaming_executor.py ...").
RAY_DATA_CHATTER = r"\bINFO\b|Running Dataset|Execution plan|Starting execution|execution finished|Total Progress"


def test_a_job_prints_progress_lines_and_keeps_ray_quiet(ray_local, saved_tiny_pair, tmp_path, capfd, monkeypatch):
    """`bild-pipeline run JOB` (in this process, on ray_local): stderr holds its progress lines
    `decoding: N/TOTAL records (P%), ...` (and Ray's warnings, if any), stdout its summary; Ray Data's
    operator tables and INFO logs reach neither the command's streams nor the process's file descriptors.

    Progress prints every 5 s in a job; here every 0.2 s, so that a few seconds of decoding print
    several lines."""
    import logging
    import re

    from click.testing import CliRunner

    from pipeline.cli import main
    from pipeline.jobs.console import Progress, quiet_ray

    ids = write_parquet_shards(str(tmp_path / "in"), 24, 4)
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", decoding={"max_new_tokens": 16},
                   compute={"actors": 1, "batch_size": 1}, output={"rows_per_file": 2})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job.model_dump()))
    monkeypatch.setattr(Progress, "interval_seconds", 0.2)
    capfd.readouterr()  # what earlier tests left on the descriptors
    result = CliRunner().invoke(main, ["run", str(job_file)])
    outside = capfd.readouterr()
    assert result.exit_code == 0, result.output
    assert logging.getLogger("ray.data").getEffectiveLevel() >= logging.WARNING  # quiet_ray ran

    lines = [line for line in result.stderr.splitlines() if line.startswith("decoding: ")]  # Ray's warnings show
    assert lines, "no progress line: the job ended before the first one"
    done = []
    for line in lines:
        found = re.fullmatch(r"decoding: (\d+)/24 records \((\d+)%\), \d+ output tokens/s, ETA (\d+ s|-)", line)
        assert found, f"not a progress line: {line!r}"
        records, percent = int(found[1]), int(found[2])
        assert 0 < records <= len(ids) and percent == round(100 * records / len(ids))
        assert (found[3] == "-") == (records == len(ids))
        done.append(records)
    assert done == sorted(done)  # the count only grows
    summary = result.stdout.splitlines()
    assert summary[0] == f"job test: {len(ids)}/{len(ids)} records in {tmp_path / 'out'}"
    assert re.fullmatch(rf"  this run: {len(ids)} decoded \(0 errors\), 0 already done and skipped, [\d.]+ s",
                        summary[1])
    # Decoding over the actor's busy time beside end to end, whose start-up (Ray, loading) is its own figure.
    found = re.fullmatch(r"  throughput: decoding ([\d.]+) output tokens/s on 1 actor\(s\) \(busy ([\d.]+) s each on "
                         r"average\); end to end ([\d.]+) output tokens/s, [\d.]+ records/s \(([\d.]+) s, of which "
                         r"([\d.]+) s start-up\)", summary[2])
    assert found, summary[2]
    decoding, busy, end_to_end, total, startup = map(float, found.groups())
    assert decoding > end_to_end > 0 and 0 < busy < total and 0 < startup < total
    assert summary[3].startswith("  BiLD: ")
    assert summary[4] == "  engine: native" and len(summary) == 6
    assert re.fullmatch(r"  driver: peak memory \d+ MiB", summary[5]), summary[5]  # the driver's own, at any scale
    for stream in (result.output, outside.out, outside.err):
        assert not re.search(RAY_DATA_CHATTER, stream), f"Ray Data's output reached the console: {stream[-2000:]}"
    quiet_ray(verbose=True)
    assert logging.getLogger("ray.data").getEffectiveLevel() == logging.INFO
    quiet_ray(verbose=False)


def test_a_sampled_record_depends_on_its_id_and_seed_not_on_where_or_when_it_ran(ray_local, saved_tiny_pair,
                                                                                 tmp_path):
    """Sampling (decoding.do_sample) seeds each record from decoding.seed and its id (stage.record_seed):
    one record at a time in input order, and in batches of 4 from shuffled shards (each job on its own
    actor), give every record the output it gets decoded alone here; another seed changes some record's. With
    fixed windows: a sampled row's draws follow its windows, and measured ones (the default) follow the machine."""
    import random

    from pipeline.decoding import DecodingConfig, Generator, ModelPair
    from pipeline.stage import record_seed

    ids = write_parquet_shards(str(tmp_path / "in"), 8, 1)
    rows = pq.read_table(tmp_path / "in" / "shard-000.parquet").to_pylist()
    random.Random(0).shuffle(rows)
    (tmp_path / "shuffled").mkdir()
    for shard in range(4):  # the same records, in another order and in other shards
        pq.write_table(pa.Table.from_pylist(rows[shard::4]), tmp_path / "shuffled" / f"part-{shard}.parquet")
    sampling = {"do_sample": True, "temperature": 1.0, "max_new_tokens": 8, "seed": 7, "adaptive_draft": False}

    def outputs(input_dir: str, compute: dict) -> dict[str, tuple]:
        job = make_job(saved_tiny_pair, tmp_path / input_dir, tmp_path / f"out-{input_dir}", decoding=sampling,
                       compute=compute, output={"rows_per_file": 2})
        run_job(job)
        table = output_rows(job)
        assert_one_row_per_id(table, ids)
        assert table.column("error").null_count == table.num_rows
        return {row["id"]: (row["prediction"], row["output_tokens"]) for row in table.to_pylist()}

    alone = outputs("in", {"actors": 1, "batch_size": 1})
    batched = outputs("shuffled", {"actors": 1, "batch_size": 4, "records_per_call": 4})
    assert batched == alone

    pair = ModelPair.from_pretrained(*saved_tiny_pair, device="cpu")
    texts = {row["id"]: row["text"] for row in rows}

    def here(seed: int) -> dict[str, tuple]:
        config = DecodingConfig(method="bild", **{**sampling, "seed": seed})
        results = Generator(pair, config).generate([texts[key] for key in ids], [record_seed(seed, key) for key in ids])
        return {key: (result.prediction, result.stats.output_tokens) for key, result in zip(ids, results)}

    assert here(7) == alone
    assert any(other != alone[key] for key, other in here(8).items()), "another seed must change some output"
