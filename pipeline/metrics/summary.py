"""Throughput, latency, BiLD behaviour and errors from a run's numeric columns (no texts)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NUMERIC_COLUMNS = ["error", "output_tokens", "small_tokens", "large_tokens", "fallbacks", "rollbacks",
                   "small_calls", "large_calls", "draft_tokens", "latency_ms", "worker", "reference", "engine"]


def _sum(table: pa.Table, column: str) -> int:
    return int(pc.sum(table[column]).as_py() or 0) if table.num_rows else 0


def latency_summary(latencies_ms: np.ndarray) -> dict[str, float]:
    if latencies_ms.size == 0:
        return {}
    p50, p90, p99 = np.percentile(latencies_ms, [50, 90, 99])
    return {"mean": float(latencies_ms.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def bild_behaviour(table: pa.Table) -> dict[str, float]:
    """How BiLD behaved, over rows decoded without error."""
    tokens = _sum(table, "output_tokens")
    if not tokens:
        return {}
    discarded = _sum(table, "draft_tokens") - _sum(table, "small_tokens")
    return {
        "output_tokens": tokens,
        "small_token_share": _sum(table, "small_tokens") / tokens,
        "fallbacks_per_100_tokens": 100.0 * _sum(table, "fallbacks") / tokens,
        "rollbacks_per_100_tokens": 100.0 * _sum(table, "rollbacks") / tokens,
        "large_calls_per_token": _sum(table, "large_calls") / tokens,
        "small_calls_per_token": _sum(table, "small_calls") / tokens,
        "discarded_draft_tokens": discarded,
        "discarded_per_100_tokens": 100.0 * discarded / tokens,
    }


def per_actor_tokens_per_second(table: pa.Table) -> dict[str, float]:
    """Output tokens per second of decoding time, for each actor (the `worker` column)."""
    tokens: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)
    for worker, out, latency in zip(table["worker"].to_pylist(), table["output_tokens"].to_pylist(),
                                    table["latency_ms"].to_pylist()):
        tokens[worker] += out or 0
        seconds[worker] += (latency or 0.0) / 1000.0
    return {worker: tokens[worker] / seconds[worker] for worker in sorted(tokens) if seconds[worker] > 0}


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


def run_summary(table: pa.Table, wall_seconds: float | None) -> dict:
    """Records, throughput, latency, BiLD behaviour and errors of one run's numeric table."""
    ok = table.filter(pc.is_null(table["error"])) if table.num_rows else table
    failed = [m for m in table["error"].to_pylist() if m] if table.num_rows else []
    with_reference = int(pc.sum(pc.is_valid(table["reference"])).as_py() or 0) if table.num_rows else 0
    tokens = _sum(ok, "output_tokens")
    throughput = {"per_actor_output_tokens_per_s": per_actor_tokens_per_second(ok)}
    if wall_seconds:
        throughput.update(wall_seconds=wall_seconds, records_per_s=table.num_rows / wall_seconds,
                          output_tokens_per_s=tokens / wall_seconds)
    return {
        "records": {"total": table.num_rows, "ok": ok.num_rows, "errors": len(failed),
                    "with_reference": with_reference},
        "throughput": throughput,
        "latency_ms": latency_summary(np.asarray(ok["latency_ms"].to_pylist(), float) if ok.num_rows else np.array([])),
        "engines": sorted({e for e in table["engine"].to_pylist() if e}) if "engine" in table.column_names else [],
        "bild": bild_behaviour(ok),
        "errors": errors_by_kind(failed),
    }
