"""`bild-pipeline report`: throughput, latency, quality and BiLD behaviour of a finished run.

Texts never travel to the driver: per-row quality statistics are computed in Ray Data tasks and
summed there; the driver receives sums and the numeric columns (latency, token counts).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decoding.stats import DecodeStats
from pipeline.io.schema import NUMERIC_COLUMNS
from pipeline.io.storage import arrow_filesystem, data_path, output_filesystem, output_files, read_manifest
from pipeline.metrics import quality as q
from pipeline.metrics.summary import run_summary


def read_run(run_path: str, storage_options: dict | None = None):
    """(Ray dataset of the run's rows, its run.json manifest or None)."""
    import ray.data

    fs, path = output_filesystem(run_path, storage_options)
    if not output_files(fs, path):
        raise FileNotFoundError(f"{run_path}: no output rows (expected Parquet files under {data_path(run_path)})")
    dataset = ray.data.read_parquet(data_path(path), filesystem=arrow_filesystem(fs))
    return dataset, read_manifest(fs, path)


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


def summed_quality(dataset, task: str, prediction: str = "prediction", reference: str = "reference"):
    """(scores, rows scored) for a dataset with prediction/reference/error columns."""
    stats = dataset.map_batches(
        partial(_scorable, prediction=prediction, reference=reference), batch_format="pyarrow"
    ).map_batches(partial(_row_stats, task=task), batch_format="pyarrow")
    sums = _column_sums(stats, _stat_names(task) + ["rows"])
    rows = int(sums.get("rows", 0) or 0)
    grouped = {name: np.asarray([sums.get(f"{name}_{i}", 0.0) or 0.0 for i in range(width)])
               for name, width in q.stat_columns(task).items()}
    return q.corpus_scores(task, grouped, rows), rows


def _column_sums(dataset, columns: list[str]) -> dict[str, float]:
    """Sums of numeric columns computed on the cluster; an empty dataset sums to zeros."""
    found = dataset.sum(columns) or {}
    return {column: float(found.get(f"sum({column})") or 0.0) for column in columns}


def _numeric_table(dataset, extra: tuple[str, ...] = ()) -> pa.Table:
    """The run's numeric columns (no texts) on the driver, plus any `extra` ones."""
    present = [c for c in (*NUMERIC_COLUMNS, *extra) if c in dataset.schema().names]
    batches = list(dataset.select_columns(present).iter_batches(batch_format="pyarrow"))
    return pa.concat_tables(batches) if batches else pa.table({c: [] for c in present})


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


def paired_baseline(dataset, task: str) -> dict | None:
    """The job's method against report.baseline on the records decoded by both (side by side on
    the same actors): speedup, both qualities and the quality difference with a 95% paired
    bootstrap interval. None when the run has no paired records."""
    if "baseline_prediction" not in dataset.schema().names:
        return None
    batches = list(dataset.map_batches(partial(_paired_rows, task=task), batch_format="pyarrow")
                   .iter_batches(batch_format="pyarrow"))
    table = pa.concat_tables(batches) if batches else None
    if table is None or table.num_rows == 0:
        return None
    latency, baseline_latency = (np.asarray(table[c].to_pylist(), float) for c in ("latency_ms", "baseline_latency_ms"))
    found = {"method": table["baseline_method"][0].as_py(), "records": table.num_rows,
             "mean_latency_ms": float(latency.mean()), "baseline_mean_latency_ms": float(baseline_latency.mean()),
             "latency_speedup": float(baseline_latency.sum() / latency.sum()) if latency.sum() else None}
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


def _wall_seconds(manifest: dict | None) -> float | None:
    if not manifest:
        return None
    walls = [a.get("summary", {}).get("wall_seconds") for a in manifest.get("attempts", [])]
    walls = [w for w in walls if w]
    return float(sum(walls)) if walls else None


def _agreement(run, baseline) -> dict:
    """Per-id comparison with a baseline run: exact matches, BLEU of run vs baseline, latencies."""
    left = run.select_columns(["id", "prediction", "error", "latency_ms"])
    right = baseline.select_columns(["id", "prediction", "error", "latency_ms"]).rename_columns(
        {"prediction": "baseline_prediction", "error": "baseline_error", "latency_ms": "baseline_latency_ms"}
    )
    joined = left.join(right, join_type="inner", num_partitions=4, on=("id",))

    def compare(batch: pa.Table) -> pa.Table:
        both = pc.and_(pc.is_null(batch["error"]), pc.is_null(batch["baseline_error"]))
        batch = batch.filter(both)
        return pa.table({
            "same": pc.cast(pc.equal(batch["prediction"], batch["baseline_prediction"]), pa.int64()),
            "latency_ms": batch["latency_ms"],
            "baseline_latency_ms": batch["baseline_latency_ms"],
            "prediction": batch["prediction"],
            "baseline_prediction": batch["baseline_prediction"],
            "error": pa.nulls(batch.num_rows, pa.string()),
        })

    compared = joined.map_batches(compare, batch_format="pyarrow").materialize()
    rows = compared.count()
    if not rows:
        return {"rows_compared": 0}
    sums = _column_sums(compared, ["same", "latency_ms", "baseline_latency_ms"])
    agreement_bleu, _ = summed_quality(compared, "translation", "prediction", "baseline_prediction")
    return {
        "rows_compared": rows,
        "exact_match_rate": sums["same"] / rows,
        "bleu_vs_baseline": agreement_bleu.get("bleu"),
        "mean_latency_ms": sums["latency_ms"] / rows,
        "baseline_mean_latency_ms": sums["baseline_latency_ms"] / rows,
        "latency_speedup": sums["baseline_latency_ms"] / sums["latency_ms"] if sums["latency_ms"] else None,
    }


def build_report(run_path: str, *, baseline: str | None = None, task: str | None = None,
                 storage_options: dict | None = None) -> tuple[dict, pa.Table]:
    """(summary dict, numeric table of the run) for a run, optionally against a baseline run."""
    dataset, manifest = read_run(run_path, storage_options)
    job = (manifest or {}).get("job", {})
    task = task or job.get("task") or "translation"
    numeric = _numeric_table(dataset)
    summary = {
        "run": run_path,
        "job_name": job.get("name"),
        "task": task,
        "method": (job.get("decoding") or {}).get("method"),
        "decoding": job.get("decoding"),
        "config_hash": (manifest or {}).get("config_hash"),
        **run_summary(numeric, _wall_seconds(manifest)),
    }
    scores, scored = summed_quality(dataset, task)
    summary["quality"] = {"rows_scored": scored, "rows_without_reference": summary["records"]["total"]
                          - summary["records"]["with_reference"], **scores}
    summary["signatures"] = q.signatures(task)
    paired = paired_baseline(dataset, task)
    if paired:
        summary["paired_baseline"] = paired
    if baseline:
        base_dataset, base_manifest = read_run(baseline, storage_options)
        base_numeric = _numeric_table(base_dataset)
        base_scores, _ = summed_quality(base_dataset, task)
        base_summary = run_summary(base_numeric, _wall_seconds(base_manifest))
        comparison = {"run": baseline, **_agreement(dataset, base_dataset)}
        comparison["quality_delta"] = {k: scores[k] - base_scores[k] for k in scores if k in base_scores}
        mine, theirs = summary["throughput"].get("records_per_s"), base_summary["throughput"].get("records_per_s")
        comparison["throughput_speedup"] = mine / theirs if mine and theirs else None
        summary["baseline"] = comparison
    return summary, numeric


def render_markdown(summary: dict, plots: list[str]) -> str:
    def fmt(value, digits=2):
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = [f"# Report: {summary.get('job_name') or summary['run']}", "",
             f"run `{summary['run']}`, task {summary['task']}, method {summary.get('method')}, "
             f"engine {', '.join(summary.get('engines') or []) or 'not recorded'}, "
             f"config {summary.get('config_hash')}", "", "## Records", ""]
    records = summary["records"]
    lines += [f"{records['total']} records: {records['ok']} decoded, {records['errors']} errors, "
              f"{records['with_reference']} with a reference.", "", "## Throughput and latency", "",
              "| measure | value |", "|---|---|"]
    throughput = summary["throughput"]
    for key, value in throughput.items():
        if not key.startswith("per_actor"):
            lines.append(f"| {key} | {fmt(value)} |")
    for key, value in summary["latency_ms"].items():
        lines.append(f"| latency {key} (ms) | {fmt(value, 1)} |")
    lines += ["", "Latency is a record's time in its actor from joining the batch to leaving it, its encoder pass "
              "included; at batch size 1 that is the record's own decoding time, at a larger batch size it also "
              "covers the rows decoded beside it."]
    per_actor, busy = throughput.get("per_actor_output_tokens_per_s") or {}, throughput.get("per_actor_busy_seconds") or {}
    if per_actor:
        lines += ["", f"Per actor, over {throughput.get('per_actor_basis', 'its decoding time')}:", "",
                  "| actor | output tokens/s | busy seconds |", "|---|---|---|"]
        lines += [f"| {worker} | {rate:.1f} | {fmt(busy.get(worker, ''), 1)} |" for worker, rate in per_actor.items()]
    lines += ["", "## Quality", "", "| metric | value |", "|---|---|"]
    for key, value in summary["quality"].items():
        lines.append(f"| {key} | {fmt(value)} |")
    lines += ["", "Signatures: " + "; ".join(f"{k}: `{v}`" for k, v in summary["signatures"].items()), "",
              "## BiLD behaviour", "", "| measure | value |", "|---|---|"]
    lines += [f"| {key} | {fmt(value, 3)} |" for key, value in summary["bild"].items()]
    if "paired_baseline" in summary:
        lines += ["", render_paired(summary["paired_baseline"], summary.get("method"))]
    if "baseline" in summary:
        lines += ["", f"## Against baseline `{summary['baseline']['run']}`", "", "| measure | value |", "|---|---|"]
        for key, value in summary["baseline"].items():
            if key != "run":
                lines.append(f"| {key} | {fmt(value, 3) if not isinstance(value, dict) else json.dumps(value)} |")
    errors = summary["errors"]
    lines += ["", f"## Errors ({errors['count']})", ""]
    for kind, info in errors["by_kind"].items():
        lines.append(f"- **{kind}** x{info['count']}: " + "; ".join(f"`{m}`" for m in info["examples"]))
    lines += ["", *[f"![{Path(p).stem}]({Path(p).name})" for p in plots], ""]
    return "\n".join(lines)


def render_paired(paired: dict, method: str | None) -> str:
    """The report's section on report.baseline's paired records."""
    lines = [f"## Against `{paired['method']}` on {paired['records']} paired records", "",
             f"Each of these records was decoded by `{method}` and by `{paired['method']}` side by side on the same "
             f"actor (report.baseline); the baseline rows are not part of the run's output.", "",
             f"**`{method}` is {paired['latency_speedup']:.2f}x the speed of `{paired['method']}`** (mean latency "
             f"{paired['mean_latency_ms']:.1f} vs {paired['baseline_mean_latency_ms']:.1f} ms per record).", ""]
    if paired.get("quality"):
        lines += [f"Quality on the {paired['records_scored']} records with a reference; the difference's 95% interval "
                  "is a paired bootstrap over records (1,000 resamples, sacrebleu's paired-bs method):", "",
                  f"| metric | `{method}` | `{paired['method']}` | difference | 95% interval |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {v['run']:.2f} | {v['baseline']:.2f} | {v['delta']:+.2f} | [{v['low']:+.2f}, {v['high']:+.2f}] |"
                  for name, v in paired["quality"].items()]
    return "\n".join(lines)


def result_line(summary: dict) -> str:
    """The one line that states a run's result (what `make demo` ends with)."""
    records = summary["records"]
    quality = ", ".join(f"{k} {v:.2f}" for k, v in summary["quality"].items() if isinstance(v, float))
    line = f"{records['total']} records, {records['errors']} errors, {quality or 'no references'}"
    paired = summary.get("paired_baseline")
    if paired:
        line += f"; {summary.get('method')} {paired['latency_speedup']:.2f}x the speed of {paired['method']}"
        first = next(iter(paired.get("quality", {}).items()), None)
        if first:
            name, v = first
            line += f" on {paired['records']} paired records, {name} {v['delta']:+.2f} [{v['low']:+.2f}, {v['high']:+.2f}]"
    return line


def write_report(summary: dict, numeric: pa.Table, out_dir: str | Path) -> list[Path]:
    from pipeline.metrics import plots
    from pipeline.metrics.summary import actor_calls

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    ok = numeric.filter(pc.is_null(numeric["error"])) if numeric.num_rows else numeric
    name = summary.get("job_name") or "run"
    if ok.num_rows:
        made.append(plots.latency_histogram(ok["latency_ms"].to_numpy(), out / "latency.png", f"{name}: latency per record"))
        made += _record_plots(ok, summary, out)
    per_actor = summary["throughput"].get("per_actor_output_tokens_per_s") or {}
    if per_actor:
        made.append(plots.actor_throughput(per_actor, out / "actors.png"))
    if "call_started_at" in numeric.column_names and numeric["call_started_at"].null_count < numeric.num_rows:
        made.append(plots.throughput_over_time(actor_calls(numeric), out / "throughput_over_time.png"))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    (out / "report.md").write_text(render_markdown(summary, [str(p) for p in made]))
    return [out / "summary.json", out / "report.md", *made]


def _record_plots(ok: pa.Table, summary: dict, out: Path) -> list[Path]:
    """BiLD's behaviour per record (records with output), and latency against length with the paired baseline."""
    from pipeline.metrics import plots

    made = []
    ok = ok.filter(pc.greater(ok["output_tokens"], 0))
    lengths = ok["output_tokens"].to_numpy().astype(float)
    if summary.get("method") in ("bild", "speculative") and len(lengths):
        records = [DecodeStats.from_sums(row) for row in
                   ok.select(["output_tokens", "small_tokens", "fallbacks", "rollbacks"]).to_pylist()]
        made.append(plots.small_share_histogram([r.small_token_share for r in records], out / "small_share.png"))
        made.append(plots.rates_vs_length(lengths, [r.fallbacks_per_100_tokens for r in records],
                                          [r.rollbacks_per_100_tokens for r in records], out / "rates_vs_length.png"))
    series = {summary.get("method") or "run": (lengths, ok["latency_ms"].to_numpy())}
    paired = summary.get("paired_baseline")
    if paired and "baseline_latency_ms" in ok.column_names:
        both = ok.filter(pc.and_(pc.is_valid(ok["baseline_latency_ms"]), pc.is_null(ok["baseline_error"])))
        series[f"{paired['method']} (paired baseline)"] = (both["baseline_output_tokens"].to_numpy(),
                                                            both["baseline_latency_ms"].to_numpy())
    made.append(plots.latency_vs_length(series, out / "latency_vs_length.png"))
    return made
