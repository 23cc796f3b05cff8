"""Documents through `bild-pipeline run` (input.segment: sentence, jobs/documents.yaml on the tiny pair): one row per
document, its sentences counted, its layout kept, bad documents each a clear row, resume per document."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.decoding import Generator, ModelPair
from pipeline.io.segments import split_sentences
from pipeline.io.storage import read_output_table
from pipeline.jobs import load_job
from support import REPO

pytestmark = pytest.mark.slow
SAMPLE = REPO / "data" / "documents_sample" / "multi30k_documents.parquet"
BAD = {"bad-empty": "", "bad-blank": " \n\t\n ", "bad-punct": "... !? –",
       "bad-newlines": "Eins.\r\nZwei.\rDrei.\n\nVier.",
       "bad-long": "Kurz. Ein sehr langer Satz " + "mit vielen Wörtern " * 30 + "endet hier. Auch kurz."}


def _job_file(tmp_path, pair, *overrides: str):
    """jobs/documents.yaml with the tiny pair, a handful of documents and the bad ones, written out whole."""
    sample = pq.read_table(SAMPLE).slice(0, 6).select(["id", "de", "en"]).to_pylist()
    rows = sample + [{"id": key, "de": text, "en": None} for key, text in BAD.items()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "documents.parquet")
    small, large = pair
    job = load_job(REPO / "jobs" / "documents.yaml", [
        f"input.path={tmp_path / 'documents.parquet'}", f"models.small={small}", f"models.large={large}",
        "models.engine=native", "models.quantize=none", "compute.actors=1", "compute.batch_size=4",
        "decoding.max_input_tokens=64", f"output.path={tmp_path / 'out'}", *overrides])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job.model_dump()))
    return path, job, {row["id"]: row["de"] for row in rows}


def test_documents_run_to_one_row_each_with_their_sentences_put_back(ray_local, saved_tiny_pair, tmp_path):
    # Fixed windows: `bild`'s tokens depend on its windows, and measured ones on the machine's load at the time,
    # so the pipeline and the reference decode below would drift apart on a busy machine.
    path, job, texts = _job_file(tmp_path, saved_tiny_pair, "decoding.adaptive_draft=false")
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 0, result.output
    rows = {row["id"]: row for row in read_output_table(job.output.path).to_pylist()}
    assert sorted(rows) == sorted(texts)  # one row per document, nothing lost, nothing doubled
    alone = Generator(ModelPair.from_spec(job.models.to_spec()), job.decoding.to_config())
    for key, text in texts.items():  # each document: its sentences decoded one by one, put in its layout
        row, document = rows[key], split_sentences(text, "de")
        assert row["segments"] == len(document.sentences), key
        if row["error"] is None:
            assert row["prediction"] == document.join([alone.generate_one(sentence).prediction
                                                       for sentence in document.sentences]), key
    assert rows["bad-empty"]["error"] == rows["bad-blank"]["error"] == "input text is empty"
    assert (rows["bad-punct"]["prediction"], rows["bad-punct"]["error"]) == (BAD["bad-punct"], None)
    assert rows["bad-newlines"]["segments"] == 4 and rows["bad-newlines"]["error"] is None
    assert rows["bad-long"]["truncated"] is True and rows["bad-long"]["segments"] == 3
    assert rows["bad-long"]["error"] is None and rows["bad-long"]["prediction"]
    assert all(rows[key]["error"] is None for key in texts if not key.startswith("bad-"))
    assert sum(row["segments"] for key, row in rows.items() if not key.startswith("bad-")) > 6
    manifest = json.loads((tmp_path / "out" / "run.json").read_text())
    assert manifest["decisive_settings"]["input.segment"] == "sentence"

    report = CliRunner().invoke(main, ["report", str(tmp_path / "out")])
    assert report.exit_code == 0, report.output


def test_a_segmented_run_resumes_per_document(ray_local, saved_tiny_pair, tmp_path):
    """A first run of 4 documents, then the rest: each document decoded once, whole, never half a document;
    a resume that changes input.segment is refused by name."""
    path, job, texts = _job_file(tmp_path, saved_tiny_pair, "input.limit=4")
    assert CliRunner().invoke(main, ["run", str(path)]).exit_code == 0
    first = {row["id"]: row for row in read_output_table(job.output.path).to_pylist()}
    assert len(first) == 4
    path, job, _ = _job_file(tmp_path, saved_tiny_pair, "output.mode=resume")
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 0, result.output
    rows = read_output_table(job.output.path).to_pylist()
    assert sorted(row["id"] for row in rows) == sorted(texts)  # each once
    again = {row["id"]: row for row in rows if row["id"] in first}
    assert {key: row["prediction"] for key, row in again.items()} == {
        key: row["prediction"] for key, row in first.items()}
    path, _, _ = _job_file(tmp_path, saved_tiny_pair, "output.mode=resume", "input.segment=none")
    refused = CliRunner().invoke(main, ["run", str(path)])
    assert refused.exit_code == 2 and "input.segment" in refused.output
