"""Sweeps: grid points, the Pareto front on hand-made points, tune's pick, and a 2x2 sweep end to end."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.decoding import DecodingConfig
from pipeline.io.storage import read_output_table
from pipeline.jobs.schema import JobConfig
from pipeline.jobs.sweep import grid_points, pareto_flags, pick_point, run_sweep

POINTS = [  # (name, latency, bleu): b dominates c; a and d are on the front
    {"point": "a", "latency_ms": 10.0, "bleu": 20.0},
    {"point": "b", "latency_ms": 20.0, "bleu": 30.0},
    {"point": "c", "latency_ms": 25.0, "bleu": 29.0},
    {"point": "d", "latency_ms": 40.0, "bleu": 31.0},
    {"point": "large", "latency_ms": 50.0, "bleu": 31.0},  # as good as d but slower
]


def test_pareto_front_on_hand_made_points():
    assert pareto_flags(POINTS, "bleu") == [True, True, False, True, False]


def test_pick_point_is_the_fastest_within_the_budget():
    assert pick_point(POINTS, "bleu", max_drop=0.5)["point"] == "d"
    assert pick_point(POINTS, "bleu", max_drop=1.5)["point"] == "b"
    assert pick_point(POINTS, "bleu", max_drop=20)["point"] == "a"


def test_grid_points_cover_baselines_and_every_pair():
    names = [name for name, _ in grid_points(DecodingConfig(), [0.2, 0.4], [2, 3])]
    assert names == ["large", "small", "bild_fb0.2_rb2", "bild_fb0.2_rb3", "bild_fb0.4_rb2", "bild_fb0.4_rb3"]


def test_a_window_grid_is_a_third_axis_and_names_its_points():
    points = dict(grid_points(DecodingConfig(max_draft_tokens=10), [0.4], [1, 2], windows=[6, 16]))
    assert list(points) == ["large", "small", "bild_fb0.4_rb1_w6", "bild_fb0.4_rb1_w16", "bild_fb0.4_rb2_w6",
                            "bild_fb0.4_rb2_w16"]
    assert points["bild_fb0.4_rb2_w16"].max_draft_tokens == 16 and points["bild_fb0.4_rb2_w16"].rollback_threshold == 2
    assert points["large"].max_draft_tokens == 10  # the baselines keep the job's settings


@pytest.mark.parametrize("window", ["0", "4,x", ""])
def test_a_bad_window_list_is_refused_before_anything_runs(tmp_path, window):
    result = CliRunner().invoke(main, ["sweep", str(tmp_path / "missing.yaml"), "--window", window])
    assert result.exit_code == 2 and "--window" in result.output


def test_tune_writes_a_preset_that_a_job_accepts(tmp_path):
    points = [{**p, "method": "bild", "fallback_threshold": 0.4, "rollback_threshold": 3.0} for p in POINTS]
    (tmp_path / "sweep.json").write_text(json.dumps({"task": "translation", "metric": "bleu", "points": points}))
    out = tmp_path / "configs" / "tuned.yaml"
    result = CliRunner().invoke(main, ["tune", str(tmp_path / "sweep.json"), "--max-drop", "0.5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    import yaml

    preset = yaml.safe_load(out.read_text())
    assert preset == {"decoding": {"method": "bild", "fallback_threshold": 0.4, "rollback_threshold": 3.0}}
    assert "the fastest point" in out.read_text()


@pytest.mark.slow
def test_two_by_two_sweep_on_tiny_models_resumes(ray_local, saved_tiny_pair, tmp_path):
    texts = ["Ein Hund läuft.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.", "Kinder bauen."]
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(4)], "text": texts, "ref": texts}), tmp_path / "in.parquet")
    small, large = saved_tiny_pair
    job = JobConfig.model_validate({
        "name": "sweep", "input": {"path": str(tmp_path / "in.parquet"), "reference_column": "ref"},
        "models": {"small": small, "large": large, "device": "cpu"},
        "decoding": {"max_new_tokens": 8, "rollback_threshold": 0.0},
        "output": {"path": str(tmp_path / "out"), "mode": "resume"},
    })
    summary, table = run_sweep(job, [0.2, 0.6], [0.0, 5.0])
    rows = read_output_table(str(tmp_path / "out"))
    assert rows.num_rows == 4 * 6  # every record under every point, exactly once
    by_point = {p["point"]: p for p in table}
    assert set(by_point) == {"large", "small", "bild_fb0.2_rb0", "bild_fb0.2_rb5", "bild_fb0.6_rb0", "bild_fb0.6_rb5"}
    # Greedy BiLD with rollback_threshold 0 is lossless: same quality as large, whatever the fallback.
    assert by_point["bild_fb0.2_rb0"]["bleu"] == pytest.approx(by_point["large"]["bleu"])
    assert by_point["large"]["speedup_vs_large"] == pytest.approx(1.0)
    assert any(p["pareto"] for p in table)
    # Rerunning finds every (record, point) done and decodes nothing.
    again, _ = run_sweep(job, [0.2, 0.6], [0.0, 5.0])
    assert again.decoded_now == 0 and again.skipped_existing == 4
    assert read_output_table(str(tmp_path / "out")).num_rows == 24
