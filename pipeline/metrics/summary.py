"""Throughput, latency, BiLD behaviour and errors from a run's numeric columns (no texts)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decoding.config import DRAFTING_METHODS
from pipeline.decoding.stats import DecodeStats


def _sum(table: pa.Table, column: str) -> int:
    return int(pc.sum(table[column]).as_py() or 0) if table.num_rows else 0


def latency_summary(latencies_ms: np.ndarray) -> dict[str, float]:
    if latencies_ms.size == 0:
        return {}
    p50, p90, p99 = np.percentile(latencies_ms, [50, 90, 99])
    return {"mean": float(latencies_ms.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def decode_totals(table: pa.Table) -> DecodeStats:
    """The DecodeStats counters summed over a table's rows (columns it lacks count 0)."""
    return DecodeStats.from_sums({name: _sum(table, name) for name in DecodeStats().to_dict()
                                  if name in table.column_names})


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


def bild_behaviour(table: pa.Table, decoding: dict | None = None) -> dict[str, float]:
    """How BiLD behaved, over rows decoded without error; with the job's ``decoding`` section, only
    the rows that apply to its method (APPLIES_TO)."""
    totals = decode_totals(table)
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


def actor_calls(table: pa.Table) -> dict[str, list[tuple[float, float, int]]]:
    """Each actor's calls (the `worker` column): (start, seconds, output tokens of rows decoded
    without error), in time order. Every row of a call carries the call's start and duration."""
    calls: dict[str, dict[tuple[float, float], int]] = defaultdict(lambda: defaultdict(int))
    for worker, start, seconds, tokens, error in zip(*(table[c].to_pylist() for c in (
            "worker", "call_started_at", "call_seconds", "output_tokens", "error"))):
        if start is not None and seconds is not None:
            calls[worker][(start, seconds)] += 0 if error else (tokens or 0)
    return {worker: sorted((start, seconds, tokens) for (start, seconds), tokens in found.items())
            for worker, found in sorted(calls.items())}


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


def per_actor_throughput(table: pa.Table, wall_seconds: float | None) -> dict:
    """Output tokens per second of busy time for each actor, its busy seconds, and the run's
    utilization: the actors' mean busy time over the run's wall time (the share of the end-to-end
    time an actor spent decoding). A run written before call timing existed falls back to the sum
    of its records' latencies, which counts a batch's time once per record (too low at batch > 1)."""
    if "call_started_at" in table.column_names and table["call_started_at"].null_count < table.num_rows:
        calls = actor_calls(table)
        busy = {worker: busy_seconds(found) for worker, found in calls.items()}
        found = {"per_actor_output_tokens_per_s": {worker: sum(c[2] for c in calls[worker]) / busy[worker]
                                                   for worker in calls if busy[worker] > 0},
                 "per_actor_busy_seconds": busy,
                 "per_actor_basis": "busy time (the union of its calls, report.baseline's passes excluded)"}
        if wall_seconds and busy:
            found["utilization"] = sum(busy.values()) / len(busy) / wall_seconds
        return found
    ok = table.filter(pc.is_null(table["error"])) if table.num_rows else table
    tokens: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)
    for worker, out, latency in zip(ok["worker"].to_pylist(), ok["output_tokens"].to_pylist(),
                                    ok["latency_ms"].to_pylist()):
        tokens[worker] += out or 0
        seconds[worker] += (latency or 0.0) / 1000.0
    return {"per_actor_output_tokens_per_s": {w: tokens[w] / seconds[w] for w in sorted(tokens) if seconds[w] > 0},
            "per_actor_basis": "sum of record latencies (a run without call timing)"}


def error_kind(message: str) -> str:
    """A short kind for an error message: the exception name, or its first words."""
    head = message.split(":", 1)[0].strip()
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*(Error|Exception)", head):
        return head
    return " ".join(message.split()[:3])


def errors_by_kind(messages: list[str], examples: int = 3) -> dict:
    counts = Counter(error_kind(m) for m in messages)
    found: dict[str, list[str]] = defaultdict(list)
    for message in messages:
        kind = error_kind(message)
        if len(found[kind]) < examples and message not in found[kind]:
            found[kind].append(message)
    return {"count": len(messages),
            "by_kind": {kind: {"count": n, "examples": found[kind]} for kind, n in counts.most_common()}}


def run_summary(table: pa.Table, wall_seconds: float | None, decoding: dict | None = None) -> dict:
    """Records, throughput, latency, BiLD behaviour (the rows that apply to ``decoding``'s method) and
    errors of one run's numeric table."""
    ok = table.filter(pc.is_null(table["error"])) if table.num_rows else table
    failed = [m for m in table["error"].to_pylist() if m] if table.num_rows else []
    with_reference = int(pc.sum(pc.is_valid(table["reference"])).as_py() or 0) if table.num_rows else 0
    tokens = _sum(ok, "output_tokens")
    throughput = per_actor_throughput(table, wall_seconds)
    if wall_seconds:
        throughput.update(wall_seconds=wall_seconds, records_per_s=table.num_rows / wall_seconds,
                          output_tokens_per_s=tokens / wall_seconds)
    return {
        "records": {"total": table.num_rows, "ok": ok.num_rows, "errors": len(failed),
                    "with_reference": with_reference},
        "throughput": throughput,
        "latency_ms": latency_summary(np.asarray(ok["latency_ms"].to_pylist(), float) if ok.num_rows else np.array([])),
        "engines": sorted({e for e in table["engine"].to_pylist() if e}) if "engine" in table.column_names else [],
        "bild": bild_behaviour(ok, decoding),
        "errors": errors_by_kind(failed),
    }
