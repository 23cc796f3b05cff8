"""Jobs on CTranslate2 (models.engine ct2) and reports against it (report.baseline_engine ct2): what a
job file may ask for, exit code 2 naming the key where it cannot run, and a paired baseline on CTranslate2
whose outputs are our own `large`'s."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.decoding import Generator, ModelPair
from pipeline.jobs import JobConfig
from pipeline.jobs.report import build_report, result_line
from pipeline.jobs.run import EngineError, run_job
from pipeline.jobs.sweep import grid_points
from support.shards import SENTENCES

pytest.importorskip("ctranslate2")


def job_data(pair, tmp_path, **sections) -> dict:
    small, large = pair
    data = {"name": "ct2", "input": {"path": str(tmp_path / "in.parquet"), "reference_column": "ref"},
            "models": {"small": small, "large": large, "device": "cpu", "ct2_cache": str(tmp_path / "cache")},
            "decoding": {"method": "bild", "max_new_tokens": 12, "fallback_threshold": 0.5},
            "compute": {"actors": 1, "batch_size": 1}, "output": {"path": str(tmp_path / "out"), "mode": "overwrite"}}
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def test_job_files_name_the_key_ct2_cannot_run(saved_tiny_pair, tmp_path):
    cases = {
        "models.engine ct2 runs methods large and small only": {"models": {"engine": "ct2"}},
        "report.baseline_engine ct2 runs report.baseline large or small only":
            {"report": {"baseline": "speculative", "baseline_engine": "ct2"}},
        "decoding.do_sample with models.engine ct2": {"models": {"engine": "ct2"},
                                                      "decoding": {"method": "large", "do_sample": True}},
        "models.dtype float64 does not run on CTranslate2": {"models": {"engine": "ct2", "dtype": "float64"},
                                                             "decoding": {"method": "large"}},
    }
    runner = CliRunner()
    for message, sections in cases.items():
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(job_data(saved_tiny_pair, tmp_path, **sections)))
        result = runner.invoke(main, ["validate", str(tmp_path / "job.yaml")])
        assert result.exit_code == 2 and message in result.output, (message, result.output)
    fine = [{"models": {"engine": "ct2", "quantize": "int8"}, "decoding": {"method": "large"}},
            {"report": {"baseline": "large", "baseline_engine": "ct2"}},
            {"decoding": {"method": "large"}, "report": {"baseline": "large", "baseline_engine": "ct2"}}]
    for sections in fine:
        JobConfig.model_validate(job_data(saved_tiny_pair, tmp_path, **sections))


def test_a_sweep_or_a_missing_package_stops_before_ray(saved_tiny_pair, tmp_path, monkeypatch):
    job = JobConfig.model_validate(job_data(saved_tiny_pair, tmp_path, models={"engine": "ct2"},
                                            decoding={"method": "large"}))
    points = grid_points(job.decoding.to_config(), [0.5], [1.0])
    with pytest.raises(EngineError, match="models.engine ct2 runs methods large and small only .*the sweep's points' method is 'bild'"):
        run_job(job, points=points)
    monkeypatch.setattr("pipeline.decoding.engines.ct2_engine.available", lambda: False)
    with pytest.raises(EngineError, match=r"pip install 'bild-pipeline\[ct2\]'"):
        run_job(job)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bild_reports_against_ctranslate2_running_large_on_the_same_actor(ray_local, saved_tiny_pair, tmp_path):
    """report.baseline large on CTranslate2: the paired rows hold CTranslate2's outputs (float32: our
    own `large`'s, word for word), the rows say which engine ran them, and the headline names it."""
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(6)], "text": SENTENCES, "ref": SENTENCES}),
                   tmp_path / "in.parquet")
    job = JobConfig.model_validate(job_data(saved_tiny_pair, tmp_path, report={
        "baseline": "large", "baseline_engine": "ct2", "baseline_records": 4}))
    run_job(job)
    summary, _ = build_report(str(tmp_path / "out"))
    rows = {row["id"]: row for row in pq.read_table(tmp_path / "out" / "data").to_pylist()}
    paired = [rows[f"d{i}"] for i in range(4)]
    assert {row["engine"] for row in rows.values()} == {"native"}
    assert [row["baseline_engine"] for row in paired] == ["ct2"] * 4 and rows["d5"]["baseline_engine"] is None
    small, large = saved_tiny_pair
    ours = Generator(ModelPair.from_pretrained(small, large, device="cpu"),
                     dataclasses.replace(job.decoding.to_config(), method="large"))
    assert [row["baseline_prediction"] for row in paired] == [r.prediction for r in ours.generate(SENTENCES[:4])]
    assert summary["paired_baseline"]["label"] == "CTranslate2 large"
    assert "bild" in result_line(summary) and "the speed of CTranslate2 large on 4 paired records" in result_line(summary)


@pytest.mark.slow
def test_bench_pipeline_times_a_ct2_job_against_ctranslate2_in_process(ray_local, saved_tiny_pair, tmp_path):
    """bench-pipeline --job: the job and CTranslate2 in-process alternate; the job's outputs are CTranslate2's."""
    from pipeline.bench.pipeline_job import run_ct2_job_bench

    pq.write_table(pa.table({"id": [f"d{i}" for i in range(6)], "text": SENTENCES, "ref": SENTENCES}),
                   tmp_path / "in.parquet")
    job = JobConfig.model_validate(job_data(saved_tiny_pair, tmp_path, models={"engine": "ct2", "quantize": "int8"},
                                            decoding={"method": "large"}, compute={"batch_size": 4}))
    result = run_ct2_job_bench(job, repeats=1)
    assert result["records"] == 6 and result["identical_outputs"] == 6 and "int8" in result["ct2"]
    assert len(result["ratios"]) == 1 and result["ratios"][0] > 0
    with pytest.raises(ValueError, match="compares a models.engine ct2 job"):
        run_ct2_job_bench(JobConfig.model_validate(job_data(saved_tiny_pair, tmp_path)), repeats=1)
