"""Reading a run's output back (pipeline.io.storage.read_output_table), as summaries and resumes do."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.schema import OUTPUT_SCHEMA, STATS_COLUMNS
from pipeline.io.storage import data_path, read_output_table
from pipeline.metrics.summary import decode_totals


def rows(ids: list[str]) -> pa.Table:
    empty = {name: None for name in OUTPUT_SCHEMA.names}
    counters = {name: 1 for name in STATS_COLUMNS} | {"output_tokens": 10}
    return pa.Table.from_pylist([empty | counters | {"id": i} for i in ids], schema=OUTPUT_SCHEMA)


def test_a_file_written_before_a_counter_existed_reads_with_nulls_of_its_type(tmp_path):
    """A counter added to DecodeStats is a new column: resuming over older files must still sum."""
    folder = tmp_path / "run"
    data = Path(data_path(str(folder)))
    data.mkdir(parents=True)
    pq.write_table(rows(["a", "b"]).drop_columns(["draft_tokens"]), data / "old.parquet")  # before the column
    pq.write_table(rows(["c"]), data / "new.parquet")
    table = read_output_table(str(folder), columns=["id", *STATS_COLUMNS])
    assert table.schema.field("draft_tokens").type == pa.int32()
    assert table.num_rows == 3
    totals = decode_totals(table)
    assert totals.output_tokens == 30 and totals.draft_tokens == 1  # the old rows count 0
