"""The report at every batch size and against a paired baseline (issue 19's asks):

- per-actor throughput over busy time (the union of an actor's calls), not over the sum of its
  records' latencies, which counts a batch's time once per record;
- the job's method against report.baseline on the records decoded by both, with a paired
  bootstrap interval; the plots a BiLD user reads.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import sacrebleu

from pipeline.metrics import quality as q
from pipeline.metrics.summary import busy_seconds, per_actor_throughput

pytestmark = pytest.mark.slow


def batched_calls(workers=2, calls=3, rows=8, seconds=10.0) -> pa.Table:
    """Rows as a batch of `rows` records decodes them: every record's latency is about its call's time."""
    data = {"worker": [], "call_started_at": [], "call_seconds": [], "output_tokens": [], "latency_ms": [],
            "error": []}
    for w in range(workers):
        start = 1000.0 + w  # the actors start a second apart and run back to back
        for _ in range(calls):
            for _ in range(rows):
                data["worker"].append(f"host:{w}")
                data["call_started_at"].append(start)
                data["call_seconds"].append(seconds)
                data["output_tokens"].append(20)
                data["latency_ms"].append(1000 * seconds * 0.9)  # time in the batch
                data["error"].append(None)
            start += seconds
    return pa.table(data)


def test_busy_time_is_the_union_of_the_calls():
    assert busy_seconds([(0.0, 10.0, 5), (10.0, 5.0, 5), (30.0, 1.0, 5)]) == 16.0
    assert busy_seconds([(0.0, 10.0, 5), (5.0, 10.0, 5)]) == 15.0  # overlapping calls count once


def test_per_actor_rates_add_up_to_the_run_over_its_utilization_and_the_old_formula_does_not():
    table = batched_calls()
    wall = 32.0  # the run's wall time: the actors' 30 s of calls and a little around them
    found = per_actor_throughput(table, wall)
    tokens = sum(table["output_tokens"].to_pylist())
    overall = tokens / wall
    assert all(busy <= wall for busy in found["per_actor_busy_seconds"].values())
    assert sum(found["per_actor_output_tokens_per_s"].values()) == pytest.approx(overall / found["utilization"],
                                                                                 rel=0.10)
    # The formula before: tokens over the sum of the records' latencies (8 records share each call).
    old = per_actor_throughput(table.drop_columns(["call_started_at", "call_seconds"]), wall)
    assert old["per_actor_basis"].startswith("sum of record latencies")
    assert sum(old["per_actor_output_tokens_per_s"].values()) < 0.9 * overall / found["utilization"]


def test_paired_bootstrap_gives_the_sacrebleu_difference_and_an_interval_around_it():
    refs = ["the cat sat on the mat", "a dog runs in the park", "two men play football", "a woman reads a book"] * 20
    better, worse = list(refs), [r.replace("the", "a", 1) for r in refs]
    mine, theirs = (q.row_statistics("translation", texts, refs) for texts in (better, worse))
    found = q.paired_bootstrap("translation", mine, theirs)
    expected = sacrebleu.corpus_bleu(better, [refs]).score - sacrebleu.corpus_bleu(worse, [refs]).score
    assert found["bleu"]["delta"] == pytest.approx(expected)
    assert 0 < found["bleu"]["low"] <= found["bleu"]["delta"] <= found["bleu"]["high"]
    same = q.paired_bootstrap("translation", mine, mine)
    assert same["bleu"] == {"delta": 0.0, "low": 0.0, "high": 0.0}
    noise = q.paired_bootstrap("translation", mine, {k: v[np.random.default_rng(1).permutation(len(v))]
                                                        for k, v in mine.items()})
    assert noise["bleu"]["low"] <= 0.0 <= noise["bleu"]["high"]  # the same texts in another order: no difference


def test_a_job_with_a_paired_baseline_reports_speedup_quality_and_plots(ray_local, saved_tiny_pair, tmp_path):
    import pyarrow.parquet as pq

    from pipeline.io.storage import read_output_table
    from pipeline.jobs.report import build_report, result_line, write_report
    from pipeline.jobs.run import run_job
    from support.jobs import make_job
    from support.shards import SENTENCES

    ids = [f"r{i}" for i in range(10)]
    pq.write_table(pa.table({"id": ids, "text": [SENTENCES[i % len(SENTENCES)] for i in range(10)],
                             "ref": [SENTENCES[(i + 1) % len(SENTENCES)] for i in range(10)]}), tmp_path / "in.parquet")
    job = make_job(saved_tiny_pair, tmp_path / "in.parquet", tmp_path / "out", compute={"actors": 1, "batch_size": 4},
                   report={"baseline": "large", "baseline_records": 6})
    run_job(job)
    table = read_output_table(str(tmp_path / "out"))
    assert sorted(table["id"].to_pylist()) == ids  # one row per record: baseline rows are columns, not rows
    paired = {row["id"]: row for row in table.to_pylist() if row["baseline_method"] is not None}
    assert sorted(paired) == ids[:6] and all(row["baseline_latency_ms"] > 0 for row in paired.values())
    assert table["call_seconds"].null_count == 0

    summary, numeric = build_report(str(tmp_path / "out"))
    found = summary["paired_baseline"]
    assert found["method"] == "large" and found["records"] == 6 and found["latency_speedup"] > 0
    # Both sides' scores are sacrebleu's on the paired rows' own texts (the delta's sign and size are
    # checked on made-up texts below: these random outputs score about 0 on both sides).
    side = {"run": [paired[i]["prediction"] for i in ids[:6]], "baseline": [paired[i]["baseline_prediction"]
                                                                         for i in ids[:6]]}
    refs = [[paired[i]["reference"] for i in ids[:6]]]
    for name in ("run", "baseline"):
        assert found["quality"]["bleu"][name] == pytest.approx(sacrebleu.corpus_bleu(side[name], refs).score)
        assert found["quality"]["chrf"][name] == pytest.approx(sacrebleu.corpus_chrf(side[name], refs).score)
    for interval in found["quality"].values():
        assert interval["delta"] == pytest.approx(interval["run"] - interval["baseline"])
    assert set(summary["throughput"]["per_actor_busy_seconds"]) == set(table["worker"].to_pylist())
    written = {path.name for path in write_report(summary, numeric, tmp_path / "report")}
    assert {"small_share.png", "rates_vs_length.png", "latency_vs_length.png", "throughput_over_time.png"} <= written
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Against `large` on 6 paired records" in report and "95% interval" in report
    assert "![throughput_over_time](throughput_over_time.png)" in report
    assert "bild" in result_line(summary) and "x the speed of large on 6 paired records" in result_line(summary)


@pytest.mark.parametrize("plain_share, says_why", [(0.97, True), (0.5, True), (0.2, False), (None, False)])
def test_the_result_line_says_why_where_drafting_stepped_aside(plain_share, says_why):
    """A paired speed near 1x is read as a user reads it: where measured windows were 0 for most of the large
    model's steps, one clause says so and why, and points to the README's table."""
    from pipeline.jobs.report import result_line

    summary = {"records": {"total": 4, "errors": 0}, "quality": {"bleu": 30.0}, "method": "bild",
               "paired_baseline": {"label": "large", "latency_speedup": 0.99, "records": 4, "quality": {}},
               "bild": {} if plain_share is None else {"plain_step_share": plain_share}}
    line = result_line(summary)
    assert line.startswith("4 records, 0 errors, bleu 30.00; bild 0.99x the speed of large")
    assert ("drafting stepped aside" in line and "cache" in line and "README" in line) is says_why
    if says_why:
        assert f"for {plain_share:.0%} of large's steps" in line


REFERENCES = ["the cat sat on the mat", "a dog runs in the park", "two men play football in the rain",
              "a woman reads a book on the bench", "children build a sandcastle at the beach",
              "a man rides his bike to work", "musicians play on the stage tonight", "the sun sets over the hills",
              "an old man feeds the birds", "a girl paints a picture of the sea"]


def made_up_run(path, rows: list[dict]) -> None:
    """A finished run's output written by hand: one Parquet file in the output schema."""
    import pyarrow.parquet as pq

    from pipeline.io.schema import OUTPUT_SCHEMA
    from pipeline.io.storage import data_path, open_filesystem

    fs, base = open_filesystem(str(path))
    fs.makedirs(data_path(base), exist_ok=True)
    full = [{"method": "bild", "input_tokens": 5, "truncated": False, "output_tokens": 6, "small_tokens": 4,
             "large_tokens": 2, "latency_ms": 10.0, "job_name": "made-up", "worker": "host:1", "engine": "native",
             "call_started_at": 1000.0 + i, "call_seconds": 0.01, **row} for i, row in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(full, schema=OUTPUT_SCHEMA), f"{data_path(base)}/part-0.parquet")


def test_the_paired_quality_difference_is_sacrebleus_run_minus_baseline(tmp_path):
    """On texts whose baseline side is close to the references and whose run side is not, the report's
    paired difference is sacrebleu's corpus BLEU (and chrF) of the run minus the baseline's, on the paired
    records with a reference only: its sign says which side is better."""
    from pipeline.jobs.report import paired_baseline, read_run

    worse = [" ".join(ref.split()[::-1][:4]) for ref in REFERENCES]  # the run: words reversed and cut
    closer = [ref.replace("a ", "one ", 1) for ref in REFERENCES]  # the baseline: one word changed
    rows = [{"id": f"p{i}", "prediction": worse[i], "reference": ref, "baseline_method": "large",
             "baseline_prediction": closer[i], "baseline_output_tokens": 7, "baseline_latency_ms": 30.0}
            for i, ref in enumerate(REFERENCES)]
    rows += [{"id": "no-reference", "prediction": "x y", "reference": None, "baseline_method": "large",
              "baseline_prediction": "x y z", "baseline_output_tokens": 3, "baseline_latency_ms": 30.0},
             {"id": "unpaired", "prediction": "the cat", "reference": "the cat sat on the mat"}]
    made_up_run(tmp_path / "run", rows)

    found = paired_baseline(read_run(str(tmp_path / "run")), "translation")  # the report's paired_baseline
    assert found["records"] == 11 and found["records_scored"] == 10
    assert found["latency_speedup"] == pytest.approx(3.0)
    refs = [REFERENCES]
    expected = {"bleu": (sacrebleu.corpus_bleu(worse, refs).score, sacrebleu.corpus_bleu(closer, refs).score),
                "chrf": (sacrebleu.corpus_chrf(worse, refs).score, sacrebleu.corpus_chrf(closer, refs).score)}
    for name, (run, baseline) in expected.items():
        interval = found["quality"][name]
        assert (interval["run"], interval["baseline"]) == (pytest.approx(run), pytest.approx(baseline)), name
        assert interval["delta"] == pytest.approx(run - baseline) and interval["delta"] < -10, name
        assert interval["low"] <= interval["delta"] <= interval["high"] < 0, name


def test_the_baseline_must_differ_from_the_method():
    from pydantic import ValidationError

    from pipeline.jobs.schema import JobConfig

    base = {"name": "j", "input": {"path": "in/"}, "models": {"small": "s", "large": "l"}, "output": {"path": "o/"}}
    with pytest.raises(ValidationError, match="report.baseline must differ"):
        JobConfig.model_validate({**base, "decoding": {"method": "large"}, "report": {"baseline": "large"}})
    with pytest.raises(ValidationError, match="baseline"):
        JobConfig.model_validate({**base, "report": {"baseline": "beam"}})
