"""What an output already holds, as row ranges of each input file (fragments.py): a resume's "what is done"
and the summary's count, read from the output files' two position columns one file at a time.

A file's rows come from a few actor calls, each over consecutive input rows, so a file is a few ranges
whatever its size; the driver holds ranges, never a row or an id. Ranges that overlap are rows written
twice (a write task Ray retried): counted once, and told apart where it matters (run_summary.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io.fragments import POSITION_COLUMNS, Ranges
from pipeline.io.storage import readable_tables


@dataclass
class DoneRows:
    ranges: dict[str, Ranges] = field(default_factory=dict)  # input file -> its rows in the output, merged
    rows: int = 0  # distinct input rows in the output
    repeated: int = 0  # rows beyond the first of an input row (a retried write's)
    files: int = 0

    def joined(self, other: "DoneRows") -> "DoneRows":
        """The rows of both outputs' files together: a row in both counts once and as a repeat."""
        names = self.ranges.keys() | other.ranges.keys()
        merged = {name: merge([*self.ranges.get(name, ()), *other.ranges.get(name, ())]) for name in names}
        rows = sum(stop - start for ranges in merged.values() for start, stop in ranges)
        written = self.rows + self.repeated + other.rows + other.repeated
        return DoneRows(ranges=merged, rows=rows, repeated=written - rows, files=self.files + other.files)


def done_rows(fs, path: str, skip_errors: bool = False, remove_torn: bool = True,
              files: list[str] | None = None) -> DoneRows | None:
    """The input rows an output holds (with `skip_errors`, those whose row holds no error; with `files`, those of
    these output files only); None when a file lacks the position columns or a row their values (written before
    they existed: the caller goes by id). A torn file is removed (storage.readable_tables), unless not
    `remove_torn`."""
    found: dict[str, list[tuple[int, int]]] = {}
    written, count = 0, 0
    for _, table in readable_tables(fs, path, [*POSITION_COLUMNS, "error"], remove_torn, files):
        if not set(POSITION_COLUMNS) <= set(table.column_names) or table["input_row"].null_count:
            return None
        if skip_errors and "error" in table.column_names:
            table = table.filter(pc.is_null(table["error"]))
        count += 1
        written += table.num_rows
        for name, ranges in file_ranges(table).items():
            found.setdefault(name, []).extend(ranges)
    merged = {name: merge(ranges) for name, ranges in found.items()}
    rows = sum(stop - start for ranges in merged.values() for start, stop in ranges)
    return DoneRows(ranges=merged, rows=rows, repeated=written - rows, files=count)


def file_ranges(table: pa.Table) -> dict[str, list[tuple[int, int]]]:
    """The position columns of one file's rows as ranges per input file (a row written twice makes two)."""
    if not table.num_rows:
        return {}
    encoded = pc.dictionary_encode(table["input_file"]).combine_chunks()
    names = encoded.dictionary.to_pylist()
    which = encoded.indices.to_numpy(zero_copy_only=False)
    rows = table["input_row"].to_numpy()
    order = np.lexsort((rows, which))
    which, rows = which[order], rows[order]
    breaks = np.flatnonzero((np.diff(which) != 0) | (np.diff(rows) != 1)) + 1
    starts = np.concatenate([np.zeros(1, np.int64), breaks])
    stops = np.concatenate([breaks, np.full(1, len(rows), np.int64)])
    found: dict[str, list[tuple[int, int]]] = {}
    for first, last in zip(starts, stops):
        found.setdefault(names[which[first]], []).append((int(rows[first]), int(rows[last - 1]) + 1))
    return found


def merge(ranges: list[tuple[int, int]]) -> Ranges:
    """Ranges as sorted, disjoint ones covering the same rows."""
    merged: list[list[int]] = []
    for start, stop in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return tuple((start, stop) for start, stop in merged)
