"""bench-pipeline --decode none's parts: the synthetic corpus and the stage with decoding taken out (the
sides themselves run as whole drivers; docs/benchmarking.md gives the command)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.bench.scale import PassThroughStage, write_corpus
from pipeline.io.schema import OUTPUT_SCHEMA


def test_the_corpus_holds_short_records_with_unique_ids_of_ten_characters(tmp_path, monkeypatch):
    from pipeline.bench import scale

    monkeypatch.setattr(scale, "ROWS_PER_WRITE", 1000)  # several slices per file
    write_corpus(tmp_path, 2_500, files=2)
    table = pq.read_table(tmp_path)
    assert table.num_rows == 2_500 and len(pc.unique(table["id"])) == 2_500
    assert set(pc.utf8_length(table["id"]).to_pylist()) == {10}
    assert pc.max(pc.utf8_length(table["text"])).as_py() <= 24
    assert sorted(table["id"].to_pylist())[:2] == ["r000000000", "r000000001"]


def test_the_pass_through_stage_writes_an_output_row_per_record():
    class Spec:
        job_name = "scale"

    batch = pa.table({"id": ["a", "b"], "text": ["x", "y"], "reference": ["rx", None], "input_file": ["f", "f"],
                      "input_row": [0, 1]})
    out = PassThroughStage(Spec())(batch)
    assert out.schema == OUTPUT_SCHEMA
    assert out["id"].to_pylist() == ["a", "b"] and out["prediction"].to_pylist() == ["x", "y"]
    assert out["reference"].to_pylist() == ["rx", None] and out["error"].null_count == 2
    assert out["input_row"].to_pylist() == [0, 1]  # its position: what a resume reads


def test_the_pass_through_stage_writes_the_quality_statistics_an_actor_would():
    from pipeline.metrics import quality as q

    class Spec:
        job_name = "scale"

    batch = pa.table({"id": ["a", "b", "c"], "text": ["Ein Hund.", "Zwei Hunde.", "Ein Hund."],
                      "reference": ["A dog.", "Two dogs.", None], "input_file": ["f"] * 3, "input_row": [0, 1, 2]})
    stats = PassThroughStage(Spec())(batch)["quality_stats"].to_pylist()
    expected = q.stats_matrix("translation", q.row_statistics("translation", ["Ein Hund.", "Zwei Hunde."],
                                                              ["A dog.", "Two dogs."]))
    assert stats[:2] == expected.tolist() and stats[2] is None
