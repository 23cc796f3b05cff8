"""A finished run's output rows, read with pyarrow alone: only the columns asked for, in batches.

Reports and sweeps read a run that is already written, so they need no cluster: Ray stays for
decoding. The run may be on local disk or behind any fsspec URL (S3, GCS, ...). Its files were
written by several attempts and may differ in columns (an older run lacks a newer counter); the
dataset's schema is the union of theirs, and a column a file lacks reads as nulls there.

Each id (each id and sweep point) counts once: a writer task that Ray retried can leave a second row
for an id, a retried error row a newer one. The first row without an error is kept (else the first row, in
file order), the others skipped and counted (duplicate_rows). A run whose position columns show no input
row twice is read as it is: its ids are never gathered.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from pipeline.io.done import done_rows
from pipeline.io.storage import (
    arrow_filesystem,
    data_path,
    kept_rows,
    output_filesystem,
    output_files,
    read_manifest,
)

BATCH_ROWS = 65_536  # rows per batch when texts are streamed (bounded memory for runs of any size)
# Batches read ahead of the one in use, on this thread: pyarrow's threaded scanner reads ahead as far as a slow
# consumer lets it (~800 MiB of numeric columns while a report summed 10M rows; 30 MiB without).
READAHEAD_BATCHES = 2


class RunRows:
    """The Parquet files under a run's data folder as one pyarrow dataset, and its run.json manifest."""

    def __init__(self, run_path: str, storage_options: dict | None = None):
        fs, path = output_filesystem(run_path, storage_options)
        files = output_files(fs, path)
        if not files:
            raise FileNotFoundError(f"{run_path}: no output rows (expected Parquet files under {data_path(run_path)})")
        filesystem = arrow_filesystem(fs)
        first_pass = pads.dataset(files, format="parquet", filesystem=filesystem)
        schema = pa.unify_schemas([fragment.physical_schema for fragment in first_pass.get_fragments()])
        self.dataset = pads.dataset(files, format="parquet", filesystem=filesystem, schema=schema)
        self.duplicate_rows = 0
        keys = [key for key in ("id", "point") if key in schema.names]
        if "id" in keys and _may_repeat(fs, path, keys):
            self.dataset, self.duplicate_rows = _without_later_rows(self.dataset, keys)
        self.manifest = read_manifest(fs, path)

    @property
    def columns(self) -> list[str]:
        return self.dataset.schema.names

    def present(self, columns) -> list[str]:
        """Those of `columns` the run has, in the order given."""
        return [column for column in columns if column in self.columns]

    def table(self, columns, where: pads.Expression | None = None) -> pa.Table:
        """The rows (matching `where`) of `columns`, all at once: for columns without texts."""
        return self.dataset.to_table(columns=list(columns), filter=where)

    def batches(self, columns, where: pads.Expression | None = None) -> Iterator[pa.Table]:
        """The same in tables of at most BATCH_ROWS rows, read as they are used: for texts."""
        for batch in self.dataset.to_batches(columns=list(columns), filter=where, batch_size=BATCH_ROWS,
                                             batch_readahead=READAHEAD_BATCHES, fragment_readahead=1, use_threads=False):
            if batch.num_rows:
                yield pa.Table.from_batches([batch])


def _may_repeat(fs, path: str, keys: list[str]) -> bool:
    """Whether a record may have two rows: a sweep's or an older run's may (their keys are read to tell); a run
    whose position columns (io/done.py) cover no input row twice has none, and its ids are never read."""
    if "point" in keys:
        return True
    done = done_rows(fs, path, remove_torn=False)
    return done is None or done.repeated > 0


def _without_later_rows(dataset: pads.FileSystemDataset, keys: list[str]) -> tuple[pads.Dataset, int]:
    """(the dataset with one row per key, as storage.kept_rows chooses it, the number of rows left out).
    Files without a row left out stay on disk; the few with one are read and filtered in memory."""
    fragments = list(dataset.get_fragments())
    columns = keys + (["error"] if "error" in dataset.schema.names else [])
    everything = pa.concat_tables([fragment.to_table(columns=columns, schema=dataset.schema) for fragment in fragments])
    kept = np.zeros(everything.num_rows, dtype=bool)
    kept[kept_rows(everything.select(keys), everything["error"] if "error" in columns else None).to_numpy()] = True
    if kept.all():
        return dataset, 0
    start = 0
    whole, filtered = [], []
    for fragment in fragments:
        rows = fragment.count_rows()
        keep = kept[start:start + rows]
        start += rows
        if keep.all():
            whole.append(fragment.path)
        else:
            filtered.append(fragment.to_table(schema=dataset.schema).filter(pa.array(keep)))
    parts = [pads.dataset(filtered, schema=dataset.schema)]
    if whole:
        parts.insert(0, pads.dataset(whole, format="parquet", filesystem=dataset.filesystem, schema=dataset.schema))
    return pads.dataset(parts), int((~kept).sum())


def read_run(run_path: str, storage_options: dict | None = None) -> RunRows:
    """The run at `run_path` (FileNotFoundError naming it when it has no output rows)."""
    return RunRows(run_path, storage_options)
