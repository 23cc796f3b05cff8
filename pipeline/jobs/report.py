"""`bild-pipeline report`: throughput, latency, quality and BiLD behaviour of a finished run.

No cluster: the run's Parquet files are read with pyarrow (run_rows.py), the numeric columns
(latency, token counts) in batches, summed as they stream by (metrics/totals.py). Quality is the sum of the statistics the actors wrote with each row
(`quality_stats`), scored once; rows without them (older runs) have theirs counted from the texts,
read in batches, so memory stays bounded however many rows the run has. The rows' flags are counted
and their worst rows listed. report_markdown.py words it all as report.md.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from pipeline.decoding.config import DRAFTING_METHODS
from pipeline.decoding.stats import DecodeStats
from pipeline.io.schema import NUMERIC_COLUMNS
from pipeline.jobs.report_language import language_rows
from pipeline.jobs.report_markdown import render_markdown, render_paired, result_line  # noqa: F401 - their home
from pipeline.jobs.run_rows import BATCH_ROWS, RunRows, read_run
from pipeline.metrics import quality as q
from pipeline.metrics.summary import run_summary
from pipeline.metrics.totals import FLAG_COLUMNS, RunTotals


def _scorable(batch: pa.Table, prediction: str, reference: str) -> pa.Table:
    """Rows that count for quality: decoded without error and with a reference."""
    keep = pc.and_(pc.is_null(batch["error"]), pc.and_(pc.is_valid(batch[prediction]), pc.is_valid(batch[reference])))
    return batch.filter(keep).select([prediction, reference]).rename_columns(["prediction", "reference"])


def _stat_names(task: str) -> list[str]:
    return [f"{name}_{i}" for name, width in q.stat_columns(task).items() for i in range(width)]


def _row_stats(batch: pa.Table, task: str) -> pa.Table:
    names = _stat_names(task)
    if batch.num_rows == 0:
        return pa.table({name: pa.array([], pa.float64()) for name in names + ["rows"]})
    stats = q.row_statistics(task, batch["prediction"].to_pylist(), batch["reference"].to_pylist())
    columns = {f"{name}_{i}": values[:, i] for name, values in stats.items() for i in range(values.shape[1])}
    columns["rows"] = np.ones(batch.num_rows)
    return pa.table(columns)


STATS_ROWS = 2048  # rows per call to the metric: sacrebleu holds every row's n-gram counters until it returns


def _summed_stats(task: str, predictions: list[str], references: list[str]) -> dict[str, np.ndarray]:
    """One batch's quality statistics, summed over its rows (in a worker process for large runs)."""
    sums = {name: np.zeros(width) for name, width in q.stat_columns(task).items()}
    for first in range(0, len(predictions), STATS_ROWS):
        chunk = slice(first, first + STATS_ROWS)
        for name, values in q.row_statistics(task, predictions[chunk], references[chunk]).items():
            sums[name] += values.sum(0)
    return sums


def _quality_sums(batches: Iterable[pa.Table], task: str, prediction: str = "prediction",
                  reference: str = "reference", workers: int = 1) -> tuple[dict[str, np.ndarray], int]:
    """(summed statistics by metric, rows) over tables with prediction/reference/error columns. With
    workers > 1 the batches' statistics (sacrebleu's per-sentence n-gram counts, about 0.3 ms a row)
    are counted in that many processes."""
    sums = {name: np.zeros(width) for name, width in q.stat_columns(task).items()}
    rows = 0

    def add(found: dict[str, np.ndarray]) -> None:
        for name, values in found.items():
            sums[name] += values

    scorable = (_scorable(batch, prediction, reference) for batch in batches)
    texts = ((b["prediction"].to_pylist(), b["reference"].to_pylist()) for b in scorable if b.num_rows)
    if workers <= 1:
        for predictions, references in texts:
            rows += len(predictions)
            add(_summed_stats(task, predictions, references))
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = []
            for predictions, references in texts:
                rows += len(predictions)
                pending.append(pool.submit(_summed_stats, task, predictions, references))
                if len(pending) >= 2 * workers:  # a bounded window: texts are read as they are counted
                    add(pending.pop(0).result())
            for future in pending:
                add(future.result())
    return sums, rows


def summed_quality(batches: Iterable[pa.Table], task: str, prediction: str = "prediction",
                   reference: str = "reference", workers: int = 1) -> tuple[dict, int]:
    """(scores, rows scored): statistics summed batch by batch, the score computed once."""
    sums, rows = _quality_sums(batches, task, prediction, reference, workers)
    return q.corpus_scores(task, sums, rows), rows


def _quality_workers(rows: int) -> int:
    """Processes for counting `rows` rows' statistics: one per core once they span several batches."""
    if rows <= 2 * BATCH_ROWS:
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


SCORABLE = pads.field("error").is_null() & pads.field("prediction").is_valid() & pads.field("reference").is_valid()


def run_quality(rows: RunRows, task: str, where: pads.Expression | None = None) -> tuple[dict, int]:
    """(scores, rows scored) of a run's predictions (those matching `where`: a sweep's point) against
    their references: the statistics its actors wrote (`quality_stats`) summed, and counted here only
    for rows without them (older runs)."""
    sums = {name: np.zeros(width) for name, width in q.stat_columns(task).items()}
    written = 0
    scorable = SCORABLE if where is None else SCORABLE & where
    uncounted = scorable
    if "quality_stats" in rows.columns:
        width = sum(q.stat_columns(task).values())
        complete = pc.equal(pc.list_value_length(pads.field("quality_stats")), width)
        for batch in rows.batches(["quality_stats"], where=scorable & complete):
            matrix = batch["quality_stats"].combine_chunks().flatten().to_numpy().reshape(-1, width)
            for name, values in q.stats_by_metric(task, matrix.sum(0)).items():
                sums[name] += values
            written += batch.num_rows
        uncounted = scorable & ~(pads.field("quality_stats").is_valid() & complete)
    todo = rows.dataset.count_rows(filter=uncounted)
    counted, counted_rows = _quality_sums(rows.batches(["prediction", "reference", "error"], where=uncounted), task,
                                          workers=_quality_workers(todo))
    total = {name: sums[name] + counted[name] for name in sums}
    return q.corpus_scores(task, total, written + counted_rows), written + counted_rows


def _numeric_table(rows: RunRows, extra: tuple[str, ...] = ()) -> pa.Table:
    """The run's numeric columns (no texts), plus any `extra` ones, at once (a sweep's few rows per point)."""
    return rows.table(rows.present((*NUMERIC_COLUMNS, *extra)))


def run_totals(rows: RunRows) -> RunTotals:
    """The run's numeric columns summed batch by batch: a run of any size in bounded memory."""
    totals = RunTotals()
    for batch in rows.batches(rows.present(NUMERIC_COLUMNS)):
        totals.add(batch)
    return totals


def _paired_rows(batch: pa.Table, task: str) -> pa.Table:
    """The rows the job also decoded with report.baseline, both without error: latencies, token
    counts, and (where there is a reference) each one's quality statistics, side by side."""
    names = _stat_names(task)
    keep = pc.and_(pc.and_(pc.is_null(batch["error"]), pc.is_null(batch["baseline_error"])),
                   pc.and_(pc.is_valid(batch["prediction"]), pc.is_valid(batch["baseline_prediction"])))
    batch = batch.filter(keep)
    scored = pc.is_valid(batch["reference"])
    columns = {"latency_ms": batch["latency_ms"], "baseline_latency_ms": batch["baseline_latency_ms"],
               "output_tokens": batch["output_tokens"], "baseline_output_tokens": batch["baseline_output_tokens"],
               "baseline_method": batch["baseline_method"], "scored": scored}
    rated = batch.filter(scored)
    for side, column in (("run", "prediction"), ("baseline", "baseline_prediction")):
        found = q.row_statistics(task, rated[column].to_pylist(), rated["reference"].to_pylist()) if rated.num_rows \
            else {}
        stats = np.zeros((batch.num_rows, len(names)))
        if rated.num_rows:
            stats[np.flatnonzero(np.asarray(scored.to_pylist(), bool))] = np.concatenate(list(found.values()), axis=1)
        columns.update({f"{side}_{name}": stats[:, i] for i, name in enumerate(names)})
    return pa.table(columns)


PAIRED_COLUMNS = ("prediction", "reference", "error", "latency_ms", "output_tokens", "baseline_method",
                  "baseline_prediction", "baseline_error", "baseline_output_tokens", "baseline_latency_ms")


def paired_baseline(rows: RunRows, task: str) -> dict | None:
    """The job's method against report.baseline on the records decoded by both (side by side on
    the same actors): speedup and the quality difference, each with a 95% paired bootstrap interval
    (the same resampling of records, quality.bootstrap), and both qualities. None when the run has
    no paired records."""
    if "baseline_prediction" not in rows.columns:
        return None
    raw = rows.table(rows.present(PAIRED_COLUMNS + ("engine", "quantize", "baseline_engine")),
                     where=pads.field("baseline_method").is_valid())
    table = _paired_rows(raw, task)
    if table.num_rows == 0:
        return None
    latency, baseline_latency = (np.asarray(table[c].to_pylist(), float) for c in ("latency_ms", "baseline_latency_ms"))
    first = {name: raw[name][0].as_py() for name in raw.column_names if name in ("engine", "quantize", "baseline_engine")}
    method = table["baseline_method"][0].as_py()
    engine = first.get("baseline_engine") or first.get("engine")
    found = {"method": method, "engine": engine, "label": baseline_label(method, engine, first.get("quantize")),
             "records": table.num_rows,
             "mean_latency_ms": float(latency.mean()), "baseline_mean_latency_ms": float(baseline_latency.mean()),
             "latency_speedup": float(baseline_latency.sum() / latency.sum()) if latency.sum() else None}
    if found["latency_speedup"] is not None:
        def speedup(pick: np.ndarray) -> dict[str, float]:  # the same ratio of sums, on the rows picked
            run = latency[pick].sum()
            return {"latency_speedup": float(baseline_latency[pick].sum() / run) if run else float("nan")}

        interval = q.bootstrap(len(latency), speedup)["latency_speedup"]
        found["latency_speedup_interval"] = {"low": interval["low"], "high": interval["high"]}
    scored = table.filter(table["scored"])
    found["records_scored"] = scored.num_rows
    if scored.num_rows:
        def stats(side: str) -> dict[str, np.ndarray]:
            return {name: np.stack([scored[f"{side}_{name}_{i}"].to_numpy() for i in range(width)], axis=1)
                    for name, width in q.stat_columns(task).items()}

        run, base = stats("run"), stats("baseline")
        scores = {side: q.corpus_scores(task, {k: v.sum(0) for k, v in values.items()}, scored.num_rows)
                  for side, values in (("run", run), ("baseline", base))}
        found["quality"] = {name: {"run": scores["run"][name], "baseline": scores["baseline"][name], **interval}
                            for name, interval in q.paired_bootstrap(task, run, base).items()}
    return found


def baseline_label(method: str, engine: str | None, quantize: str | None) -> str:
    """How a report names the paired baseline: the method, or e.g. "CTranslate2 int8 large" where
    report.baseline_engine ran it on CTranslate2 (the yardstick users would otherwise run)."""
    if engine != "ct2":
        return method
    return f"CTranslate2 {'int8 ' if quantize == 'int8' else ''}{method}"


def _job_started(manifest: dict | None) -> float | None:
    """When the run's first attempt started (Unix seconds), from run.json; None without one."""
    starts = [a.get("started_at") for a in (manifest or {}).get("attempts", []) if a.get("started_at")]
    return min(dt.datetime.fromisoformat(start).timestamp() for start in starts) if starts else None


def _wall_seconds(manifest: dict | None) -> float | None:
    if not manifest:
        return None
    walls = [a.get("summary", {}).get("wall_seconds") for a in manifest.get("attempts", [])]
    walls = [w for w in walls if w]
    return float(sum(walls)) if walls else None


def _agreement(run: RunRows, baseline: RunRows) -> dict:
    """Per-id comparison with a baseline run: exact matches, BLEU of run vs baseline, latencies."""
    columns = ["id", "prediction", "error", "latency_ms"]
    right = baseline.table(columns).rename_columns(["id", "baseline_prediction", "baseline_error", "baseline_latency_ms"])
    joined = run.table(columns).join(right, keys="id", join_type="inner")
    compared = joined.filter(pc.and_(pc.is_null(joined["error"]), pc.is_null(joined["baseline_error"])))
    rows = compared.num_rows
    if not rows:
        return {"rows_compared": 0}
    same = pc.sum(pc.cast(pc.equal(compared["prediction"], compared["baseline_prediction"]), pa.int64())).as_py()
    latency, baseline_latency = (pc.sum(compared[c]).as_py() for c in ("latency_ms", "baseline_latency_ms"))
    agreement_bleu, _ = summed_quality([compared], "translation", "prediction", "baseline_prediction")
    return {
        "rows_compared": rows,
        "exact_match_rate": same / rows,
        "bleu_vs_baseline": agreement_bleu.get("bleu"),
        "mean_latency_ms": latency / rows,
        "baseline_mean_latency_ms": baseline_latency / rows,
        "latency_speedup": baseline_latency / latency if latency else None,
    }


FLAGGED_ROWS = 5  # the worst rows report.md lists for each flag
EXCERPT_CHARS = 80  # of a listed row's prediction: its start and its end (where loops are)


def row_flags(rows: RunRows, totals: RunTotals) -> tuple[dict, dict[str, list[dict]]] | None:
    """(how many rows each flag marks, the worst FLAGGED_ROWS rows of each: id, output tokens, unknown
    tokens and a prediction excerpt). None for a run written before the rows carried flags."""
    if totals.flags is None:
        return None
    counts = {name: totals.flags[name] for name in ("rows_checked", "stopped_by_budget", "repetition",
                                                      "rows_with_unknown_tokens", "unknown_tokens")}
    # Worst first: for the loops and the budget stops, those that are both, then the longest; for unknown
    # tokens, the most. Ties by id.
    orders = {"stopped_by_budget": [("repetition", "descending"), ("output_tokens", "descending")],
              "repetition": [("stopped_by_budget", "descending"), ("output_tokens", "descending")],
              "unknown_tokens": [("unknown_tokens", "descending")]}
    wanted = {"stopped_by_budget": pads.field("stopped_by_budget"), "repetition": pads.field("repetition"),
              "unknown_tokens": pads.field("unknown_tokens") > 0}
    columns = ["id", "prediction", "output_tokens", *FLAG_COLUMNS]
    worst = {}
    for name, where in wanted.items():
        kept = None
        for batch in rows.batches(columns, where=where & pads.field("error").is_null()):
            both = batch if kept is None else pa.concat_tables([kept, batch])
            kept = both.take(pc.sort_indices(both, sort_keys=[*orders[name], ("id", "ascending")])[:FLAGGED_ROWS])
        worst[name] = [{"id": row["id"], "output_tokens": row["output_tokens"], "unknown_tokens": row["unknown_tokens"],
                        "prediction": _excerpt(row["prediction"] or "")} for row in (kept.to_pylist() if kept else [])]
    return counts, worst


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= EXCERPT_CHARS:
        return text
    half = (EXCERPT_CHARS - 3) // 2
    head, tail = text[:half], text[-half:]
    head = head.rsplit(" ", 1)[0] if " " in head else head  # whole words where the text has spaces
    tail = tail.split(" ", 1)[1] if " " in tail else tail
    return f"{head} … {tail}"


def build_report(run_path: str, *, baseline: str | None = None, task: str | None = None,
                 storage_options: dict | None = None) -> tuple[dict, RunTotals]:
    """(summary dict, the run's totals) for a run, optionally against a baseline run."""
    rows = read_run(run_path, storage_options)
    manifest = rows.manifest
    job = (manifest or {}).get("job", {})
    task = task or job.get("task") or "translation"
    totals = run_totals(rows)
    summary = {
        "run": run_path,
        "job_name": job.get("name"),
        "task": task,
        "method": (job.get("decoding") or {}).get("method"),
        "decoding": job.get("decoding"),
        "config_hash": (manifest or {}).get("config_hash"),
        **run_summary(totals, _wall_seconds(manifest), job.get("decoding") or None),
        "duplicate_rows_skipped": rows.duplicate_rows,
        "job_started": _job_started(manifest),
    }
    flags = row_flags(rows, totals)
    if flags:
        summary["flags"], summary["flagged_rows"] = flags
    languages = language_rows(rows, job)
    if languages:
        summary["languages"] = languages
    scores, scored = run_quality(rows, task)
    summary["quality"] = {"rows_scored": scored, "rows_without_reference": summary["records"]["total"]
                          - summary["records"]["with_reference"], **scores}
    summary["signatures"] = q.signatures(task)
    paired = paired_baseline(rows, task)
    if paired:
        summary["paired_baseline"] = paired
    if baseline:
        base_rows = read_run(baseline, storage_options)
        base_scores, _ = run_quality(base_rows, task)
        base_summary = run_summary(run_totals(base_rows), _wall_seconds(base_rows.manifest))
        comparison = {"run": baseline, **_agreement(rows, base_rows)}
        comparison["quality_delta"] = {k: scores[k] - base_scores[k] for k in scores if k in base_scores}
        mine, theirs = summary["throughput"].get("records_per_s"), base_summary["throughput"].get("records_per_s")
        comparison["throughput_speedup"] = mine / theirs if mine and theirs else None
        summary["baseline"] = comparison
    return summary, totals


def write_report(summary: dict, totals: RunTotals, out_dir: str | Path) -> list[Path]:
    """report.md, summary.json and the plots; the per-record plots draw a uniform sample of the decoded rows
    (totals.SAMPLE_ROWS), the per-actor ones every call."""
    from pipeline.metrics import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    ok = totals.sampled_rows()
    ok = ok.filter(pc.is_valid(ok["latency_ms"])) if ok is not None else None  # a row without timing: not plotted
    name = summary.get("job_name") or "run"
    if ok is not None and ok.num_rows:
        made.append(plots.latency_histogram(ok["latency_ms"].to_numpy(), out / "latency.png", f"{name}: latency per record"))
        made += _record_plots(ok, summary, out)
    per_actor = summary["throughput"].get("per_actor_output_tokens_per_s") or {}
    if per_actor:
        made.append(plots.actor_throughput(per_actor, out / "actors.png"))
    if totals.timed_rows:
        made.append(plots.throughput_over_time(totals.call_list(), out / "throughput_over_time.png",
                                               summary.get("job_started")))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    (out / "report.md").write_text(render_markdown(summary, [str(p) for p in made]))
    return [out / "summary.json", out / "report.md", *made]


def _record_plots(ok: pa.Table, summary: dict, out: Path) -> list[Path]:
    """BiLD's behaviour per record (records with output), and latency against length with the paired baseline."""
    from pipeline.metrics import plots

    made = []
    ok = ok.filter(pc.greater(ok["output_tokens"], 0))
    lengths = ok["output_tokens"].to_numpy().astype(float)
    if summary.get("method") in DRAFTING_METHODS and len(lengths):
        counters = ("output_tokens", "small_tokens", "fallbacks", "rollbacks", "draft_tokens", "deferrals")
        records = DecodeStats.per_record({name: ok[name].to_numpy() for name in counters if name in ok.column_names})
        made.append(plots.small_share_histogram(records.small_token_share, out / "small_share.png"))
        made.append(plots.rates_vs_length(lengths, records.fallbacks_per_100_tokens, records.rollbacks_per_100_tokens,
                                          out / "rates_vs_length.png"))
        if summary["method"] == "cascade":
            shares = records.deferral_share
            made.append(plots.deferral_share_histogram(shares[~np.isnan(shares)], out / "deferral_share.png"))
    series = {summary.get("method") or "run": (lengths, ok["latency_ms"].to_numpy())}
    paired = summary.get("paired_baseline")
    if paired and "baseline_latency_ms" in ok.column_names:
        both = ok.filter(pc.and_(pc.is_valid(ok["baseline_latency_ms"]), pc.is_null(ok["baseline_error"])))
        series[f"{paired['label']} (paired baseline)"] = (both["baseline_output_tokens"].to_numpy(),
                                                            both["baseline_latency_ms"].to_numpy())
    made.append(plots.latency_vs_length(series, out / "latency_vs_length.png"))
    return made
