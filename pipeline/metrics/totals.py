"""A run's numeric columns summed batch by batch, so that a report of any size holds sums, never rows.

Records, errors (by kind, a few examples each), BiLD's counters, each actor's calls (its busy time),
the rows' flags, and latency: its mean exactly and its percentiles exactly up to EXACT_LATENCIES rows,
beyond that from a histogram of fixed log-spaced bins about 1% wide (mergeable, as the sums are). A
uniform sample of the decoded rows (bottom-k of random keys) feeds the per-record plots.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decoding.stats import DecodeStats

EXACT_LATENCIES = 1_000_000  # up to this many rows the percentiles are np.percentile's own
LATENCY_EDGES_MS = np.geomspace(1e-3, 1e8, 2201)  # bins ~1.2% wide from 1 microsecond to a day
SAMPLE_ROWS = 50_000  # decoded rows kept for the per-record plots
ERROR_EXAMPLES = 3
FLAG_COLUMNS = ("stopped_by_budget", "repetition", "unknown_tokens")


def _sum(table: pa.Table, column: str) -> int:
    return int(pc.sum(table[column]).as_py() or 0) if table.num_rows else 0


def decode_totals(table: pa.Table) -> DecodeStats:
    """The DecodeStats counters summed over a table's rows (columns it lacks count 0)."""
    return DecodeStats.from_sums({name: _sum(table, name) for name in DecodeStats().to_dict()
                                  if name in table.column_names})


def error_kind(message: str) -> str:
    """A short kind for an error message: the exception name, or its first words."""
    head = message.split(":", 1)[0].strip()
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*(Error|Exception)", head):
        return head
    return " ".join(message.split()[:3])


def actor_calls(table: pa.Table) -> dict[str, list[tuple[float, float, int]]]:
    """Each actor's calls (the `worker` column): (start, seconds, output tokens of rows decoded
    without error), in time order. Every row of a call carries the call's start and duration."""
    calls: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for row in _call_tokens(table).to_pylist():
        calls[row["worker"]].append((row["start"], row["seconds"], row["tokens_sum"]))
    return {worker: sorted(found) for worker, found in sorted(calls.items())}


def _call_tokens(table: pa.Table) -> pa.Table:
    """One row per actor call among `table`'s rows (worker, start, seconds, tokens_sum), summed in Arrow: a batch of
    65,536 rows is a few hundred calls, never 65,536 Python tuples."""
    timed = table.filter(pc.and_(pc.is_valid(table["call_started_at"]), pc.is_valid(table["call_seconds"])))
    tokens = pc.if_else(pc.is_valid(timed["error"]), 0, pc.fill_null(timed["output_tokens"], 0)).cast(pa.int64())
    calls = pa.table({"worker": timed["worker"], "start": timed["call_started_at"], "seconds": timed["call_seconds"],
                      "tokens": tokens})
    return calls.group_by(["worker", "start", "seconds"], use_threads=False).aggregate([("tokens", "sum")])


@dataclass
class LatencySketch:
    exact: list = field(default_factory=list)  # arrays, while the rows are few
    counts: np.ndarray | None = None  # per bin, once they are not
    rows: int = 0
    total: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")

    def add(self, values: np.ndarray) -> None:
        if not values.size:
            return
        self.rows += values.size
        self.total += float(values.sum())
        self.low, self.high = min(self.low, float(values.min())), max(self.high, float(values.max()))
        if self.counts is None and self.rows <= EXACT_LATENCIES:
            self.exact.append(values)
            return
        if self.counts is None:
            self.counts = np.zeros(len(LATENCY_EDGES_MS) + 1, np.int64)
            for kept in self.exact:
                self._count(kept)
            self.exact = []
        self._count(values)

    def _count(self, values: np.ndarray) -> None:
        self.counts += np.bincount(np.searchsorted(LATENCY_EDGES_MS, values), minlength=len(self.counts))

    def percentile(self, q: float) -> float:
        if self.counts is None:
            return float(np.percentile(np.concatenate(self.exact), q))
        rank = q / 100 * (self.rows - 1)
        place = int(np.searchsorted(np.cumsum(self.counts), rank, side="right"))
        lower = LATENCY_EDGES_MS[place - 1] if place > 0 else self.low
        upper = LATENCY_EDGES_MS[place] if place < len(LATENCY_EDGES_MS) else self.high
        return float(min(self.high, max(self.low, np.sqrt(lower * upper))))  # the bin's geometric middle

    def summary(self) -> dict[str, float]:
        if not self.rows:
            return {}
        return {"mean": self.total / self.rows, "p50": self.percentile(50), "p90": self.percentile(90),
                "p99": self.percentile(99)}


@dataclass
class RunTotals:
    """What a report says of a run's rows, summed as they stream by (add), then worded (see metrics/summary.py)."""
    rows: int = 0
    ok: int = 0
    with_reference: int = 0
    counters: Counter = field(default_factory=Counter)  # DecodeStats over rows without error
    error_kinds: Counter = field(default_factory=Counter)
    error_examples: dict = field(default_factory=lambda: defaultdict(list))
    latency: LatencySketch = field(default_factory=LatencySketch)
    calls: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))  # worker -> call -> tokens
    timed_rows: int = 0  # rows with call timing (call_started_at); a run without it falls back to latencies
    worker_tokens: dict = field(default_factory=lambda: defaultdict(float))
    worker_seconds: dict = field(default_factory=lambda: defaultdict(float))
    engines: set = field(default_factory=set)
    flags: Counter | None = None  # None for a run written before the rows carried flags
    sample: pa.Table | None = None
    _random: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def add(self, table: pa.Table) -> "RunTotals":
        if not table.num_rows:
            return self
        self.rows += table.num_rows
        failed = pc.is_valid(table["error"])
        ok = table.filter(pc.invert(failed))
        self.ok += ok.num_rows
        if "reference" in table.column_names:
            self.with_reference += int(pc.sum(pc.is_valid(table["reference"])).as_py() or 0)
        self.counters.update(decode_totals(ok).to_dict())
        for message in table["error"].filter(failed).to_pylist():
            kind = error_kind(message)
            self.error_kinds[kind] += 1
            if len(self.error_examples[kind]) < ERROR_EXAMPLES and message not in self.error_examples[kind]:
                self.error_examples[kind].append(message)
        if "latency_ms" in ok.column_names and ok.num_rows:
            self.latency.add(pc.drop_null(ok["latency_ms"]).to_numpy().astype(float))
        if "engine" in table.column_names:
            self.engines |= {engine for engine in pc.unique(table["engine"]).to_pylist() if engine}
        self._add_calls(table, ok)
        if all(name in table.column_names for name in FLAG_COLUMNS):
            self._add_flags(table)
        self._add_sample(ok)
        return self

    def _add_calls(self, table: pa.Table, ok: pa.Table) -> None:
        if "call_started_at" in table.column_names:
            self.timed_rows += table.num_rows - table["call_started_at"].null_count
            for row in _call_tokens(table).to_pylist():
                self.calls[row["worker"]][(row["start"], row["seconds"])] += row["tokens_sum"]
        if "latency_ms" not in ok.column_names:
            return
        per_worker = pa.table({"worker": ok["worker"], "tokens": pc.fill_null(ok["output_tokens"], 0).cast(pa.int64()),
                               "seconds": pc.divide(pc.fill_null(ok["latency_ms"], 0.0), 1000.0)})
        for row in per_worker.group_by("worker", use_threads=False).aggregate(
                [("tokens", "sum"), ("seconds", "sum")]).to_pylist():
            self.worker_tokens[row["worker"]] += row["tokens_sum"]
            self.worker_seconds[row["worker"]] += row["seconds_sum"]

    def _add_flags(self, table: pa.Table) -> None:
        checked = table.filter(pc.is_valid(table["stopped_by_budget"]))
        unknown = checked["unknown_tokens"]
        self.flags = self.flags if self.flags is not None else Counter()
        self.flags.update({
            "rows_checked": checked.num_rows,
            "stopped_by_budget": int(pc.sum(pc.cast(checked["stopped_by_budget"], pa.int64())).as_py() or 0),
            "repetition": int(pc.sum(pc.cast(pc.fill_null(checked["repetition"], False), pa.int64())).as_py() or 0),
            "rows_with_unknown_tokens": int(pc.sum(pc.cast(pc.greater(unknown, 0), pa.int64())).as_py() or 0),
            "unknown_tokens": int(pc.sum(unknown).as_py() or 0)})

    def _add_sample(self, ok: pa.Table) -> None:
        """Keep the SAMPLE_ROWS rows of smallest random key seen so far: a uniform sample of every row added."""
        if not ok.num_rows:
            return
        keyed = ok.append_column("_key", pa.array(self._random.random(ok.num_rows)))
        both = keyed if self.sample is None else pa.concat_tables([self.sample, keyed], promote_options="default")
        if both.num_rows > SAMPLE_ROWS:
            both = both.take(pc.sort_indices(both["_key"])[:SAMPLE_ROWS])
        self.sample = both

    def call_list(self) -> dict[str, list[tuple[float, float, int]]]:
        """Each actor's calls, as metrics.summary.actor_calls gives them."""
        return {worker: sorted((start, seconds, tokens) for (start, seconds), tokens in found.items())
                for worker, found in sorted(self.calls.items())}

    def sampled_rows(self) -> pa.Table | None:
        """The sampled decoded rows, in no particular order (None without any)."""
        return self.sample.drop_columns(["_key"]) if self.sample is not None else None

    def errors(self) -> dict:
        return {"count": sum(self.error_kinds.values()),
                "by_kind": {kind: {"count": n, "examples": self.error_examples[kind]}
                            for kind, n in self.error_kinds.most_common()}}

    def decode_stats(self) -> DecodeStats:
        return DecodeStats.from_sums(self.counters)
