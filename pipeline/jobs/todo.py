"""What a run decodes: the input's fragments less what its output holds, its records counted and their ids
checked on the workers (docs/design.md §6).

A job resumes by position: each output row says which input file and row it came from, so "what is done"
is a set of row ranges (io/done.py) and the to-do is fragments that skip them inside their own read tasks.
A sweep (a record is done when every point of it is) and an output written before the position columns
existed resume by id instead, as before: the driver then reads the input's ids, and the read is filtered
by the ids still to decode.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io.done import DoneRows, done_rows
from pipeline.io.fragments import Fragment, counted, first_rows, plan_fragments, read_fragment, without_done
from pipeline.io.id_check import check_unique_ids
from pipeline.io.storage import existing_rows

log = logging.getLogger(__name__)


@dataclass
class Todo:
    fragments: list[Fragment]  # what the run reads
    records_in_input: int  # of the job's input (after input.limit)
    to_decode: int  # records
    ids: pa.Array | None = None  # resuming by id: the ids to decode, else None (every record read is decoded)
    partial: dict = dataclasses.field(default_factory=dict)  # a sweep's {id: points already done}
    done: DoneRows | None = None  # by position: what the output held (rows with an error left out when they are
    #                                retried); None where the run goes by id

    def dataset(self, fs, input_config, block_rows: int):
        """The records to decode, as a lazy Ray dataset in blocks of at most `block_rows` rows."""
        from pipeline.io.fragment_source import read_input  # Ray Data: imported where a job reads

        records = read_input(fs, input_config, self.fragments, block_rows)
        if self.ids is None:
            return records
        wanted = self.ids

        def keep(batch: pa.Table) -> pa.Table:
            return batch.filter(pc.is_in(batch["id"], value_set=wanted))

        return records.map_batches(keep, batch_format="pyarrow")


def input_fragments(input_config, listing) -> list[Fragment]:
    """The job's input as fragments, input.limit applied, once every id in them is known to be there and unique
    (InputError otherwise). A CSV or JSONL file is counted as its ids are checked."""
    fs, _ = listing
    fragments = plan_fragments(input_config, listing)
    if input_config.format == "parquet":
        fragments = first_rows(fragments, input_config.limit)
        check_unique_ids(fs, input_config, fragments)
        return fragments
    return first_rows(counted(fragments, check_unique_ids(fs, input_config, fragments)), input_config.limit)


def first_ids(fs, input_config, fragments: list[Fragment], count: int) -> pa.Array:
    """The ids of the input's first `count` records (report.baseline's), reading only the fragments that hold them."""
    found, left = [], count
    for fragment in fragments:
        if left <= 0:
            break
        ids = read_fragment(fs, input_config, fragment, ids_only=True)["id"].combine_chunks()[:left]
        found.append(ids)
        left -= len(ids)
    return pa.concat_arrays(found) if found else pa.array([], pa.string())


def plan_todo(fs, input_config, fragments: list[Fragment], out_fs, out_path: str, *, resume: bool,
              point_names: list[str] | None, retry_errors: bool) -> Todo:
    """What to decode. `point_names`: a sweep's points (None for a job). With `retry_errors`, a row holding an
    error does not count as done."""
    total = sum(fragment.rows for fragment in fragments)
    if not resume:  # the output holds no rows (overwrite cleared it; output.mode error refuses one that does)
        return Todo(fragments, total, total, done=DoneRows())
    done = None if point_names is not None else done_rows(out_fs, out_path, skip_errors=retry_errors)
    if done is not None:
        todo = without_done(fragments, done.ranges)
        if done.repeated:
            log.warning("%d duplicate row(s) of records already in %s (a retried write): each counts once",
                        done.repeated, out_path)
        return Todo(todo, total, sum(fragment.rows for fragment in todo), done=done)
    # The ids were checked by input_fragments: here they are only read, on the driver, as this path needs them.
    ids = pa.concat_arrays([read_fragment(fs, input_config, fragment, ids_only=True)["id"].combine_chunks()
                            for fragment in fragments]) if fragments else pa.array([], pa.string())
    wanted, partial = _by_id(out_fs, out_path, ids, point_names, retry_errors)
    return Todo(fragments, total, len(wanted), ids=wanted, partial=partial)


def _by_id(fs, path: str, ids: pa.Array, point_names: list[str] | None, retry_errors: bool):
    """(ids still to decode, {id: points already done} for partly done ids), resuming by id.

    A job's record is done when its id is in the output; a sweep's when every point of it is. With
    `retry_errors`, a row that holds an error does not count."""
    keys = ["id"] if point_names is None else ["id", "point"]
    rows = existing_rows(fs, path, [*keys, "error"])
    if retry_errors and rows.num_rows:
        retried = rows.filter(pc.is_valid(rows["error"]))["id"].unique()
        rows = rows.filter(pc.is_null(rows["error"]))
        if len(retried):
            log.warning("decoding again %d record(s) whose rows hold an error (output.retry_errors)",
                        len(pc.filter(retried, pc.invert(pc.is_in(retried, value_set=rows["id"])))))
    if point_names is None:
        done = rows["id"]
        if len(done) > len(done.unique()):
            log.warning("%d duplicate row(s) of ids already in %s (a retried write): each id counts once",
                        len(done) - len(done.unique()), path)
        return pc.filter(ids, pc.invert(pc.is_in(ids, value_set=done.unique()))), {}
    by_id: dict[str, set[str]] = {}
    for pair in rows.select(keys).to_pylist():
        if pair["point"] in point_names:
            by_id.setdefault(pair["id"], set()).add(pair["point"])
    complete = pa.array([i for i, done in by_id.items() if len(done) == len(point_names)], pa.string())
    todo = pc.filter(ids, pc.invert(pc.is_in(ids, value_set=complete)))
    partial = {i: sorted(done) for i, done in by_id.items() if len(done) < len(point_names)}
    return todo, partial
