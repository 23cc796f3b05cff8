"""Throughput, latency, BiLD behaviour and errors of a run, worded from its rows' totals (metrics/totals.py)."""

from __future__ import annotations

import pyarrow as pa

from pipeline.decoding.config import DRAFTING_METHODS
from pipeline.decoding.stats import DecodeStats
from pipeline.metrics.totals import RunTotals, decode_totals


# Which of bild_behaviour's rows apply to which runs: a rate of something the method never does (a plain
# `large` run's rollbacks, a `bild` run's deferrals) is not a row of its report. A row not listed
# (output_tokens) applies to every method.
DRAFTING = DRAFTING_METHODS
APPLIES_TO = {
    "small_token_share": DRAFTING, "fallbacks_per_100_tokens": DRAFTING, "rollbacks_per_100_tokens": DRAFTING,
    "large_calls_per_token": DRAFTING, "small_calls_per_token": DRAFTING, "discarded_draft_tokens": DRAFTING,
    "discarded_per_100_tokens": DRAFTING, "deferral_share": ("cascade",), "plain_steps": DRAFTING,
    "plain_step_share": DRAFTING,
}


def _applies(name: str, value, decoding: dict) -> bool:
    """Whether the row `name` applies to a run decoded under `decoding` (the job's decoding section): its
    method is one APPLIES_TO lists; fallbacks also need BiLD or draft_window fallback, plain steps
    decoding.adaptive_draft, unless the run counted some anyway (a manifest that does not say)."""
    method = decoding.get("method")
    if method is None:
        return True  # a run that does not say its method: every row, as before
    if method not in (APPLIES_TO.get(name) or (method,)):
        return False
    if name == "fallbacks_per_100_tokens":
        return method == "bild" or decoding.get("draft_window") == "fallback" or bool(value)
    if name in ("plain_steps", "plain_step_share"):
        return bool(decoding.get("adaptive_draft")) or bool(value)
    return True


def bild_behaviour(rows: pa.Table | DecodeStats, decoding: dict | None = None) -> dict[str, float]:
    """How BiLD behaved, over rows decoded without error (or their counters summed already); with the job's
    ``decoding`` section, only the rows that apply to its method (APPLIES_TO)."""
    totals = rows if isinstance(rows, DecodeStats) else decode_totals(rows)
    if not totals.output_tokens:
        return {}
    found = _behaviour(totals)
    if decoding is None:
        return found
    return {name: value for name, value in found.items() if _applies(name, value, decoding)}


def _behaviour(totals: DecodeStats) -> dict[str, float]:
    return {
        "output_tokens": totals.output_tokens,
        "small_token_share": totals.small_token_share,
        "fallbacks_per_100_tokens": totals.fallbacks_per_100_tokens,
        "rollbacks_per_100_tokens": totals.rollbacks_per_100_tokens,
        "large_calls_per_token": totals.large_calls_per_token,
        "small_calls_per_token": totals.small_calls_per_token,
        "discarded_draft_tokens": totals.discarded_draft_tokens,
        "discarded_per_100_tokens": totals.discarded_per_100_tokens,
        "deferral_share": totals.deferral_share,  # cascade: drafted positions deferred (None without drafts)
        "plain_steps": totals.plain_steps,  # large-model steps taken without drafting (decoding.adaptive_draft)
        "plain_step_share": totals.plain_step_share,
    }


def busy_seconds(calls: list[tuple[float, float, int]]) -> float:
    """The union of an actor's call intervals (calls never overlap on one actor, but be safe)."""
    busy, reached = 0.0, float("-inf")
    for start, seconds, _ in sorted(calls):
        end = start + seconds
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return busy


def decoding_rate(calls: dict[str, list[tuple[float, float, int]]]) -> float:
    """Output tokens per second of busy time, summed over the actors (``actor_calls``' shape): what
    the actors decode together while they work, start-up and idle time excluded."""
    return sum(sum(call[2] for call in found) / busy for found in calls.values() if (busy := busy_seconds(found)) > 0)


def per_actor_throughput(rows: pa.Table | RunTotals, wall_seconds: float | None) -> dict:
    """Output tokens per second of busy time for each actor, its busy seconds, and the run's
    utilization: the actors' mean busy time over the run's wall time (the share of the end-to-end
    time an actor spent decoding). A run written before call timing existed falls back to the sum
    of its records' latencies, which counts a batch's time once per record (too low at batch > 1)."""
    totals = rows if isinstance(rows, RunTotals) else RunTotals().add(rows)
    if totals.timed_rows:
        calls = totals.call_list()
        busy = {worker: busy_seconds(found) for worker, found in calls.items()}
        found = {"per_actor_output_tokens_per_s": {worker: sum(c[2] for c in calls[worker]) / busy[worker]
                                                   for worker in calls if busy[worker] > 0},
                 "per_actor_busy_seconds": busy,
                 "per_actor_basis": "busy time (the union of its calls, report.baseline's passes excluded)"}
        if wall_seconds and busy:
            found["utilization"] = sum(busy.values()) / len(busy) / wall_seconds
        return found
    tokens, seconds = totals.worker_tokens, totals.worker_seconds
    return {"per_actor_output_tokens_per_s": {w: tokens[w] / seconds[w] for w in sorted(tokens) if seconds[w] > 0},
            "per_actor_basis": "sum of record latencies (a run without call timing)"}


def run_summary(totals: RunTotals, wall_seconds: float | None, decoding: dict | None = None) -> dict:
    """Records, throughput, latency, BiLD behaviour (the rows that apply to ``decoding``'s method) and
    errors of one run, from its rows' totals (metrics/totals.py)."""
    stats = totals.decode_stats()
    throughput = per_actor_throughput(totals, wall_seconds)
    if wall_seconds:
        throughput.update(wall_seconds=wall_seconds, records_per_s=totals.rows / wall_seconds,
                          output_tokens_per_s=stats.output_tokens / wall_seconds)
    return {
        "records": {"total": totals.rows, "ok": totals.ok, "errors": totals.rows - totals.ok,
                    "with_reference": totals.with_reference},
        "throughput": throughput,
        "latency_ms": totals.latency.summary(),
        "engines": sorted(totals.engines),
        "bild": bild_behaviour(stats, decoding) if stats.output_tokens else {},
        "errors": totals.errors(),
    }
