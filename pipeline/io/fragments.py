"""The input as fragments: row ranges of its files, each read by one Ray Data read task.

Every record carries where it came from, and so does its output row: ``input_file`` (its file's path
inside input.path) and ``input_row`` (its row there, from 0). That is what lets a job's driver work in
files, not records (docs/design.md §6): input.limit is a position, a resume's "what is done" is a set of row
ranges per input file (io/done.py), a fragment wholly done is never read, and one partly done drops its
done rows inside its own read task. The driver holds one small Fragment per row range, nothing per record.
"""

from __future__ import annotations

import dataclasses
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.io.records import RECORD_SCHEMA, id_strings, normalize_table, parse_jsonl

POSITION_COLUMNS = ("input_file", "input_row")
INPUT_SCHEMA = RECORD_SCHEMA.append(pa.field("input_file", pa.string())).append(pa.field("input_row", pa.int64()))
# A fragment holds whole Parquet row groups, about this many rows (one group when a group is larger): enough
# work per read task that a 100M-record corpus is a few hundred tasks, little enough that a resume rereads
# little around what is done.
FRAGMENT_ROWS = 1_000_000
FOOTER_THREADS = 16  # Parquet footers are read this many at a time (a remote store answers each in ~50 ms)

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint [start, stop) row ranges


@dataclass(frozen=True)
class Fragment:
    path: str  # the file, in the input's filesystem
    name: str  # its path inside input.path: what its rows carry as input_file
    start: int  # its first row in the file
    stop: int | None  # one past its last; None until counted (a CSV or JSONL file is one fragment, counted by id_check)
    groups: tuple[int, ...] = ()  # Parquet: the row groups that hold [start, stop)
    groups_start: int = 0  # the file row of the first of them
    skip: Ranges = ()  # rows inside [start, stop) already done (a resume): its read task drops them

    @property
    def rows(self) -> int:
        """The rows it yields: its range less what it skips."""
        return (self.stop or 0) - self.start - sum(stop - start for start, stop in self.skip)


def input_name(input_path: str, file: str) -> str:
    """A file's name inside the input: its path below input.path's folder, or its base name when input.path names
    the file itself. Stable across machines and mounts, so a resume elsewhere finds the same names."""
    base = input_path.rstrip("/") + "/"
    return file[len(base):] if file.startswith(base) else posixpath.basename(file)


def plan_fragments(input_config, listing) -> list[Fragment]:
    """The input's fragments in input order: a Parquet file's row groups, FRAGMENT_ROWS at a time, from its footer
    (read on the driver, FOOTER_THREADS at a time); a CSV or JSONL file whole, its rows not yet counted."""
    fs, files = listing
    root = fs._strip_protocol(input_config.path)  # as input_files lists it
    if input_config.format != "parquet":
        return [Fragment(path=file, name=input_name(root, file), start=0, stop=None) for file in files]
    from pipeline.io.storage import arrow_filesystem

    filesystem = arrow_filesystem(fs)
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        footers = list(pool.map(lambda file: pq.read_metadata(file, filesystem=filesystem), files))
    fragments = []
    for file, footer in zip(files, footers):
        sizes = [footer.row_group(group).num_rows for group in range(footer.num_row_groups)]
        fragments.extend(_group_fragments(file, input_name(root, file), sizes))
    return fragments


def _group_fragments(path: str, name: str, sizes: list[int]) -> list[Fragment]:
    fragments, groups, first, row = [], [], 0, 0
    for group, size in enumerate(sizes):
        if not groups:
            first = row
        groups.append(group)
        row += size
        if row - first >= FRAGMENT_ROWS or group == len(sizes) - 1:
            fragments.append(Fragment(path, name, first, row, tuple(groups), first))
            groups = []
    return fragments


def counted(fragments: list[Fragment], counts: list[int]) -> list[Fragment]:
    """The fragments with their rows counted (id_check counts a CSV or JSONL file as it checks its ids)."""
    return [fragment if fragment.stop is not None else dataclasses.replace(fragment, stop=fragment.start + count)
            for fragment, count in zip(fragments, counts)]


def first_rows(fragments: list[Fragment], limit: int | None) -> list[Fragment]:
    """The fragments that hold the input's first `limit` rows (all of them without a limit), the last cut short."""
    if limit is None:
        return fragments
    kept, left = [], limit
    for fragment in fragments:
        if left <= 0:
            break
        size = fragment.stop - fragment.start
        kept.append(fragment if size <= left else dataclasses.replace(fragment, stop=fragment.start + left))
        left -= size
    return kept


def without_done(fragments: list[Fragment], done: dict[str, Ranges]) -> list[Fragment]:
    """The fragments with the rows `done` (per input file) to skip; those wholly done left out."""
    todo = []
    for fragment in fragments:
        skip = tuple((max(start, fragment.start), min(stop, fragment.stop)) for start, stop in done.get(fragment.name, ())
                     if start < fragment.stop and stop > fragment.start)
        fragment = dataclasses.replace(fragment, skip=skip)
        if fragment.rows:
            todo.append(fragment)
    return todo


def read_fragment(fs, input_config, fragment: Fragment, ids_only: bool = False) -> pa.Table:
    """A fragment's records in the normal form (records.py) with their two position columns, the rows it skips
    left out; with ``ids_only``, only the id column (and the positions)."""
    cfg = input_config
    columns = (cfg.id_column, cfg.text_column, cfg.reference_column)
    if cfg.format == "jsonl":
        lines = list(parse_jsonl(fs.cat_file(fragment.path), posixpath.basename(fragment.path), *columns))
        table = pa.Table.from_pylist(lines, schema=RECORD_SCHEMA)
        offset = 0
    else:
        wanted = [cfg.id_column] if ids_only else [name for name in columns if name]
        if cfg.format == "parquet":
            with fs.open(fragment.path, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                present = set(parquet.schema_arrow.names)
                table = parquet.read_row_groups(list(fragment.groups), columns=[c for c in wanted if c in present])
            offset = fragment.groups_start
        else:
            with fs.open(fragment.path, "rb") as handle:
                table = pacsv.read_csv(handle, convert_options=_csv_options(columns, wanted))
            offset = 0
        if ids_only:
            table = pa.table({"id": id_strings(table[cfg.id_column])})
        else:
            table = normalize_table(table, *columns)
    stop = table.num_rows + offset if fragment.stop is None else fragment.stop
    table = table.slice(fragment.start - offset, stop - fragment.start)
    if ids_only:
        table = table.select(["id"])
    rows = np.arange(fragment.start, fragment.start + table.num_rows, dtype=np.int64)
    table = table.append_column("input_file", pa.repeat(pa.scalar(fragment.name, pa.string()), table.num_rows))
    table = table.append_column("input_row", pa.array(rows))
    if fragment.skip:
        keep = np.ones(table.num_rows, dtype=bool)
        for start, stop in fragment.skip:
            keep[start - fragment.start:stop - fragment.start] = False
        table = table.filter(pa.array(keep))
    return table


def _csv_options(columns, include: list[str]):
    """Read the named columns as text, so "007" stays "007" and numbers do not change the type."""
    return pacsv.ConvertOptions(column_types={name: pa.string() for name in columns if name},
                                strings_can_be_null=False, include_columns=include)


def fragment_blocks(fs, input_config, fragment: Fragment, block_rows: int):
    """A read task's work: the fragment's rows, `block_rows` at a time."""
    table = read_fragment(fs, input_config, fragment)
    for start in range(0, table.num_rows, block_rows):
        yield table.slice(start, block_rows)
