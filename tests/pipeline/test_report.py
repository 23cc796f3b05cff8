"""`report`: metric values against sacrebleu / rouge-score computed directly, S3, missing references,
errored rows, and a baseline comparison. Runs are written by hand so the expected values are known."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sacrebleu
from rouge_score import rouge_scorer

from pipeline.io.storage import open_filesystem
from pipeline.jobs.report import build_report, write_report
from pipeline.io.schema import OUTPUT_SCHEMA

pytestmark = pytest.mark.slow

PREDICTIONS = ["A dog runs across the grass.", "Two men are playing football in a park.",
               "A woman in a red hat reads a book.", "Children build a sand castle on the beach.",
               "A man rides his bicycle through the city.", "The musicians play on stage."]
REFERENCES = ["A dog is running over the meadow.", "Two men play soccer in the park.",
              "A woman with a red hat is reading a book.", "Kids are building a sandcastle at the beach.",
              "A man cycles through the town.", "Musicians are playing on a stage in front of a crowd."]


def write_run(url, rows, task="translation", method="bild", storage_options=None, wall_seconds=2.0):
    fs, path = open_filesystem(url, storage_options)
    fs.makedirs(f"{path}/data", exist_ok=True)
    full = [{**{name: None for name in OUTPUT_SCHEMA.names}, "method": method, "worker": "host:1",
             "input_tokens": 5, "truncated": False, **row} for row in rows]
    with fs.open(f"{path}/data/part-0.parquet", "wb") as handle:
        pq.write_table(pa.Table.from_pylist(full, schema=OUTPUT_SCHEMA), handle)
    manifest = {"job": {"name": "t", "task": task, "decoding": {"method": method}}, "config_hash": "abc",
                "attempts": [{"summary": {"wall_seconds": wall_seconds}}]}
    with fs.open(f"{path}/run.json", "w") as handle:
        json.dump(manifest, handle)


def ok_row(i, prediction, reference, latency=10.0, tokens=10, small=8):
    return {"id": str(i), "prediction": prediction, "reference": reference, "latency_ms": latency,
            "output_tokens": tokens, "small_tokens": small, "large_tokens": tokens - small, "fallbacks": 1,
            "rollbacks": 1, "small_calls": 10, "large_calls": 2, "draft_tokens": small + 1}


def test_translation_scores_equal_sacrebleu_with_missing_references_and_errors(tmp_path):
    rows = [ok_row(i, p, r) for i, (p, r) in enumerate(zip(PREDICTIONS, REFERENCES))]
    rows.append(ok_row(6, "No reference here.", None))
    rows.append({"id": "7", "error": "input text is empty", "reference": "Something."})
    rows.append({"id": "8", "error": "RuntimeError: CUDA out of memory", "reference": "Else."})
    write_run(tmp_path / "run", rows)
    summary, numeric = build_report(str(tmp_path / "run"))
    assert summary["quality"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)
    assert summary["quality"]["chrf"] == pytest.approx(sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES]).score)
    assert summary["quality"]["rows_scored"] == 6 and summary["quality"]["rows_without_reference"] == 1
    assert summary["records"] == {"total": 9, "ok": 7, "errors": 2, "with_reference": 8}
    assert summary["errors"]["by_kind"]["RuntimeError"]["count"] == 1
    assert summary["bild"]["small_token_share"] == pytest.approx(0.8)
    assert summary["bild"]["discarded_per_100_tokens"] == pytest.approx(10.0)
    assert summary["throughput"]["records_per_s"] == pytest.approx(9 / 2.0)
    assert "nrefs:1" in summary["signatures"]["bleu"]
    files = write_report(summary, numeric, tmp_path / "report")
    assert {f.name for f in files} >= {"summary.json", "report.md", "latency.png"}
    assert "bleu" in (tmp_path / "report" / "report.md").read_text()


def test_summarization_scores_equal_rouge_score(tmp_path):
    rows = [ok_row(i, p + " It was sunny.", r + " The sun shone.") for i, (p, r) in
            enumerate(zip(PREDICTIONS, REFERENCES))]
    write_run(tmp_path / "run", rows, task="summarization")
    summary, _ = build_report(str(tmp_path / "run"))
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    for name in ("rouge1", "rouge2", "rougeL"):
        expected = np.mean([100 * scorer.score(r["reference"], r["prediction"])[name].fmeasure for r in rows])
        assert summary["quality"][name] == pytest.approx(expected)
    lsum = np.mean([100 * scorer.score(r["reference"].replace(". ", ".\n"),
                                       r["prediction"].replace(". ", ".\n"))["rougeLsum"].fmeasure for r in rows])
    assert summary["quality"]["rougeLsum"] == pytest.approx(lsum)


def test_report_of_a_run_in_s3_against_a_baseline(s3_server, tmp_path):
    import s3fs

    s3fs.S3FileSystem(**s3_server).mkdir("reports")
    base = [ok_row(i, r, r, latency=30.0, small=0) for i, r in enumerate(REFERENCES)]
    run = [ok_row(i, PREDICTIONS[i] if i < 2 else REFERENCES[i], REFERENCES[i], latency=10.0)
           for i in range(len(REFERENCES))]
    write_run("s3://reports/base", base, method="large", storage_options=s3_server, wall_seconds=6.0)
    write_run("s3://reports/run", run, storage_options=s3_server, wall_seconds=2.0)
    summary, _ = build_report("s3://reports/run", baseline="s3://reports/base", storage_options=s3_server)
    comparison = summary["baseline"]
    assert comparison["rows_compared"] == 6
    assert comparison["exact_match_rate"] == pytest.approx(4 / 6)
    assert comparison["latency_speedup"] == pytest.approx(3.0)
    assert comparison["throughput_speedup"] == pytest.approx(3.0)
    run_predictions = [r["prediction"] for r in run]
    assert comparison["bleu_vs_baseline"] == pytest.approx(sacrebleu.corpus_bleu(run_predictions, [REFERENCES]).score)
    assert comparison["quality_delta"]["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(run_predictions, [REFERENCES]).score - 100.0)


def test_quality_summed_over_batches_and_processes_equals_sacrebleu(tmp_path, monkeypatch):
    """Large runs stream their texts in batches and count statistics in several processes: the
    corpus scores are still sacrebleu's on all rows at once."""
    from pipeline.jobs import run_rows
    from pipeline.jobs.report import run_quality, summed_quality

    predictions, references = PREDICTIONS * 5, REFERENCES[1:] * 5 + REFERENCES[:1] * 5
    rows = [ok_row(i, p, r) for i, (p, r) in enumerate(zip(predictions, references))]
    write_run(tmp_path / "run", rows)
    monkeypatch.setattr(run_rows, "BATCH_ROWS", 4)
    run = run_rows.read_run(str(tmp_path / "run"))
    assert len(list(run.batches(["prediction"]))) == 8
    expected = {"bleu": sacrebleu.corpus_bleu(predictions, [references]).score,
                "chrf": sacrebleu.corpus_chrf(predictions, [references]).score}
    for workers in (1, 2):
        scores, scored = summed_quality(run.batches(["prediction", "reference", "error"]), "translation", workers=workers)
        assert scored == 30 and scores == pytest.approx(expected)
    assert run_quality(run, "translation")[0] == pytest.approx(expected)


def test_a_run_whose_files_differ_in_columns_is_read_whole(tmp_path):
    """A resumed run's older files may lack columns a newer version writes (here `quantize` and the
    paired-baseline columns): every file's rows count, the missing values read as nulls."""
    write_run(tmp_path / "run", [{**ok_row(i, PREDICTIONS[i], REFERENCES[i]), "quantize": "int8"} for i in range(3)])
    old_schema = pa.schema([f for f in OUTPUT_SCHEMA if f.name != "quantize" and not f.name.startswith("baseline_")])
    old = [{**{name: None for name in old_schema.names}, "method": "bild", "worker": "host:2", "input_tokens": 5,
            **ok_row(i, PREDICTIONS[i], REFERENCES[i])} for i in range(3, 6)]
    pq.write_table(pa.Table.from_pylist(old, schema=old_schema), tmp_path / "run" / "data" / "a-old.parquet")
    summary, totals = build_report(str(tmp_path / "run"))
    sample = totals.sampled_rows()
    assert summary["records"]["total"] == 6 and sample.num_rows == 6
    assert sample["quantize"].to_pylist().count("int8") == 3  # the newer file's column, though listed second
    assert summary["quality"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)


def test_the_report_command_starts_no_ray(tmp_path):
    """`bild-pipeline report` reads the run with pyarrow: Ray is not even imported."""
    import subprocess
    import sys

    write_run(tmp_path / "run", [ok_row(i, p, r) for i, (p, r) in enumerate(zip(PREDICTIONS, REFERENCES))])
    code = ("import sys; from pipeline.cli import main\n"
            f"main(['report', {str(tmp_path / 'run')!r}], standalone_mode=False)\n"
            "assert 'ray' not in sys.modules, 'the report imported ray'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "6 records, 0 errors, bleu" in done.stdout


def _with_stats(rows, task="translation"):
    """The rows with the quality_stats an actor writes (metrics.quality's layout)."""
    from pipeline.metrics import quality as q

    stats = q.stats_matrix(task, q.row_statistics(task, [r["prediction"] for r in rows], [r["reference"] for r in rows]))
    return [{**row, "quality_stats": values.tolist()} for row, values in zip(rows, stats)]


def test_the_report_sums_the_statistics_rows_carry_and_counts_only_the_rest(tmp_path, monkeypatch):
    """Rows written with quality_stats are summed as they are (the texts are not read again); rows
    without them (an older run's), or with statistics of another width, are counted from their texts.
    Either way the scores are sacrebleu's on all rows."""
    from pipeline.jobs import report
    from pipeline.metrics import quality as q

    rows = [ok_row(i, p, r) for i, (p, r) in enumerate(zip(PREDICTIONS, REFERENCES))]
    carried = _with_stats(rows[:4])
    carried[3]["quality_stats"] = carried[3]["quality_stats"][:5]  # another layout: counted again
    write_run(tmp_path / "run", carried + rows[4:])
    counted = []
    real = q.row_statistics
    monkeypatch.setattr(q, "row_statistics", lambda task, p, r: counted.extend(p) or real(task, p, r))
    summary, _ = report.build_report(str(tmp_path / "run"))
    assert sorted(counted) == sorted([PREDICTIONS[3], *PREDICTIONS[4:]])
    assert summary["quality"]["rows_scored"] == 6
    assert summary["quality"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)
    assert summary["quality"]["chrf"] == pytest.approx(sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES]).score)


def test_carried_statistics_are_what_the_report_scores(tmp_path):
    """The column is not decoration: statistics of other texts than the row's give those texts' score."""
    from pipeline.jobs.report import build_report

    rows = [ok_row(i, p, r) for i, (p, r) in enumerate(zip(PREDICTIONS, REFERENCES))]
    perfect = _with_stats([{**row, "prediction": row["reference"]} for row in rows])
    write_run(tmp_path / "run", [{**row, "quality_stats": stats["quality_stats"]} for row, stats in zip(rows, perfect)])
    summary, _ = build_report(str(tmp_path / "run"))
    assert summary["quality"]["bleu"] == pytest.approx(100.0)


def test_the_report_benchmark_script_runs_and_both_scoring_paths_agree(tmp_path):
    """scripts/bench_report.py (the million-row figure in docs/reports.md), at a small size: it runs, and
    the report of rows that carry quality_stats and of the same rows without them give the same scores."""
    import runpy
    import subprocess
    import sys

    from support import REPO

    script = REPO / "scripts" / "bench_report.py"
    done = subprocess.run([sys.executable, str(script), "--rows", "2000"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2000 records" in done.stdout and "MiB peak resident memory" in done.stdout
    made_up_run = runpy.run_path(str(script))["made_up_run"]
    scores = {}
    for row_stats in (True, False):
        made_up_run(tmp_path / str(row_stats), 3000, references=True, row_stats=row_stats)
        scores[row_stats] = build_report(str(tmp_path / str(row_stats)))[0]["quality"]
    assert scores[True] == pytest.approx(scores[False]) and scores[True]["rows_scored"] > 2900


def test_a_cascade_run_reports_its_deferral_rate_and_plots_it_per_record(tmp_path):
    from pipeline.jobs.report import build_report, write_report

    rows = [{**ok_row(i, p, r), "draft_tokens": 10, "deferrals": d}
            for i, (p, r, d) in enumerate(zip(PREDICTIONS, REFERENCES, (0, 2, 4, 6, 8, 10)))]
    write_run(tmp_path / "run", rows, method="cascade")
    summary, numeric = build_report(str(tmp_path / "run"))
    assert summary["bild"]["deferral_share"] == pytest.approx(30 / 60)
    files = write_report(summary, numeric, tmp_path / "report")
    assert "deferral_share.png" in {f.name for f in files}
    assert "| deferral_share | 0.500 |" in (tmp_path / "report" / "report.md").read_text()


def test_a_run_with_adaptive_windows_reports_its_steps_without_drafting(tmp_path):
    from pipeline.jobs.report import build_report, write_report

    rows = [{**ok_row(i, p, r), "large_calls": 4, "plain_steps": s}
            for i, (p, r, s) in enumerate(zip(PREDICTIONS, REFERENCES, (0, 1, 2, 3, 4, 2)))]
    write_run(tmp_path / "run", rows, method="bild")
    summary, numeric = build_report(str(tmp_path / "run"))
    assert summary["bild"]["plain_steps"] == 12 and summary["bild"]["plain_step_share"] == pytest.approx(12 / 24)
    write_report(summary, numeric, tmp_path / "report")
    assert "| plain_step_share | 0.500 |" in (tmp_path / "report" / "report.md").read_text()
