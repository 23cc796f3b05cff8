"""The input as fragments (io/fragments.py), the output's "what is done" as row ranges (io/done.py) and the ids
checked on the workers (io/id_check.py): what lets a job's driver work in files, not records."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io import fragments as fr
from pipeline.io.done import DoneRows, done_rows, file_ranges, merge
from pipeline.io.storage import InputError, data_path, input_files, open_filesystem, output_files
from pipeline.jobs.run import run_job
from pipeline.jobs.todo import input_fragments, plan_todo
from support.jobs import assert_one_row_per_id, make_job, output_rows


def _corpus(folder, sizes: dict[str, list[int]]) -> list[str]:
    """Parquet files named as `sizes`' keys, each of row groups of the sizes listed; returns the ids in order."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = []
    for name, groups in sizes.items():
        with pq.ParquetWriter(folder / name, pa.schema([("id", pa.string()), ("text", pa.string()),
                                                        ("ref", pa.string())])) as writer:
            for size in groups:
                chunk = [f"{name[:-8]}-{len(ids) + i}" for i in range(size)]
                ids += chunk
                writer.write_table(pa.table({"id": chunk, "text": ["Ein Hund."] * size, "ref": ["A dog."] * size}))
    return ids


def test_fragments_hold_whole_row_groups_and_limit_and_resume_cut_them(tmp_path, saved_tiny_pair, monkeypatch):
    monkeypatch.setattr(fr, "FRAGMENT_ROWS", 5)
    ids = _corpus(tmp_path / "in", {"a.parquet": [3, 3, 4], "b.parquet": [2]})
    config = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out").input
    listing = input_files(config)
    fragments = fr.plan_fragments(config, listing)
    assert [(f.name, f.start, f.stop, f.groups) for f in fragments] == [
        ("a.parquet", 0, 6, (0, 1)), ("a.parquet", 6, 10, (2,)), ("b.parquet", 0, 2, (0,))]
    limited = fr.first_rows(fragments, 7)
    assert [(f.name, f.start, f.stop) for f in limited] == [("a.parquet", 0, 6), ("a.parquet", 6, 7)]
    read = pa.concat_tables(fr.read_fragment(listing[0], config, f) for f in limited)
    assert read["id"].to_pylist() == ids[:7] and read["input_row"].to_pylist() == list(range(7))
    todo = fr.without_done(fragments, {"a.parquet": ((0, 6), (8, 9)), "b.parquet": ((0, 2),)})
    assert [(f.start, f.stop, f.skip, f.rows) for f in todo] == [(6, 10, ((8, 9),), 3)]
    assert fr.read_fragment(listing[0], config, todo[0])["id"].to_pylist() == [ids[6], ids[7], ids[9]]


def test_an_outputs_rows_become_merged_ranges_and_repeats_are_counted():
    table = pa.table({"input_file": ["a", "a", "b", "a", "a", "b"], "input_row": [4, 2, 0, 3, 3, 1]})
    assert file_ranges(table) == {"a": [(2, 4), (3, 5)], "b": [(0, 2)]}  # row 3 twice: two ranges over it
    assert merge([(5, 7), (0, 2), (2, 3), (6, 9)]) == ((0, 3), (5, 9))


def test_two_outputs_joined_count_a_row_in_both_once_and_as_a_repeat():
    """The summary joins what the output held before the run with this run's files (run_summary.py)."""
    before = DoneRows({"x": ((0, 5),)}, rows=5, repeated=0, files=1)
    now = DoneRows({"x": ((4, 8),), "y": ((0, 2),)}, rows=6, repeated=1, files=2)
    joined = before.joined(now)
    assert (joined.ranges, joined.rows, joined.repeated, joined.files) == ({"x": ((0, 8),), "y": ((0, 2),)}, 10, 2, 3)


def test_done_rows_reads_positions_and_an_older_output_has_none(tmp_path):
    fs, path = open_filesystem(str(tmp_path / "out"))
    fs.makedirs(data_path(path))
    pq.write_table(pa.table({"id": ["x", "y", "z"], "input_file": ["a", "a", "a"], "input_row": [0, 1, 2],
                             "error": [None, "boom", None]}), f"{data_path(path)}/1.parquet")
    pq.write_table(pa.table({"id": ["y"], "input_file": ["a"], "input_row": [1], "error": [None]}),
                   f"{data_path(path)}/2.parquet")
    done = done_rows(fs, path)
    assert (done.ranges, done.rows, done.repeated, done.files) == ({"a": ((0, 3),)}, 3, 1, 2)
    assert done_rows(fs, path, skip_errors=True).ranges == {"a": ((0, 3),)}  # row 1 decoded again in 2.parquet
    only = done_rows(fs, path, files=[f"{data_path(path)}/2.parquet"])
    assert (only.ranges, only.rows, only.files) == ({"a": ((1, 2),)}, 1, 1)
    pq.write_table(pa.table({"id": ["w"], "error": [None]}), f"{data_path(path)}/0.parquet")
    assert done_rows(fs, path) is None


def test_the_workers_name_repeated_and_missing_ids_across_files(ray_local, tmp_path, saved_tiny_pair, monkeypatch):
    _corpus(tmp_path / "ok", {f"{n}.parquet": [3] for n in "abcdefgh"})
    config = make_job(saved_tiny_pair, tmp_path / "ok", tmp_path / "out").input
    assert sum(f.rows for f in input_fragments(config, input_files(config))) == 24  # 8 buckets: no false repeat
    bad = tmp_path / "bad"
    bad.mkdir()
    for name, values in {"a.parquet": ["1", "2", "3"], "b.parquet": ["3", "4", "2"], "c.parquet": ["5", " ", "6"]}.items():
        pq.write_table(pa.table({"id": values, "text": ["x"] * 3, "ref": ["y"] * 3}), bad / name)
    config = make_job(saved_tiny_pair, bad, tmp_path / "out").input
    with pytest.raises(InputError, match="1 input record"):
        input_fragments(config, input_files(config))
    pq.write_table(pa.table({"id": ["5", "7", "6"], "text": ["x"] * 3, "ref": ["y"] * 3}), bad / "c.parquet")
    with pytest.raises(InputError, match=r"2 input id\(s\) occur more than once, e.g. .*'2' x2"):
        input_fragments(config, input_files(config))
    limited = make_job(saved_tiny_pair, bad, tmp_path / "out", input={"limit": 3}).input
    assert len(input_fragments(limited, input_files(limited))) == 1  # the repeats lie beyond the limit


def test_a_resume_goes_by_position_and_an_older_output_by_id(ray_local, saved_tiny_pair, tmp_path):
    ids = _corpus(tmp_path / "in", {"a.parquet": [5, 4], "b.parquet": [6]})
    first = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", input={"limit": 7})
    assert run_job(first).decoded_now == 7
    job = make_job(saved_tiny_pair, tmp_path / "in", tmp_path / "out", output={"mode": "resume"})
    fs, path = open_filesystem(job.output.path)
    listing = input_files(job.input)
    todo = plan_todo(listing[0], job.input, input_fragments(job.input, listing), fs, path, resume=True,
                     point_names=None, retry_errors=False)
    assert todo.ids is None and todo.to_decode == 8  # no id set: fragments that skip what is done
    assert [(f.name, f.start, f.stop, f.skip) for f in todo.fragments] == [("a.parquet", 0, 9, ((0, 7),)),
                                                                           ("b.parquet", 0, 6, ())]
    summary = run_job(job)
    assert (summary.decoded_now, summary.skipped_existing, summary.records_in_output) == (8, 7, 15)
    assert_one_row_per_id(output_rows(job), ids)
    # An output written before the position columns: its files lack them, so the resume goes by id.
    older, *rest = output_files(fs, path)
    pq.write_table(pq.read_table(older).drop_columns(["input_file", "input_row"]), older)
    for file in rest:
        fs.rm(file)
    todo = plan_todo(listing[0], job.input, input_fragments(job.input, listing), fs, path, resume=True,
                     point_names=None, retry_errors=False)
    assert todo.ids is not None and todo.to_decode == 15 - pq.read_metadata(older).num_rows
    assert run_job(job).decoded_now == todo.to_decode
    assert_one_row_per_id(output_rows(job), ids)
