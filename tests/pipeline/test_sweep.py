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


def test_cascade_and_lenience_points_follow_the_bild_grid():
    points = dict(grid_points(DecodingConfig(), [0.4], [1], cascades={"chow": [0.1, 0.3], "opt": [0.5]},
                              leniences=[0.0, 0.2]))
    assert list(points) == ["large", "small", "bild_fb0.4_rb1", "cascade_chow_a0.1", "cascade_chow_a0.3",
                            "cascade_opt_a0.5", "speculative_l0", "speculative_l0.2"]
    chow = points["cascade_chow_a0.3"]
    assert (chow.method, chow.deferral, chow.deferral_threshold) == ("cascade", "chow", 0.3)
    assert (points["speculative_l0.2"].method, points["speculative_l0.2"].lenience) == ("speculative", 0.2)


@pytest.mark.parametrize("option", [["--cascade", "sometimes=0.1"], ["--cascade", "chow"]])
def test_a_bad_cascade_grid_is_refused_before_anything_runs(tmp_path, option):
    result = CliRunner().invoke(main, ["sweep", str(tmp_path / "missing.yaml"), *option])
    assert result.exit_code == 2 and "--cascade" in result.output


def test_tune_picks_across_methods_and_writes_the_cascades_keys(tmp_path):
    points = [{**p, "method": "bild", "fallback_threshold": 0.4, "rollback_threshold": 3.0} for p in POINTS]
    points.append({"point": "cascade_diff_a0.1", "latency_ms": 15.0, "bleu": 30.9, "method": "cascade",
                   "deferral": "diff", "deferral_threshold": 0.1, "draft_window": "fixed", "fallback_threshold": 0.4,
                   "rollback_threshold": 3.0, "max_draft_tokens": 10, "lenience": 0.0})
    (tmp_path / "sweep.json").write_text(json.dumps({"task": "translation", "metric": "bleu", "points": points}))
    out = tmp_path / "tuned.yaml"
    result = CliRunner().invoke(main, ["tune", str(tmp_path / "sweep.json"), "--max-drop", "0.5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    import yaml

    preset = yaml.safe_load(out.read_text())["decoding"]
    assert preset == {"method": "cascade", "deferral": "diff", "deferral_threshold": 0.1, "draft_window": "fixed",
                      "fallback_threshold": 0.4, "max_draft_tokens": 10}
    from pipeline.jobs.schema import DecodingSection

    assert DecodingSection(**preset).to_config().method == "cascade"  # a job accepts it


@pytest.mark.parametrize("window", ["0", "4,x", ""])
def test_a_bad_window_list_is_refused_before_anything_runs(tmp_path, window):
    for spelling in ("--max-draft-tokens", "--window"):  # the option's name, and its old one
        result = CliRunner().invoke(main, ["sweep", str(tmp_path / "missing.yaml"), spelling, window])
        assert result.exit_code == 2 and "Invalid value for --max-draft-tokens" in result.output


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


def test_tune_picks_among_one_methods_points_when_asked(tmp_path):
    """`large` itself may be the fastest point within the budget (measured windows where drafting cannot pay);
    --method bild picks the fastest `bild` point instead, and a method without a point within it is refused."""
    points = [{"point": "large", "method": "large", "latency_ms": 10.0, "bleu": 33.0},
              {"point": "bild_fb0.4_rb1", "method": "bild", "latency_ms": 10.2, "bleu": 33.0,
               "fallback_threshold": 0.4, "rollback_threshold": 1.0},
              {"point": "bild_fb0.2_rb1", "method": "bild", "latency_ms": 10.4, "bleu": 33.1,
               "fallback_threshold": 0.2, "rollback_threshold": 1.0}]
    (tmp_path / "sweep.json").write_text(json.dumps({"task": "translation", "metric": "bleu", "points": points}))
    out = tmp_path / "tuned.yaml"
    tune = ["tune", str(tmp_path / "sweep.json"), "--max-drop", "0.5", "--out", str(out)]
    assert CliRunner().invoke(main, tune).exit_code == 0 and "large" in out.read_text().split("decoding:")[1]
    result = CliRunner().invoke(main, [*tune, "--method", "bild"])
    assert result.exit_code == 0, result.output
    import yaml

    assert yaml.safe_load(out.read_text())["decoding"]["fallback_threshold"] == 0.4
    result = CliRunner().invoke(main, [*tune, "--method", "speculative"])
    assert result.exit_code == 2 and "no speculative point" in result.output


@pytest.mark.parametrize("adaptive", [True, False])
def test_tune_keeps_the_windows_the_sweep_measured(tmp_path, adaptive):
    """A sweep's points carry their decoding settings (run.json's sweep_points): the preset keeps how their
    windows were chosen, so that a job runs the point as it was timed."""
    points = [{**p, "method": "bild", "fallback_threshold": 0.4, "rollback_threshold": 3.0, "max_draft_tokens": 10,
               "adaptive_draft": adaptive} for p in POINTS]
    (tmp_path / "sweep.json").write_text(json.dumps({"task": "translation", "metric": "bleu", "points": points}))
    out = tmp_path / "tuned.yaml"
    result = CliRunner().invoke(main, ["tune", str(tmp_path / "sweep.json"), "--max-drop", "0.5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    import yaml

    assert yaml.safe_load(out.read_text())["decoding"]["adaptive_draft"] is adaptive


def large_greedy_outputs(pair: tuple[str, str], texts: list[str], max_new_tokens: int) -> list[str]:
    """What the large model alone writes for each text (greedy), decoded here in the test process."""
    from pipeline.decoding import Generator, ModelPair

    loaded = ModelPair.from_pretrained(*pair, device="cpu")
    config = DecodingConfig(method="large", max_new_tokens=max_new_tokens)
    return [result.prediction for result in Generator(loaded, config).generate(texts)]


@pytest.mark.slow
def test_two_by_two_sweep_on_tiny_models_resumes(ray_local, saved_tiny_pair, tmp_path):
    """Every record under every point once; the rb0 points give large's output record by record; the
    table's latency, speedup, BLEU and Pareto flags are those of its rows; a rerun decodes nothing."""
    import sacrebleu

    texts = ["Ein Hund läuft.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.", "Kinder bauen."]
    refs = large_greedy_outputs(saved_tiny_pair, texts, 8)  # references on which the points' BLEU differs
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(4)], "text": texts, "ref": refs}), tmp_path / "in.parquet")
    small, large = saved_tiny_pair
    job = JobConfig.model_validate({
        "name": "sweep", "input": {"path": str(tmp_path / "in.parquet"), "reference_column": "ref"},
        "models": {"small": small, "large": large, "device": "cpu"},
        # fixed windows: four records are too few for measured ones to draft, and the checks below need drafts
        "decoding": {"max_new_tokens": 8, "rollback_threshold": 0.0, "adaptive_draft": False},
        "output": {"path": str(tmp_path / "out"), "mode": "resume"},
    })
    summary, table = run_sweep(job, [0.2, 0.6], [0.0, 5.0])
    rows = read_output_table(str(tmp_path / "out")).to_pylist()
    assert len(rows) == 4 * 6 and all(row["error"] is None for row in rows)  # every record, every point, once
    by_point = {p["point"]: p for p in table}
    assert set(by_point) == {"large", "small", "bild_fb0.2_rb0", "bild_fb0.2_rb5", "bild_fb0.6_rb0", "bild_fb0.6_rb5"}
    out = {(row["point"], row["id"]): row for row in rows}
    assert len(out) == 24

    def decoded(point: str, key: str) -> tuple[str, int]:
        return out[(point, key)]["prediction"], out[(point, key)]["output_tokens"]

    ids = [f"s{i}" for i in range(4)]
    # Greedy BiLD with rollback_threshold 0 is lossless: large's output for every record, whatever the
    # fallback; it did draft and roll back (so a skipped rollback would show), and small alone differs.
    for point in ("bild_fb0.2_rb0", "bild_fb0.6_rb0"):
        assert [decoded(point, key) for key in ids] == [decoded("large", key) for key in ids], point
        assert sum(out[(point, key)]["rollbacks"] for key in ids) > 0, point
    assert sum(out[("bild_fb0.2_rb0", key)]["small_tokens"] for key in ids) > 0
    assert any(decoded("small", key) != decoded("large", key) for key in ids), "the comparison could not fail"

    # The table's numbers are its rows': mean latency, speedup over large, sacrebleu's corpus BLEU; the
    # Pareto flags are those of these numbers.
    latency = {p: sum(out[(p, key)]["latency_ms"] for key in ids) / len(ids) for p in by_point}
    bleu = {p: sacrebleu.corpus_bleu([out[(p, key)]["prediction"] for key in ids],
                                     [[out[(p, key)]["reference"] for key in ids]]).score for p in by_point}
    assert len(set(bleu.values())) > 1  # the references tell the points apart
    for name, point in by_point.items():
        assert point["latency_ms"] == pytest.approx(latency[name]), name
        assert point["speedup_vs_large"] == pytest.approx(latency["large"] / latency[name]), name
        assert point["bleu"] == pytest.approx(bleu[name]), name
    recomputed = [{"latency_ms": latency[p["point"]], "bleu": bleu[p["point"]]} for p in table]
    assert [p["pareto"] for p in table] == pareto_flags(recomputed, "bleu")
    # Rerunning finds every (record, point) done and decodes nothing.
    again, _ = run_sweep(job, [0.2, 0.6], [0.0, 5.0])
    assert again.decoded_now == 0 and again.skipped_existing == 4
    assert read_output_table(str(tmp_path / "out")).num_rows == 24


def test_a_sweep_over_documents_keeps_one_row_per_document_and_point(ray_local, saved_tiny_pair, tmp_path):
    """input.segment: sentence under a sweep: each document once under every point, its sentences put back
    (segments counted), and greedy BiLD with rollback_threshold 0 gives large's documents exactly."""
    documents = ["Ein Hund läuft. Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.\n\nKinder bauen."]
    pq.write_table(pa.table({"id": ["d0", "d1"], "text": documents}), tmp_path / "in.parquet")
    small, large = saved_tiny_pair
    job = JobConfig.model_validate({
        "name": "sweep-docs", "input": {"path": str(tmp_path / "in.parquet"), "segment": "sentence",
                                        "language": "de"},
        "models": {"small": small, "large": large, "device": "cpu"},
        "decoding": {"max_new_tokens": 6, "rollback_threshold": 0.0},
        "output": {"path": str(tmp_path / "out"), "mode": "resume"},
    })
    run_sweep(job, [0.4], [0.0])
    rows = {(row["point"], row["id"]): row for row in read_output_table(str(tmp_path / "out")).to_pylist()}
    assert sorted(rows) == sorted((point, key) for point in ("large", "small", "bild_fb0.4_rb0") for key in ("d0", "d1"))
    assert all(row["error"] is None and row["segments"] == 2 for row in rows.values())
    for key in ("d0", "d1"):
        assert rows[("bild_fb0.4_rb0", key)]["prediction"] == rows[("large", key)]["prediction"]
    assert "\n\n" in rows[("large", "d1")]["prediction"]  # the paragraph break kept between the sentences
