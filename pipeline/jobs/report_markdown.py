"""The report's words: report.md from a report's summary dict (report.py builds it), and the one line
that states a run's result. Nothing here reads a run."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.jobs.report_language import render_languages

# One line for each row of the throughput table (report.md lists those its run has under the table).
THROUGHPUT_DEFINITIONS = {
    "wall_seconds": "the run's end-to-end time, summed over its attempts: from the job's start (Ray, reading the "
                    "input, loading the models included) until its output was written",
    "records_per_s": "records in the output (errors included) / wall_seconds",
    "output_tokens_per_s": "output tokens of the rows decoded without error / wall_seconds",
    "utilization": "the actors' mean busy time (the union of each one's decoding calls) / wall_seconds: the share "
                   "of the end-to-end time an actor spent decoding",
    "latency": "a record's time in its actor from joining the batch to leaving it, its encoder pass included; at "
               "batch size 1 that is its own decoding time, at a larger batch size it also covers the rows "
               "decoded beside it",
}

# The report's flags (the rows' stopped_by_budget, repetition and unknown_tokens columns), in its words.
FLAG_WORDS = {
    "stopped_by_budget": "stopped by the token budget (decoding.max_new_tokens reached without EOS)",
    "repetition": "with a repeating tail (the last n tokens or words, n <= 4, repeated 3 times in a row)",
    "unknown_tokens": "with source tokens the tokenizer does not know (they became its unknown token)",
}

# Which of a flag's rows report.md lists first (report.row_flags orders them so).
FLAG_ORDER = {"stopped_by_budget": "loops, then the longest outputs", "repetition":
              "those also cut off by the budget, then the longest outputs", "unknown_tokens": "most unknown tokens"}


def _fmt(value, digits=2):
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def render_markdown(summary: dict, plots: list[str]) -> str:
    fmt = _fmt
    lines = [f"# Report: {summary.get('job_name') or summary['run']}", "",
             f"run `{summary['run']}`, task {summary['task']}, method {summary.get('method')}, "
             f"engine {', '.join(summary.get('engines') or []) or 'not recorded'}, "
             f"config {summary.get('config_hash')}", "", "## Records", ""]
    records = summary["records"]
    lines += [f"{records['total']} records: {records['ok']} decoded, {records['errors']} errors, "
              f"{records['with_reference']} with a reference."
              + (f" {summary['duplicate_rows_skipped']} duplicate row(s) of ids already counted (a retried write) "
                 "skipped." if summary.get("duplicate_rows_skipped") else ""), "", "## Throughput and latency", "",
              "| measure | value |", "|---|---|"]
    throughput = summary["throughput"]
    shown = [key for key in throughput if not key.startswith("per_actor")]
    lines += [f"| {key} | {fmt(throughput[key])} |" for key in shown]
    for key, value in summary["latency_ms"].items():
        lines.append(f"| latency {key} (ms) | {fmt(value, 1)} |")
    if summary["latency_ms"]:
        shown.append("latency")
    lines += ["", *[f"- **{key}**: {THROUGHPUT_DEFINITIONS[key]}." for key in shown if key in THROUGHPUT_DEFINITIONS]]
    per_actor, busy = throughput.get("per_actor_output_tokens_per_s") or {}, throughput.get("per_actor_busy_seconds") or {}
    if per_actor:
        lines += ["", f"Per actor, over {throughput.get('per_actor_basis', 'its decoding time')}:", "",
                  "| actor | output tokens/s | busy seconds |", "|---|---|---|"]
        lines += [f"| {worker} | {rate:.1f} | {fmt(busy.get(worker, ''), 1)} |" for worker, rate in per_actor.items()]
    lines += ["", "## Quality", "", "| metric | value |", "|---|---|"]
    for key, value in summary["quality"].items():
        lines.append(f"| {key} | {fmt(value)} |")
    lines += ["", "Signatures: " + "; ".join(f"{k}: `{v}`" for k, v in summary["signatures"].items())]
    if summary["bild"]:
        lines += ["", "## BiLD behaviour", "", "| measure | value |", "|---|---|"]
        lines += [f"| {key} | {fmt(value, 3)} |" for key, value in summary["bild"].items()]
    if "flags" in summary:
        lines += ["", render_flags(summary["flags"], summary.get("flagged_rows") or {})]
    if "languages" in summary:
        lines += ["", render_languages(summary["languages"])]
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


def render_flags(flags: dict, flagged_rows: dict[str, list[dict]]) -> str:
    """The report's section on the rows' flags: how many rows each flag marks, and the worst of them."""
    counts = {"stopped_by_budget": flags["stopped_by_budget"], "repetition": flags["repetition"],
              "unknown_tokens": flags["rows_with_unknown_tokens"]}
    lines = ["## Flagged rows", "",
             f"Of the {flags['rows_checked']} rows decoded with flags: "
             + "; ".join(f"{n} {FLAG_WORDS[name]}" for name, n in counts.items())
             + f" ({flags['unknown_tokens']} unknown tokens in all)."]
    for name, shown in flagged_rows.items():
        if not shown:
            continue
        rows = f"{counts[name]} row" + ("s" if counts[name] != 1 else "")
        lines += ["", f"**{name}** ({rows}; {len(shown)} shown, {FLAG_ORDER[name]} first):", ""]
        for row in shown:
            detail = f"{row['unknown_tokens']} unknown token(s)" if name == "unknown_tokens" \
                else f"{row['output_tokens']} tokens"
            lines.append(f"- `{row['id']}` ({detail}): “{row['prediction']}”")
    return "\n".join(lines)


def render_paired(paired: dict, method: str | None) -> str:
    """The report's section on report.baseline's paired records."""
    baseline = paired["label"]
    interval = paired.get("latency_speedup_interval")
    spread = (f"95% interval [{interval['low']:.2f}, {interval['high']:.2f}], a paired bootstrap over records; "
              if interval else "")
    lines = [f"## Against `{baseline}` on {paired['records']} paired records", "",
             f"Each of these records was decoded by `{method}` and by `{baseline}` side by side on the same "
             f"actor (report.baseline); the baseline rows are not part of the run's output.", "",
             f"**`{method}` is {paired['latency_speedup']:.2f}x the speed of `{baseline}`** ({spread}mean latency "
             f"{paired['mean_latency_ms']:.1f} vs {paired['baseline_mean_latency_ms']:.1f} ms per record).", ""]
    if paired.get("quality"):
        lines += [f"Quality on the {paired['records_scored']} records with a reference; the difference's 95% interval "
                  "is a paired bootstrap over records (1,000 resamples, sacrebleu's paired-bs method):", "",
                  f"| metric | `{method}` | `{baseline}` | difference | 95% interval |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {v['run']:.2f} | {v['baseline']:.2f} | {v['delta']:+.2f} | [{v['low']:+.2f}, {v['high']:+.2f}] |"
                  for name, v in paired["quality"].items()]
    return "\n".join(lines)


# A drafting run whose measured windows were 0 for at least this share of the large model's steps stepped aside:
# drafting could not pay there, and the result line says why.
STEPPED_ASIDE = 0.5


def result_line(summary: dict) -> str:
    """The one line that states a run's result (what `make demo` ends with); where measured drafting stepped
    aside, a clause says why, as a user reads a paired speed near 1x."""
    records = summary["records"]
    quality = ", ".join(f"{k} {v:.2f}" for k, v in summary["quality"].items() if isinstance(v, float))
    line = f"{records['total']} records, {records['errors']} errors, {quality or 'no references'}"
    paired = summary.get("paired_baseline")
    if paired:
        baseline = paired["label"]
        line += f"; {summary.get('method')} {paired['latency_speedup']:.2f}x the speed of {baseline}"
        first = next(iter(paired.get("quality", {}).items()), None)
        if first:
            name, v = first
            line += f" on {paired['records']} paired records, {name} {v['delta']:+.2f} [{v['low']:+.2f}, {v['high']:+.2f}]"
    plain = (summary.get("bild") or {}).get("plain_step_share") or 0.0
    if plain >= STEPPED_ASIDE:
        line += (f"; drafting stepped aside for {plain:.0%} of large's steps, measured slower here (a large model "
                 "that sits in the CPU's cache, as the demo's does, verifies k drafts for about k of its steps: "
                 "README, \"What it buys\")")
    return line
