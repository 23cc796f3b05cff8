"""Where records come from and go to: fsspec URLs (local, s3://, hf://, ...) as Ray Data datasets."""

from __future__ import annotations

import json
import logging
import posixpath
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.io.schema import SWEEP_SCHEMA

log = logging.getLogger(__name__)

EXTENSIONS = {"parquet": ["parquet"], "csv": ["csv"], "jsonl": ["jsonl", "json"]}
# A run's layout: OUTPUT/run.json (the manifest) beside OUTPUT/data/*.parquet (the rows), so that any
# Parquet reader pointed at OUTPUT/data sees only Parquet files.
MANIFEST = "run.json"
DATA_DIR = "data"


def data_path(output_path: str) -> str:
    return posixpath.join(output_path, DATA_DIR)


class InputError(ValueError):
    """The input cannot be used at all (missing column, duplicate ids): the job stops before decoding."""


def open_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """(fsspec filesystem, path within it) for any fsspec URL; storage_options go through as they are."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs, path


def output_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path) for a run's output folder, whose listings are never cached.

    Ray Data's writers add files to the folder while the driver lists it (the progress line, the
    resume state, the summary). A cached listing would then disagree with the store: s3fs answers
    FileNotFoundError for a file its cached listing of the folder lacks."""
    return open_filesystem(url, {**(storage_options or {}), "use_listings_cache": False})


def arrow_filesystem(fs: fsspec.AbstractFileSystem) -> pafs.FileSystem:
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def input_files(input_config) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """(filesystem, the input's files): the file input.path names, or every file below that folder with
    its format's extension, except those whose path inside it starts with "." or "_", sorted — the
    files Ray Data would read there. A job lists them once and plans its fragments from that list
    (fragments.py), so a file that lands in between is not read."""
    cfg = input_config
    fs, path = open_filesystem(cfg.path, cfg.storage_options)
    if not fs.exists(path):
        raise InputError(f"input.path {cfg.path!r} does not exist")
    if not fs.isdir(path):
        return fs, [path]
    base = path.rstrip("/") + "/"
    files = sorted(
        found for found in fs.find(path)
        if not found[len(base):].startswith((".", "_"))
        and found.lower().endswith(tuple("." + ext for ext in EXTENSIONS[cfg.format]))
    )
    if not files:
        raise InputError(f"input.path {cfg.path!r} holds no {cfg.format} files "
                         f"(*.{', *.'.join(EXTENSIONS[cfg.format])})")
    return fs, files


def missing_columns(input_config, names: list[str], where: str) -> list[str]:
    """A message for each of the input's id, text and reference columns that ``names`` (the columns of
    ``where``) lacks; a JSONL record may leave its reference out."""
    cfg = input_config
    wanted = [("input.id_column", cfg.id_column), ("input.text_column", cfg.text_column)]
    if cfg.format != "jsonl":
        wanted.append(("input.reference_column", cfg.reference_column))
    return [f"{key} {name!r} is not a column of {where} (columns: {', '.join(names)})"
            for key, name in wanted if name and name not in names]


def output_files(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    """The Parquet files of the run at `path` (its data directory), as the store lists them now."""
    data = data_path(path)
    fs.invalidate_cache(data)  # a filesystem handed in may hold an old listing (see output_filesystem)
    if not fs.exists(data):
        return []
    return sorted(p for p in fs.find(data) if p.endswith(".parquet"))


class OutputReadError(OSError):
    """An output file exists and is whole but could not be read (throttling, a network error, no
    permission): the run stops and deletes nothing, so that no finished work is lost."""


def is_torn_parquet(fs: fsspec.AbstractFileSystem, file: str) -> bool:
    """Whether a Parquet file was cut off before its footer was written (a writer that died).

    A whole file ends in a 4-byte footer length and the magic bytes PAR1, and holds its footer."""
    size = fs.size(file)
    if size < 12:
        return True
    with fs.open(file, "rb") as handle:
        handle.seek(size - 8)
        tail = handle.read(8)
    return tail[4:] != b"PAR1" or int.from_bytes(tail[:4], "little") + 12 > size


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def existing_rows(fs: fsspec.AbstractFileSystem, path: str, columns: list[str]) -> pa.Table:
    """Some columns of every row already written under an output path, in one table (readable_tables)."""
    tables = [table for _, table in readable_tables(fs, path, columns)]
    if not tables:
        return pa.table({column: pa.array([], pa.string()) for column in columns})
    return pa.concat_tables(tables)


def readable_tables(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None = None,
                    remove_torn: bool = True, files: list[str] | None = None):
    """(file, its table of `columns`) for each output file in turn (or each of `files`), a column a file lacks
    left out.

    A torn file (a write cut off by a crash) is removed, so its records are decoded again, never
    lost or doubled; not `remove_torn` (a reader that does not hold the lease), it raises as any
    other failure to read a file does: OutputReadError, removing nothing."""
    for file in output_files(fs, path) if files is None else files:
        try:
            with fs.open(file, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                present = parquet.schema_arrow.names
                table = parquet.read(columns=[c for c in columns if c in present] if columns else None)
        except Exception as exc:  # noqa: BLE001 - torn or not, decided below from the file's tail
            if not remove_torn:
                raise OutputReadError(f"cannot read the output file {file} ({_describe(exc)})") from exc
            _remove_if_torn(fs, file, exc)
            continue
        yield file, table


def _remove_if_torn(fs: fsspec.AbstractFileSystem, file: str, problem: BaseException) -> None:
    try:
        torn = is_torn_parquet(fs, file)
    except Exception as exc:  # noqa: BLE001 - whether it is torn cannot be told: keep it
        raise OutputReadError(f"cannot read the output file {file} ({_describe(exc)}); nothing was removed: "
                              "run the job again once the store answers") from problem
    if not torn:
        raise OutputReadError(f"cannot read the output file {file} ({_describe(problem)}), which is not a torn "
                              "write; nothing was removed: fix the cause and run the job again") from problem
    log.warning("removing the torn output file %s (its write was cut off); its records will be decoded again", file)
    fs.rm(file)


def read_output_table(url: str, storage_options: dict | None = None, columns: list[str] | None = None) -> pa.Table:
    """All output rows under a run's path (for summaries and tests).

    A column asked for that an older file lacks (one added to the output later) reads as nulls of
    the column's type, so that old and new files still concatenate.
    """
    fs, path = output_filesystem(url, storage_options)
    tables = list(output_tables(fs, output_files(fs, path), columns))
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})  # older files: fewer columns


def output_tables(fs: fsspec.AbstractFileSystem, files: list[str], columns: list[str] | None = None):
    """The rows of each of `files` in turn (one table each, read as it is used), as read_output_table reads
    them: a run of millions of rows summed file by file never sits in memory whole."""
    for file in files:
        with fs.open(file, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            present = parquet.schema_arrow.names
            table = parquet.read(columns=[c for c in columns if c in present] if columns else None)
        for name in columns or []:
            if name not in present:
                kind = SWEEP_SCHEMA.field(name).type if name in SWEEP_SCHEMA.names else pa.string()
                table = table.append_column(name, pa.nulls(table.num_rows, kind))
        yield table.select(columns) if columns else table


def kept_rows(keys: pa.Table, errors: pa.Array | pa.ChunkedArray | None = None) -> pa.Array:
    """The row numbers that one row per key keeps, in order: the first row of a key without an `error`, else
    its first row. A writer task Ray retried can leave a second row for an id; a retried error row (output.
    retry_errors) leaves a newer one that decoded."""
    import numpy as np
    import pyarrow.compute as pc

    count = keys.num_rows
    rank = np.arange(count, dtype=np.int64)
    if errors is not None:
        rank += count * pc.is_valid(errors).to_numpy(zero_copy_only=False).astype(np.int64)
    best = keys.append_column("_rank", pa.array(rank)).group_by(keys.column_names, use_threads=False).aggregate(
        [("_rank", "min")])["_rank_min"].to_numpy()
    return pa.array(np.sort(best % max(count, 1)))


def drop_superseded_rows(fs: fsspec.AbstractFileSystem, path: str, keys: list[str]) -> int:
    """Rewrite the output files that hold a row kept_rows leaves out (an error row decoded again, a retried
    write's second row) without it; returns the rows dropped. Each file is written whole under another name,
    then moved over the old one: a crash leaves it as it was, and readers keep the same rows either way."""
    files = output_files(fs, path)
    tables = list(output_tables(fs, files, [*keys, "error"]))
    if not tables:
        return 0
    import numpy as np

    everything = pa.concat_tables(tables)
    kept = np.zeros(everything.num_rows, dtype=bool)
    kept[kept_rows(everything.select(keys), everything["error"]).to_numpy()] = True
    start = 0
    for file, table in zip(files, tables):
        keep, start = kept[start:start + table.num_rows], start + table.num_rows
        if keep.all():
            continue
        with fs.open(file, "rb") as handle:
            whole = pq.read_table(handle)
        if keep.any():
            with fs.open(f"{file}.rewrite", "wb") as handle:
                pq.write_table(whole.filter(pa.array(keep)), handle)
            fs.mv(f"{file}.rewrite", file)
        else:
            fs.rm(file)
    return int((~kept).sum())


def write_manifest(fs: fsspec.AbstractFileSystem, path: str, manifest: dict) -> None:
    fs.makedirs(path, exist_ok=True)
    with fs.open(posixpath.join(path, MANIFEST), "w") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True, default=str)


def read_manifest(fs: fsspec.AbstractFileSystem, path: str) -> dict | None:
    target = posixpath.join(path, MANIFEST)
    if not fs.exists(target):
        return None
    with fs.open(target, "r") as handle:
        return json.load(handle)
