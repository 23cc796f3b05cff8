"""The BiLD rates, defined once on DecodeStats: per record, summed over records, and from output columns."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.decoding.stats import DecodeStats
from pipeline.metrics.summary import bild_behaviour
from pipeline.metrics.totals import decode_totals

RECORDS = [
    DecodeStats(output_tokens=10, small_tokens=8, large_tokens=2, fallbacks=1, rollbacks=1, small_calls=9,
                large_calls=2, draft_tokens=9),
    DecodeStats(output_tokens=30, small_tokens=24, large_tokens=6, fallbacks=2, rollbacks=0, small_calls=26,
                large_calls=4, draft_tokens=27),
]


def test_rates_of_summed_records():
    total = DecodeStats.total(RECORDS)
    assert total == RECORDS[0] + RECORDS[1]
    assert total.output_tokens == 40 and total.draft_tokens == 36
    assert total.small_token_share == pytest.approx(0.8)
    assert total.fallbacks_per_100_tokens == pytest.approx(7.5)
    assert total.rollbacks_per_100_tokens == pytest.approx(2.5)
    assert total.discarded_draft_tokens == 4 and total.discarded_per_100_tokens == pytest.approx(10.0)
    assert total.draft_acceptance == pytest.approx(32 / 36)
    assert total.large_calls_per_token == pytest.approx(0.15)


def test_nothing_generated_gives_zero_rates():
    empty = DecodeStats.total([])
    assert empty == DecodeStats()
    assert empty.small_token_share == empty.fallbacks_per_100_tokens == 0.0 and empty.draft_acceptance is None


def test_a_run_table_reads_the_same_rates_as_its_records():
    table = pa.Table.from_pylist([record.to_dict() for record in RECORDS])
    total = DecodeStats.total(RECORDS)
    assert decode_totals(table) == total
    behaviour = bild_behaviour(table)
    assert behaviour["small_token_share"] == total.small_token_share
    assert behaviour["fallbacks_per_100_tokens"] == total.fallbacks_per_100_tokens
    assert behaviour["discarded_per_100_tokens"] == total.discarded_per_100_tokens
    # A table with only some counters (a run's summary columns): the others count 0.
    partial = decode_totals(table.select(["output_tokens", "small_tokens", "rollbacks"]))
    assert partial == DecodeStats(output_tokens=40, small_tokens=32, rollbacks=1)


def test_per_record_rates_are_each_records_own():
    """A table's counters read at once (arrays) give every record the rates its own DecodeStats gives,
    0 where it generated nothing."""
    rows = [DecodeStats(output_tokens=10, small_tokens=7, fallbacks=2, rollbacks=1),
            DecodeStats(output_tokens=0), DecodeStats(output_tokens=4, small_tokens=1, fallbacks=3)]
    columns = {name: [getattr(row, name) for row in rows] for name in ("output_tokens", "small_tokens", "fallbacks",
                                                                       "rollbacks")}
    together = DecodeStats.per_record(columns)
    for rate in ("small_token_share", "fallbacks_per_100_tokens", "rollbacks_per_100_tokens"):
        assert list(getattr(together, rate)) == [getattr(row, rate) for row in rows], rate
