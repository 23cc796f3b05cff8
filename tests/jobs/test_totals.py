"""A run's rows summed as they stream by (metrics/totals.py): what lets a report of 100M rows hold sums, not rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.io.schema import OUTPUT_SCHEMA
from pipeline.metrics import totals as t
from pipeline.metrics.summary import run_summary


def _rows(count: int, start: int = 0, seed: int = 0) -> pa.Table:
    random = np.random.default_rng(seed)
    failed = random.random(count) < 0.05
    tokens = random.integers(1, 40, count)
    given = {"id": [str(start + i) for i in range(count)],
             "error": [f"ValueError: bad {i % 3}" if bad else None for i, bad in enumerate(failed)],
             "reference": ["r"] * count, "latency_ms": random.lognormal(3.0, 1.0, count),
             "output_tokens": tokens, "small_tokens": tokens // 2, "large_tokens": tokens - tokens // 2,
             "worker": [f"h:{i % 2}" for i in range(count)], "call_started_at": (start + np.arange(count)) // 8 * 1.0,
             "call_seconds": np.full(count, 0.5)}
    return pa.table({f.name: pa.array(given[f.name], f.type) if f.name in given else pa.nulls(count, f.type)
                     for f in OUTPUT_SCHEMA}, schema=OUTPUT_SCHEMA)


def test_latency_percentiles_past_the_exact_rows_are_within_two_percent(monkeypatch):
    monkeypatch.setattr(t, "EXACT_LATENCIES", 100)
    values = np.random.default_rng(1).lognormal(3.0, 1.2, 20_000)
    sketch = t.LatencySketch()
    for chunk in np.array_split(values, 20):
        sketch.add(chunk)
    assert sketch.counts is not None and sketch.counts.sum() == values.size  # the histogram took over
    found = sketch.summary()
    assert found["mean"] == pytest.approx(values.mean(), rel=1e-12)
    for q in (50, 90, 99):
        assert found[f"p{q}"] == pytest.approx(np.percentile(values, q), rel=0.02), q


def test_the_sample_is_bounded_and_drawn_from_every_batch(monkeypatch):
    monkeypatch.setattr(t, "SAMPLE_ROWS", 500)
    totals = t.RunTotals()
    for batch in range(10):
        totals.add(_rows(1000, start=batch * 1000, seed=batch))
    sample = totals.sampled_rows()
    assert sample.num_rows == 500 and sample["error"].null_count == 500  # decoded rows only
    early = sum(int(i) < 5000 for i in sample["id"].to_pylist())
    assert 200 < early < 300  # uniform over the run, not its first or last rows


def test_a_summary_summed_in_batches_is_the_summary_of_the_whole_table():
    whole = _rows(3000)
    batched = t.RunTotals()
    for start in range(0, 3000, 700):
        batched.add(whole.slice(start, 700))
    once = run_summary(t.RunTotals().add(whole), 100.0)
    assert run_summary(batched, 100.0) == once
    assert once["records"]["errors"] == sum(e is not None for e in whole["error"].to_pylist())
    assert once["latency_ms"]["p90"] == pytest.approx(np.percentile(
        [v for v, e in zip(whole["latency_ms"].to_pylist(), whole["error"].to_pylist()) if e is None], 90))
    assert set(once["errors"]["by_kind"]) == {"ValueError"} and once["bild"]["output_tokens"] > 0
