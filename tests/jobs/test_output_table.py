"""Reading a run's output back (pipeline.io.storage.read_output_table), as summaries and resumes do."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io.schema import OUTPUT_SCHEMA, STATS_COLUMNS
from pipeline.io.storage import (
    OutputReadError,
    data_path,
    existing_rows,
    is_torn_parquet,
    output_filesystem,
    read_output_table,
)
from pipeline.metrics.totals import decode_totals


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


def run_with_files(tmp_path, files: dict[str, bytes]) -> Path:
    data = Path(data_path(str(tmp_path / "run")))
    data.mkdir(parents=True)
    for name, content in files.items():
        (data / name).write_bytes(content)
    return data


def parquet_bytes(ids: list[str]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(rows(ids), sink)
    return sink.getvalue().to_pybytes()


def test_a_torn_file_is_removed_and_whole_files_are_kept(tmp_path):
    """A write cut off before its footer is torn: resume removes it, so its records are decoded again."""
    whole = parquet_bytes(["c", "d"])
    data = run_with_files(tmp_path, {"a.parquet": parquet_bytes(["a", "b"]), "torn.parquet": whole[: len(whole) // 2],
                                     "tiny.parquet": b"PAR1"})
    fs, path = output_filesystem(str(tmp_path / "run"))
    assert is_torn_parquet(fs, str(data / "torn.parquet")) and not is_torn_parquet(fs, str(data / "a.parquet"))
    assert existing_rows(fs, path, ["id"])["id"].to_pylist() == ["a", "b"]
    assert sorted(p.name for p in data.iterdir()) == ["a.parquet"]


@pytest.mark.parametrize("failure", ["unreadable", "corrupt"])
def test_a_whole_file_that_cannot_be_read_stops_the_resume_and_nothing_is_removed(tmp_path, monkeypatch, failure):
    """A transient error (throttling, a network blip, a stale listing) or a damaged but whole file must
    not delete finished work: the resume stops with a message naming the file."""
    whole = parquet_bytes(["a", "b"])
    if failure == "corrupt":  # the footer is intact, the data before it is not
        whole = whole[:4] + b"\0" * (len(whole) - 200) + whole[-196:]
    data = run_with_files(tmp_path, {"a.parquet": whole, "b.parquet": parquet_bytes(["c"])})
    fs, path = output_filesystem(str(tmp_path / "run"))
    if failure == "unreadable":
        opened = fs.open

        def flaky_open(file, *args, **kwargs):
            if file.endswith("a.parquet") and "rb" in args:
                raise ConnectionError("the store did not answer")
            return opened(file, *args, **kwargs)

        monkeypatch.setattr(fs, "open", flaky_open)
    with pytest.raises(OutputReadError, match="a.parquet.*nothing was removed"):
        existing_rows(fs, path, ["id"])
    assert sorted(p.name for p in data.iterdir()) == ["a.parquet", "b.parquet"]
